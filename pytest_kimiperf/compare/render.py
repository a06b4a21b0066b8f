"""The comparison's answer, as the plugin's first screen gives it: one answer line per group and
load on the primary metric, a compact row per metric, and the run's outcome with its exit status;
the same in Markdown and JSON (the JSON report's comparison fields)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kimiperf.compare.verdict import Group, CompareOutcome, Row
from pytest_kimiperf.judge.noise import misdeclared
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.numbers import fmt_change, fmt_value, json_safe
from pytest_kimiperf.reports.answers import CompactRow
from pytest_kimiperf.reports.outputs import comparison_json
from pytest_kimiperf.reports.model import metric_heading
from pytest_kimiperf.reports.sentences import note_text
from pytest_kimiperf.judge.gate import UNRESOLVED_EXIT
from pytest_kimiperf.reports.terminal import Table

_SCREEN_ONLY = ("the runs of each group came from one live server (--same-server): each group is one boot, "
               "and one boot can screen a change, never convict it")


def compact(row: Row) -> CompactRow:
    """The row as the plugin's compact tables hold one (the gate's words: REGRESSION, improvement)."""
    return CompactRow(row.load, row.metric, row.group, row.comparison, in_session=False)


def _verdict_words(row: Row) -> str:
    """The verdict, and where these runs cannot convict a change they see, that they screened it."""
    if row.unresolved:
        why = "one live server a side" if row.screened else "one boot a side"
        return f"UNRESOLVED, {row.comparison.verdict.value} ({why}: screened, not convicted)"
    return compact(row).verdict


def answer_lines(outcome: CompareOutcome) -> list[str]:
    """One line per group and load, on the load's primary metric; and one where the runs show a
    boot spread beyond the one the rules declare (judge/noise.py)."""
    lines = []
    for row in outcome.rows:
        if not row.primary:
            continue
        c = row.comparison
        lines.append(f"{row.group} vs {row.reference}, {metric_heading(row.metric)} ({row.load}): "
                     f"{fmt_change(c.change)}, {compact(row).interval}: {_verdict_words(row)} "
                     f"(tolerance {c.tolerance * 100:g}%, {c.boots_current} vs {c.boots_reference} "
                     f"boot{'s' * (c.boots_reference != 1)}; {fmt_value(c.median_current)} vs "
                     f"{fmt_value(c.median_reference)} {c.unit})")
    spreads = misdeclared([(f"{metric_heading(r.metric)} ({r.load}) of {r.group} vs {r.reference}", r.comparison)
                           for r in outcome.rows])
    if spreads is not None:
        lines.append(note_text(spreads))
    return lines


def outcome_line(outcome: CompareOutcome) -> str:
    """The last line: passed or FAILED, and the exit status."""
    status = outcome.exit_status
    regressions = sum(1 for r in outcome.rows if r.comparison.verdict is VerdictKind.REGRESSION)
    if status == 0:
        return "compare passed: exit status 0"
    if status == UNRESOLVED_EXIT:
        count = sum(1 for r in outcome.rows if r.unresolved)
        return (f"compare UNRESOLVED: {count} change{'s' * (count != 1)} beyond the tolerance that one boot a side "
                f"cannot convict: exit status {status}; compare runs of separate boots, two a group or more")
    parts = [f"{regressions} regression{'s' * (regressions != 1)}"] if regressions else []
    if outcome.failed_runs:
        parts.append(f"{len(outcome.failed_runs)} run{'s' * (len(outcome.failed_runs) != 1)} with too many failed requests")
    if not parts:
        parts.append("a change beyond the tolerance left unresolved (--strict)")
    return f"compare FAILED ({', '.join(parts)}): exit status {status}"


def render_text(groups: Sequence[Group], outcome: CompareOutcome) -> str:
    """The terminal's answer."""
    lines = [f"kimiperf compare: {outcome.tool} files, "
             + "; ".join(f"{g.label}: {len(g.runs)} run{'s' * (len(g.runs) != 1)}" for g in groups)
             + f" (each judged against {groups[0].label})"]
    if outcome.same_server:
        lines.append(_SCREEN_ONLY)
    lines += ["", "answers:", *(f"  {line}" for line in answer_lines(outcome))]
    lines += [f"  FAILED {run}" for run in outcome.failed_runs]
    judged = [r for r in outcome.rows if r.comparison.verdict is not VerdictKind.INSUFFICIENT_SAMPLES]
    lines += ["", *_table(judged)]
    lines += [f"  {line}" for line in _too_few_lines(outcome)]
    lines += ["", outcome_line(outcome)]
    return "\n".join(lines) + "\n"


