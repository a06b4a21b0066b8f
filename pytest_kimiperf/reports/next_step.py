"""What to do next: the run's outcome in one line, and the one missing-baseline warning.

:func:`outcome_line` says what a run showed and what to do next; :func:`missing_baseline_warning`
is the session's one warning about baselines this machine lacks.

**The missing baseline.** A first run on a new machine has no baseline: it judges the profiles
against each other and the decode floor, nothing against history. Saying so once per metric, test
and boot (48 warnings for one fact) buried it; the run now says it once, listing what is missing
and the exact command that records it (``--kimiperf-record-command``, else this run's own pytest
command with ``--kimiperf-update-baselines``). The run after that is judged against the baseline;
its line tallies the verdicts of each test's last boot, the one that decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.reports.model import SessionReport
from pytest_kimiperf.reports.sentences import RECORDING_ACCEPTS, select_hardware


@dataclass(frozen=True)
class MissingBaselines:
    """The tests, profiles and metrics that had no baseline for this machine's fingerprint."""

    fingerprint: str
    # test -> (profiles, metric labels), in the order the run met them
    tests: dict[str, tuple[list[str], list[str]]]
    metrics: int  # metric x test x profile, each counted once however many boots it had
    # The hardware a baseline of the same server was recorded under (BaselineLine.recorded_hardware):
    # stating it is the advice, not recording.
    recorded_hardware: str = ""

    def listing(self) -> str:
        """``test_ttft [default, ring-ll]: time to first token, p90 time to first token; ...``"""
        return "; ".join(self.lines())

    def lines(self, most: int | None = None) -> list[str]:
        """One line per test (``most`` of them, then how many more)."""
        lines = [f"{test} [{', '.join(profiles)}]: {', '.join(labels)}" for test, (profiles, labels) in self.tests.items()]
        if most is not None and len(lines) > most:
            more = len(lines) - most
            lines = [*lines[:most], f"and {more} more test{'s' * (more != 1)} (the summary's tables list them)"]
        return lines

    def next_step(self, record_command: str, *, gate: bool) -> str:
        """What to do: state the hardware a baseline of this server was recorded under (under a
        gate, only that), else record, saying what recording accepts."""
        record = f"{record_command} (it {RECORDING_ACCEPTS})"
        if not self.recorded_hardware:
            return record
        return select_hardware(self.recorded_hardware) + ("" if gate else f"; if the hardware is new, {record}")


def missing_baselines(results: Sequence[TestResult], fingerprint: str) -> MissingBaselines | None:
    """What had no baseline on this hardware in ``results`` (None when nothing is missing)."""
    tests: dict[str, tuple[list[str], list[str]]] = {}
    seen: set[tuple[str, str, str]] = set()
    recorded = ""
    for res in results:
        for metric, mres in res.metrics.items():
            if mres.baseline_line is None or not mres.baseline_line.state.missing:
                continue
            recorded = recorded or mres.baseline_line.recorded_hardware
            profiles, labels = tests.setdefault(res.test, ([], []))
            if res.profile not in profiles:
                profiles.append(res.profile)
            label = METRICS[metric].label if metric in METRICS else metric
            if label not in labels:
                labels.append(label)
            seen.add((res.test, res.profile, metric))
    return MissingBaselines(fingerprint, tests, len(seen), recorded) if tests else None


def _boots_per_profile(results: Sequence[TestResult]) -> int:
    """The most boots any profile had in this run."""
    return max((res.boot for res in results), default=0)


# The tests the warning names before "and N more": it stays a few lines however many tests miss one.
_WARNING_TESTS = 3


def missing_baseline_warning(report: SessionReport, record_command: str) -> str | None:
    """The session's one MissingBaselineWarning text, or None when every metric had a baseline
    (or this run records them): a few lines, the tests it covers and the command."""
    if report.baselines_update is not None:
        return None
    missing = missing_baselines(report.results, _fingerprint(report))
    if missing is None:
        return None
    boots = _boots_per_profile(report.results)
    metrics, tests = missing.metrics, len(missing.tests)
    command = f"{record_command} ({boots} boot{'s' * (boots != 1)} per profile, as this run)"
    return "\n".join([
        f"no baseline for this hardware ({missing.fingerprint}) for {metrics} metric{'s' * (metrics != 1)} "
        f"of {tests} test{'s' * (tests != 1)}, judged against no history:",
        *(f"  {line}" for line in missing.lines(_WARNING_TESTS)),
        f"  next: {missing.next_step(command, gate=report.gate)}"])


