"""The compact rows of the summary's first screen: one per metric and profile, with its change.

Each row is one metric of one test under one profile against its reference (another profile of
this session, or the baseline): the change, the interval at its level and the verdict, or why there
is none. The terminal's compact tables, the answers and `kimiperf compare` all show these rows;
the boots, the server's view and the roofline are left to ``-v`` and to the Markdown and JSON
reports, which keep everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.judge.profiles import WITHIN_INTERVAL
from pytest_kimiperf.judge.stats import Comparison, VerdictKind
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.numbers import fmt_ci
from pytest_kimiperf.reports.model import SessionReport, profile_verdict


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


def _fmt_interval(comparison: Comparison, *, in_session: bool) -> str:
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
        return "" if self.comparison is None else _fmt_interval(self.comparison, in_session=self.in_session)


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