def _too_few_lines(outcome: CompareOutcome) -> list[str]:
    """The metrics left unjudged for too few samples, one line per load and group (a tail needs
    enough samples beyond its quantile in every run: a p99 300, judge/stats.py)."""
    left: dict[tuple[str, str], list[str]] = {}
    for r in outcome.rows:
        if r.comparison.verdict is VerdictKind.INSUFFICIENT_SAMPLES:
            left.setdefault((r.load, r.group), []).append(metric_heading(r.metric))
    return [f"not judged, too few samples in a run ({load}, {group}): {', '.join(names)}"
            for (load, group), names in left.items()]


def _table(rows: Sequence[Row]) -> list[str]:
    header = ["load", "metric", "group", "change", "interval", "verdict"]
    cells = [[r.load, metric_heading(r.metric), r.group, fmt_change(r.comparison.change), compact(r).interval,
              _verdict_words(r)] for r in rows]
    table = Table(header, aligns="lllrll")
    for row in cells:
        table.add(row)
    return [table.format(header), *(table.format(row) for row in cells)]


def render_markdown(groups: Sequence[Group], outcome: CompareOutcome) -> str:
    """The answer as Markdown: the answers, then one table row per metric."""
    out = [f"# kimiperf compare: {outcome.tool}", ""]
    out += [f"- **{g.label}**: {len(g.runs)} run{'s' * (len(g.runs) != 1)} ({', '.join(sorted({r.path for r in g.runs}))})"
            for g in groups]
    if outcome.same_server:
        out += ["", _SCREEN_ONLY[0].upper() + _SCREEN_ONLY[1:] + "."]
    out += ["", "## Answers", "", *(f"- {line}" for line in answer_lines(outcome))]
    out += [f"- FAILED {run}" for run in outcome.failed_runs]
    out += ["", "| load | metric | group | change | interval | verdict |", "|---|---|---|--:|---|---|"]
    out += [f"| {r.load} | {metric_heading(r.metric)} | {r.group} | {fmt_change(r.comparison.change)} | "
            f"{compact(r).interval} | {_verdict_words(r)} |" for r in outcome.rows]
    out += ["", f"**{outcome_line(outcome)}**"]
    return "\n".join(out) + "\n"


def render_json(groups: Sequence[Group], outcome: CompareOutcome) -> dict[str, Any]:
    """The answer as JSON: the groups' files, each row's comparison as the JSON report holds one."""
    data = {
        "tool": outcome.tool,
        "same_server": outcome.same_server,
        "reference_group": groups[0].label,
        "groups": {g.label: [{"path": r.path, "load": r.load, "label": r.label} for r in g.runs] for g in groups},
        "rows": [{"load": r.load, "group": r.group, "reference_group": r.reference, "primary": r.primary,
                  "screened": r.screened, "unresolved": r.unresolved, "verdict_words": _verdict_words(r),
                  **comparison_json(r.comparison)} for r in outcome.rows],
        "failed_runs": list(outcome.failed_runs),
        "exit_status": outcome.exit_status,
        "outcome": outcome_line(outcome),
    }
    cleaned: dict[str, Any] = json_safe(data)
    return cleaned