def outcome_line(report: SessionReport, record_command: str) -> str | None:
    """One line: what this run judged, and what to do next."""
    if not report.results:
        return None
    judged = _judged_besides_history(report)
    update = report.baselines_update
    if update is not None:
        if not update.entries:
            return "no baseline recorded: no test produced a boot that may be recorded (see above)"
        left = len(update.not_recorded)
        skipped = f"; {left} test boot{'s' * (left != 1)} not recorded (listed above)" if left else ""
        if update.on_pass:
            return f"this passing run appended its boots to {update.entries} baseline entries in {update.path}{skipped}"
        anew = (f"; {update.restarted} of them judged changed against their history (a REGRESSION or an "
                "improvement above) start it anew at this run's level, their older boots dropped: review the diff"
                if update.restarted else "")
        return (f"recorded {update.entries} baseline entries in {update.path}{skipped}{anew}; the same run "
                "without --kimiperf-update-baselines now judges against them")
    missing = missing_baselines(report.results, _fingerprint(report))
    tally = _tally(report.results)
    if missing is not None and not tally:
        did = f"this run judged {judged}, nothing against history" if judged else "this run measured but judged nothing"
        then = "" if missing.recorded_hardware else ", then the run you just made judges against it"
        return (f"no baseline for this machine ({missing.fingerprint}) yet: {did}. Next: "
                f"{missing.next_step(record_command, gate=report.gate)}{then}") + _invalid(report.results)
    if not tally:
        return f"this run judged {judged or 'nothing'}; no metric was compared with a baseline"
    order = {word: i for i, word in enumerate(_VERDICT_ORDER)}
    verdicts = ", ".join(f"{tally[v]} {v}" for v in sorted(tally, key=lambda v: order.get(v, len(order))))
    line = f"against this machine's baseline, each test's last boot: {verdicts}"
    if judged:
        line += f"; besides, {judged}"
    if missing is not None:
        metrics = f"{missing.metrics} metric{'s' * (missing.metrics != 1)}"
        line += f". {metrics} had no baseline: {missing.next_step(record_command, gate=report.gate)}"
    return line + _invalid(report.results)


def _invalid(results: Sequence[TestResult]) -> str:
    count = sum(1 for res in results if res.invalid)
    if not count:
        return ""
    return (f". {count} test boot{'s' * (count != 1)} measured INVALID (no verdict from a busy host or an "
            "untrusted client: the failures above say which)")


# The tally's order: what fails first, what passes last.
_VERDICT_ORDER = ("REGRESSION", "improvement", "changed, size unresolved", "inconclusive", "not comparable",
                  "insufficient samples", "no detectable change", "within tolerance")


def _judged_besides_history(report: SessionReport) -> str:
    parts = []
    if report.compared_profiles():
        others = [p for p in report.profile_names() if p != report.reference_profile]
        failed = len(report.control_regressions())
        parts.append(f"{', '.join(others)} against {report.reference_profile}" + (
            f" ({failed} REGRESSION{'s' * (failed != 1)} against the recorded build: the run fails)" if failed else ""))
    if report.floor_results():
        parts.append("the decode floor")
    return " and ".join(parts)


def _tally(results: Sequence[TestResult]) -> Counter[str]:
    last: dict[tuple[str, str], int] = {}
    for res in results:
        last[(res.test, res.profile)] = max(last.get((res.test, res.profile), 0), res.boot)
    tally: Counter[str] = Counter()
    for res in results:
        if res.boot != last[(res.test, res.profile)]:
            continue
        for mres in res.metrics.values():
            if mres.baseline is not None:
                verdict = mres.baseline.verdict.value
                tally["REGRESSION" if verdict == "regression" else verdict] += 1
    return tally


def _fingerprint(report: SessionReport) -> str:
    return str((report.fingerprint or {}).get("key", "unknown"))
