"""The terminal summary: the session's answer on one screen, as lines for pytest's reporter.

The summary (:func:`render_summary`) returns :class:`TerminalLine` objects instead of writing, so
the layout is a pure function of the report and the verbosity; what the lines say is gathered in
:mod:`~pytest_kimiperf.reports.answers`. Tables keep to :data:`MAX_WIDTH` columns: a row too wide
puts its test or metric on a line of its own above it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
import math
import textwrap
from typing import assert_never

from pytest_kimiperf.judge.gate import RunDecision, RunEnd
from pytest_kimiperf.judge.notes import FloorResult, HostWatched
from pytest_kimiperf.judge.profiles import INTERVAL_LEGEND
from pytest_kimiperf.judge.stats import Comparison, VerdictKind
from pytest_kimiperf.measure.invalid_causes import advice_for
from pytest_kimiperf.measure.time_account import TimeAccount, TimePart
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_spread, fmt_value
from pytest_kimiperf.reports.answers import (
    CompactRow, AnswerTone, answer_lines, baseline_rows, failure_lines, measured_lines, outcome_line, profile_rows,
    run_verdict, unmeasured_line,
)
from pytest_kimiperf.reports.model import (
    BaselineRow, MetricBlock, ProfileCell, ServerViewRow, SessionReport, boot_label, figure_legend, fmt_range,
    profile_verdict, range_names, short_test,
)
from pytest_kimiperf.reports.nccl import APPLIED, DIFFERENT, NOT_SEEN
from pytest_kimiperf.reports.outputs import output_labels
from pytest_kimiperf.reports.sentences import comparison_line, evidence_text, note_text, source_text


# Building blocks: a line with its markup, fixed-width tables, wrapping.
MAX_WIDTH = 100

_RED = {"red": True}
LOUD = {"red": True, "bold": True}
_YELLOW = {"yellow": True}
_GREEN = {"green": True}


@dataclass(frozen=True)
class TerminalLine:
    """One line of the summary: a separator with a title when ``sep`` is set, else plain text."""

    text: str
    sep: str | None = None
    markup: Mapping[str, bool] = field(default_factory=dict)


def wrapped(text: str, *, indent: int, markup: Mapping[str, bool] | None = None) -> list[TerminalLine]:
    """``text`` wrapped to the summary's width, continuation lines indented four more."""
    parts = textwrap.wrap(text, width=MAX_WIDTH, initial_indent=" " * indent,
                          subsequent_indent=" " * (indent + 4), break_long_words=False,
                          break_on_hyphens=False)
    return [TerminalLine(part, markup=markup or {}) for part in parts]


class Table:
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


def _verdict_markup(verdict: str) -> Mapping[str, bool]:
    """A verdict's colour: a regression loud red, a pass green, anything unresolved yellow."""
    if verdict == VerdictKind.REGRESSION.value:
        return LOUD
    if verdict == VerdictKind.IMPROVEMENT.value or verdict == VerdictKind.WITHIN_TOLERANCE.value:
        return _GREEN
    return _YELLOW


def _floor_markup(status: str) -> Mapping[str, bool]:
    """A decode floor's colour: below the floor loud red, below target yellow, ok green."""
    return {"below floor": LOUD, "below target": _YELLOW, "ok": _GREEN}.get(status, {})


def plural(count: int, word: str, plural: str | None = None) -> str:
    """``1 metric``, ``3 metrics``; ``plural`` for irregular words (``entries``)."""
    return f"{count} {word if count == 1 else plural or word + 's'}"


# Marks the row of a test's primary metric in the compact tables.
_PRIMARY_MARK = "* "


def _answer_section(report: SessionReport) -> list[TerminalLine]:
    """The summary's opening: one line per answer, the failures, and the run's outcome."""
    lines = [TerminalLine("kimiperf: answers", sep="=")]
    for answer in answer_lines(report):
        lines.extend(wrapped(answer.text, indent=0, markup=_TONE_MARKUP[answer.tone]))
    for failure in failure_lines(report):
        lines.extend(wrapped(failure, indent=0, markup=_RED))
    outcome = outcome_line(report, report.record_command)
    if outcome is not None:
        verdict = run_verdict(report)
        lines.extend(wrapped(f"run {verdict}: {outcome}", indent=0, markup=LOUD if verdict != "passed" else {}))
    return lines


