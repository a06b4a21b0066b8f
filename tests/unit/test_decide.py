"""Every reason a run fails, and its exit status, is decided in judge/gate.py.

A test's outcome comes from its final failures; the run's exit status from pytest's, the failed
tests' outcomes, the control comparisons and the errors of the files. INVALID-only runs exit 75,
UNRESOLVED ones 76, and nothing else is ever turned into a pass.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_kimiperf.judge.gate import (
    EXIT_OK, EXIT_TESTS_FAILED, INVALID_ONLY_EXIT, OUTCOME_PROPERTY, UNRESOLVED_EXIT, FailedTests, PerfOutcome, RunEnd,
    CAUSE_PROPERTY, decide_run, decide_test, failed_outcome, invalid_cause, outcome_of,
)
from pytest_kimiperf.judge.notes import InvalidRun, ChangeSoFar, SavedLine, Unresolved
from pytest_kimiperf.judge.profiles import ProfileComparison
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, MetricResult, MissingBaselines, TestResult
from pytest_kimiperf.measure.invalid_causes import InvalidCause, advice
from pytest_kimiperf.reports.answers import run_verdict
from pytest_kimiperf.reports.sentences import note_text
from pytest_kimiperf.reports.terminal import end_line

MARKED = [("median_decode_tok_s", 512.0), (OUTCOME_PROPERTY, "invalid")]


def _result(*failures: Any, invalid: str | None = None, missing: bool = False) -> TestResult:
    res = TestResult(test="t.py::test_decode", nodeid="t.py::test_decode[default-1]", profile="default",
                     deployment="tiny-cpu", scenario="single-stream", failures=list(failures), invalid=invalid)
    state = BaselineState.MISSING if missing else BaselineState.JUDGED
    res.metrics["decode_tok_s"] = MetricResult("decode_tok_s", "tok/s", "higher_is_better", 0.05, [100.0],
                                               baseline_line=BaselineLine(state, "decode tok/s"))
    return res


def _failed(*outcomes: PerfOutcome) -> FailedTests:
    failed = FailedTests()
    for i, outcome in enumerate(outcomes):
        failed.add(f"t.py::test_{i}[default-1]", outcome)
    return failed


def _against_control(verdict: VerdictKind) -> ProfileComparison:
    return ProfileComparison("t.py::test_decode", "decode_tok_s", "ring-ll", "ring-ll-control",
                             SimpleNamespace(verdict=verdict))  # type: ignore[arg-type]


UNRESOLVED = Unresolved((ChangeSoFar("decode tok/s", -0.2, 1, 0.05),), "attached", 2)


def test_only_a_marked_call_phase_is_an_invalid_or_unresolved_failure() -> None:
    assert failed_outcome("call", MARKED) is PerfOutcome.INVALID
    assert failed_outcome("setup", MARKED) is PerfOutcome.FAILED  # the server did not boot: not the host's fault
    assert failed_outcome("call", [("median_decode_tok_s", 512.0)]) is PerfOutcome.FAILED
    assert failed_outcome("call", [(OUTCOME_PROPERTY, "unresolved")]) is PerfOutcome.UNRESOLVED


def test_a_tests_outcome_is_read_from_its_final_failures() -> None:
    assert outcome_of(_result()) is PerfOutcome.PASSED
    assert outcome_of(_result(InvalidRun("host busy"), invalid="host busy")) is PerfOutcome.INVALID
    assert outcome_of(_result(UNRESOLVED)) is PerfOutcome.UNRESOLVED
    # An UNRESOLVED change beside any other failure (a regression of another metric) is a failure:
    # the run must exit 1, not 76, which invites a rerun.
    assert outcome_of(_result(UNRESOLVED, SavedLine("REGRESSION"))) is PerfOutcome.FAILED


def test_a_missing_baseline_fails_the_test_only_where_the_run_says_so() -> None:
    warned = _result(missing=True)
    assert decide_test(warned, missing_baseline_fails=False) is PerfOutcome.PASSED and not warned.failures
    failed = _result(missing=True)
    assert decide_test(failed, missing_baseline_fails=True) is PerfOutcome.FAILED
    assert [type(f) for f in failed.failures] == [MissingBaselines]
    assert decide_test(_result(), missing_baseline_fails=True) is PerfOutcome.PASSED  # its baseline is there
    # An INVALID run measured the host, not the build: it stays INVALID (exit 75), with no second reason.
    busy = _result(InvalidRun("host busy"), invalid="host busy", missing=True)
    assert decide_test(busy, missing_baseline_fails=True) is PerfOutcome.INVALID and len(busy.failures) == 1


def test_unresolved_failures_exit_76_even_beside_invalid_ones_and_say_what_would_resolve_them() -> None:
    decision = decide_run(EXIT_TESTS_FAILED, _failed(PerfOutcome.UNRESOLVED, PerfOutcome.INVALID))
    assert decision.exit_status == UNRESOLVED_EXIT == 76 and decision.end is RunEnd.ONLY_UNRESOLVED
    assert end_line(decision) == (
        "kimiperf: every failure was UNRESOLVED (1 test: a change beyond the tolerance that one boot of an attached "
        "server cannot convict): exit status 76; give the deployment a restart_command so the run can take more boots")
    assert decide_run(EXIT_TESTS_FAILED, _failed(PerfOutcome.UNRESOLVED, PerfOutcome.FAILED)).exit_status == EXIT_TESTS_FAILED


def test_invalid_failures_alone_exit_75_and_say_so() -> None:
    decision = decide_run(EXIT_TESTS_FAILED, _failed(PerfOutcome.INVALID, PerfOutcome.INVALID))
    assert decision.exit_status == INVALID_ONLY_EXIT == 75
    assert end_line(decision) == (
        "kimiperf: every failure was an INVALID measurement (2 tests, nothing learned about the build): exit status "
        "75 (EX_TEMPFAIL); its line above says why")


@pytest.mark.parametrize("cause", list(InvalidCause))
def test_every_invalid_cause_has_its_own_advice_in_every_place_that_advises(cause: InvalidCause) -> None:
    others = {advice(c) for c in InvalidCause if c is not cause}
    assert advice(cause) not in others  # no two causes share their advice
    failed = FailedTests()
    failed.add("t.py::test_0[default-1]", PerfOutcome.INVALID, invalid_cause("call", [(CAUSE_PROPERTY, cause.value)]))
    decision = decide_run(EXIT_TESTS_FAILED, failed)
    assert decision.invalid_causes == (cause.value,)
    assert end_line(decision) == (
        "kimiperf: every failure was an INVALID measurement (1 test, nothing learned about the build): exit status "
        f"75 (EX_TEMPFAIL); {advice(cause)}")
    assert note_text(InvalidRun("the reason", cause.value)) == f"INVALID measurement: the reason ({advice(cause)})"
    result = _result(InvalidRun("the reason", cause.value), invalid="the reason")
    result.invalid_cause = cause.value
    report = SimpleNamespace(results=[result], control_regressions=lambda: [])
    assert run_verdict(report) == f"FAILED (1 INVALID ({advice(cause)}))"  # type: ignore[arg-type]
    assert not any("quiet" in advice(c) for c in (InvalidCause.CPU_QUOTA,))


@pytest.mark.parametrize("status", [pytest.ExitCode.OK, pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR])
def test_a_status_other_than_tests_failed_is_left_alone(status: int) -> None:
    decision = decide_run(status, _failed(PerfOutcome.INVALID))
    assert decision.exit_status == status and decision.end is RunEnd.PYTEST and end_line(decision) is None


def test_a_regression_against_the_control_or_an_unwritten_file_fails_a_run_whose_tests_passed() -> None:
    comparisons = [_against_control(VerdictKind.REGRESSION), _against_control(VerdictKind.WITHIN_TOLERANCE)]
    decision = decide_run(EXIT_OK, _failed(), comparisons=comparisons, control=True)
    assert (decision.exit_status, decision.end, decision.passed) == (EXIT_TESTS_FAILED, RunEnd.CONTROL_REGRESSION, False)
    assert decision.control_regressions == (comparisons[0],)
    # Without --kimiperf-control the same comparison is one profile against another: no verdict on the build.
    assert decide_run(EXIT_OK, _failed(), comparisons=comparisons, control=False).passed
    errors = decide_run(EXIT_OK, _failed(), errors=["cannot write report.json"])
    assert (errors.exit_status, errors.end, errors.errors) == (EXIT_TESTS_FAILED, RunEnd.OUTPUT_ERROR,
                                                               ("cannot write report.json",))
    # An INVALID-only run that also failed to write its report is no run to retry for the host's sake alone.
    assert decide_run(EXIT_TESTS_FAILED, _failed(PerfOutcome.INVALID), errors=["x"]).exit_status == EXIT_TESTS_FAILED


OUTCOMES = st.lists(st.sampled_from([PerfOutcome.FAILED, PerfOutcome.INVALID, PerfOutcome.UNRESOLVED]), max_size=6)
STATUSES = st.sampled_from([EXIT_OK, EXIT_TESTS_FAILED, 2, 3, 4, 5])


@given(status=STATUSES, outcomes=OUTCOMES, regressions=st.booleans(), errors=st.booleans())
def test_the_run_passes_only_where_pytest_passed_and_nothing_of_the_plugins_failed(
        status: int, outcomes: list[PerfOutcome], regressions: bool, errors: bool) -> None:
    comparisons = [_against_control(VerdictKind.REGRESSION)] if regressions else []
    decision = decide_run(status, _failed(*outcomes), comparisons=comparisons, control=True,
                          errors=["x"] if errors else [])
    assert decision.passed == (status == EXIT_OK and not regressions and not errors)
    if decision.exit_status in (INVALID_ONLY_EXIT, UNRESOLVED_EXIT):
        # Its own status only stands in for pytest's 1, and only when no failure was a finding.
        assert status == EXIT_TESTS_FAILED and PerfOutcome.FAILED not in outcomes and not regressions and not errors
        assert (decision.exit_status == UNRESOLVED_EXIT) == (PerfOutcome.UNRESOLVED in outcomes)
