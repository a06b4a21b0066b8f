"""--kimiperf-append-on-pass: which runs grow the history, which do not, and why they say."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.config.settings import RawOption
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge.history import AppendWhy, NotAppended, append_refusal
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.notes import SavedLine, note_from_json
from pytest_kimiperf.judge.stats import compare_boots
from pytest_kimiperf.judge.noise import CanaryCheck
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, EnvDiff, MetricResult, TestResult
from pytest_kimiperf.storage.git_facts import current_git_branch
from pytest_kimiperf.reports.sentences import note_text
from tests.unit.test_gate_switch import _settings

TOL = 0.03


def judged(change: float, *, boot: int = 1, test: str = "t.py::test_decode", comparable: bool = True,
           spread: float = 0.001) -> TestResult:
    """A test whose decode is ``change`` (a fraction) off a history of 5 boots, boots ``spread`` apart."""
    spec = metric_spec("decode_tok_s")
    ref = [BootSummary(median=100.0 * (1 + spread * (i - 2)), n=20, se_log=0.001, session=f"s{i}") for i in range(5)]
    cur = [BootSummary(median=100.0 * (1 + change) * (1 + spread * (i - 0.5)), n=20, se_log=0.001, session="now")
           for i in range(2)]
    mres = MetricResult("decode_tok_s", spec.unit, spec.direction.value, TOL, [100.0] * 20)
    mres.baseline = compare_boots(cur, ref, direction=Direction.HIGHER_IS_BETTER, tolerance=TOL, prior_spread=spread,
                                  comparable=comparable)
    res = TestResult(test=test, nodeid=f"{test}[default]", profile="default", deployment="d", scenario="s", boot=boot)
    res.metrics["decode_tok_s"] = mres
    return res


def test_a_passing_run_on_an_allowed_branch_within_half_the_tolerance_appends() -> None:
    assert append_refusal([judged(-0.01), judged(0.05, test="t.py::other")], passed=True, branch="main",
                          allowed=("main",)) is None


def test_a_failing_run_appends_nothing_and_says_how_many_failed() -> None:
    res = judged(0.0)
    res.failures.append(SavedLine("decode below the floor"))
    refusal = append_refusal([res, judged(0.0, test="t.py::b")], passed=False, branch="main", allowed=("main",))
    assert refusal == NotAppended(AppendWhy.FAILED, "main", ("main",), failed=1)
    assert note_text(refusal) == ("not appended to the baseline history: 1 perf test failed or was invalid, and a "
                            "failing run appends nothing")
    # pytest's own outcome counts too: a failing test that is no perf test.
    assert append_refusal([judged(0.0)], passed=False, branch="main", allowed=("main",)).failed == 0  # type: ignore[union-attr]


def test_another_branch_or_a_detached_checkout_appends_nothing() -> None:
    refusal = append_refusal([judged(0.0)], passed=True, branch="42/merge", allowed=("main", "release"))
    assert refusal is not None and refusal.why is AppendWhy.BRANCH
    assert note_text(refusal) == ("not appended to the baseline history: this run is on branch '42/merge', and appends "
                            "only on main,release")
    detached = append_refusal([judged(0.0)], passed=True, branch=None, allowed=("main",))
    assert "no branch (a detached checkout)" in note_text(detached)  # type: ignore[arg-type]


def test_a_noisy_run_whose_point_alone_is_beyond_half_the_tolerance_still_appends() -> None:
    # Boots 2% apart: a point 2% worse is within the noise, and refusing such nights would keep
    # only the fast ones (the history would drift up).
    res = judged(-0.02, spread=0.02)
    assert res.metrics["decode_tok_s"].baseline.bound_high > -0.015  # type: ignore[union-attr]
    assert append_refusal([res], passed=True, branch="main", allowed=("main",)) is None


def test_a_run_that_looked_worse_than_the_tolerance_without_a_verdict_appends_nothing() -> None:
    # One CI run's boots of a slowed server, one the harness missed: 39.6 and 776 tok/s against
    # a recording of 1093. Their own spread made the verdict inconclusive (-84%, 90% CI
    # -99.9..+3792% with the spread they measured alone; -99..+157% pooled with the declared 18%
    # at its 3 df); appended, a boot 96% slower would have entered the history.
    spec = metric_spec("decode_tok_s")
    ref = [BootSummary(median=1093.0, n=30, se_log=0.01, session="recorded")]
    cur = [BootSummary(median=m, n=30, se_log=0.01, session="now") for m in (39.57, 776.5)]
    mres = MetricResult("decode_tok_s", spec.unit, spec.direction.value, 0.25, [39.57] * 30)
    mres.baseline = compare_boots(cur, ref, direction=Direction.HIGHER_IS_BETTER, tolerance=0.25, prior_spread=0.18)
    assert mres.baseline.verdict.value == "inconclusive" and mres.baseline.ci_high > 1  # type: ignore[union-attr]
    assert mres.baseline.reference_spread_sd_log < 0.2 < mres.baseline.spread_sd_log  # type: ignore[union-attr]
    res = TestResult(test="t.py::test_decode", nodeid="t.py::test_decode[default]", profile="default",
                     deployment="d", scenario="s", boot=2)
    res.metrics["decode_tok_s"] = mres
    refusal = append_refusal([res], passed=True, branch="main", allowed=("main",))
    assert refusal is not None and refusal.why is AppendWhy.UNRESOLVED, refusal
    assert refusal.gain == pytest.approx(-0.84, abs=0.01)
    assert note_text(refusal) == (
        "not appended to the baseline history: decode tok/s of t.py::test_decode [default] looked -84.0% against "
        "it, beyond its 25% tolerance, without a verdict (inconclusive): a change this run could not rule out is "
        "not taken into the history")
    assert note_from_json(refusal.to_json()) == refusal
    # The same boots looking better append: only a change for the worse is kept out.
    mres.baseline = compare_boots(ref * 2, cur, direction=Direction.HIGHER_IS_BETTER, tolerance=0.25, prior_spread=0.18)
    assert mres.baseline.unresolved_beyond_tolerance and mres.baseline.gain > 0  # type: ignore[union-attr]
    assert append_refusal([res], passed=True, branch="main", allowed=("main",)) is None


def test_only_each_tests_last_boot_counts() -> None:
    # Boot 1 looked 2% worse, boot 2 (whose comparison rests on both) is within half the tolerance.
    assert append_refusal([judged(-0.02, boot=1), judged(-0.005, boot=2)], passed=True, branch="main",
                          allowed=("main",)) is None


@pytest.mark.parametrize("canary_moved", [True, False])
def test_a_metric_not_comparable_to_its_history_appends_nothing_whatever_its_figure(canary_moved: bool) -> None:
    # Seen in CI: a boot 86% slower, on a host whose canary had moved, was "not comparable"
    # (reported only), the run passed, and its boot entered the history. Another host or
    # configuration joins the history only on purpose.
    for change in (-0.86, 0.0):
        res = judged(change, comparable=False)
        res.metrics["decode_tok_s"].baseline_line = BaselineLine(
            BaselineState.JUDGED, "", res.metrics["decode_tok_s"].baseline,
            canary=CanaryCheck({"python_mops": -0.3, "copy_gbs": -0.4}, True) if canary_moved else None,
            env=None if canary_moved else EnvDiff({"NCCL_PROTO": "LL"}, (), {}, ()))
        refusal = append_refusal([judged(0.0, test="t.py::b"), res], passed=True, branch="main", allowed=("main",))
        assert refusal is not None and refusal.why is AppendWhy.NOT_COMPARABLE
        assert (refusal.test, refusal.metric, refusal.canary_moved) == ("t.py::test_decode", "decode_tok_s", canary_moved)
        why = "the host canary moved" if canary_moved else "the profile's environment or arguments differ"
        assert note_text(refusal) == (
            f"not appended to the baseline history: decode tok/s of t.py::test_decode [default] is not comparable to it "
            f"({why}; {'-86.0%' if change else '+0.0%'}): another host or configuration joins the history only on "
            "purpose (--kimiperf-update-baselines)")
        assert note_from_json(refusal.to_json()) == refusal


def test_the_branch_is_the_ci_systems_else_the_checkouts(tmp_path: Path) -> None:
    assert current_git_branch(tmp_path, {"GITHUB_ACTIONS": "true", "GITHUB_REF_NAME": "main"}) == "main"
    assert current_git_branch(tmp_path, {"GITHUB_ACTIONS": "true", "GITHUB_REF_NAME": "7/merge"}) == "7/merge"
    assert current_git_branch(tmp_path, {"GITLAB_CI": "true"}) is None  # a merge request pipeline
    assert current_git_branch(tmp_path, {"GITLAB_CI": "true", "CI_COMMIT_BRANCH": "main"}) == "main"
    assert current_git_branch(tmp_path, {"BUILDKITE": "true", "BUILDKITE_BRANCH": "trunk"}) == "trunk"
    assert current_git_branch(tmp_path, {}) is None  # not a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "trunk"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], check=True, timeout=30)
    assert current_git_branch(tmp_path, {}) == "trunk"
    subprocess.run([*git, "checkout", "-q", "--detach"], check=True, timeout=30)
    assert current_git_branch(tmp_path, {}) is None


def test_the_option_is_branch_names_checked_once(tmp_path: Path) -> None:
    assert _settings(tmp_path).append_on_pass == ()
    s = _settings(tmp_path, append_on_pass=RawOption("main, release/1.2", "ini option kimiperf_append_on_pass"))
    assert s.append_on_pass == ("main", "release/1.2")
    with pytest.raises(ConfigError, match=r"append-on-pass branch 'my branch' \(from command line "
                                          r"--kimiperf-append-on-pass\): use branch names of letters"):
        _settings(tmp_path, append_on_pass=RawOption("my branch", "command line --kimiperf-append-on-pass"))
    with pytest.raises(ConfigError, match=r"--kimiperf-update-baselines with append-on-pass 'main': .* give one"):
        _settings(tmp_path, append_on_pass=RawOption("main", "ini option kimiperf_append_on_pass"),
                  update_baselines=RawOption(True, "command line --update-baselines"))