_TONE_MARKUP: Mapping[AnswerTone, Mapping[str, bool]] = {AnswerTone.LOUD: LOUD, AnswerTone.WORSE: _RED, AnswerTone.PLAIN: {}}


def _compact_table(rows: Sequence[CompactRow]) -> list[TerminalLine]:
    """One row per metric and profile: change, interval at its level, verdict; the test named
    on its first row, the profile column only where several profiles share the table."""
    several = len({row.profile for row in rows}) > 1
    header = ["test", "metric", *(["profile"] if several else []), "change", "interval", "verdict"]
    cells: list[tuple[str, list[str], Mapping[str, bool]]] = []
    for row in rows:
        c = row.comparison
        verdict = "INVALID measurement" if c is None and row.invalid else row.verdict
        change = [fmt_change(c.change), row.interval] if c is not None else ["", ""]
        metric = f"{_PRIMARY_MARK}{row.metric}" if row.primary else f"{' ' * len(_PRIMARY_MARK)}{row.metric}"
        cells.append((short_test(row.test), [metric, *([row.profile] if several else []), *change, verdict],
                      _row_markup(row)))
    firsts = [i == 0 or test != cells[i - 1][0] for i, (test, _, _) in enumerate(cells)]  # a test's first row
    table = Table(header, aligns="lllrll" if several else "llrll", indent=2)
    beside = [[test if first else "", *text] for (test, text, _), first in zip(cells, firsts)]
    for shown in beside:
        table.add(shown)
    if table.width() <= MAX_WIDTH:
        return [TerminalLine(table.format(header), markup={"bold": True}),
                *(TerminalLine(table.format(shown), markup=markup) for shown, (_, _, markup) in zip(beside, cells))]
    # Too wide with the test beside its rows (long profile names): the test heads its rows.
    table = Table(header[1:], aligns="llrll" if several else "lrll", indent=4)
    for _, text, _ in cells:
        table.add(text)
    lines = [TerminalLine(table.format(header[1:]), markup={"bold": True})]
    for (test, text, markup), first in zip(cells, firsts):
        if first:
            lines.append(TerminalLine(f"  {test}", markup={"bold": True}))
        lines.append(TerminalLine(table.format(text), markup=markup))
    return lines


def _primary_legend(rows: Sequence[CompactRow]) -> list[TerminalLine]:
    if not any(row.primary for row in rows):
        return []
    return [TerminalLine(f"  {_PRIMARY_MARK.strip()} the test's primary metric, the one its answer line speaks of; "
                         "the other rows are secondary")]


def _row_markup(row: CompactRow) -> Mapping[str, bool]:
    if row.note or row.comparison is None:
        return _YELLOW
    return _comparison_markup(row.comparison, in_session=row.in_session)


def _comparison_markup(comparison: Comparison, *, in_session: bool) -> Mapping[str, bool]:
    if in_session and comparison.verdict is VerdictKind.REGRESSION:
        return _RED  # a slower profile is a finding, not a failed test: red, but not loud
    return _verdict_markup(comparison.verdict.value)


def _compact_profile_table(report: SessionReport) -> list[TerminalLine]:
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


def _compact_baseline_table(report: SessionReport) -> list[TerminalLine]:
    """Each profile against its baseline, one row per metric, on its last boot (which rests on
    all its boots)."""
    rows = baseline_rows(report)
    if not rows:
        return []
    title = "kimiperf: against the baseline, on each profile's boots (-v: each boot)"
    return [TerminalLine(title, sep="="), *_compact_table(rows), *_primary_legend(rows)]


