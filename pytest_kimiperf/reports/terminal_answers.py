"""The summary's first screen: the answers, then one compact table per comparison.

What the lines say is gathered in :mod:`~pytest_kimiperf.reports.answers`; this module lays them
out for the terminal, as :mod:`~pytest_kimiperf.reports.terminal` does for the ``-v`` sections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.numbers import fmt_change
from pytest_kimiperf.reports.answers import (
    CompactRow, answer_lines, baseline_rows, failure_lines, profile_rows, run_verdict, short_test,
)
from pytest_kimiperf.reports.model import SessionReport
from pytest_kimiperf.reports.next_step import outcome_line
from pytest_kimiperf.reports.terminal_layout import (
    LOUD, MAX_WIDTH, RED, YELLOW, Table, TerminalLine, plural, verdict_markup, wrapped,
)


# Marks the row of a test's primary metric in the compact tables.
PRIMARY_MARK = "* "


def answer_section(report: SessionReport) -> list[TerminalLine]:
    """The summary's opening: one line per answer, the failures, and the run's outcome."""
    lines = [TerminalLine("kimiperf: answers", sep="=")]
    for answer in answer_lines(report):
        lines.extend(wrapped(answer, indent=0, markup=_answer_markup(answer)))
    for failure in failure_lines(report):
        lines.extend(wrapped(failure, indent=0, markup=RED))
    outcome = outcome_line(report, report.record_command)
    if outcome is not None:
        verdict = run_verdict(report)
        lines.extend(wrapped(f"run {verdict}: {outcome}", indent=0, markup=LOUD if verdict != "passed" else {}))
    return lines


def _answer_markup(answer: str) -> Mapping[str, bool]:
    if answer.startswith("INVALID") or ": BELOW on " in answer:
        return LOUD
    return RED if ": worse (" in answer or ": REGRESSION (" in answer else {}


def _compact_table(rows: Sequence[CompactRow]) -> list[TerminalLine]:
    """One row per metric and profile: change, interval at its level, verdict; the test named
    on its first row, the profile column only where several profiles share the table."""
    several = len({row.profile for row in rows}) > 1
    header = ["test", "metric", *(["profile"] if several else []), "change", "interval", "verdict"]
    cells: list[tuple[str, list[str], Mapping[str, bool]]] = []
    for row in rows:
        c = row.comparison
        verdict = row.verdict if c is not None else _short_note(row.verdict)
        change = [fmt_change(c.change), row.interval] if c is not None else ["", ""]
        metric = f"{PRIMARY_MARK}{row.metric}" if row.primary else f"{' ' * len(PRIMARY_MARK)}{row.metric}"
        cells.append((short_test(row.test), [metric, *([row.profile] if several else []), *change, verdict],
                      _row_markup(row)))
    table = Table(header, aligns="lllrll" if several else "llrll", indent=2)
    previous = None
    for test, text, _ in cells:
        table.add([test if test != previous else "", *text])
        previous = test
    if table.width() <= MAX_WIDTH:
        lines = [TerminalLine(table.format(header), markup={"bold": True})]
        previous = None
        for test, text, markup in cells:
            lines.append(TerminalLine(table.format([test if test != previous else "", *text]), markup=markup))
            previous = test
        return lines
    # Too wide with the test beside its rows (long profile names): the test heads its rows.
    table = Table(header[1:], aligns="llrll" if several else "lrll", indent=4)
    for _, text, _ in cells:
        table.add(text)
    lines = [TerminalLine(table.format(header[1:]), markup={"bold": True})]
    previous = None
    for test, text, markup in cells:
        if test != previous:
            lines.append(TerminalLine(f"  {test}", markup={"bold": True}))
            previous = test
        lines.append(TerminalLine(table.format(text), markup=markup))
    return lines


def _primary_legend(rows: Sequence[CompactRow]) -> list[TerminalLine]:
    if not any(row.primary for row in rows):
        return []
    return [TerminalLine(f"  {PRIMARY_MARK.strip()} the test's primary metric, the one its answer line speaks of; "
                         "the other rows are secondary")]


def _short_note(note: str) -> str:
    return "INVALID measurement" if note.startswith("INVALID") else note


def _row_markup(row: CompactRow) -> Mapping[str, bool]:
    if row.note or row.comparison is None:
        return YELLOW
    if row.in_session and row.comparison.verdict is VerdictKind.REGRESSION:
        return RED  # a slower profile is a finding, not a failed test: red, but not loud
    return verdict_markup(row.comparison.verdict.value)


def compact_profile_table(report: SessionReport) -> list[TerminalLine]:
    """Each profile against the reference, one row per metric, on all boots."""
    if not report.compared_profiles():
        return []
    rows = profile_rows(report)
    if not rows:
        return []
    others = list(dict.fromkeys(row.profile for row in rows))
    who = others[0] if len(others) == 1 else "profiles"
    title = f"kimiperf: {who} vs {report.reference_profile}, on all boots (-v: each boot)"
    return [TerminalLine(title, sep="="), *_compact_table(rows), *_primary_legend(rows)]


def compact_baseline_table(report: SessionReport) -> list[TerminalLine]:
    """Each profile against its baseline, one row per metric, on its last boot (which rests on
    all its boots)."""
    rows = baseline_rows(report)
    if not rows:
        return []
    title = "kimiperf: against the baseline, on each profile's boots (-v: each boot)"
    return [TerminalLine(title, sep="="), *_compact_table(rows), *_primary_legend(rows)]


def warning_count(report: SessionReport) -> list[TerminalLine]:
    """One line for the warnings that ``-v`` and the Markdown summary spell out."""
    warnings = report.warnings()
    if not warnings:
        return []
    return [TerminalLine(f"kimiperf: {plural(len(warnings), 'warning')} besides the answers: -v or the Markdown "
                         "summary lists them", markup=YELLOW)]
