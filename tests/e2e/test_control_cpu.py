"""--kimiperf-control on the real CPU engine: the recorded build (here the identical server,
served by the deployment's control_command) boots beside the candidate, and an A/A gets no direction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS
from tests.e2e.test_e2e_cpu import no_servers_before_and_after  # noqa: F401 - a fixture

DECODE = """
from pytest_kimiperf.measure.scenarios import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=12, warmup_requests=2)

def test_single_stream_decode(perf):
    perf.check(perf.measure(SCENARIO), ["decode_tok_s"])
"""


def test_the_identical_server_as_its_own_control_boots_interleaved_and_gets_no_direction(
    pytester: pytest.Pytester, no_servers_before_and_after, tmp_path: Path
) -> None:
    command = list(BUILTIN_DEPLOYMENTS["tiny-cpu"].command)
    pytester.makepyprojecttoml('[tool.kimiperf.deployments.tiny-control]\nextends = "tiny-cpu"\n'
                               f"control_command = {json.dumps(command)}\n")
    pytester.makepyfile(test_e2e=DECODE)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        "--deployment", "tiny-control", "--kimiperf-control", "--kimiperf-boots", "2", "--kimiperf-json", str(report),
        "-p", "no:cacheprovider", timeout=1200)
    # An A/A: the candidate and its control are one server; no baseline, so nothing else judges.
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=4)
    starts = [line.split("for profile ")[1].split()[0] for line in result.outlines
              if "starting tiny-control server for profile" in line]
    assert starts == ["default", "default@control", "default@control", "default"], starts
    result.stdout.fnmatch_lines(["kimiperf: control command (default@control): * -m vllm.entrypoints.openai.api_server *"])
    data = json.loads(report.read_text())
    assert data["control"] is True and data["reference_profile"] == "default@control"
    [decode] = [c for c in data["profile_comparisons"] if c["unit"] == "tok/s"]
    assert decode["boots_current"] == 2 and decode["boots_reference"] == 2
    # tiny-cpu declares spawn modes: the comparison weighs them (judge/gate.compare_with_control).
    assert decode["verdict"] not in ("regression", "improvement"), decode
    assert "slower than the control" not in result.stdout.str()
