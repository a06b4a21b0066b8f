"""The terminal summary: the session's answer on one screen, as lines for pytest's reporter.

Rendering returns :class:`TerminalLine` objects instead of writing, so the layout is a pure
function of the report and the verbosity; the session reporter hands the lines to the terminal
reporter's ``write_sep``/``write_line``, whose markup is dropped where the terminal has no colour.
Tables keep to :data:`MAX_WIDTH` columns: when the metric names make a row too wide, the metric
moves to a line of its own above its profiles.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import assert_never

from pytest_kimiperf.judge.decide import RunDecision, RunEnd
from pytest_kimiperf.judge.in_session import INTERVAL_LEGEND
from pytest_kimiperf.judge.floors import FloorResult
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_spread, fmt_value
from pytest_kimiperf.reports.cells import figure_legend, fmt_range, range_names
from pytest_kimiperf.reports.next_step import outcome_line
from pytest_kimiperf.reports.sentences import comparison_line, rests_on, source_text
from pytest_kimiperf.reports.model import (
    BaselineRow,
    MetricBlock,
    ProfileCell,
    SessionReport,
    boot_label,
    profile_verdict,
)
from pytest_kimiperf.reports.terminal_answers import (
    answer_section, compact_baseline_table, compact_profile_table, warning_count,
)
from pytest_kimiperf.reports.terminal_context import (
    nccl_debug_lines,
    roofline_lines,
    server_view_section,
    servers_and_files,
    warning_section,
)
from pytest_kimiperf.reports.terminal_layout import (
    LOUD,
    MAX_WIDTH,
    RED,
    YELLOW,
    Table,
    TerminalLine,
    floor_markup,
    plural,
    verdict_markup,
    wrapped,
)

QUIET = -1
VERBOSE = 1


def render_summary(
    report: SessionReport | None,
    *,
    verbosity: int,
    output_error: str | None = None,
    decision: RunDecision | None = None,
) -> list[TerminalLine]:
    """The summary's lines: the answers first, then one compact row per metric and profile;
    ``-v`` adds every boot, the baselines' detail, the floor, the roofline and the server's view
    (the Markdown and JSON reports always hold them); ``-q`` keeps the verdicts and anything
    alarming. Last, an exit status of the plugin's own, when the ``decision`` gave one."""
    lines: list[TerminalLine] = []
    quiet = verbosity <= QUIET
    if report is not None and report.results:
        if quiet:
            lines.extend(_quiet_verdicts(report))
            lines.extend(nccl_debug_lines(report, titled=True, quiet=True))
        else:
            lines.extend(answer_section(report))
            if verbosity >= VERBOSE:
                lines.extend(_full_sections(report))
            else:
                lines.extend(compact_profile_table(report))
                lines.extend(nccl_debug_lines(report, titled=True, quiet=False))
                lines.extend(compact_baseline_table(report))
                lines.extend(warning_count(report))
    elif report is not None:
        # The servers ran but no perf test got to a result: what NCCL logged still tells.
        lines.extend(nccl_debug_lines(report, titled=True, quiet=quiet))
    if report is not None:
        lines.extend(servers_and_files(report, quiet=quiet, verbose=verbosity >= VERBOSE))
    failed = report.control_regressions() if report is not None else []
    if failed and report is not None:
        lines.append(TerminalLine(f"kimiperf: slower than the control ({report.reference_profile}, the recorded "
                                  "build, booted in this session)", sep="!", markup=LOUD))
        lines.extend(TerminalLine(f"FAILED {r.test} [{r.profile}] {comparison_line(r.comparison)}", markup=RED)
                     for r in failed if r.comparison is not None)
    errors = list(report.errors) if report is not None else []
    if output_error:  # the reporter's own failures: never one of the report's (reporter.output_errors)
        errors.append(output_error)
    if errors:
        lines.append(TerminalLine("kimiperf: reports and baselines", sep="!", markup=LOUD))
        lines.extend(TerminalLine(f"ERROR: {error}", markup=RED) for error in errors)
    outcome = outcome_line(report, report.record_command) if report is not None else None
    if outcome is not None and report is not None and (quiet or not report.results):
        # Last, where the eye lands: what the run judged and what to do next.
        lines.append(TerminalLine("kimiperf: what this run showed", sep="="))
        lines.extend(wrapped(outcome, indent=0))
    if decision is not None and (end := end_line(decision)) is not None:
        lines.append(TerminalLine(end))
    return lines


