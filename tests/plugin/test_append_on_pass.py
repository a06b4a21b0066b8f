"""--kimiperf-append-on-pass through pytest: a passing run on the branch grows the history; others leave it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import stub_deployment_toml
from tests.plugin.test_plugin import MARKED

KEY = "test_marked.py::test_decode|default|decode_tok_s"


def _boots(pytester: pytest.Pytester) -> int:
    [path] = (pytester.path / "baselines" / "stub").glob("*.json")
    return len(json.loads(path.read_text())["entries"][KEY]["boots"])


def _recorded(pytester: pytest.Pytester, stub_project, *, ttft: bool = True) -> tuple[str, ...]:
    """A stub project with one recorded boot; the arguments of its runs. Without ``ttft`` the test
    checks decode alone: 5 requests leave a loaded host's client 3 TTFT figures or fewer, and then
    which entries a run records and compares is the host's, not the subject."""
    stub_project(stub_deployment_toml())
    marked = MARKED.replace("{TOLERANCES}", '{"decode_tok_s": 0.4, "ttft_ms": 0.9}')
    pytester.makepyfile(test_marked=marked if ttft else marked.replace('["decode_tok_s", "ttft_ms"]', '["decode_tok_s"]'))
    args = ("--deployment", "stub", "-p", "no:cacheprovider")
    pytester.runpytest_subprocess(*args, "--update-baselines", timeout=120).assert_outcomes(passed=1)
    return args


def test_a_passing_run_on_the_branch_appends_and_a_run_elsewhere_does_not(
        pytester: pytest.Pytester, stub_project, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _recorded(pytester, stub_project, ttft=False)
    assert _boots(pytester) == 1

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    out = pytester.path / "perf.json"
    result = pytester.runpytest_subprocess(*args, "--kimiperf-append-on-pass", "main", "--kimiperf-json", str(out),
                                           timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*baselines appended (a passing run, --kimiperf-append-on-pass): *stub*.json (1 entry)*"])
    assert _boots(pytester) == 2
    assert json.loads(out.read_text())["baselines"]["appended_on_pass"] is True
    # The recording is the anchor, the passing run its first night (judge/history.py).
    [path] = (pytester.path / "baselines" / "stub").glob("*.json")
    entry = json.loads(path.read_text())["entries"][KEY]
    assert (len(entry["anchor"]), len(entry["nights"])) == (1, 1)
    assert entry["anchor"][0] == entry["boots"][0] and entry["nights"][0]["boots"] == 1
    before = _alpha_spent(out)

    # A pull request's run (GitHub's ref is "<n>/merge"), set by the ini twin: nothing appended, and why.
    monkeypatch.setenv("GITHUB_REF_NAME", "7/merge")
    result = pytester.runpytest_subprocess(*args, "-o", "kimiperf_append_on_pass=main", "--kimiperf-json", str(out),
                                           timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*baselines: not appended to the baseline history: this run is on branch "
                                 "'7/merge', and appends only on main*"])
    assert _boots(pytester) == 2
    baselines = json.loads(out.read_text())["baselines"]
    assert (baselines["updated"], baselines["appended_on_pass"]) == (False, False)
    assert "this run is on branch '7/merge'" in baselines["not_appended"]
    # With nights, each entry is judged twice (window and drift): the run's 1% is split over twice
    # as many comparisons. Which metrics a run compares is the host's (one it left too few figures
    # of compares nothing: _judged); the share every comparison it made was given is the plugin's.
    assert _alpha_spent(out) == pytest.approx(before / 2)


def _judged(report: Path) -> list[dict]:
    """The baseline comparisons the run made: a side with too few figures of a metric makes none."""
    return [m["baseline"] for t in json.loads(report.read_text())["tests"] for m in t["metrics"].values()
            if (b := m.get("baseline") or {}).get("boots_current") and b.get("boots_reference")]


def _alpha_spent(report: Path) -> float:
    """The false-alarm share each baseline comparison of the run was given (1 - its confidence),
    over the comparisons it made: one share for all of them."""
    [spent] = {round(1 - baseline["confidence"], 12) for baseline in _judged(report)}
    return spent


def test_a_run_on_a_host_whose_canary_moved_is_reported_only_and_appends_nothing(
        pytester: pytest.Pytester, stub_project, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen in CI: a real boot 86% slower, on a host whose canary had moved since the recording,
    # was "not comparable" (reported only), the run passed, and its boot entered the history.
    args = _recorded(pytester, stub_project)
    [path] = (pytester.path / "baselines" / "stub").glob("*.json")
    data = json.loads(path.read_text())
    for entry in data["entries"].values():  # recorded on a host twice as fast in every probe
        for boot in entry["boots"]:
            canary = boot["origin"]["canary"]
            canary.update({probe: score * 2 for probe, score in canary.items() if probe != "noise"})
    path.write_text(json.dumps(data))

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REF_NAME", "main")
    out = pytester.path / "perf.json"
    result = pytester.runpytest_subprocess(*args, "--kimiperf-append-on-pass", "main", "--kimiperf-json", str(out),
                                           timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*not comparable*host differs (canary*",
                                 "*baselines: not appended to the baseline history: * of test_marked.py::test_decode "
                                 "[[]default[]] is not comparable to it (the host canary moved; *): another host or "
                                 "configuration joins the history only on purpose (--kimiperf-update-baselines)*"])
    assert _boots(pytester) == 1
    baselines = json.loads(out.read_text())["baselines"]
    assert (baselines["updated"], baselines["appended_on_pass"]) == (False, False)


def test_a_bad_branch_name_is_a_usage_error(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml())
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-append-on-pass", "main branch",
                                           timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*append-on-pass branch 'main branch' (from command line --kimiperf-append-on-pass)*"])
