"""Every reason a perf run fails or is held back, decided here and nowhere else.

Two questions, one module, from typed facts only:

- :func:`decide_test`: how one test boot ends. The gate (judge/gate.py) has filled its result
  with every failure it found (a regression, the floor, an SLO, failed requests, drift, an
  INVALID measurement, an UNRESOLVED change); this adds the one the gate cannot know, a missing
  baseline under ``--kimiperf-missing-baseline=fail``, and names the test's :class:`Outcome`.
- :func:`decide_run`: how the run ends, with its exit status, from what pytest would exit with,
  each failed test's outcome, the profile comparisons (a REGRESSION against the control under
  ``--kimiperf-control`` fails the run) and the errors of the reports and baselines.

The reports only say what these decided (reports/terminal.py, reports/answers.py).

Exit statuses of their own, where pytest would exit 1 for these failures alone:

- :data:`INVALID_ONLY_EXIT`, 75 (``EX_TEMPFAIL`` in sysexits.h, "a temporary failure ... the user
  is invited to retry"): every failed test failed on an INVALID measurement (a busy host, or a
  client-bound load): nothing was learned about the build; rerun on a quiet runner.
- :data:`UNRESOLVED_EXIT`, 76: every failure was UNRESOLVED (or INVALID, with an UNRESOLVED one
  among them): a change beyond the tolerance that one boot of an attached server without a
  ``restart_command`` can never convict. Nothing says the build is slower yet, nor that it is not.

Each such test carries the JUnit property ``kimiperf_outcome`` (``invalid`` or ``unresolved``;
pytest's junitxml writes ``item.user_properties`` and xdist carries them to the controller with
the report), which is also how the controller learns a failed test's outcome.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pytest_kimiperf.judge.notes import Unresolved
from pytest_kimiperf.judge.profiles import ProfileComparison
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.judge.verdicts import BaselineLine, MissingBaselines, TestResult

# pytest.ExitCode's values, without importing pytest here.
EXIT_OK = 0
EXIT_TESTS_FAILED = 1
INVALID_ONLY_EXIT = 75
UNRESOLVED_EXIT = 76
OUTCOME_PROPERTY = "kimiperf_outcome"
# An INVALID test's cause (measure.invalid_causes.InvalidCause's value), beside its outcome.
CAUSE_PROPERTY = "kimiperf_invalid_cause"


class Outcome(str, enum.Enum):
    """How one test ended, as the run's exit status counts it."""

    PASSED = "passed"
    FAILED = "failed"  # any failure that is a finding about the build, or not kimiperf's
    INVALID = "invalid"  # nothing learned: its cause says why (measure/invalid_causes.py)
    UNRESOLVED = "unresolved"  # a change beyond the tolerance this run can never convict


def missing_baselines(result: TestResult) -> list[BaselineLine]:
    """The baseline lines of the metrics that have no baseline on this hardware (under any
    software versions): what ``--kimiperf-missing-baseline`` warns or fails on."""
    return [m.baseline_line for m in result.metrics.values()
            if m.baseline_line is not None and m.baseline_line.state.missing]


def outcome_of(result: TestResult) -> Outcome:
    """The outcome of a result whose failures are final (after :func:`decide_test`)."""
    if not result.failures:
        return Outcome.PASSED
    if result.invalid is not None:
        return Outcome.INVALID
    if all(isinstance(failure, Unresolved) for failure in result.failures):
        return Outcome.UNRESOLVED
    return Outcome.FAILED


def decide_test(result: TestResult, *, missing_baseline_fails: bool) -> Outcome:
    """Finish one judged test boot: under ``--kimiperf-missing-baseline=fail``
    (``missing_baseline_fails``) the metrics without a baseline here become one more failure of
    ``result``; then the test's outcome. A result the gate left without failures passes."""
    missing = missing_baselines(result) if missing_baseline_fails and result.invalid is None else []
    if missing:
        result.failures.append(MissingBaselines(tuple(missing)))
    return outcome_of(result)


def failed_outcome(when: str, user_properties: Iterable[tuple[str, object]]) -> Outcome:
    """A failed test report's outcome: its call phase's ``kimiperf_outcome`` property, else FAILED
    (a setup error, a failed teardown, a test that is no perf test)."""
    if when == "call":
        marked = {value for name, value in user_properties if name == OUTCOME_PROPERTY}
        for outcome in (Outcome.INVALID, Outcome.UNRESOLVED):
            if outcome.value in marked:
                return outcome
    return Outcome.FAILED