def _warning_count(report: SessionReport) -> list[TerminalLine]:
    """One line for the warnings that ``-v`` and the Markdown summary spell out."""
    warnings = report.warnings()
    if not warnings:
        return []
    return [TerminalLine(f"kimiperf: {plural(len(warnings), 'warning')} besides the answers: -v or the Markdown "
                         "summary lists them", markup=_YELLOW)]


_NCCL_DEBUG_TITLE = "NCCL variables in the server logs (--kimiperf-nccl-debug)"


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
    table = Table(["variable", "verdict"], aligns="ll", indent=4)  # one column width for all profiles
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
            for note in check.said():
                lines.extend(wrapped(f"note: {note}", indent=4))
    return lines


_NCCL_MARKUP: Mapping[str, Mapping[str, bool]] = {APPLIED: _GREEN, NOT_SEEN: _YELLOW, DIFFERENT: _RED}


def _roofline_lines(report: SessionReport, *, titled: bool) -> list[TerminalLine]:
    roof = report.roofline
    if roof is None:
        return []
    title = "decode ceiling (roofline)"
    lines = [TerminalLine(f"kimiperf: {title}", sep="=") if titled
             else TerminalLine(title, markup={"bold": True})]
    if not roof.known:
        lines.extend(wrapped(roof.arithmetic_line(), indent=2, markup=_YELLOW))
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


def _server_view_section(report: SessionReport) -> list[TerminalLine]:
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
    return lines + _fidelity_lines(rows)


def _fidelity_lines(rows: Sequence[ServerViewRow]) -> list[TerminalLine]:
    """Each run's fidelity: the engine's time per token (its core's stamps) beside the client's
    mean TPOT over the same window, and their ratio."""
    shown = [row for row in rows if row.client_over_engine is not None]
    if not shown:
        return []
    header = ["test", "profile", "TPOT ms: engine", "client", "client/engine"]
    table = Table(header, aligns="llrrr", indent=4)
    cells = [[short_test(row.test), row.profile, fmt_value(row.engine_tpot_ms), fmt_value(row.client_tpot_ms),
              f"{row.client_over_engine:.3f}"] for row in shown]
    for line in cells:
        table.add(line)
    return [TerminalLine("each run's fidelity: what lies between the engine's clock and the client's"),
            TerminalLine(table.format(header), markup={"bold": True}),
            *(TerminalLine(table.format(line)) for line in cells)]


def _warning_section(report: SessionReport) -> list[TerminalLine]:
    warnings = report.warnings()
    if not warnings:
        return []
    lines = [TerminalLine("kimiperf: warnings", sep="=")]
    for warning in warnings:
        lines.extend(wrapped(warning, indent=0, markup=_YELLOW))
    return lines


def servers_and_files(report: SessionReport, *, quiet: bool, verbose: bool = True) -> list[TerminalLine]:
    """Each server's boots and log, the files written, and any leftover process (loud at every
    verbosity); ``verbose`` adds each boot's account, the weight cache and pytest-benchmark's note."""
    lines: list[TerminalLine] = []
    loud: list[TerminalLine] = []
    for facts in report.profiles:
        if facts.sweep is not None:  # at every verbosity: the run ended processes this session did not start
            lines.append(TerminalLine(facts.sweep.summary(), markup=_YELLOW))
        for leftover in facts.leftovers:
            loud.append(TerminalLine(
                f"LEFTOVER process of the {facts.name} server survived SIGKILL: {leftover}", markup=LOUD))
        if facts.error:
            loud.append(TerminalLine(f"server {facts.name} failed: {facts.error}", markup=_RED))
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
                f"  profile {facts.name} overrides {var}={shell!r} from the shell with {value!r}", markup=_YELLOW))
    # What the host watch said of the load itself, once each (a PCIe link trained below its best is
    # another machine than the baseline's; a power limit the load reached is part of its figure;
    # where the client ran, and a CPU quota).
    remarks = dict.fromkeys(remark for res in report.results for note in res.messages
                            if isinstance(note, HostWatched) for remark in note.remarks)
    lines.extend(TerminalLine(f"host watch: {remark}", markup=_YELLOW) for remark in remarks)
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
                markup=_GREEN))
        else:
            lines.append(TerminalLine(
                "baselines: nothing written (no perf test produced valid samples)", markup=_YELLOW))
        for why in update.not_recorded:
            lines.append(TerminalLine(f"baselines: not recorded: {why}", markup=_YELLOW))
    if report.not_appended is not None:
        lines.append(TerminalLine(f"baselines: {note_text(report.not_appended)}", markup=_YELLOW))
    if not lines and not loud:
        return []
    out = [TerminalLine("kimiperf: servers and files", sep="=")] if lines and not quiet else []
    out.extend(lines)
    if loud:
        out.append(TerminalLine("kimiperf: server trouble", sep="!", markup=LOUD))
        out.extend(loud)
    return out