def end_line(decision: RunDecision) -> str | None:
    """The terminal's last word on a run that ends with an exit status of the plugin's own
    (judge/decide.py); None for every other end."""
    match decision.end:
        case RunEnd.ONLY_UNRESOLVED:
            tests = decision.unresolved_tests
            return (f"kimiperf: every failure was UNRESOLVED ({tests} test{'s' * (tests != 1)}: a change beyond the "
                    "tolerance that one boot of an attached server cannot convict): exit status "
                    f"{decision.exit_status}; give the deployment a restart_command so the run can take more boots")
        case RunEnd.ONLY_INVALID:
            tests = decision.invalid_tests
            return (f"kimiperf: every failure was an INVALID measurement ({tests} test{'s' * (tests != 1)}: a busy "
                    f"host or a client-bound load, nothing learned about the build): exit status "
                    f"{decision.exit_status} (EX_TEMPFAIL), rerun on a quiet runner")
        case RunEnd.PYTEST | RunEnd.CONTROL_REGRESSION | RunEnd.OUTPUT_ERROR:
            return None
        case _:
            assert_never(decision.end)


def _full_sections(report: SessionReport) -> list[TerminalLine]:
    """What ``-v`` adds: every boot's row, the baselines' detail, the floor, the roofline, the
    server's view and the warnings."""
    lines = []
    profiles = _profile_section(report, verbose=True)
    lines.extend(profiles)
    lines.extend(nccl_debug_lines(report, titled=not profiles, quiet=False))
    lines.extend(_baseline_section(report, verbose=True))
    floors = _floor_section(report)
    lines.extend(floors)
    lines.extend(roofline_lines(report, titled=not floors))
    lines.extend(server_view_section(report))
    lines.extend(warning_section(report))
    return lines


# -- profile comparison -----------------------------------------------------------------------


def _profile_section(report: SessionReport, *, verbose: bool) -> list[TerminalLine]:
    if not report.compared_profiles():
        return []
    ref = report.reference_profile
    tails = report.has_tails()
    lines = [TerminalLine(f"kimiperf: profiles vs {ref}", sep="=")]
    lines.append(TerminalLine(f"{figure_legend(tails)};"))
    lines.append(TerminalLine(f"change vs {ref}: of the boots' geometric mean, with its {INTERVAL_LEGEND}"))
    blocks = report.test_blocks()
    header = ["metric", "profile", *range_names(tails), "change", "CI", "verdict"]
    rows: list[tuple[list[str], Mapping[str, bool], list[str]]] = []  # cells, markup, details
    for block in blocks:
        for metric in block.metrics:
            for i, cell in enumerate(metric.cells):
                rows.append((_profile_cells(metric, cell, first=i == 0), _cell_markup(cell),
                             _cell_details(cell, ref) if verbose else []))
    table = Table(header, aligns="llrlrll")
    for cells, _, _ in rows:
        table.add(cells)
    stacked = table.width() > MAX_WIDTH
    if stacked:
        table = Table(header[1:], aligns="lrlrll", indent=4)
        for cells, _, _ in rows:
            table.add(cells[1:])
    row_iter = iter(rows)
    for block in blocks:
        title = f"{block.test} ({block.scenario})" if block.scenario else block.test
        lines.append(TerminalLine(title, markup={"bold": True}))
        lines.append(TerminalLine(table.format(table.header), markup={"bold": True}))
        for metric in block.metrics:
            if stacked:
                lines.append(TerminalLine(f"  {metric.heading}"))
            for _ in metric.cells:
                cells, markup, details = next(row_iter)
                lines.append(TerminalLine(table.format(cells[1:] if stacked else cells), markup=markup))
                lines.extend(TerminalLine(" " * 6 + d) for d in details)
    return lines


def _profile_cells(metric: MetricBlock, cell: ProfileCell, *, first: bool) -> list[str]:
    heading = metric.heading if first else ""
    base = [heading, cell.profile, fmt_value(cell.figure.value), fmt_range(cell.figure)]
    if cell.note:
        return base + ["", "", cell.note]
    if cell.comparison is None:
        return base + ["", "", "reference" if cell.is_reference else ""]
    c = cell.comparison
    return base + [fmt_change(c.change), fmt_ci(c.ci_low, c.ci_high), profile_verdict(c)]


