"""The terminal summary: the session's answer on one screen, as lines for pytest's reporter.

Rendering returns :class:`TerminalLine` objects instead of writing, so the layout is a pure
function of the report and the verbosity; ``session_outputs`` hands the lines to the terminal
reporter's ``write_sep``/``write_line``, whose markup is dropped where the terminal has no colour.
Tables keep to :data:`MAX_WIDTH` columns: when the metric names make a row too wide, the metric
moves to a line of its own above its profiles.
"""

from __future__ import annotations

import math

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_kimiperf.reports.model import (
    boot_label,
    fmt_spread,
    BaselineRow,
    MetricBlock,
    ProfileCell,
    SessionReport,
    fmt_ci,
    fmt_iqr,
    fmt_pct,
    fmt_value,
    profile_verdict,
)
from pytest_kimiperf.reports.nccl_check import APPLIED, DIFFERENT, NOT_SEEN
from pytest_kimiperf.judge.stats import VerdictKind

MAX_WIDTH = 100
QUIET = -1
VERBOSE = 1

_RED = {"red": True}
_LOUD = {"red": True, "bold": True}
_YELLOW = {"yellow": True}
_GREEN = {"green": True}


@dataclass(frozen=True)
class TerminalLine:
    """One line of the summary: a separator with a title when ``sep`` is set, else plain text."""

    text: str
    sep: str | None = None
    markup: Mapping[str, bool] = field(default_factory=dict)


def render_summary(
    report: SessionReport | None,
    *,
    verbosity: int,
    output_error: str | None = None,
) -> list[TerminalLine]:
    """The summary's lines: ``-q`` keeps the verdicts and anything alarming, ``-v`` adds samples."""
    lines: list[TerminalLine] = []
    if report is not None and report.results:
        if verbosity <= QUIET:
            lines.extend(_quiet_verdicts(report))
            lines.extend(_nccl_debug_lines(report, titled=True, quiet=True))
        else:
            profiles = _profile_section(report, verbose=verbosity >= VERBOSE)
            lines.extend(profiles)
            lines.extend(_nccl_debug_lines(report, titled=not profiles, quiet=False))
            lines.extend(_baseline_section(report, verbose=verbosity >= VERBOSE))
            floors = _floor_section(report)
            lines.extend(floors)
            lines.extend(_roofline_lines(report, titled=not floors))
            lines.extend(_server_view_section(report))
            lines.extend(_warning_section(report))
    elif report is not None:
        # The servers ran but no perf test got to a result: what NCCL logged still tells.
        lines.extend(_nccl_debug_lines(report, titled=True, quiet=verbosity <= QUIET))
    if report is not None:
        lines.extend(_servers_and_files(report, quiet=verbosity <= QUIET))
    errors = list(report.errors) if report is not None else []
    if output_error and output_error not in errors:
        errors.append(output_error)
    if errors:
        lines.append(TerminalLine("kimiperf: reports and baselines", sep="!", markup=_LOUD))
        lines.extend(TerminalLine(f"ERROR: {error}", markup=_RED) for error in errors)
    return lines


# -- NCCL profile comparison ------------------------------------------------------------------


def _profile_section(report: SessionReport, *, verbose: bool) -> list[TerminalLine]:
    if not report.compared_profiles():
        return []
    ref = report.reference_profile
    lines = [
        TerminalLine(f"kimiperf: NCCL profiles vs {ref}", sep="="),
        TerminalLine(f"median (IQR) of each boot; change vs {ref} of the mean boot log-median, with its 90% CI"),
    ]
    blocks = report.test_blocks()
    header = ["metric", "profile", "median", "IQR", "change", "90% CI", "verdict"]
    rows: list[tuple[list[str], Mapping[str, bool], list[str]]] = []  # cells, markup, details
    for block in blocks:
        for metric in block.metrics:
            for i, cell in enumerate(metric.cells):
                rows.append((_profile_cells(metric, cell, first=i == 0), _cell_markup(cell),
                             _cell_details(cell, ref) if verbose else []))
    table = _Table(header, aligns="llrlrll")
    for cells, _, _ in rows:
        table.add(cells)
    stacked = table.width() > MAX_WIDTH
    if stacked:
        table = _Table(header[1:], aligns="lrlrll", indent=4)
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
    base = [heading, cell.profile, fmt_value(cell.median), fmt_iqr(cell.q1, cell.q3)]
    if cell.note:
        return base + ["", "", cell.note]
    if cell.comparison is None:
        return base + ["", "", "reference" if cell.is_reference else ""]
    c = cell.comparison
    return base + [fmt_pct(c.change), fmt_ci(c.ci_low, c.ci_high), profile_verdict(c)]