QUIET = -1
_VERBOSE = 1


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
            if (unmeasured := unmeasured_line(report)) is not None:
                lines.extend(wrapped(unmeasured, indent=0, markup=_YELLOW))
            lines.extend(_nccl_debug_lines(report, titled=True, quiet=True))
        else:
            lines.extend(_answer_section(report))
            if verbosity >= _VERBOSE:
                lines.extend(_full_sections(report))
            else:
                lines.extend(_compact_profile_table(report))
                lines.extend(_nccl_debug_lines(report, titled=True, quiet=False))
                lines.extend(_compact_baseline_table(report))
                lines.extend(_measured_section(report, only_lost=True))
                lines.extend(_warning_count(report))
    elif report is not None:
        # The servers ran but no perf test got to a result: what NCCL logged still tells.
        lines.extend(_nccl_debug_lines(report, titled=True, quiet=quiet))
    if report is not None:
        lines.extend(servers_and_files(report, quiet=quiet, verbose=verbosity >= _VERBOSE))
    failed = report.control_regressions() if report is not None else []
    if failed and report is not None:
        lines.append(TerminalLine(f"kimiperf: slower than the control ({report.reference_profile}, the recorded "
                                  "build, booted in this session)", sep="!", markup=LOUD))
        lines.extend(TerminalLine(f"FAILED {r.test} [{r.profile}] {comparison_line(r.comparison)}", markup=_RED)
                     for r in failed if r.comparison is not None)
    errors = list(report.errors) if report is not None else []
    if output_error:  # the reporter's own failures: never one of the report's (reporter.output_errors)
        errors.append(output_error)
    if errors:
        lines.append(TerminalLine("kimiperf: reports and baselines", sep="!", markup=LOUD))
        lines.extend(TerminalLine(f"ERROR: {error}", markup=_RED) for error in errors)
    if report is not None and report.time_account is not None:
        lines.extend(time_account_lines(report.time_account, quiet=quiet))
    outcome = outcome_line(report, report.record_command) if report is not None else None
    if outcome is not None and report is not None and (quiet or not report.results):
        # Last, where the eye lands: what the run judged and what to do next.
        lines.append(TerminalLine("kimiperf: what this run showed", sep="="))
        lines.extend(wrapped(outcome, indent=0))
    if decision is not None and (end := end_line(decision)) is not None:
        lines.append(TerminalLine(end))
    return lines