def _cell_markup(cell: ProfileCell) -> Mapping[str, bool]:
    if cell.note:
        return YELLOW
    if cell.comparison is None:
        return {}
    if cell.comparison.verdict is VerdictKind.REGRESSION:
        return RED  # a slower profile is a finding, not a failed test: red, but not loud
    return verdict_markup(cell.comparison.verdict.value)


def _cell_details(cell: ProfileCell, reference: str) -> list[str]:
    parts = [f"n={cell.n}"]
    if cell.comparison is not None:
        c = cell.comparison
        parts.append(f"rests on {rests_on(c)} ({reference}), tolerance {c.tolerance * 100:g}%")
    return textwrap.wrap(", ".join(parts), width=MAX_WIDTH - 6, subsequent_indent="  ") + _wrap_samples(cell.samples)


def _wrap_samples(samples: Sequence[float]) -> list[str]:
    words = [fmt_value(s) for s in samples]
    lines: list[str] = []
    current = "samples:"
    for word in words:
        if len(current) + 1 + len(word) > MAX_WIDTH - 8:
            lines.append(current)
            current = "        "
        current += " " + word
    lines.append(current)
    return lines


# -- baselines --------------------------------------------------------------------------------


def _baseline_section(report: SessionReport, *, verbose: bool) -> list[TerminalLine]:
    rows = report.baseline_rows()
    if not rows:
        return []
    where = report.baselines_path or "baselines"
    lines = [TerminalLine(f"kimiperf: against baselines ({where})", sep="=")]
    if all(row.baseline is None for row in rows):
        # Nothing was compared: one line per reason says it all; a row per metric would only
        # repeat "no baseline for this hardware" for every test.
        reasons: dict[str, int] = {}
        for row in rows:
            reasons[row.message] = reasons.get(row.message, 0) + 1
        for reason, count in reasons.items():
            lines.extend(wrapped(f"{reason} "
                                 f"({plural(count, 'metric')})", indent=0, markup=YELLOW))
        return lines
    header = ["metric", "current", "baseline", "change", "90% CI", "verdict"]
    table = Table(header, aligns="lrrrll", indent=4)
    groups: dict[tuple[str, str], list[BaselineRow]] = {}
    for row in rows:
        groups.setdefault((row.test, row.profile), []).append(row)
        if row.baseline is not None:
            table.add(_baseline_cells(row))
    for (test, profile), group in groups.items():
        lines.append(TerminalLine(f"{test} [{profile}]", markup={"bold": True}))
        if all(row.baseline is None for row in group):
            lines.extend(wrapped(_shared_message(group), indent=2,
                                 markup=YELLOW))
            continue
        lines.append(TerminalLine(table.format(header), markup={"bold": True}))
        for row in group:
            if row.baseline is None:
                lines.extend(wrapped(f"{row.heading}: {row.message}",
                                     indent=4, markup=YELLOW))
                continue
            lines.append(TerminalLine(table.format(_baseline_cells(row)),
                                      markup=verdict_markup(row.baseline.verdict.value)))
            if verbose:
                b = row.baseline
                detail = (f"{'IQR' if row.figure.quantile is None else '90% CI of the ' + row.figure.name} "
                          f"{fmt_range(row.figure)}, {b.boots_current} boot(s) vs "
                          f"{b.boots_reference} baseline boots, boot spread "
                          f"{fmt_spread(_spread(b.spread_sd_log))} ({source_text(b.spread_source)}), "
                          f"tolerance {b.tolerance * 100:g}%")
                lines.extend(TerminalLine(" " * 6 + part) for part in
                             textwrap.wrap(detail, width=MAX_WIDTH - 6, subsequent_indent="  "))
    return lines


def _baseline_cells(row: BaselineRow) -> list[str]:
    b = row.baseline
    if b is None:
        return [row.heading, fmt_value(row.figure.value), "", "", "", ""]
    verdict = "REGRESSION" if b.verdict is VerdictKind.REGRESSION else b.verdict.value
    return [
        row.heading, fmt_value(row.figure.value), fmt_value(b.median_reference), fmt_change(b.change),
        fmt_ci(b.ci_low, b.ci_high), verdict,
    ]


def _limits(floor: FloorResult | None) -> list[tuple[str, float]]:
    if floor is None:
        return []
    return [(name, value) for name, value in (("floor", floor.floor), ("target", floor.target)) if value is not None]