def _cell_markup(cell: ProfileCell) -> Mapping[str, bool]:
    if cell.note:
        return _YELLOW
    if cell.comparison is None:
        return {}
    if cell.comparison.verdict is VerdictKind.REGRESSION:
        return _RED  # a slower profile is a finding, not a failed test: red, but not loud
    return _verdict_markup(cell.comparison.verdict.value)


def _cell_details(cell: ProfileCell, reference: str) -> list[str]:
    parts = [f"n={cell.n}"]
    if cell.comparison is not None:
        c = cell.comparison
        parts.append(f"rests on {c.rests_on()} ({reference}), tolerance {c.tolerance * 100:g}%")
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


# -- --nccl-debug ---------------------------------------------------------------------------

_NCCL_DEBUG_TITLE = "NCCL variables in the server logs (--nccl-debug)"


def _nccl_debug_lines(report: SessionReport, *, titled: bool, quiet: bool) -> list[TerminalLine]:
    checks = report.nccl_checks()
    if quiet:
        # -q keeps what is alarming: a variable NCCL logged with another value.
        checks = [check for check in checks if check.mismatches or check.error]
    if not checks:
        return []
    if titled:
        lines = [TerminalLine(f"kimiperf: {_NCCL_DEBUG_TITLE}", sep="=")]
    else:
        lines = [TerminalLine(_NCCL_DEBUG_TITLE, markup={"bold": True})]
    shown = {check.profile: [v for v in check.variables if not quiet or v.status == DIFFERENT]
             for check in checks}
    table = _Table(["variable", "verdict"], aligns="ll", indent=4)  # one column width for all profiles
    for variables in shown.values():
        for v in variables:
            table.add([f"{v.variable}={v.expected}", v.message])
    for check in checks:
        log = f" (log: {check.log_path})" if check.log_path else ""
        lines.append(TerminalLine(f"  {check.profile}{log}"))
        if check.error:
            lines.append(TerminalLine(f"    {check.error}", markup=_YELLOW))
        for v in shown[check.profile]:
            lines.append(TerminalLine(table.format([f"{v.variable}={v.expected}", v.message]),
                                      markup=_NCCL_MARKUP.get(v.status, {})))
        if not quiet:
            for note in check.notes:
                lines.extend(_wrapped(f"note: {note}", indent=4))
    return lines


_NCCL_MARKUP: Mapping[str, Mapping[str, bool]] = {APPLIED: _GREEN, NOT_SEEN: _YELLOW, DIFFERENT: _RED}


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
            lines.append(TerminalLine(f"{reason} ({_plural(count, 'metric')})", markup=_YELLOW))
        return lines
    header = ["metric", "current", "baseline", "change", "90% CI", "verdict"]
    table = _Table(header, aligns="lrrrll", indent=4)
    groups: dict[tuple[str, str], list[BaselineRow]] = {}
    for row in rows:
        groups.setdefault((row.test, row.profile), []).append(row)
        if row.baseline is not None:
            table.add(_baseline_cells(row))
    for (test, profile), group in groups.items():
        lines.append(TerminalLine(f"{test} [{profile}]", markup={"bold": True}))
        if all(row.baseline is None for row in group):
            lines.append(TerminalLine(f"  {_shared_message(group)}", markup=_YELLOW))
            continue
        lines.append(TerminalLine(table.format(header), markup={"bold": True}))
        for row in group:
            if row.baseline is None:
                lines.append(TerminalLine(f"    {row.heading}: {row.message}", markup=_YELLOW))
                continue
            lines.append(TerminalLine(table.format(_baseline_cells(row)),
                                      markup=_verdict_markup(str(row.baseline["verdict"]))))
            if verbose:
                b = row.baseline
                detail = (f"IQR {fmt_iqr(row.q1, row.q3)}, {b.get('boots_current')} boot(s) vs "
                          f"{b.get('boots_reference')} baseline boots, boot spread "
                          f"{fmt_spread(_spread(b.get('spread_sd_log')))} ({b.get('spread_source')}), "
                          f"tolerance {float(b['tolerance']) * 100:g}%")
                lines.extend(TerminalLine(" " * 6 + part) for part in
                             textwrap.wrap(detail, width=MAX_WIDTH - 6, subsequent_indent="  "))
    return lines


