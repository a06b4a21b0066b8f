"""What the summary's first screen answers: one line per question the run asks.

A run asks a few questions: did each profile change the reference on the metric its test is
about, did any metric move against the baseline, and did the run pass. The answer block says each
in one line (:func:`answer_lines`, :func:`run_verdict`, :func:`failure_lines`), from the compact
rows (``compact_rows.py``); ``terminal`` lays these lines out, and what to do next is
``next_step.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.judge.gate import Outcome, outcome_of
from pytest_kimiperf.judge.notes import BootsForWithin
from pytest_kimiperf.judge.noise import misdeclared
from pytest_kimiperf.judge.stats import Leaning, VerdictKind, leaning
from pytest_kimiperf.judge.verdicts import BaselineState
from pytest_kimiperf.judge.verdicts import MissingBaselines as MissingBaselineNote
from pytest_kimiperf.measure.invalid_causes import advice_for
from pytest_kimiperf.numbers import fmt_change, fmt_value
from pytest_kimiperf.reports.compact_rows import CompactRow, baseline_rows, last_boots, primary_of, profile_rows
from pytest_kimiperf.reports.measured import lost_remark, no_counts_line, stream_remark
from pytest_kimiperf.reports.two_clocks import client_clock_only, engine_words, judged_on_the_client_clock_alone
from pytest_kimiperf.reports.model import SessionReport, boot_label, metric_heading, short_test
from pytest_kimiperf.reports.sentences import beside_comparison, missing_reason, note_text


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
                      f"{lost_remark(report, row.test, row.metric, (row.profile, ref))}"
                      f"{stream_remark(report, row.test, (row.profile, ref))}", _tone(row))
               for row in _primary_rows(profile_rows(report), report)]
    if (only_client := client_clock_only(report.results)) is not None:
        answers.append(Answer(only_client))
    if (reach := report.what_nccl_reached()) is not None:  # where decode's all-reduces bypassed NCCL
        others = [p for p in report.profile_names() if p != ref]
        answers.append(Answer(f"{others[0] if len(others) == 1 else 'profiles'} vs {ref}, what NCCL could reach: {reach}"))
    answers += [Answer(f"{row.profile} vs its baseline, {_about(row)}"
                       f"{engine_words(report.results, row.test, row.comparison, row.profile, None)}"
                       f"{lost_remark(report, row.test, row.metric, (row.profile,))}"
                       f"{stream_remark(report, row.test, (row.profile,))}", _tone(row))
                for row in _primary_rows(baseline_rows(report), report)]
    client_alone = sum(1 for res in last_boots(report.results) for m in res.metrics.values()
                       if m.baseline_line is not None and m.baseline_line.client_clock_only)
    if (alone := judged_on_the_client_clock_alone(client_alone)) is not None:
        answers.append(Answer(alone))
    if (uncounted := no_counts_line(report)) is not None:
        answers.append(Answer(uncounted))
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


def spread_line(report: SessionReport) -> str | None:
    """The one line on spreads the run's boots show beyond the deployment's declaration (the
    profile comparisons and each test's last boot against its baseline), None where they show
    none at the run's level (judge/noise.py)."""
    ref = report.reference_profile
    judged = [(f"{metric_heading(pc.metric)} of {short_test(pc.test)} [{pc.profile} vs {ref}]", pc.comparison)
              for pc in report.profile_comparisons if pc.comparison is not None]
    judged += [(f"{metric_heading(row.metric)} of {short_test(row.test)} [{row.profile}]", row.comparison)
               for row in baseline_rows(report) if row.comparison is not None
               and row.comparison.verdict not in (VerdictKind.NOT_COMPARABLE, VerdictKind.NOT_JUDGED)]
    note = misdeclared(judged, deployment=str(report.deployment.get("name") or ""))
    return None if note is None else note_text(note)


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
    return engine_words(report.results, row.test, row.comparison, row.profile, report.reference_profile)


def _about(row: CompactRow) -> str:
    what = f"{metric_heading(row.metric)} ({short_test(row.test)})"
    c = row.comparison
    if c is None:
        return f"{what}: {row.verdict}"
    # Undecided between profiles: how many boots a side would show it within (judge/profiles.py).
    more = next((f"; {note_text(n)}" for n in c.notes if isinstance(n, BootsForWithin)), "") if row.in_session else ""
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
    outcomes = [outcome_of(res) for res in report.results]  # as judge/gate.py decided each
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
                "the run line says what to do" if isinstance(first, MissingBaselineNote) else note_text(first))
        said.setdefault((short_test(res.test), text), []).append(f"{res.profile} boot {res.boot}")
    return [f"FAILED {test} [{', '.join(boots)}]: {text}" for (test, text), boots in said.items()]
