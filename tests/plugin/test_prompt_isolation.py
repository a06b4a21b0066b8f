"""Measurements share no state: no server is sent a prompt twice.

Seeds (workload.prompt_seed), the prefix-cache figures read from vLLM's /metrics and the rule
that flags unexpected hits (server_metrics.unexpected_prefix_hits), the recorder that wires
both, and the shipped suite end to end against the stub: the decode test sends the same prompts
alone and after the rest of the suite, the same under every profile, and no server gets a prompt twice.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tests.helpers import STUB_SERVER, stub_deployment_toml
from pytest_kimiperf.measure import runner, workload
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.measure.results import RoundResult, RunResult
from pytest_kimiperf.judge.stats import BootLedger
from pytest_kimiperf.recorder import PerfCase, PerfRecorder, RecorderHooks
from pytest_kimiperf.server.process import ServerHandle, pick_free_port
from pytest_kimiperf.judge.notes import PrefixCacheReused
from pytest_kimiperf.measure.server_view import (
    DEFAULT_BLOCK_TOKENS,
    PrefixReuse,
    ServerView,
    snapshot_from_text,
    unexpected_prefix_hits,
)
from pytest_kimiperf.measure.workload import prompt_seed
from pytest_kimiperf.reports.sentences import note_text, warning_lines
from tests import helpers

DATA = helpers.DATA / "server_metrics"
PERF_TESTS = helpers.PERF_TESTS
DECODE_TEST = "perf_tests/test_decode.py::test_single_stream_decode"


def _recorded(name: str) -> str:
    return (DATA / f"vllm_cpu_0.32_{name}.txt").read_text()


def _view(before: str, after: str) -> dict[str, Any]:
    return ServerView.between(snapshot_from_text(_recorded(before), model="tiny-llama"),
                              snapshot_from_text(_recorded(after), model="tiny-llama")).to_json()


# --------------------------------------------------------------------------- seeds


def test_prompt_seed_is_the_same_in_every_process_and_python_version() -> None:
    # A pinned value: a change of the derivation would silently change every baseline's prompts.
    assert prompt_seed(DECODE_TEST, "default", 1) == 7106791866738872605
    code = f"from pytest_kimiperf.measure.workload import prompt_seed; print(prompt_seed({DECODE_TEST!r}, 'default', 1))"
    for hash_seed in ("0", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": hash_seed, "PATH": ""})
        assert int(out.stdout) == 7106791866738872605


def test_prompt_seed_differs_per_test_profile_boot_and_base_seed() -> None:
    seeds = {
        prompt_seed(test, profile, boot, base)
        for test in (DECODE_TEST, "perf_tests/test_latency.py::test_ttft",
                     "perf_tests/test_throughput.py::test_output_throughput[8]",
                     "perf_tests/test_throughput.py::test_output_throughput[32]")
        for profile in ("default", "ring-ll")
        for boot in (1, 2)
        for base in (0, 1)
    }
    assert len(seeds) == 4 * 2 * 2 * 2
    assert prompt_seed(DECODE_TEST, "default", 1, 0) != 0


def test_prompt_seed_keeps_ids_that_only_move_a_separator_apart() -> None:
    assert prompt_seed("a:b", "c", 1) != prompt_seed("a", "b:c", 1)
    assert prompt_seed("t", "p", 11, 1) != prompt_seed("t", "p", 1, 11)


def test_prompt_seed_is_a_non_negative_int64() -> None:
    for boot in range(50):
        seed = prompt_seed(DECODE_TEST, "default", boot, -boot)
        assert isinstance(seed, int) and 0 <= seed < 2**63


# --------------------------------------------------------------------------- the recorder


def _recorder(tmp_path: Path, *, boot: int = 1, external: bool = False) -> PerfRecorder:
    settings = SimpleNamespace(deployment=TINY_CPU, perf_strict=False, boots=1, max_boots=1, control=False,
                               missing_baseline_fails=False,
                               profiles=(SimpleNamespace(name="default"),))
    server = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="ring-ll",
                          log_path=None, external=external)

    def fail(message: str) -> None:
        raise AssertionError(message)

    run = SimpleNamespace(settings=settings, ledger=BootLedger, origin=lambda: None, baselines=lambda: None,
                          family=lambda: None)
    return PerfRecorder(run, PerfCase(nodeid="t.py::test[ring-ll]", test="t.py::test", server=server, boot=boot),
                        RecorderHooks(ensure_alive=lambda: None, publish=lambda result: None, fail=fail))


def _run_with_server_view(view: dict[str, Any], name: str) -> RunResult:
    records = tuple(
        RequestRecord(ok=True, error="", prompt_tokens=300, output_tokens=4, t_send_ns=i * 10**8,
                      chunk_ns=tuple(i * 10**8 + 10**7 * (k + 1) for k in range(4)),
                      t_done_ns=i * 10**8 + 4 * 10**7, request_id=f"{name}-{i}")
        for i in range(8)
    )
    return RunResult(scenario_name=name, rounds=(RoundResult(records=records, wall_s=0.8),),
                     server_metrics=(view,))


@pytest.mark.parametrize("external", [False, True], ids=["booted", "attached"])
def test_measure_sends_prompts_seeded_from_the_test_and_on_an_attached_server_its_profile_and_boot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, external: bool) -> None:
    played: list[workload.Scenario] = []

    def fake_run_scenario(target: Target, scenario: workload.Scenario) -> RunResult:
        played.append(scenario)
        return _run_with_server_view({}, scenario.scenario_name)

    monkeypatch.setattr(runner, "run_scenario", fake_run_scenario)
    scenario = workload.SingleStream(prompt_tokens=300, output_tokens=4, requests=8, seed=5)
    _recorder(tmp_path, boot=2, external=external).measure(scenario)
    # A booted server is a fresh process a boot (its prefix cache empty): every boot and profile
    # sends the test's prompts. An attached one keeps its cache: the profile and boot join the seed.
    expected = prompt_seed("t.py::test", "ring-ll", 2, 5) if external else prompt_seed("t.py::test", "", 0, 5)
    assert played[0].seed == expected
    assert played[0].scenario_name == scenario.scenario_name  # baselines keep their key


def test_unexpected_prefix_hits_are_a_warning_of_the_test(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    repeated = _view("after_8_unique_completions", "after_8_repeated_completions")
    monkeypatch.setattr(runner, "run_scenario",
                        lambda target, scenario: _run_with_server_view(repeated, scenario.scenario_name))
    recorder = _recorder(tmp_path)
    run = recorder.measure(workload.SingleStream(prompt_tokens=300, output_tokens=4, requests=8))
    result = recorder.check(run, ["ttft_ms"])
    assert any("prefix cache served 2048 prompt tokens" in w for w in warning_lines(result))
    assert result.run is not None and result.run.server_metrics[0]["prefix_cache_hits"] == 2048


# --------------------------------------------------------------------------- prefix-cache figures


def test_recorded_metrics_give_prefix_cache_tokens_and_the_block_size() -> None:
    snap = snapshot_from_text(_recorded("after_8_repeated_completions"), model="tiny-llama")
    assert snap.prefix_cache_queries == 4800  # 16 requests of 300 prompt tokens
    assert snap.prefix_cache_hits == 2048
    assert snap.block_tokens == 128  # the CPU engine's block, not the GPU default of 16


def test_unique_completions_prompts_hit_nothing_and_are_not_flagged() -> None:
    view = _view("start", "after_8_unique_completions")
    assert (view["prefix_cache_queries"], view["prefix_cache_hits"], view["prefix_cache_hit_rate"]) == (2400, 0, 0)
    assert unexpected_prefix_hits([view], endpoint="completions") is None


def test_prompts_sent_again_hit_whole_blocks_and_are_flagged() -> None:
    view = _view("after_8_unique_completions", "after_8_repeated_completions")
    # 300 tokens: the last is always recomputed, so 2 whole 128-token blocks of each of the 8 hit.
    assert view["prefix_cache_hits"] == 8 * 2 * 128
    assert view["prefix_cache_hit_rate"] == pytest.approx(2048 / 2400)
    reuse = unexpected_prefix_hits([view], endpoint="completions")
    assert reuse == PrefixReuse(hit_tokens=2048.0, queried_tokens=2400.0)
    assert "2048 prompt tokens of this run (85.3% of 2400 queried)" in note_text(PrefixCacheReused(2048.0, 2400.0))


def test_chat_endpoint_hits_are_reported_but_never_flagged() -> None:
    view = _view("after_8_repeated_completions", "after_8_unique_chat")
    assert view["prefix_cache_queries"] == 2400 and view["prefix_cache_hits"] == 0
    flooded = {**view, "prefix_cache_hits": 1024.0}  # a long chat template, once per request
    assert unexpected_prefix_hits([flooded], endpoint="chat") is None


def test_a_run_that_resent_its_own_prompts_is_not_flagged_again() -> None:
    view = _view("after_8_unique_completions", "after_8_repeated_completions")
    assert unexpected_prefix_hits([view], endpoint="completions", reused_requests=8) is None


@pytest.mark.parametrize(("hits", "block", "flagged"), [
    (DEFAULT_BLOCK_TOKENS - 1, None, False),
    (DEFAULT_BLOCK_TOKENS, None, True),
    (127, 128, False),
    (128, 128, True),
])
def test_hits_under_one_block_are_tolerated_and_one_block_is_not(hits: int, block: int | None,
                                                                   flagged: bool) -> None:
    view = {"prefix_cache_queries": 4096.0, "prefix_cache_hits": float(hits), "kv_block_tokens": block}
    assert (unexpected_prefix_hits([view], endpoint="completions") is not None) is flagged


def test_hits_add_up_over_a_run_and_its_extensions() -> None:
    half = {"prefix_cache_queries": 1000.0, "prefix_cache_hits": 64.0, "kv_block_tokens": 128}
    assert unexpected_prefix_hits([half], endpoint="completions") is None
    assert unexpected_prefix_hits([half, half], endpoint="completions") is not None


def test_a_server_without_prefix_cache_counters_is_not_flagged() -> None:
    before = snapshot_from_text("vllm:generation_tokens_total 1\n")
    view = ServerView.between(before, before).to_json()
    assert view["prefix_cache_hits"] is None and view["prefix_cache_hit_rate"] is None
    assert unexpected_prefix_hits([view], endpoint="completions") is None
    assert unexpected_prefix_hits([], endpoint="completions") is None


def test_the_older_gpu_prefix_cache_names_are_read_when_the_new_ones_are_absent() -> None:
    text = ('vllm:gpu_prefix_cache_queries_total{model_name="m"} 300\n'
            'vllm:gpu_prefix_cache_hits_total{model_name="m"} 32\n')
    snap = snapshot_from_text(text, model="m")
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (300, 32)


def test_prefix_cache_figures_reach_the_run_json() -> None:
    view = _view("after_8_unique_completions", "after_8_repeated_completions")
    data = _run_with_server_view(view, "single-stream-300in-4out").to_json()
    server = data["server_metrics"][0]
    assert (server["prefix_cache_queries"], server["prefix_cache_hits"], server["kv_block_tokens"]) == (2400, 2048, 128)
    json.dumps(data)  # reports write it as is


# --------------------------------------------------------------------------- against the stub


def _prompt_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def stub_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A stub server that logs every prompt it is sent; yields its URL and the log."""
    log = tmp_path / "prompts.jsonl"
    port = pick_free_port("127.0.0.1")
    proc = subprocess.Popen(
        [sys.executable, str(STUB_SERVER), "--model", "stub-model", "--port", str(port), "--load-seconds", "0",
         "--tok-per-s", "2000", "--ttft-ms", "1", "--prompt-log", str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the stub did not start"
            time.sleep(0.05)
        yield base_url, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_warm_up_and_rounds_never_repeat_a_prompt(stub_server: tuple[str, Path]) -> None:
    base_url, log = stub_server
    scenario = workload.Concurrency(concurrency=2, prompt_tokens=16, output_tokens=4, requests=4, rounds=4,
                                     warmup_requests=3, seed=prompt_seed("t.py::test", "default", 1))
    run = runner.run_scenario(Target(base_url, "stub-model", server_metrics=False), scenario)
    prompts = [entry["prompt"] for entry in _prompt_log(log)]
    assert len(run.rounds) == 4
    assert len(prompts) == 3 + 4 * 4  # warm-up and rounds
    assert len(set(prompts)) == len(prompts)


def test_two_seeds_share_no_prompt(stub_server: tuple[str, Path]) -> None:
    base_url, log = stub_server
    for test in ("a.py::test", "b.py::test"):
        seed = prompt_seed(test, "default", 1)
        runner.run_scenario(Target(base_url, "stub-model", server_metrics=False), workload.SingleStream(
            prompt_tokens=16, output_tokens=4, requests=3, warmup_requests=1, seed=seed))
    prompts = [entry["prompt"] for entry in _prompt_log(log)]
    assert len(prompts) == 8 and len(set(prompts)) == 8


def _assert_passed(result: pytest.RunResult, passed: int) -> None:
    # Not assert_outcomes: only what ran must pass (boots on demand nobody asked for never run).
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == passed and not outcomes.get("failed") and not outcomes.get("errors")


@pytest.mark.usefixtures("isolated_state")
def test_the_decode_test_sends_the_same_prompts_alone_and_after_other_tests_and_no_prompt_is_sent_twice(
    pytester: pytest.Pytester, stub_project: Any, tmp_path: Path,
) -> None:
    log = tmp_path / "prompts.jsonl"
    boots = tmp_path / "boots.txt"
    # The prompts are the subject, not the figures: the stub streams at 1000 tok/s (as in
    # test_perf_suite), which spends ~15 s where its default 100 tok/s spent ~2 minutes asleep.
    stub_project(stub_deployment_toml(boot_count=boots, extra_args=("--prompt-log", str(log), "--tok-per-s", "1000")))
    shutil.copytree(PERF_TESTS, pytester.path / "perf_tests")
    common = ("--deployment", "stub", "-p", "no:randomly")

    alone = pytester.runpytest_subprocess("perf_tests", "-k", "decode", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                          *common, timeout=300)
    _assert_passed(alone, 2)
    proto_of = {int(line.split()[0]): line.split()[1] for line in boots.read_text().splitlines()}
    alone_log = _prompt_log(log)
    by_profile = {proto: [e["prompt"] for e in alone_log if proto_of[e["pid"]] == proto] for proto in ("-", "LL")}
    log.unlink()

    # Every other shipped test first, the decode test last.
    suite = pytester.runpytest_subprocess("perf_tests/test_throughput.py", "perf_tests/test_latency.py",
                                          "perf_tests/test_decode.py", *common, timeout=600)
    _assert_passed(suite, 5)
    suite_log = _prompt_log(log)
    is_decode = [e["request_id"].startswith("single-stream-128in-128out-") for e in suite_log]
    assert is_decode.index(True) > 0 and all(is_decode[is_decode.index(True):])
    in_suite = [e["prompt"] for e, decode in zip(suite_log, is_decode) if decode]

    assert in_suite == by_profile["-"] and len(in_suite) == 3 + 20
    # Each profile's boot is a server of its own: both send the same prompts (a paired comparison),
    # and no server is ever sent a prompt twice.
    assert by_profile["LL"] == by_profile["-"]
    for pid in {e["pid"] for e in alone_log} | {e["pid"] for e in suite_log}:
        sent = [e["prompt"] for e in (*alone_log, *suite_log) if e["pid"] == pid]
        assert len(set(sent)) == len(sent)