def _baseline_cells(row: BaselineRow) -> list[str]:
    b = row.baseline or {}
    verdict = str(b.get("verdict", ""))
    if verdict == VerdictKind.REGRESSION.value:
        verdict = "REGRESSION"
    return [
        row.heading, fmt_value(row.median),
        fmt_value(_num(b.get("median_reference"))), fmt_pct(_num(b.get("change"))),
        fmt_ci(_num(b.get("ci_low")), _num(b.get("ci_high"))), verdict,
    ]


def _shared_message(group: Sequence[BaselineRow]) -> str:
    messages = {row.message for row in group}
    if len(messages) == 1:
        return next(iter(messages))
    return "; ".join(f"{row.heading}: {row.message}" for row in group)


# -- floors, warnings, servers and files -------------------------------------------------------


def _floor_section(report: SessionReport) -> list[TerminalLine]:
    floored = report.floor_results()
    if not floored:
        return []
    dep = report.deployment
    first = floored[0].floor or {}
    limits = ", ".join(
        f"{name} {fmt_value(_num(first.get(name)))} tok/s"
        for name in ("floor", "target") if first.get(name) is not None
    )
    title = f"kimiperf: decode floor of {dep.get('name', 'the deployment')}"
    lines = [TerminalLine(f"{title} ({limits})" if limits else title, sep="=")]
    table = _Table(["profile", "decode tok/s", "status"], aligns="lrl", indent=4)
    for res in floored:
        table.add([boot_label(res), fmt_value(_num((res.floor or {}).get("median"))), ""])
    current_test = None
    for res in floored:
        floor = res.floor or {}
        if res.test != current_test:
            current_test = res.test
            lines.append(TerminalLine(res.test, markup={"bold": True}))
            lines.append(TerminalLine(table.format(table.header), markup={"bold": True}))
        status = str(floor.get("status", ""))
        lines.append(TerminalLine(
            table.format([boot_label(res), fmt_value(_num(floor.get("median"))),
                          "BELOW FLOOR" if status == "below floor" else status]),
            markup=_floor_markup(status)))
    return lines


def _roofline_lines(report: SessionReport, *, titled: bool) -> list[TerminalLine]:
    roof = report.roofline
    if roof is None:
        return []
    title = "decode ceiling (roofline)"
    lines = [TerminalLine(f"kimiperf: {title}", sep="=") if titled
             else TerminalLine(title, markup={"bold": True})]
    if not roof.known:
        lines.extend(_wrapped(roof.arithmetic_line(), indent=2, markup=_YELLOW))
        return lines
    lines.extend(_wrapped(roof.arithmetic_line(), indent=2))
    current_test = None
    for m in roof.measurements:
        if m.test != current_test:
            current_test = m.test
            lines.append(TerminalLine(f"  {m.test}"))
        lines.append(TerminalLine(f"    {m.line()}"))
    for note in roof.notes:
        lines.extend(_wrapped(f"note: {note}", indent=2))
    return lines


def _wrapped(text: str, *, indent: int, markup: Mapping[str, bool] | None = None) -> list[TerminalLine]:
    parts = textwrap.wrap(text, width=MAX_WIDTH, initial_indent=" " * indent,
                          subsequent_indent=" " * (indent + 4), break_long_words=False,
                          break_on_hyphens=False)
    return [TerminalLine(part, markup=markup or {}) for part in parts]