def time_account_lines(account: TimeAccount, *, quiet: bool) -> list[TerminalLine]:
    """The session's time part by part (a boot's phases and each test's windows beneath), the
    unaccounted rest, the total they add up to, and the plan's prediction beside the boots;
    ``quiet``: the parts in one line."""
    def secs(seconds: float) -> str:
        return f"{seconds:.1f}" if seconds < 100 else f"{seconds:.0f}"

    def share(seconds: float) -> str:
        return f"{seconds / account.wall_clock_s:.0%}" if account.wall_clock_s > 0 else "-"

    def named(part: TimePart) -> str:
        what = {"boots": "boot", "measuring": "window", "measured again": "window", "server stops": "stop",
                "other tests": "test", "perf tests' set-up, checks and teardown": "test"}.get(part.name)
        return f"{part.name} ({plural(part.count, what)})" if what is not None else part.name

    rest = ("other / unaccounted", account.unaccounted_s)
    total = "total: the pytest process, from its start to session finish"
    if quiet:
        said = ", ".join(f"{name} {secs(s)} s" for name, s in [*((p.name, p.seconds) for p in account.parts), rest])
        return wrapped(f"kimiperf: time, {total}: {secs(account.wall_clock_s)} s: {said}", indent=0)
    table = Table(["part", "s", "share", ""], aligns="lrrl")  # the empty last column pads the shares
    rows: list[tuple[list[str], list[str]]] = []  # each row's cells and the lines beneath it
    for part in account.parts:
        rows.append(([named(part), secs(part.seconds), share(part.seconds), ""], []))
        for row in part.rows:
            beneath = [", ".join(f"{d} {secs(s)} s" for d, s in row.details)] if row.details else []
            label = f"  {row.label}" + (f" ({plural(row.count, 'window')})" if row.count else "")
            rows.append(([label, secs(row.seconds), "", ""], beneath))
    rows.append(([rest[0], secs(rest[1]), share(rest[1]), ""], []))
    rows.append(([total, secs(account.wall_clock_s), share(account.wall_clock_s), ""], []))
    for cells, _ in rows:
        table.add(cells)
    lines = [TerminalLine("kimiperf: where the time went", sep="="), TerminalLine(table.format(table.header))]
    for cells, beneath in rows:
        lines.append(TerminalLine(table.format(cells)))
        for text in beneath:
            lines.extend(wrapped(text, indent=6))
    plan = account.planned
    took = f"this run: {plural(account.boots, 'boot')}, {secs(account.ready_s)} s to ready"
    if plan is None:
        lines.extend(wrapped(f"plan: none made; {took}", indent=2))
    else:
        most = f" (up to {plan.most_boots} with boots on demand)" if plan.most_boots > plan.boots else ""
        each = (f", {secs(plan.ready_s)} s each to ready: {secs(plan.ready_s * plan.boots)} s" if plan.ready_s is not None
                else "")
        source = f" ({plan.source})" if plan.ready_s is not None else f"; time to ready {plan.source}"
        lines.extend(wrapped(f"plan (--kimiperf-plan): {plural(plan.boots, 'boot')}{most}{each}{source}; {took}; "
                             "the plan predicts no measuring time", indent=2))
    return lines


def end_line(decision: RunDecision) -> str | None:
    """The terminal's last word on a run that ends with an exit status of the plugin's own
    (judge/gate.py); None for every other end."""
    match decision.end:
        case RunEnd.ONLY_UNRESOLVED:
            tests = decision.unresolved_tests
            return (f"kimiperf: every failure was UNRESOLVED ({tests} test{'s' * (tests != 1)}: a change beyond the "
                    "tolerance that one boot of an attached server cannot convict): exit status "
                    f"{decision.exit_status}; give the deployment a restart_command so the run can take more boots")
        case RunEnd.ONLY_INVALID:
            tests = decision.invalid_tests
            advice = advice_for(decision.invalid_causes) or "its line above says why"
            return (f"kimiperf: every failure was an INVALID measurement ({tests} test{'s' * (tests != 1)}, nothing "
                    f"learned about the build): exit status {decision.exit_status} (EX_TEMPFAIL); {advice}")
        case RunEnd.PYTEST | RunEnd.CONTROL_REGRESSION | RunEnd.OUTPUT_ERROR:
            return None
        case _:
            assert_never(decision.end)


def _full_sections(report: SessionReport) -> list[TerminalLine]:
    """What ``-v`` adds: every boot's row, the baselines' detail, the floor, the roofline, the
    server's view and the warnings."""
    profiles = _profile_section(report, verbose=True)
    floors = _floor_section(report)
    return [*profiles, *_nccl_debug_lines(report, titled=not profiles, quiet=False),
            *_baseline_section(report, verbose=True), *floors, *_roofline_lines(report, titled=not floors),
            *_server_view_section(report), *_measured_section(report), *_warning_section(report)]


