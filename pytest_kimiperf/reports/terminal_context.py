"""The terminal summary's sections about the run itself, beside its verdicts.

What NCCL logged it applied (``--kimiperf-nccl-debug``), the decode ceiling (roofline), the server's own
view next to the client's, the warnings, and the servers and files: boots, leftovers, where
the reports and baselines went. Pure functions of the report, like the rest of the summary.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from pytest_kimiperf.numbers import fmt_value
from pytest_kimiperf.reports.model import SessionReport
from pytest_kimiperf.reports.outputs import output_labels
from pytest_kimiperf.reports.nccl_check import APPLIED, DIFFERENT, NOT_SEEN
from pytest_kimiperf.reports.sentences import say
from pytest_kimiperf.reports.terminal_layout import (
    GREEN, LOUD, MAX_WIDTH, RED, YELLOW, Table, TerminalLine, plural, wrapped,
)

# -- --kimiperf-nccl-debug ---------------------------------------------------------------------------

_NCCL_DEBUG_TITLE = "NCCL variables in the server logs (--kimiperf-nccl-debug)"


def nccl_debug_lines(report: SessionReport, *, titled: bool, quiet: bool) -> list[TerminalLine]:
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
    table = Table(["variable", "verdict"], aligns="ll", indent=4)  # one column width for all profiles
    for variables in shown.values():
        for v in variables:
            table.add([f"{v.variable}={v.expected}", v.message])
    for check in checks:
        log = f" (log: {check.log_path})" if check.log_path else ""
        lines.append(TerminalLine(f"  {check.profile}{log}"))
        if check.error:
            lines.append(TerminalLine(f"    {check.error}", markup=YELLOW))
        for v in shown[check.profile]:
            lines.append(TerminalLine(table.format([f"{v.variable}={v.expected}", v.message]),
                                      markup=_NCCL_MARKUP.get(v.status, {})))
        if not quiet:
            for note in check.notes:
                lines.extend(wrapped(f"note: {note}", indent=4))
    return lines


_NCCL_MARKUP: Mapping[str, Mapping[str, bool]] = {APPLIED: GREEN, NOT_SEEN: YELLOW, DIFFERENT: RED}


def roofline_lines(report: SessionReport, *, titled: bool) -> list[TerminalLine]:
    roof = report.roofline
    if roof is None:
        return []
    title = "decode ceiling (roofline)"
    lines = [TerminalLine(f"kimiperf: {title}", sep="=") if titled
             else TerminalLine(title, markup={"bold": True})]
    if not roof.known:
        lines.extend(wrapped(roof.arithmetic_line(), indent=2, markup=YELLOW))
        return lines
    lines.extend(wrapped(roof.arithmetic_line(), indent=2))
    current_test = None
    for m in roof.measurements:
        if m.test != current_test:
            current_test = m.test
            lines.append(TerminalLine(f"  {m.test}"))
        lines.append(TerminalLine(f"    {m.line()}"))
    for note in roof.notes:
        lines.extend(wrapped(f"note: {note}", indent=2))
    return lines


def server_view_section(report: SessionReport) -> list[TerminalLine]:
    rows = report.server_views()
    if not rows:
        return []
    header = ["profile", "TTFT ms: server", "client", "ITL ms: server", "client", "tokens: server", "client"]
    table = Table(header, aligns="lrrrrrr", indent=4)
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


def warning_section(report: SessionReport) -> list[TerminalLine]:
    warnings = report.warnings()
    if not warnings:
        return []
    lines = [TerminalLine("kimiperf: warnings", sep="=")]
    for warning in warnings:
        wrapped = textwrap.wrap(warning, width=MAX_WIDTH, subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False)
        lines.extend(TerminalLine(part, markup=YELLOW) for part in wrapped)
    return lines


def servers_and_files(report: SessionReport, *, quiet: bool, verbose: bool = True) -> list[TerminalLine]:
    """Each server's boots and log, the files written, and any leftover process (loud at every
    verbosity); ``verbose`` adds each boot's account, the weight cache and pytest-benchmark's note."""
    lines: list[TerminalLine] = []
    loud: list[TerminalLine] = []
    for facts in report.profiles:
        for leftover in facts.leftovers:
            loud.append(TerminalLine(
                f"LEFTOVER process of the {facts.name} server survived SIGKILL: {leftover}", markup=LOUD))
        if facts.error:
            loud.append(TerminalLine(f"server {facts.name} failed: {facts.error}", markup=RED))
        if quiet:
            continue
        if facts.boots is None:
            boot = "not started by this process (an xdist worker or --kimiperf-server-url)"
        elif facts.boots == 0:
            boot = "not started"
        else:
            ready = f", ready after {facts.boot_s:.0f} s" if facts.boot_s is not None else ""
            boot = f"booted {facts.boots}x{ready}"
        log = f"; log: {facts.log_path}" if facts.log_path else ""
        lines.append(TerminalLine(f"server {facts.name}: {boot}{log}"))
        if verbose:
            lines.extend(TerminalLine(f"  {account.summary()}") for account in facts.boot_accounts)
        for var, (shell, value) in sorted(facts.overridden_shell_env.items()):
            lines.append(TerminalLine(
                f"  profile {facts.name} overrides {var}={shell!r} from the shell with {value!r}", markup=YELLOW))
    wc = report.weight_cache
    if wc is not None:
        loud.extend(TerminalLine(f"LEFTOVER process of the weight-cache daemons survived SIGKILL: {p}",
                                 markup=LOUD) for p in wc.leftovers)
        if verbose and not quiet:
            lines.append(TerminalLine(wc.summary()))
    if not quiet:
        for key, label in output_labels().items():  # each format's own label (reports/outputs.py)
            if key in report.outputs:
                extra = f" ({plural(len(report.plot_files), 'PNG file')})" if key == "plots" else ""
                lines.append(TerminalLine(f"{label}: {report.outputs[key]}{extra}"))
        if report.benchmark_rows_hidden and verbose:
            lines.extend(wrapped(
                f"pytest-benchmark: its table leaves out {plural(report.benchmark_rows_hidden, 'perf test')} "
                "(one round each, the scenario's wall time, is no distribution to tabulate); its JSON and "
                "storage keep them, with the LLM figures in extra_info", indent=0))
    if report.baselines_update is not None:
        update = report.baselines_update
        if update.entries:
            how = "appended (a passing run, --kimiperf-append-on-pass)" if update.on_pass else "written"
            lines.append(TerminalLine(
                f"baselines {how}: {update.path} ({plural(update.entries, 'entry', 'entries')})",
                markup=GREEN))
        else:
            lines.append(TerminalLine(
                "baselines: nothing written (no perf test produced valid samples)", markup=YELLOW))
        for why in update.not_recorded:
            lines.append(TerminalLine(f"baselines: not recorded: {why}", markup=YELLOW))
    if report.not_appended is not None:
        lines.append(TerminalLine(f"baselines: {say(report.not_appended)}", markup=YELLOW))
    if not lines and not loud:
        return []
    out = [TerminalLine("kimiperf: servers and files", sep="=")] if lines and not quiet else []
    out.extend(lines)
    if loud:
        out.append(TerminalLine("kimiperf: server trouble", sep="!", markup=LOUD))
        out.extend(loud)
    return out