def _server_view_section(report: SessionReport) -> list[TerminalLine]:
    rows = report.server_views()
    if not rows:
        return []
    header = ["profile", "TTFT ms: server", "client", "ITL ms: server", "client", "tokens: server", "client"]
    table = _Table(header, aligns="lrrrrrr", indent=4)
    by_test: dict[str, list[list[str]]] = {}
    for row in rows:
        cells = [row.profile, *(fmt_value(v) for v in (
            row.server_ttft_ms, row.client_ttft_ms, row.server_itl_ms, row.client_itl_ms,
            row.server_tokens, row.client_tokens))]
        table.add(cells)
        by_test.setdefault(row.test, []).append(cells)
    lines = [TerminalLine("kimiperf: the server's view (vLLM /metrics) next to the client's", sep="="),
             TerminalLine("means over the measured requests; the server's are estimated from its histograms")]
    for test, test_rows in by_test.items():
        lines.append(TerminalLine(test, markup={"bold": True}))
        lines.append(TerminalLine(table.format(header), markup={"bold": True}))
        lines.extend(TerminalLine(table.format(cells)) for cells in test_rows)
    return lines


def _warning_section(report: SessionReport) -> list[TerminalLine]:
    warnings = report.warnings()
    if not warnings:
        return []
    lines = [TerminalLine("kimiperf: warnings", sep="=")]
    for warning in warnings:
        wrapped = textwrap.wrap(warning, width=MAX_WIDTH, subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False)
        lines.extend(TerminalLine(part, markup=_YELLOW) for part in wrapped)
    return lines


def _servers_and_files(report: SessionReport, *, quiet: bool) -> list[TerminalLine]:
    lines: list[TerminalLine] = []
    loud: list[TerminalLine] = []
    for facts in report.profiles:
        for leftover in facts.leftovers:
            loud.append(TerminalLine(
                f"LEFTOVER process of the {facts.name} server survived SIGKILL: {leftover}", markup=_LOUD))
        if facts.error:
            loud.append(TerminalLine(f"server {facts.name} failed: {facts.error}", markup=_RED))
        if quiet:
            continue
        if facts.boots is None:
            boot = "not started by this process (an xdist worker or --server-url)"
        elif facts.boots == 0:
            boot = "not started"
        else:
            ready = f", ready after {facts.boot_s:.0f} s" if facts.boot_s is not None else ""
            boot = f"booted {facts.boots}x{ready}"
        log = f"; log: {facts.log_path}" if facts.log_path else ""
        lines.append(TerminalLine(f"server {facts.name}: {boot}{log}"))
        lines.extend(TerminalLine(f"  {account.summary()}") for account in facts.boot_accounts)
        for var, (shell, value) in sorted(facts.overridden_shell_env.items()):
            lines.append(TerminalLine(
                f"  profile {facts.name} overrides {var}={shell!r} from the shell with {value!r}", markup=_YELLOW))
    wc = report.weight_cache
    if wc is not None:
        loud.extend(TerminalLine(f"LEFTOVER process of the weight-cache daemons survived SIGKILL: {p}",
                                 markup=_LOUD) for p in wc.leftovers)
        if not quiet:
            lines.append(TerminalLine(wc.summary()))
    if not quiet:
        labels = {"json": "JSON report", "markdown": "Markdown summary",
                  "github_step_summary": "Markdown appended to $GITHUB_STEP_SUMMARY", "plots": "plots"}
        for key, label in labels.items():
            if key in report.outputs:
                extra = f" ({_plural(len(report.plot_files), 'PNG file')})" if key == "plots" else ""
                lines.append(TerminalLine(f"{label}: {report.outputs[key]}{extra}"))
    if report.baselines_update is not None:
        update = report.baselines_update
        if update.entries:
            lines.append(TerminalLine(
                f"baselines written: {update.path} ({_plural(update.entries, 'entry', 'entries')})",
                markup=_GREEN))
        else:
            lines.append(TerminalLine(
                "baselines: nothing written (no perf test produced valid samples)", markup=_YELLOW))
        for why in update.not_recorded:
            lines.append(TerminalLine(f"baselines: not recorded: {why}", markup=_YELLOW))
    if not lines and not loud:
        return []
    out = [TerminalLine("kimiperf: servers and files", sep="=")] if lines and not quiet else []
    out.extend(lines)
    if loud:
        out.append(TerminalLine("kimiperf: server trouble", sep="!", markup=_LOUD))
        out.extend(loud)
    return out


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
                    head = f"  {metric.heading}: {cell.profile} {fmt_value(cell.median)}"
                    if reference is not None:
                        head += f" vs {ref} {fmt_value(reference.median)}"
                    if cell.note or cell.comparison is None:
                        lines.append(TerminalLine(f"{head}: {cell.note or 'not compared'}", markup=_YELLOW))
                        continue
                    c = cell.comparison
                    lines.append(TerminalLine(
                        f"{head}: {fmt_pct(c.change)} ({fmt_ci(c.ci_low, c.ci_high)}) {profile_verdict(c)}",
                        markup=_cell_markup(cell)))
    missing: dict[str, int] = {}
    for row in report.baseline_rows():
        if row.baseline is None:
            missing[row.message] = missing.get(row.message, 0) + 1
            continue
        _, current, base, change, ci, verdict = _baseline_cells(row)
        verdicts.setdefault(row.test, []).append(TerminalLine(
            f"  [{row.profile}] {row.heading}: {current} vs baseline {base}: {change} ({ci}) {verdict}",
            markup=_verdict_markup(str(row.baseline["verdict"]))))
    for res in report.floor_results():
        floor = res.floor or {}
        status = str(floor.get("status", ""))
        limits = ", ".join(f"{name} {fmt_value(_num(floor.get(name)))}"
                           for name in ("floor", "target") if floor.get(name) is not None)
        verdicts.setdefault(res.test, []).append(TerminalLine(
            f"  [{boot_label(res)}] decode {fmt_value(_num(floor.get('median')))} tok/s: "
            f"{'BELOW FLOOR' if status == 'below floor' else status} ({limits})",
            markup=_floor_markup(status)))
    lines = []
    for test, test_lines in verdicts.items():
        if test_lines:
            lines.append(TerminalLine(test))
            lines.extend(test_lines)
    for reason, count in missing.items():
        lines.append(TerminalLine(f"baselines: {reason} ({_plural(count, 'metric')})", markup=_YELLOW))
    if lines:
        lines.insert(0, TerminalLine("kimiperf", sep="="))
    return lines