def _shared_message(group: Sequence[BaselineRow]) -> str:
    messages = {row.message for row in group}
    if len(messages) == 1:
        return next(iter(messages))
    return "; ".join(f"{row.heading}: {row.message}" for row in group)


# -- floors -------------------------------------------------------


def _floor_section(report: SessionReport) -> list[TerminalLine]:
    floored = report.floor_results()
    if not floored:
        return []
    dep = report.deployment
    first = floored[0].floor
    limits = ", ".join(f"{name} {fmt_value(value)} tok/s" for name, value in _limits(first))
    title = f"kimiperf: decode floor of {dep.get('name', 'the deployment')}"
    lines = [TerminalLine(f"{title} ({limits})" if limits else title, sep="=")]
    table = Table(["profile", "decode tok/s", "status"], aligns="lrl", indent=4)
    for res in floored:
        table.add([boot_label(res), fmt_value(res.floor.median if res.floor else None), ""])
    current_test = None
    for res in floored:
        floor = res.floor
        if floor is None:
            continue
        if res.test != current_test:
            current_test = res.test
            lines.append(TerminalLine(res.test, markup={"bold": True}))
            lines.append(TerminalLine(table.format(table.header), markup={"bold": True}))
        status = floor.status.value
        lines.append(TerminalLine(
            table.format([boot_label(res), fmt_value(floor.median),
                          "BELOW FLOOR" if status == "below floor" else status]),
            markup=floor_markup(status)))
    return lines


# -- -q -----------------------------------------------------------------------------------------


def _quiet_verdicts(report: SessionReport) -> list[TerminalLine]:
    ref = report.reference_profile
    verdicts: dict[str, list[TerminalLine]] = {}
    if report.compared_profiles():
        for block in report.test_blocks():
            lines = verdicts.setdefault(block.test, [])
            for metric in block.metrics:
                reference = next((c for c in metric.cells if c.is_reference), None)
                for cell in metric.cells:
                    if cell.is_reference:
                        continue
                    head = f"  {metric.heading}: {cell.profile} {fmt_value(cell.figure.value)}"
                    if reference is not None:
                        head += f" vs {ref} {fmt_value(reference.figure.value)}"
                    if cell.note is None and cell.comparison is None:
                        continue  # an earlier boot: its profile is compared on its last boot
                    if cell.note or cell.comparison is None:
                        lines.append(TerminalLine(f"{head}: {cell.note}", markup=YELLOW))
                        continue
                    c = cell.comparison
                    lines.append(TerminalLine(
                        f"{head}: {fmt_change(c.change)} ({fmt_ci(c.ci_low, c.ci_high)}) {profile_verdict(c)}",
                        markup=_cell_markup(cell)))
    missing: dict[str, int] = {}
    for row in report.baseline_rows():
        if row.baseline is None:
            missing[row.message] = missing.get(row.message, 0) + 1
            continue
        _, current, base, change, ci, verdict = _baseline_cells(row)
        verdicts.setdefault(row.test, []).append(TerminalLine(
            f"  [{row.profile}] {row.heading}: {current} vs baseline {base}: {change} ({ci}) {verdict}",
            markup=verdict_markup(row.baseline.verdict.value)))
    for res in report.floor_results():
        floor = res.floor
        if floor is None:
            continue
        status = floor.status.value
        limits = ", ".join(f"{name} {fmt_value(value)}" for name, value in _limits(floor))
        verdicts.setdefault(res.test, []).append(TerminalLine(
            f"  [{boot_label(res)}] decode {fmt_value(floor.median)} tok/s: "
            f"{'BELOW FLOOR' if status == 'below floor' else status} ({limits})",
            markup=floor_markup(status)))
    lines = []
    for test, test_lines in verdicts.items():
        if test_lines:
            lines.append(TerminalLine(test))
            lines.extend(test_lines)
    for reason, count in missing.items():
        lines.extend(wrapped(f"baselines: {reason} "
                             f"({plural(count, 'metric')})", indent=0, markup=YELLOW))
    if lines:
        lines.insert(0, TerminalLine("kimiperf", sep="="))
    return lines


# -- helpers --------------------------------------------------------------------------------------


def _spread(sd_log: object) -> float | None:
    return None if not isinstance(sd_log, (int, float)) else math.expm1(float(sd_log))