def _measured_section(report: SessionReport, *, only_lost: bool = False) -> list[TerminalLine]:
    """Every boot's count of what each test measured of what it sent, figure by figure
    (``only_lost``, the first screen's: only the figures some boot did not measure for every
    request; ``-v``, the Markdown and the JSON hold them all)."""
    counted = measured_lines(report, only_lost=only_lost)
    if not counted:
        return []
    title = "requests not measured, per boot (-v: every figure)" if only_lost else "requests measured of sent, per boot"
    lines = [TerminalLine(f"kimiperf: {title}", sep="=")]
    for line in counted:
        lines.extend(wrapped(line, indent=0, markup=_YELLOW if "not measured" in line else {}))
    return lines


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
        return _YELLOW
    return {} if cell.comparison is None else _comparison_markup(cell.comparison, in_session=True)


def _cell_details(cell: ProfileCell, reference: str) -> list[str]:
    parts = [f"n={cell.n}"]
    if cell.comparison is not None:
        c = cell.comparison
        parts.append(f"rests on {evidence_text(c)} ({reference}), tolerance {c.tolerance * 100:g}%")
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


def _baseline_section(report: SessionReport, *, verbose: bool) -> list[TerminalLine]:
    rows = report.baseline_rows()
    if not rows:
        return []
    where = report.baselines_path or "baselines"
    lines = [TerminalLine(f"kimiperf: against baselines ({where})", sep="=")]
    if all(row.baseline is None for row in rows):
        # Nothing was compared: one line per reason, not "no baseline for this hardware" per test.
        for reason, count in Counter(row.message for row in rows).items():
            lines.extend(wrapped(f"{reason} ({plural(count, 'metric')})", indent=0, markup=_YELLOW))
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
            lines.extend(wrapped(_shared_message(group), indent=2, markup=_YELLOW))
            continue
        lines.append(TerminalLine(table.format(header), markup={"bold": True}))
        for row in group:
            if row.baseline is None:
                lines.extend(wrapped(f"{row.heading}: {row.message}", indent=4, markup=_YELLOW))
                continue
            lines.append(TerminalLine(table.format(_baseline_cells(row)),
                                      markup=_verdict_markup(row.baseline.verdict.value)))
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
            markup=_floor_markup(status)))
    return lines


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
                        lines.append(TerminalLine(f"{head}: {cell.note}", markup=_YELLOW))
                        continue
                    c = cell.comparison
                    lines.append(TerminalLine(
                        f"{head}: {fmt_change(c.change)} ({fmt_ci(c.ci_low, c.ci_high)}) {profile_verdict(c)}",
                        markup=_cell_markup(cell)))
    missing: Counter[str] = Counter()
    for row in report.baseline_rows():
        if row.baseline is None:
            missing[row.message] += 1
            continue
        _, current, base, change, ci, verdict = _baseline_cells(row)
        verdicts.setdefault(row.test, []).append(TerminalLine(
            f"  [{row.profile}] {row.heading}: {current} vs baseline {base}: {change} ({ci}) {verdict}",
            markup=_verdict_markup(row.baseline.verdict.value)))
    for res in report.floor_results():
        floor = res.floor
        if floor is None:
            continue
        status = floor.status.value
        limits = ", ".join(f"{name} {fmt_value(value)}" for name, value in _limits(floor))
        verdicts.setdefault(res.test, []).append(TerminalLine(
            f"  [{boot_label(res)}] decode {fmt_value(floor.median)} tok/s: "
            f"{'BELOW FLOOR' if status == 'below floor' else status} ({limits})",
            markup=_floor_markup(status)))
    lines = []
    for test, test_lines in verdicts.items():
        if test_lines:
            lines.append(TerminalLine(test))
            lines.extend(test_lines)
    for reason, count in missing.items():
        lines.extend(wrapped(f"baselines: {reason} ({plural(count, 'metric')})", indent=0, markup=_YELLOW))
    if lines:
        lines.insert(0, TerminalLine("kimiperf", sep="="))
    return lines


def _spread(sd_log: object) -> float | None:
    return None if not isinstance(sd_log, (int, float)) else math.expm1(float(sd_log))
