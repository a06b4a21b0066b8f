"""A run whose only failures are INVALID measurements (or UNRESOLVED changes) ends with an exit status of its own."""

from __future__ import annotations

import pytest

from pytest_kimiperf.reports.outcome import (
    INVALID_ONLY_EXIT, INVALID_OUTCOME, OUTCOME_PROPERTY, UNRESOLVED_EXIT, UNRESOLVED_OUTCOME, FailureTally,
    failure_outcome,
)

MARKED = [("median_decode_tok_s", 512.0), (OUTCOME_PROPERTY, INVALID_OUTCOME)]


def test_only_a_marked_call_phase_is_an_invalid_or_unresolved_failure() -> None:
    assert failure_outcome("call", MARKED) == INVALID_OUTCOME
    assert failure_outcome("setup", MARKED) is None  # the server did not boot: not the host's fault
    assert failure_outcome("call", [("median_decode_tok_s", 512.0)]) is None
    assert failure_outcome("call", [(OUTCOME_PROPERTY, UNRESOLVED_OUTCOME)]) == UNRESOLVED_OUTCOME


def test_unresolved_failures_exit_76_even_beside_invalid_ones_and_say_what_would_resolve_them() -> None:
    tally = FailureTally()
    tally.add("tests/test_perf.py::test_decode[default-1]", outcome=UNRESOLVED_OUTCOME)
    tally.add("tests/test_perf.py::test_ttft[default-1]", outcome=INVALID_OUTCOME)
    assert tally.exit_status(pytest.ExitCode.TESTS_FAILED) == UNRESOLVED_EXIT == 76
    assert tally.summary_line() == (
        "kimiperf: every failure was UNRESOLVED (1 test: a change beyond the tolerance that one boot of an attached "
        "server cannot convict): exit status 76; give the deployment a restart_command so the run can take more boots")
    tally.add("tests/test_perf.py::test_decode2[default-1]")  # a regression: pytest's 1
    assert tally.exit_status(pytest.ExitCode.TESTS_FAILED) == pytest.ExitCode.TESTS_FAILED


def test_invalid_failures_alone_exit_75_and_say_so() -> None:
    tally = FailureTally()
    tally.add("perf_tests/test_decode.py::test_decode[default-1]", invalid=True)
    tally.add("perf_tests/test_decode.py::test_decode[ring-ll-1]", invalid=True)
    assert tally.exit_status(pytest.ExitCode.TESTS_FAILED) == INVALID_ONLY_EXIT == 75
    assert tally.summary_line() == (
        "kimiperf: every failure was an INVALID measurement (2 tests: a busy host or a client-bound load, nothing "
        "learned about the build): exit status 75 (EX_TEMPFAIL), rerun on a quiet runner")


@pytest.mark.parametrize("status", [pytest.ExitCode.OK, pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR])
def test_a_status_other_than_tests_failed_is_left_alone(status: int) -> None:
    tally = FailureTally()
    tally.add("t", invalid=True)
    assert tally.exit_status(status) == status


def test_any_other_failure_keeps_pytests_1() -> None:
    tally = FailureTally()
    tally.add("perf_tests/test_decode.py::test_decode[default-1]", invalid=True)
    tally.add("perf_tests/test_decode.py::test_decode[ring-ll-1]", invalid=False)  # a regression
    assert tally.exit_status(pytest.ExitCode.TESTS_FAILED) == pytest.ExitCode.TESTS_FAILED
    assert FailureTally().exit_status(pytest.ExitCode.TESTS_FAILED) == pytest.ExitCode.TESTS_FAILED
