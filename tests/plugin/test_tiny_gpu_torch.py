"""tiny-gpu-torch end to end, on the CPU: its server (server/torch_engine.py) through the whole plugin.

The GPU deployment's twin, tiny-torch-cpu, runs the same server command with ``--device cpu``:
two profiles, a boot each, a single-stream and a concurrent test, the JSON and Markdown reports.
What is asserted is the plumbing (boots, the boot account read from the server's log, exact
request and token counts on both sides, the server's /metrics deltas, nothing left running),
never a speed: a verdict between two boots on this host is its noise. On a GPU host the same
flow runs on tiny-gpu-torch in ci/gpu-lent.sh.
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from tests.helpers import expect_outcomes_with_decode_lost, nvml_loads

# The host watch and the client's self-check read how busy this host is (their own tests cover
# them): off here, so a busy host slows this test and never fails it.
PROJECT = """
[tool.kimiperf.deployments.tt]
extends = "tiny-torch-cpu"
host_bounds = { max_foreign_cpu_share = "none", max_steal_share = "none" }
client_bounds = { max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }
"""

TESTS = """
import psutil
from pytest_kimiperf.measure.workload import Concurrency, SingleStream

def test_engine_core_is_a_marked_child(kimiperf_server):
    server = psutil.Process(kimiperf_server.pid)
    [core] = [p for p in server.children() if "pytest_kimiperf.server.torch_model" in p.cmdline()]
    assert core.environ()["KIMIPERF_LAUNCH_ID"] == server.environ()["KIMIPERF_LAUNCH_ID"]

def test_single_stream_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=64, output_tokens=16, requests=4, warmup_requests=1))
    perf.check(run, ["decode_tok_s"], floor=True)

def test_throughput(perf):
    run = perf.measure(Concurrency(concurrency=4, prompt_tokens=32, output_tokens=16, requests=8, rounds=3,
                                   warmup_requests=2))
    perf.check(run, ["output_throughput"])
"""


def _torch_servers(state: Path) -> set[int]:
    """The torch servers this test's run started (its launch records are in ``state``)."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        if any(part.startswith("pytest_kimiperf.server.torch_") for part in process.info["cmdline"] or []):
            try:
                if process.environ().get("KIMIPERF_STATE_DIR") == str(state):
                    found.add(process.pid)
            except psutil.Error:
                pass
    return found


def test_two_profiles_on_the_torch_server_boot_measure_and_report(pytester: pytest.Pytester, isolated_state: Path,
                                                                 tmp_path: Path) -> None:
    pytester.makepyprojecttoml(PROJECT)
    pytester.makepyfile(test_torch=TESTS)
    report, summary = tmp_path / "report.json", tmp_path / "summary.md"
    result = pytester.runpytest_subprocess(
        "--kimiperf-deployment", "tt", "--kimiperf-profile", "default,ring-ll", "--kimiperf-boots", "1",
        "--kimiperf-max-boots", "1", "--kimiperf-json", str(report), "--kimiperf-markdown", str(summary),
        "-p", "no:randomly", "-p", "no:cacheprovider", timeout=300)
    data = json.loads(report.read_text())
    # Every test passes but a decode test whose window kept no decode figure (a client held off
    # through every stream reads them in bursts): its floor fails it, by the count it reports.
    expect_outcomes_with_decode_lost(result, data, passed=6)
    result.stdout.fnmatch_lines(["kimiperf: starting tt server for profile default on *",
                                 "kimiperf: tt server (default) ready after *s",
                                 "kimiperf: starting tt server for profile ring-ll on *",
                                 "kimiperf: tt server (ring-ll) ready after *s"])
    assert {name: p["boots"] for name, p in data["profiles"].items()} == {"default": 1, "ring-ll": 1}
    for profile in data["profiles"].values():
        [account] = profile["boot_accounts"]
        # The account is read from the server's log, vLLM's lines: each phase the torch engine
        # passes through is found, and the weights' load time it states.
        assert [p["phase"] for p in account["phases"]] == [
            "process start", "resolving model", "initializing engine", "loading weights", "allocating KV cache",
            "starting API server"]
        assert account["weights_s"] is not None and account["total_s"] > 0
    runs = {(t["test"].split("::")[1], t["profile"]): t["run"] for t in data["tests"]}
    assert sorted(runs) == sorted((test, profile) for test in ("test_single_stream_decode", "test_throughput")
                                  for profile in ("default", "ring-ll"))
    for (test, _), run in runs.items():
        requests, output = (4, 16) if test == "test_single_stream_decode" else (24, 16)
        assert (run["completed"], run["total_output_tokens"]) == (requests, requests * output)
        # The server's own count of what it generated over exactly the measured requests (its
        # /metrics before and after), the client's count to the token.
        [view] = run["server_metrics"]
        assert view["generation_tokens"] == requests * output and view["ttft_count"] == requests
        assert view["itl_count"] == requests * (output - 1) and view["prefix_cache_hits"] == 0
    compared = {c["profile"] for c in data["profile_comparisons"]}
    assert compared == {"ring-ll"}
    text = summary.read_text()
    assert "### Profiles vs `default`" in text and "`ring-ll`" in text
    logs = [Path(p["boot_accounts"][0]["log_path"]) for p in data["profiles"].values()]
    assert all("INFO:     Application startup complete." in log.read_text() for log in logs)
    assert not _torch_servers(isolated_state)  # nothing of either boot is left running


@pytest.mark.skipif(nvml_loads(), reason="this host has an NVIDIA GPU")
def test_the_gpu_deployment_stops_every_perf_test_before_any_boot_on_a_host_without_a_gpu(
        pytester: pytest.Pytester, isolated_state: Path) -> None:
    pytester.makepyfile(test_torch=TESTS)
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "tiny-gpu-torch", "-p", "no:randomly",
                                           "-p", "no:cacheprovider", "-k", "decode", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*deployment 'tiny-gpu-torch' needs 1x NVIDIA GPU; found no NVIDIA GPU*"])
    assert "starting tiny-gpu-torch server" not in result.stdout.str()
