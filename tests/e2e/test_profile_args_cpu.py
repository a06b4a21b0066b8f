"""A profile of server arguments on the real CPU engine: the positive control `make perf` lacks.

``--enforce-eager`` turns off vLLM's torch.compile (Inductor) on the CPU engine, which changes
how fast a token is decoded: unlike an NCCL variable on the CPU (gloo), it is a real difference
between two servers. Two boots each, interleaved A B B A, judged by the same statistics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.e2e.test_e2e_cpu import no_servers_before_and_after  # noqa: F401 - a fixture

EAGER_PROJECT = """
[tool.kimiperf.profiles.eager]
description = "no torch.compile: vLLM runs the model eagerly"
args = ["--enforce-eager"]
"""

EAGER_TESTS = """
import psutil
from pytest_kimiperf.measure.scenarios import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=12, warmup_requests=2)

def test_the_server_runs_the_profiles_arguments(kimiperf_server, kimiperf_profile):
    argv = psutil.Process(kimiperf_server.pid).cmdline()
    assert ("--enforce-eager" in argv) == (kimiperf_profile.name == "eager"), argv
    assert argv.count("--max-model-len") == 1, argv

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"])
"""


def test_an_enforce_eager_profile_against_default_two_boots_each_interleaved_is_judged(
    pytester: pytest.Pytester, no_servers_before_and_after: None, tmp_path: Path  # noqa: F811
) -> None:
    pytester.makefile(".toml", pyproject=EAGER_PROJECT)
    pytester.makepyfile(test_eager=EAGER_TESTS)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        "--deployment", "tiny-cpu", "--kimiperf-profile", "default,eager", "--kimiperf-boots", "2",
        "--kimiperf-json", str(report), "-p", "no:randomly", timeout=1200,
    )
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines([
        "kimiperf: profile eager: args --enforce-eager (checked against vLLM *'s serve parser)"])
    starts = [line.split("for profile ")[1].split()[0] for line in result.outlines
              if "starting tiny-cpu server for profile" in line]
    assert starts == ["default", "eager", "eager", "default"], starts
    data = json.loads(report.read_text())
    assert data["profiles"]["eager"]["profile_args"] == ["--enforce-eager"]
    assert data["profiles"]["default"]["profile_args"] == []
    # The argument reached vLLM and changed what it did: every default boot has a compile phase
    # (torch.compile on the CPU, from its cache or not), no eager boot has one.
    compiles = {name: ["compiling" in [ph["phase"] for ph in a["phases"]] for a in p["boot_accounts"]]
                for name, p in data["profiles"].items()}
    assert compiles == {"default": [True, True], "eager": [False, False]}, compiles
    decode = [t for t in data["tests"] if t["test"].endswith("test_single_stream_decode")]
    assert sorted((t["profile"], t["profile_args"]) for t in decode) == [
        ("default", []), ("default", []), ("eager", ["--enforce-eager"]), ("eager", ["--enforce-eager"])]
    compared = [c for c in data["profile_comparisons"] if c["unit"] == "tok/s"]
    assert len(compared) == 1, compared
    comparison = compared[0]
    assert (comparison["boots_current"], comparison["boots_reference"]) == (2, 2)
    # What the gate concluded, printed for CI's log. Measured on a quiet host, 3 boots each
    # (closing note of issue 24): eager decodes 883-911 tok/s per boot against default's
    # 1094-1195, -22.8% (90% CI -35.1..-8.2%), "changed, size unresolved": beyond the 18% boot
    # spread tiny-cpu declares but inside its 25% tolerance, so two boots a side cannot convict
    # it. What they must never do is call the slower engine better, or give no verdict at all.
    change = comparison["change"]
    print(f"enforce-eager vs default: decode change {change:+.1%}, verdict {comparison['verdict']!r}: "
          f"{comparison['message']}")
    assert math.isfinite(change), comparison["message"]
    assert comparison["verdict"] not in ("improvement", "not comparable", "insufficient samples", "not judged"), \
        comparison["message"]
