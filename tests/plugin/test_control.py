"""--kimiperf-control through pytest: the recorded build boots beside the candidate, and a regression against it fails."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers import STUB_SERVER, counted_boots, percent_after, stub_deployment_toml
from tests.plugin.test_plugin import MARKED


def _control(tok_per_s: float) -> str:
    command = [sys.executable, str(STUB_SERVER), "--model", "{served_model_name}", "--host", "{host}", "--port",
               "{port}", "--load-seconds", "0.4", "--tok-per-s", str(tok_per_s)]
    return f"control_command = {json.dumps(command)}\n"


def test_a_passing_run_with_a_control_appends_the_candidates_boots_alone(
        pytester: pytest.Pytester, stub_project, monkeypatch: pytest.MonkeyPatch) -> None:
    stub_project(stub_deployment_toml(extra_args=("--tok-per-s", "50")) + _control(50.0))
    pytester.makepyfile(test_marked=MARKED.replace("{TOLERANCES}", '{"decode_tok_s": 0.25, "ttft_ms": 0.9}'))
    args = ("--deployment", "stub", "-p", "no:cacheprovider")
    pytester.runpytest_subprocess(*args, "--update-baselines", timeout=120).assert_outcomes(passed=1)
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    result = pytester.runpytest_subprocess(*args, "--kimiperf-control", "--kimiperf-boots", "2",
                                           "--kimiperf-append-on-pass", "main", timeout=180)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*baselines appended (a passing run, --kimiperf-append-on-pass): *(2 entries)*"])
    [path] = (pytester.path / "baselines" / "stub").glob("*.json")
    entries = json.loads(path.read_text())["entries"]
    assert sorted(entries) == ["test_marked.py::test_decode|default|decode_tok_s",
                               "test_marked.py::test_decode|default|ttft_ms"]
    assert len(entries["test_marked.py::test_decode|default|decode_tok_s"]["boots"]) == 3  # 1 recorded + 2 appended


@pytest.mark.parametrize("control_tok_per_s, fails", [(250.0, True), (50.0, False)])
def test_a_candidate_slower_than_its_control_fails_the_run_and_one_as_fast_passes(
        pytester: pytest.Pytester, stub_project, control_tok_per_s: float, fails: bool) -> None:
    stub_project(stub_deployment_toml(extra_args=("--tok-per-s", "50")) + _control(control_tok_per_s))
    pytester.makepyfile(test_marked=MARKED.replace("{TOLERANCES}", '{"decode_tok_s": 0.25, "ttft_ms": 0.9}'))
    out = pytester.path / "perf.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-control", "--kimiperf-boots", "2",
                                           "--kimiperf-json", str(out), "-p", "no:cacheprovider", timeout=180)
    # Both sides boot twice, interleaved; each test passes on its own (the control has no history).
    result.assert_outcomes(passed=4)
    report = json.loads(out.read_text())
    assert report["control"] is True and report["reference_profile"] == "default@control"
    [decode] = [r for r in report["profile_comparisons"] if r["metric"] == "decode"]
    # Each side booted twice; the comparison rests on the boots whose runs measured enough decode
    # figures, as the report counts them (a loaded host's stalls can leave a boot short).
    assert decode["profile"] == "default"
    assert (decode["boots_current"], decode["boots_reference"]) == (counted_boots(report, "default"),
                                                                    counted_boots(report, "default@control"))
    result.stdout.fnmatch_lines(["*fails on a regression, decode below the floor, a regression against the control "
                                 "(default@control, the recorded build)*",
                                 "kimiperf: control command (default@control): * --tok-per-s *"])
    # The command that records a baseline drops the control: the recorded build is not recorded.
    result.stdout.fnmatch_lines(["*next: python -m pytest --basetemp=* --deployment stub --kimiperf-boots 2 "
                                 "--kimiperf-json * -p no:cacheprovider --kimiperf-update-baselines*"])
    if fails:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        said = " ".join(result.stdout.str().split())  # the outcome line wraps
        assert "default against default@control (1 REGRESSION against the recorded build: the run fails)" in said
        assert decode["verdict"] == "regression"
        result.stdout.fnmatch_lines([
            "*kimiperf: slower than the control (default@control, the recorded build, booted in this session)*",
            "FAILED test_marked.py::test_decode [[]default[]] decode tok/s: REGRESSION -*"])
        # 50 against 250 tok/s: -80% as set, on the stub's set schedule (a late wake-up delays
        # one token, never the pace).
        assert -83 <= percent_after(result.stdout.str(), "decode tok/s: REGRESSION") <= -77
    else:
        assert result.ret == pytest.ExitCode.OK, result.stdout.str()
        assert decode["verdict"] != "regression"
        assert "slower than the control" not in result.stdout.str()
    # The control's tests are judged against no history: the missing baselines are the candidate's alone.
    result.stdout.fnmatch_lines(["*no baseline for this hardware (*) for 2 metrics of 1 test, judged against no history:",
                                 "*test_decode [[]default[]]: decode, time to first token"])
