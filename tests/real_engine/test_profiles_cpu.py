"""Profiles on the real CPU engine under xdist: each boots once, sees its own environment and
arguments, serves exactly the requests and tokens asked for, and the export says so.

Three boots of tiny-cpu (default, ring-ll, eager). What the profiles' figures say of each other
is statistics and is measured in benchmarks/real_engine_verdicts.py, not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT
from tests.helpers import expect_outcomes_with_decode_lost, measured_count
from tests.real_engine.conftest import plumbing_deployment

PROFILES_PROJECT = plumbing_deployment() + """
[tool.kimiperf.profiles.eager]
description = "no torch.compile: vLLM runs the model eagerly"
args = ["--enforce-eager"]
"""

PROFILES = """
import psutil
from pytest_kimiperf.measure.runner import run_scenario
from pytest_kimiperf.measure.workload import SingleStream
from pytest_kimiperf.measure.target import Target

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=32, requests=8, warmup_requests=1)

def test_server_env_args_and_exact_lengths(kimiperf_server, kimiperf_profile):
    server = psutil.Process(kimiperf_server.pid)
    names = [p.name() for p in server.children(recursive=True)]
    assert "VLLM::EngineCore" in names, names
    # The API server's environment as the kernel holds it. (EngineCore and workers inherit
    # it, but their /proc/PID/environ reads empty: vLLM's setproctitle reuses that memory.)
    env = server.environ()
    for name, value in kimiperf_profile.env.items():
        assert env.get(name) == value, name
    if kimiperf_profile.name != "ring-ll":
        assert "NCCL_PROTO" not in env and "NCCL_ALGO" not in env
    argv = server.cmdline()
    assert ("--enforce-eager" in argv) == (kimiperf_profile.name == "eager"), argv
    assert argv.count("--max-model-len") == 1, argv
    run = run_scenario(Target(kimiperf_server.base_url, kimiperf_server.model), SCENARIO)
    assert len(run.valid_records) == 8, run.invalid_reasons
    assert {(r.prompt_tokens, r.output_tokens) for r in run.records} == {(64, 32)}

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"], floor=True)
"""


def test_profiles_under_xdist_boot_once_each_see_their_env_and_args_and_serve_what_was_asked(
    pytester: pytest.Pytester, no_servers_before_and_after: None, tmp_path: Path
) -> None:
    pytester.makefile(".toml", pyproject=PROFILES_PROJECT)
    pytester.makepyfile(test_e2e=PROFILES)
    report, export = tmp_path / "report.json", tmp_path / "export"
    # Under xdist (-n 2): the plugin's scheduler gives every perf test of a boot to one worker;
    # the JSON report, written by the controller, says what the workers did. On the CPU engine
    # NCCL variables cannot act (gloo); --enforce-eager turns off vLLM's torch.compile, which
    # shows in the boot's phases.
    result = pytester.runpytest_subprocess(
        "-n", "2", "--deployment", "tiny", "--nccl-profile", "default,ring-ll,eager", "--kimiperf-boots", "1",
        "--kimiperf-max-boots", "1",  # one boot a profile: no boot on demand for an undecided comparison
        "--kimiperf-json", str(report), "--kimiperf-export", str(export), "-p", "no:randomly", timeout=1200,
    )
    # Which requests keep a decode figure is this host's scheduling: a client the scheduler held
    # off (a normal-priority client on 2 shared cores) reads chunks at once, under one kernel
    # stamp, and a stream whose first chunk shared its read or that came in bursts gives no decode
    # figure (measure/coverage.py). These plumbing runs switch that self-check off, so the run
    # keeps what it measured and reports the count: every count below is the one it reports.
    data = json.loads(report.read_text())
    decode = [t for t in data["tests"] if t["test"].endswith("test_single_stream_decode")]
    decode_measured = {t["profile"]: measured_count(t["run"], "decode_tok_s") for t in decode}
    assert sorted(decode_measured) == ["default", "eager", "ring-ll"], decode_measured
    # A verdict of one boot against another may be anything on this host's noise; this run
    # has no baseline, so every test passes unless the plumbing broke, but for a decode test none
    # of whose requests gave a decode figure: it has none and fails saying so (a fresh clone's run here
    # once lost all 8 of one boot's).
    expect_outcomes_with_decode_lost(result, data, passed=6)
    result.stdout.fnmatch_lines([
        "kimiperf: profile eager: args --enforce-eager (checked against vLLM *'s serve parser)"])
    # The weight cache cannot serve a CPU engine: no daemons, and the engine loads from disk.
    result.stdout.fnmatch_lines(["*weight cache: off (CPU engine: *UnsupportedPlatformForIPCError*; loading from disk)"])
    assert not any("ipc_cache" in log.read_text() for log in pytester.path.glob("runpytest-0/**/server-tiny-*.log"))
    assert {name: p["boots"] for name, p in data["profiles"].items()} == {"default": 1, "ring-ll": 1, "eager": 1}
    starts = [line.split("for profile ")[1].split()[0] for line in result.outlines
              if "starting tiny server for profile" in line]
    assert starts == ["default", "ring-ll", "eager"], starts
    assert data["profiles"]["eager"]["profile_args"] == ["--enforce-eager"]
    assert data["profiles"]["default"]["profile_args"] == data["profiles"]["ring-ll"]["profile_args"] == []
    # The argument reached vLLM and changed what it did: a compiled boot has a compile phase
    # (torch.compile on the CPU, from its cache or not), an eager boot has none.
    compiles = {name: ["compiling" in [ph["phase"] for ph in a["phases"]] for a in p["boot_accounts"]]
                for name, p in data["profiles"].items()}
    assert compiles == {"default": [True], "ring-ll": [True], "eager": [False]}, compiles
    assert sorted((t["profile"], t["profile_args"]) for t in decode) == [
        ("default", []), ("eager", ["--enforce-eager"]), ("ring-ll", [])]
    for test in decode:
        summary = test["metrics"]["decode_tok_s"]["summary"]
        assert summary["n"] == decode_measured[test["profile"]] and summary["n"] + summary["n_failed"] <= 8, \
            (summary, decode_measured)
        assert summary["n"] == 0 or summary["median"] > 0
    compared = {c["profile"]: c for c in data["profile_comparisons"]
                if c["unit"] == "tok/s" and c["test"].endswith("test_single_stream_decode")}
    assert set(compared) == {"ring-ll", "eager"}, compared
    # A side counts its boot where that boot's decode figure stands: MIN_SAMPLES_PER_BOOT requests
    # measured (an eager boot here once kept 2 of 8, the rest read at once).
    for profile, c in compared.items():
        assert (c["boots_current"], c["boots_reference"]) == (
            int(decode_measured[profile] >= MIN_SAMPLES_PER_BOOT),
            int(decode_measured["default"] >= MIN_SAMPLES_PER_BOOT)), (c, decode_measured)
    # The export: one bench-serve file per test and profile, counting what the real server
    # streamed (8 requests of 32 tokens each, the warm-up not among them), and every request's
    # timeline in requests.jsonl.
    for profile in ("default", "ring-ll", "eager"):
        [path] = export.glob(f"*single_stream_decode*--{profile}--boot1.json")
        bench = json.loads(path.read_text())
        assert (bench["completed"], bench["total_output_tokens"], bench["total_input_tokens"]) == (8, 8 * 32, 8 * 64), bench
    lines = [json.loads(line) for line in (export / "requests.jsonl").read_text().splitlines()]
    decode_lines = [line for line in lines if line["test"].endswith("test_single_stream_decode")]
    assert sorted(line["profile"] for line in decode_lines) == sorted(["default", "ring-ll", "eager"] * 8)
    assert {(line["status"], line["prompt_tokens"], line["output_tokens"]) for line in decode_lines} == {("ok", 64, 32)}
    # The worker's boot progress reached the controller's output, and the summary put the
    # profiles side by side.
    result.stdout.fnmatch_lines([
        "[[]gw?[]] kimiperf [[]default[]] loading weights*elapsed",
        "[[]gw?[]] kimiperf: tiny server (default) ready after *s",
        "[[]gw?[]] kimiperf: tiny server (ring-ll) ready after *s",
    ])
    result.stdout.fnmatch_lines(["*kimiperf: profiles vs default*", "*decode_tok_s*ring-ll*(90%)*",
                                 "*decode_tok_s*eager*(90%)*"])
    # The test's name heads its rows: on their line, or on the line above them where the
    # intervals this host measured make a row too wide for the terminal.
    table = result.stdout.str().split("kimiperf: profiles vs default", 1)[1]
    assert "single_stream_decode" in table.split("decode_tok_s", 1)[0], table[:600]
