"""What the summary's first screen says: the answers, the compact rows, and what to do next.

A run asks a few questions: did each profile change the reference on the metric its test is
about, did any metric move against the baseline, and did the run pass. The answer block says each
in one line; the compact tables below it give every metric one row per profile (change, interval
at its level, verdict) and leave the boots, the server's view and the roofline to ``-v`` and to
the Markdown and JSON reports, which keep everything. ``terminal`` lays these lines out. The
module holds, in order:

* the answers and the compact rows (:func:`answer_lines`, :class:`CompactRow`,
  :func:`profile_rows`, :func:`baseline_rows`, :func:`run_verdict`, :func:`failure_lines`);
* what a run showed, in one line, and what to do next (:func:`outcome_line`); and the one
  missing-baseline warning (:func:`missing_baseline_warning`).

**The missing baseline.** A first run on a new machine has no baseline: it judges the profiles
against each other and the decode floor, nothing against history. Saying so once per metric, test
and boot (48 warnings for one fact) buried it; the run now says it once, listing what is missing
and the exact command that records it (``--kimiperf-record-command``, else this run's own pytest
command with ``--kimiperf-update-baselines``). The run after that is judged against the baseline;
its line tallies the verdicts of each test's last boot, the one that decides.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.judge.decide import Outcome, outcome_of
from pytest_kimiperf.judge.notes import BootsForWithin
from pytest_kimiperf.judge.profiles import WITHIN_INTERVAL
from pytest_kimiperf.judge.spread_check import misdeclared
from pytest_kimiperf.judge.stats import Comparison, Leaning, VerdictKind, leaning
from pytest_kimiperf.judge.verdicts import BaselineState, TestResult
from pytest_kimiperf.judge.verdicts import MissingBaselines as MissingBaselineNote
from pytest_kimiperf.measure.invalid_causes import advice_for
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_value
from pytest_kimiperf.reports.measured import lost_remark
from pytest_kimiperf.reports.two_clocks import client_clock_only, engine_remark
from pytest_kimiperf.reports.model import SessionReport, boot_label, metric_heading, profile_verdict, short_test
from pytest_kimiperf.reports.nccl_reach import reach_summary, sets_nccl
from pytest_kimiperf.reports.sentences import (
    RECORDING_ACCEPTS, beside_comparison, missing_reason, say, select_hardware,
)


# The answers, and one compact row per metric and profile.

def primary_of(results: Sequence[TestResult]) -> dict[str, str]:
    """Each test's primary metric, as its boots recorded it (TestResult.primary): the metric its
    answer line speaks of; a test whose boots recorded none (an older report) takes the first
    metric it checked."""
    primary: dict[str, str] = {}
    for res in results:
        if res.primary is not None:
            primary[res.test] = res.primary
        elif res.test not in primary and res.metrics:
            primary[res.test] = next(iter(res.metrics))
    return primary


def interval_level(comparison: Comparison, *, in_session: bool) -> float:
    """The level of the interval a row shows: the gate's equivalence level, or for a profile
    judged within tolerance in one session the narrower interval that claim rests on."""
    if in_session and comparison.verdict is VerdictKind.WITHIN_TOLERANCE:
        return WITHIN_INTERVAL
    return comparison.equivalence_confidence


def fmt_interval(comparison: Comparison, *, in_session: bool) -> str:
    """``-4.8..+5.4% (90%)``: the interval and its level."""
    level = interval_level(comparison, in_session=in_session) * 100
    return f"{fmt_ci(comparison.ci_low, comparison.ci_high)} ({level:.0f}%)"


@dataclass(frozen=True)
class CompactRow:
    """One metric of one test under one profile: its change against the reference (another
    profile, or the baseline), the interval at its level, and the verdict; or why there is none."""

    test: str
    metric: str
    profile: str
    comparison: Comparison | None
    note: str | None = None
    in_session: bool = True  # against another profile of this session; False: against the baseline
    primary: bool = False  # the test's primary metric (TestResult.primary); the others are secondary
    invalid: bool = False  # the boot's measurement was INVALID: the note says why

    @property
    def verdict(self) -> str:
        """The verdict as the table shows it (between profiles "worse"/"better", against the
        baseline the gate's REGRESSION), or the note that stands in for one."""
        if self.comparison is None or self.note:
            return self.note or ""
        if self.in_session:
            return profile_verdict(self.comparison)
        verdict = self.comparison.verdict
        return "REGRESSION" if verdict is VerdictKind.REGRESSION else str(verdict.value)

    @property
    def interval(self) -> str:
        """The interval with its level, or nothing where there is no comparison."""
        return "" if self.comparison is None else fmt_interval(self.comparison, in_session=self.in_session)


def profile_rows(report: SessionReport) -> list[CompactRow]:
    """Each test, metric and non-reference profile against the reference profile, on all boots:
    one row each, the comparison where there is one, else the first boot's note (an INVALID boot
    is named in the answers, not once a row)."""
    rows: dict[tuple[str, str, str], CompactRow] = {}
    primary = primary_of(report.results)
    for block in report.test_blocks():
        for metric in block.metrics:
            for cell in metric.cells:
                if cell.is_reference or (cell.comparison is None and cell.note is None):
                    continue  # the reference, or an earlier boot: compared once, on the last
                key = (block.test, metric.metric, cell.name or cell.profile)
                if key not in rows or (rows[key].comparison is None and cell.comparison is not None):
                    note = None if cell.comparison is not None else cell.note
                    remark = engine_remark(report.results, block.test, metric.metric, cell.comparison, key[2],
                                           report.reference_profile)
                    if remark is not None and remark.withdrawn:
                        note = "UNRESOLVED: the client's clock moved, the engine's did not"
                    rows[key] = CompactRow(*key, cell.comparison, note,
                                           primary=primary.get(block.test) == metric.metric, invalid=cell.invalid)
    return list(rows.values())


def last_boots(results: Sequence[TestResult]) -> list[TestResult]:
    """Each test's and profile's last boot, whose baseline verdict rests on all its boots."""
    last: dict[tuple[str, str], TestResult] = {}
    for res in results:
        key = (res.test, res.profile)
        if key not in last or res.boot >= last[key].boot:
            last[key] = res
    return list(last.values())


def baseline_rows(report: SessionReport) -> list[CompactRow]:
    """Each test, metric and profile against the baseline, on its last boot; metrics with no
    baseline are left to the answer block's one line."""
    rows = []
    primary = primary_of(report.results)
    for res in last_boots(report.results):
        for metric, mres in res.metrics.items():
            first = primary.get(res.test) == metric
            if mres.baseline is not None:
                rows.append(CompactRow(res.test, metric, res.profile, mres.baseline, in_session=False, primary=first))
            elif res.invalid:
                rows.append(CompactRow(res.test, metric, res.profile, None, "INVALID measurement", in_session=False,
                                       primary=first, invalid=True))
    return rows


def _primary_rows(rows: Sequence[CompactRow], report: SessionReport) -> list[CompactRow]:
    """For each profile, the row of the first test's primary metric that has one."""
    primary = primary_of(report.results)
    chosen: dict[str, CompactRow] = {}
    for row in rows:
        if row.profile in chosen or row.metric != primary.get(row.test):
            continue
        chosen[row.profile] = row
    return list(chosen.values())


class Tone(enum.Enum):
    """How loud an answer is said: a failed check or a run with no verdict, a worse figure, or
    neither."""

    LOUD = "loud"
    WORSE = "worse"
    PLAIN = "plain"


@dataclass(frozen=True)
class Answer:
    """One line of the summary's answers, and how loud it is, decided from the facts it says."""

    text: str
    tone: Tone = Tone.PLAIN


def answer_lines(report: SessionReport) -> list[Answer]:
    """One line per question: each profile against the reference on its primary metric (and what
    its NCCL variables could reach, where decode bypassed NCCL), each profile against the baseline
    on it, the decode floor, and INVALID boots."""
    ref = report.reference_profile
    answers = [Answer(f"{row.profile} vs {ref}, {_about(row)}{_engine_words(report, row)}"
                      f"{lost_remark(report, row.test, row.metric, (row.profile, ref))}", _tone(row))
               for row in _primary_rows(profile_rows(report), report)]
    if (only_client := client_clock_only(report.results)) is not None:
        answers.append(Answer(only_client))
    if (reach := what_nccl_reached(report)) is not None:  # where decode's all-reduces bypassed NCCL
        others = [p for p in report.profile_names() if p != ref]
        answers.append(Answer(f"{others[0] if len(others) == 1 else 'profiles'} vs {ref}, what NCCL could reach: {reach}"))
    answers += [Answer(f"{row.profile} vs its baseline, {_about(row)}{lost_remark(report, row.test, row.metric, (row.profile,))}",
                       _tone(row))
                for row in _primary_rows(baseline_rows(report), report)]
    floor = _floor_line(report)
    if floor is not None:
        answers.append(Answer(floor[0], Tone.LOUD if floor[1] else Tone.PLAIN))
    answers += [Answer(line) for line in _not_compared(report)]
    spreads = spread_line(report)
    if spreads is not None:
        answers.append(Answer(spreads))
    invalid = _invalid_line(report)
    if invalid:
        answers.append(Answer(invalid, Tone.LOUD))
    return answers


def what_nccl_reached(report: SessionReport) -> str | None:
    """Where the compared profiles' NCCL variables could not reach decode's all-reduces, from each
    boot's log (nccl_reach.reach_summary); None where they could, or nothing says."""
    if not report.compared_profiles():
        return None
    hard = (report.fingerprint or {}).get("hard") or {}
    return reach_summary(
        {p.name: [a.all_reduce for a in p.boot_accounts if a.all_reduce is not None] for p in report.profiles},
        nccl_profiles=[p.name for p in report.profiles if sets_nccl(p.profile_env)],
        interconnect=str(hard["gpu.interconnect"]) if hard.get("gpu.interconnect") else None)


def spread_line(report: SessionReport) -> str | None:
    """The one line on spreads the run's boots show beyond the deployment's declaration (the
    profile comparisons and each test's last boot against its baseline), None where they show
    none at the run's level (judge/spread_check.py)."""
    ref = report.reference_profile
    judged = [(f"{metric_heading(pc.metric)} of {short_test(pc.test)} [{pc.profile} vs {ref}]", pc.comparison)
              for pc in report.profile_comparisons if pc.comparison is not None]
    judged += [(f"{metric_heading(row.metric)} of {short_test(row.test)} [{row.profile}]", row.comparison)
               for row in baseline_rows(report) if row.comparison is not None
               and row.comparison.verdict not in (VerdictKind.NOT_COMPARABLE, VerdictKind.NOT_JUDGED)]
    note = misdeclared(judged, deployment=str(report.deployment.get("name") or ""))
    return None if note is None else say(note)


def _tone(row: CompactRow) -> Tone:
    """WORSE where the row's verdict leans worse (a slower profile, a regression), else PLAIN."""
    c = row.comparison
    return Tone.WORSE if c is not None and not row.note and leaning(c.verdict) is Leaning.WORSE else Tone.PLAIN


def _invalid_line(report: SessionReport) -> str | None:
    """The INVALID boots in one line, by test; each test's failure above says why."""
    by_test: dict[str, list[str]] = {}
    for res in report.results:
        if res.invalid:
            by_test.setdefault(short_test(res.test), []).append(f"{res.profile} boot {res.boot}")
    if not by_test:
        return None
    count = sum(len(boots) for boots in by_test.values())
    listing = "; ".join(f"{test} [{', '.join(boots)}]" for test, boots in by_test.items())
    first = next(res.invalid for res in report.results if res.invalid)
    reason = first.split(":", 2)[:2]
    return (f"INVALID, no verdict ({count} test boot{'s' * (count != 1)}, each failure above says why; the "
            f"first: {':'.join(reason).strip()}): {listing}")


def _not_compared(report: SessionReport) -> list[str]:
    """Why metrics that have a baseline were not judged against it (another host's canary, other
    versions), one line per reason; a missing baseline is the run line's to say, once."""
    last = {(res.test, boot_label(res)) for res in last_boots(report.results) if not res.invalid}
    reasons: dict[str, int] = {}
    for row in report.baseline_rows():
        if (row.test, row.profile) not in last or (row.line is not None and row.line.state is BaselineState.MISSING):
            continue
        if row.line is not None and row.line.state is BaselineState.OTHER_HARDWARE:
            # The same for every metric: said once; the figures are the table's, and what to do
            # the run line's (outcome_line), once.
            reason = f"not comparable, shown only: {missing_reason(row.line)}"
        elif row.baseline is None and row.line is not None:
            reason = row.message
        elif row.baseline is not None and row.baseline.verdict is VerdictKind.NOT_COMPARABLE:
            # The figures are the table's; what stands beside them is the same for every metric.
            beside = beside_comparison(row.line) if row.line is not None else []
            reason = "not comparable: " + " — ".join(beside) if beside else row.message
        else:
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
    return [f"against the baseline ({count} metric{'s' * (count != 1)}): {message}" for message, count in reasons.items()]


def _engine_words(report: SessionReport, row: CompactRow) -> str:
    """The engine's clock beside the client's change (reports/two_clocks.py), '' where it has none."""
    remark = engine_remark(report.results, row.test, row.metric, row.comparison, row.profile, report.reference_profile)
    return remark.text if remark is not None else ""


def _about(row: CompactRow) -> str:
    what = f"{metric_heading(row.metric)} ({short_test(row.test)})"
    c = row.comparison
    if c is None:
        return f"{what}: {row.verdict}"
    # Undecided between profiles: how many boots a side would show it within (judge/profiles.py).
    more = next((f"; {say(n)}" for n in c.notes if isinstance(n, BootsForWithin)), "") if row.in_session else ""
    return (f"{what}: {fmt_change(c.change)}, {row.interval}: {row.verdict} "
            f"(tolerance {c.tolerance * 100:g}%, {c.boots_current} vs {c.boots_reference} boots){more}")


def _floor_line(report: SessionReport) -> tuple[str, bool] | None:
    """The decode floor's answer, and whether a boot fell below it."""
    floored = [res for res in report.floor_results() if res.floor is not None]
    if not floored:
        return None
    first = floored[0].floor
    assert first is not None
    below = [res for res in floored if res.floor is not None and res.floor.failed]
    lowest = min(floored, key=lambda res: res.floor.median if res.floor else 0.0)
    limit = f"floor {fmt_value(first.floor)} {first.unit}" if first.floor is not None else "no floor"
    if below:
        names = ", ".join(f"{r.profile} boot {r.boot}" for r in below)
        return f"decode {limit}: BELOW on {names} (lowest {fmt_value(lowest.floor.median if lowest.floor else None)})", True
    low = lowest.floor
    assert low is not None
    return f"decode {limit}: every boot above it (lowest {fmt_value(low.median)}, {lowest.profile} boot {lowest.boot})", False


def run_verdict(report: SessionReport) -> str:
    """``passed``, or ``FAILED`` with what failed it, as the run's answer opens."""
    outcomes = [outcome_of(res) for res in report.results]  # as judge/decide.py decided each
    failed = sum(o in (Outcome.FAILED, Outcome.UNRESOLVED) for o in outcomes) + len(report.control_regressions())
    invalid = outcomes.count(Outcome.INVALID)
    parts = []
    if failed:
        parts.append(f"{failed} test boot{'s' * (failed != 1)} failed")
    if invalid:
        causes = [res.invalid_cause for res in report.results if res.invalid_cause and outcome_of(res) is Outcome.INVALID]
        parts.append(f"{invalid} INVALID ({advice_for(causes) or 'each line says why'})")
    return f"FAILED ({', '.join(parts)})" if parts else "passed"


def failure_lines(report: SessionReport) -> list[str]:
    """Why tests failed: each failed boot's first failure, one line per test and reason, naming
    the boots it holds for (INVALID boots have the answers' line). A missing baseline points to
    the lines that say why (another hardware's, above) and what to do (the run line), once."""
    said: dict[tuple[str, str], list[str]] = {}
    for res in report.results:
        if not res.failures or res.invalid:
            continue
        first = res.failures[0]
        text = (f"missing baseline (--kimiperf-missing-baseline=fail) for {', '.join(line.label for line in first.lines)}: "
                "the run line says what to do" if isinstance(first, MissingBaselineNote) else say(first))
        said.setdefault((short_test(res.test), text), []).append(f"{res.profile} boot {res.boot}")
    return [f"FAILED {test} [{', '.join(boots)}]: {text}" for (test, text), boots in said.items()]


# What to do next: the run's outcome in one line, and the one missing-baseline warning.

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


def boots_per_profile(results: Sequence[TestResult]) -> int:
    """The most boots any profile had in this run."""
    return max((res.boot for res in results), default=0)


# The tests the warning names before "and N more": it stays a few lines however many tests miss one.
WARNING_TESTS = 3


def missing_baseline_warning(report: SessionReport, record_command: str) -> str | None:
    """The session's one MissingBaselineWarning text, or None when every metric had a baseline
    (or this run records them): a few lines, the tests it covers and the command."""
    if report.baselines_update is not None:
        return None
    missing = missing_baselines(report.results, _fingerprint(report))
    if missing is None:
        return None
    boots = boots_per_profile(report.results)
    metrics, tests = missing.metrics, len(missing.tests)
    command = f"{record_command} ({boots} boot{'s' * (boots != 1)} per profile, as this run)"
    return "\n".join([
        f"no baseline for this hardware ({missing.fingerprint}) for {metrics} metric{'s' * (metrics != 1)} "
        f"of {tests} test{'s' * (tests != 1)}, judged against no history:",
        *(f"  {line}" for line in missing.lines(WARNING_TESTS)),
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