# -- helpers --------------------------------------------------------------------------------------


class _Table:
    """Fixed-width columns sized to their widest cell; the last column is never padded."""

    def __init__(self, header: Sequence[str], *, aligns: str, indent: int = 2) -> None:
        self.header = list(header)
        self.aligns = aligns
        self.indent = indent
        self.widths = [len(h) for h in header]

    def add(self, cells: Sequence[str]) -> None:
        self.widths = [max(w, len(c)) for w, c in zip(self.widths, cells)]

    def width(self) -> int:
        return self.indent + sum(self.widths) + 2 * (len(self.widths) - 1)

    def format(self, cells: Sequence[str]) -> str:
        parts = []
        last = len(cells) - 1
        for i, (cell, width, align) in enumerate(zip(cells, self.widths, self.aligns)):
            if i == last:
                parts.append(cell)
            else:
                parts.append(cell.rjust(width) if align == "r" else cell.ljust(width))
        return (" " * self.indent + "  ".join(parts)).rstrip()


def _spread(sd_log: object) -> float | None:
    return None if not isinstance(sd_log, (int, float)) else math.expm1(float(sd_log))


def _verdict_markup(verdict: str) -> Mapping[str, bool]:
    if verdict == VerdictKind.REGRESSION.value:
        return _LOUD
    if verdict == VerdictKind.IMPROVEMENT.value or verdict == VerdictKind.WITHIN_TOLERANCE.value:
        return _GREEN
    return _YELLOW


def _floor_markup(status: str) -> Mapping[str, bool]:
    return {"below floor": _LOUD, "below target": _YELLOW, "ok": _GREEN}.get(status, {})


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word if count == 1 else plural or word + 's'}"