def invalid_cause(when: str, user_properties: Iterable[tuple[str, object]]) -> str | None:
    """A failed call report's INVALID cause (its ``kimiperf_invalid_cause`` property), else None."""
    if when != "call":
        return None
    return next((str(value) for name, value in user_properties if name == CAUSE_PROPERTY), None)


@dataclass
class FailedTests:
    """The run's failed test reports, by outcome (a test can fail in setup, call and teardown:
    each report counts)."""

    by_outcome: dict[Outcome, list[str]] = field(default_factory=dict)
    invalid_causes: list[str] = field(default_factory=list)

    def add(self, nodeid: str, outcome: Outcome, cause: str | None = None) -> None:
        self.by_outcome.setdefault(outcome, []).append(nodeid)
        if outcome is Outcome.INVALID and cause:
            self.invalid_causes.append(cause)

    def causes(self) -> tuple[str, ...]:
        """The INVALID tests' causes, each once, in the order they came."""
        return tuple(dict.fromkeys(self.invalid_causes))

    def tests(self, outcome: Outcome) -> int:
        """How many distinct tests failed with ``outcome``."""
        return len(dict.fromkeys(self.by_outcome.get(outcome, [])))


class RunEnd(str, enum.Enum):
    """Why the run ends as it does (each is one exit status)."""

    PYTEST = "pytest"  # as pytest decided: passed, or tests failed, or pytest's own status
    CONTROL_REGRESSION = "control-regression"  # slower than the control booted in this session
    OUTPUT_ERROR = "output-error"  # a report or baseline could not be written (or a warning escalated)
    ONLY_INVALID = "only-invalid"  # every failure INVALID: the causes' advice says what to do
    ONLY_UNRESOLVED = "only-unresolved"  # every failure UNRESOLVED (or INVALID)


@dataclass(frozen=True)
class RunDecision:
    """How the run ends: its exit status, why, and what of this run failed it."""

    exit_status: int
    end: RunEnd
    control_regressions: tuple[ProfileComparison, ...] = ()
    errors: tuple[str, ...] = ()
    invalid_tests: int = 0
    unresolved_tests: int = 0
    invalid_causes: tuple[str, ...] = ()  # the INVALID tests' causes (InvalidCause values), each once

    @property
    def passed(self) -> bool:
        """Whether the run passed (what --kimiperf-append-on-pass asks)."""
        return self.exit_status == EXIT_OK


def control_regressions(comparisons: Sequence[ProfileComparison], *, control: bool) -> tuple[ProfileComparison, ...]:
    """Under --kimiperf-control, the candidate's comparisons with its control that are a
    REGRESSION: each fails the run (the in-session rule, judge/profiles.py)."""
    if not control:
        return ()
    return tuple(r for r in comparisons if r.comparison is not None and r.comparison.verdict is VerdictKind.REGRESSION)


def decide_run(pytest_status: int, failed: FailedTests, *, comparisons: Sequence[ProfileComparison] = (),
               control: bool = False, errors: Sequence[str] = ()) -> RunDecision:
    """The run's exit status, from what pytest would exit with (``pytest_status``), the failed
    tests' outcomes, the profile ``comparisons`` (which fail the run under ``control``) and the
    ``errors`` of the reports and baselines.

    A control regression or an error fails the run (exit 1), whatever the tests did. Otherwise,
    where pytest would exit 1: every failure INVALID is :data:`INVALID_ONLY_EXIT`; every failure
    UNRESOLVED or INVALID, with an UNRESOLVED one, is :data:`UNRESOLVED_EXIT`. Any other status
    of pytest's (interrupted, a usage error, nothing collected) stands."""
    regressions = control_regressions(comparisons, control=control)
    invalid, unresolved = failed.tests(Outcome.INVALID), failed.tests(Outcome.UNRESOLVED)
    if regressions or errors:
        end = RunEnd.CONTROL_REGRESSION if regressions else RunEnd.OUTPUT_ERROR
        return RunDecision(EXIT_TESTS_FAILED, end, regressions, tuple(errors), invalid, unresolved, failed.causes())
    status, end = pytest_status, RunEnd.PYTEST
    if pytest_status == EXIT_TESTS_FAILED and not failed.by_outcome.get(Outcome.FAILED):
        if failed.by_outcome.get(Outcome.UNRESOLVED):
            status, end = UNRESOLVED_EXIT, RunEnd.ONLY_UNRESOLVED
        elif failed.by_outcome.get(Outcome.INVALID):
            status, end = INVALID_ONLY_EXIT, RunEnd.ONLY_INVALID
    return RunDecision(status, end, invalid_tests=invalid, unresolved_tests=unresolved, invalid_causes=failed.causes())
