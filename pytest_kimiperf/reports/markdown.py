"""The Markdown summary: the terminal's tables as GitHub-flavoured Markdown.

Written to ``--kimiperf-markdown`` and appended to ``$GITHUB_STEP_SUMMARY`` (GitHub Actions shows
that file on the run's summary page; each step appends to it, so we never overwrite it — see
GitHub's "Adding a job summary" documentation).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.reports.model import figure_legend, fmt_range, range_names
from pytest_kimiperf.judge.engine_clock import two_clocks_of
from pytest_kimiperf.reports.sentences import note_text
from pytest_kimiperf.reports.answers import spread_line
from pytest_kimiperf.reports.next_step import outcome_line
from pytest_kimiperf.reports.measured import measured_lines
from pytest_kimiperf.reports.model import (
    boot_label,
    SessionReport,
    profile_verdict,
)
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_value
from pytest_kimiperf.reports.nccl_check import DIFFERENT
from pytest_kimiperf.judge.profiles import INTERVAL_LEGEND
from pytest_kimiperf.judge.stats import VerdictKind


def render_markdown(report: SessionReport) -> str:
    """The whole summary as Markdown text, ending with a newline."""
    dep = report.deployment
    lines = [f"## kimiperf: {_text(str(dep.get('name', 'perf tests')))}", ""]
    tests = len({r.test for r in report.results})
    facts = [f"{tests} perf test{'' if tests == 1 else 's'}",
             "profiles " + ", ".join(_code(p) for p in report.profile_names())]
    if report.fingerprint is not None:
        facts.append(f"fingerprint {_code(str(report.fingerprint.get('key', '?')))}")
    lines += ["; ".join(facts) + ".", ""]
    outcome = outcome_line(report, report.record_command)
    if outcome is not None:
        lines += [f"**What this run showed:** {_text(outcome)}", ""]
    spreads = spread_line(report)
    if spreads is not None:
        lines += [f"**Spreads:** {_text(spreads)}", ""]
    if not report.results:
        lines += ["No perf test produced a result.", ""]
    lines += _profile_tables(report)
    lines += _nccl_debug_table(report)
    lines += _baseline_tables(report)
    lines += _floor_table(report)
    lines += _roofline(report)
    lines += _server_views(report)
    lines += _bullets("Requests measured of sent, per boot", measured_lines(report))
    lines += _bullets("Warnings", report.warnings())
    lines += _servers(report)
    lines += _bullets("Errors", report.errors)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_markdown(path: Path, text: str, *, append: bool, source: str) -> None:
    """Write (or append, for $GITHUB_STEP_SUMMARY) the summary; ``source`` names where the path came from."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if append else "w", encoding="utf-8", newline="\n") as handle:
            if append and handle.tell() > 0:
                handle.write("\n")
            handle.write(text)
    except OSError as exc:
        raise KimiperfError(
            f"cannot write the Markdown perf summary to {path} (from {source}): {exc.strerror or exc}"
        ) from None


def _profile_tables(report: SessionReport) -> list[str]:
    if not report.compared_profiles():
        return []
    ref = report.reference_profile
    lines = [
        f"### Profiles vs {_code(ref)}", "",
        f"{_text(_sentence(figure_legend(report.has_tails())))}; change vs {_code(ref)}: of the boots' "
        f"geometric mean, with its {INTERVAL_LEGEND}; boots are the samples.", "",
    ]
    if (reach := report.what_nccl_reached()) is not None:
        lines += [f"**What NCCL could reach:** {_text(reach)}.", ""]
    rows = []
    for block in report.test_blocks():
        test = _code(block.test)
        for metric in block.metrics:
            heading = _text(metric.heading)
            for cell in metric.cells:
                if cell.note:
                    change, ci, verdict = "", "", _text(cell.note)
                elif cell.comparison is not None:
                    c = cell.comparison
                    change, ci = fmt_change(c.change), fmt_ci(c.ci_low, c.ci_high)
                    verdict = _emphasize(profile_verdict(c), c.verdict)
                    if (clocks := two_clocks_of(c)) is not None and clocks.withdrawn:
                        verdict += f" ({_text(note_text(clocks))})"
                else:
                    change, ci, verdict = "", "", "reference" if cell.is_reference else ""
                rows.append([test, heading, _code(cell.profile), fmt_value(cell.figure.value),
                             _text(fmt_range(cell.figure)), change, ci, verdict])
                test = heading = ""
    lines += _table(["test", "metric", "profile", *range_names(report.has_tails()), f"vs {_text(ref)}", "CI",
                     "verdict"],
                    "lllrlrll", rows)
    return lines + [""]


def _server_views(report: SessionReport) -> list[str]:
    rows = report.server_views()
    if not rows:
        return []
    lines = ["### The server's view (vLLM /metrics) next to the client's", ""]
    lines += _table(
        ["test", "profile", "TTFT ms (server)", "TTFT ms (client)", "ITL ms (server)", "ITL ms (client)",
         "tokens (server)", "tokens (client)", "TPOT ms (engine)", "TPOT ms (client)", "client / engine"],
        "llrrrrrrrrr",
        [[_text(r.test), _text(r.profile), *(fmt_value(v) for v in (
            r.server_ttft_ms, r.client_ttft_ms, r.server_itl_ms, r.client_itl_ms, r.server_tokens,
            r.client_tokens, r.engine_tpot_ms, r.client_tpot_ms)),
          f"{r.client_over_engine:.3f}" if r.client_over_engine is not None else ""] for r in rows],
    )
    return lines + [""]


def _baseline_tables(report: SessionReport) -> list[str]:
    rows = report.baseline_rows()
    if not rows:
        return []
    where = _code(report.baselines_path) if report.baselines_path else "baselines"
    lines = [f"### Against baselines ({where})", ""]
    compared = [row for row in rows if row.baseline is not None]
    missing: dict[str, int] = {}
    for row in rows:
        if row.baseline is None:
            missing[row.message] = missing.get(row.message, 0) + 1
    if compared:
        table_rows = []
        for row in compared:
            b = row.baseline
            assert b is not None
            verdict = b.verdict
            word = "REGRESSION" if verdict is VerdictKind.REGRESSION else verdict.value
            table_rows.append([
                _code(row.test), _code(row.profile), _text(row.heading), fmt_value(row.figure.value),
                _text(fmt_range(row.figure)), fmt_value(b.median_reference),
                fmt_change(b.change), fmt_ci(b.ci_low, b.ci_high),
                _emphasize(word, verdict),
            ])
        lines += _table(["test", "profile", "metric", "current", range_names(report.has_tails())[1], "baseline",
                         "change", "90% CI", "verdict"], "lllrlrrll", table_rows)
        lines.append("")
    for reason, count in missing.items():
        lines.append(f"- {_text(reason)} ({count} {'metric' if count == 1 else 'metrics'})")
    if missing:
        lines.append("")
    return lines


def _floor_table(report: SessionReport) -> list[str]:
    floored = report.floor_results()
    if not floored:
        return []
    rows = []
    for res in floored:
        floor = res.floor
        if floor is None:
            continue
        status = floor.status.value
        rows.append([_code(res.test), _code(boot_label(res)), fmt_value(floor.median),
                     fmt_value(floor.floor), fmt_value(floor.target),
                     f"**{status.upper()}**" if status == "below floor" else _text(status)])
    return ["### Decode floor", ""] + _table(
        ["test", "profile", "decode tok/s", "floor", "target", "status"], "llrrrl", rows) + [""]


def _nccl_debug_table(report: SessionReport) -> list[str]:
    checks = report.nccl_checks()
    if not checks:
        return []
    lines = ["### NCCL variables in the server logs (`--kimiperf-nccl-debug`)", ""]
    rows = []
    notes: list[str] = []
    for check in checks:
        if check.error:
            rows.append([_code(check.profile), "", "", "", _text(check.error)])
        for v in check.variables:
            word = _text(v.message)
            rows.append([_code(check.profile), _code(v.variable), _code(v.expected),
                         _code(v.logged) if v.logged is not None else "",
                         f"**{word}**" if v.status == DIFFERENT else word])
        notes.extend(f"{_code(check.profile)}: {_text(note)}" for note in check.said() if note not in notes)
    if rows:
        lines += _table(["profile", "variable", "profile value", "NCCL logged", "verdict"], "lllll", rows)
        lines.append("")
    seen: set[str] = set()
    for note in notes:
        if note not in seen:
            seen.add(note)
            lines.append(f"- {note}")
    return lines + ([""] if notes else [])


def _roofline(report: SessionReport) -> list[str]:
    roof = report.roofline
    if roof is None:
        return []
    lines = ["### Decode ceiling (roofline)", ""]
    if not roof.known:
        return lines + [_text(roof.arithmetic_line()), ""]
    est = roof.estimate
    assert est is not None
    facts = [
        (f"weights read per GPU per token: {est.weight_bytes.per_gpu_bytes:,} bytes "
         f"(tp={est.weight_bytes.tp}; {est.weight_bytes.total_bytes:,} in the whole model)"),
        f"memory bandwidth: {fmt_value(est.bandwidth_gbs)} GB/s ({_text(roof.bandwidth.source)})",
        f"bandwidth ceiling: {fmt_value(est.bandwidth_ceiling_tok_s)} tok/s",
    ]
    if est.collectives_per_token:
        if roof.comm_term_known:
            facts.append(f"collectives per token: {est.collectives_per_token} x "
                         f"{est.allreduce_latency_us:g} us ({_text(roof.allreduce_latency.source)})")
            facts.append(f"ceiling with communication: {fmt_value(est.ceiling_tok_s)} tok/s")
        else:
            facts.append(f"collectives per token: {est.collectives_per_token}, latency unknown "
                         f"({_text(roof.allreduce_latency.source)}): communication term unknown")
    if roof.binding_term:
        facts.append(f"bound by: {roof.binding_term}")
    lines += [f"- {fact}" for fact in facts] + [""]
    header = ["test", "profile", "decode tok/s", "of bandwidth ceiling"]
    if est.collectives_per_token:  # at tp=1 the two ceilings are one
        header.append("of ceiling with communication")
    rows = []
    for m in roof.measurements:
        row = [_code(m.test), _code(m.label), fmt_value(m.median_tok_s), _share(m.fraction_of_bandwidth_ceiling)]
        if est.collectives_per_token:
            row.append(_share(m.fraction_of_ceiling) if m.fraction_of_ceiling is not None else "unknown")
        rows.append(row)
    lines += _table(header, "llrrr"[: len(header)], rows) + [""]
    lines += [f"- {_text(note)}" for note in roof.notes]
    return lines + ([""] if roof.notes else [])


def _share(fraction: float | None) -> str:
    # A share of a ceiling: 27%, and two digits below ten (1.5%) so small shares do not read 0%.
    if fraction is None:
        return "n/a"
    pct = 100 * fraction
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"


def _servers(report: SessionReport) -> list[str]:
    if not report.profiles:
        return []
    rows = []
    for facts in report.profiles:
        overrides = " ".join([*(f"{k}={v}" for k, v in sorted(facts.profile_env.items())),
                              *facts.profile_args]) or "(none)"
        boots = "?" if facts.boots is None else str(facts.boots)
        ready = "" if facts.boot_s is None else f"{facts.boot_s:.0f} s"
        notes = [f"**LEFTOVER**: {_text(x)}" for x in facts.leftovers]
        if facts.error:
            notes.append(f"failed: {_text(facts.error)}")
        notes += [f"replaces the deployment's {_code(r)}" for r in facts.replaced_args]
        rows.append([_code(facts.name), _code(overrides), boots, ready, "; ".join(notes)])
    return ["### Servers", ""] + _table(
        ["profile", "overrides", "boots", "ready after", "notes"], "llrrl", rows) + [""] + _boot_accounts(report)


def _boot_accounts(report: SessionReport) -> list[str]:
    # One line per boot, in the words of the terminal summary: where each boot's seconds went.
    accounts = [a for facts in report.profiles for a in facts.boot_accounts]
    cache = [f"{_text(report.weight_cache.summary())}", ""] if report.weight_cache is not None else []
    if not accounts:
        return cache
    return cache + ["Boots:", ""] + [f"- {_text(a.summary())}" for a in accounts] + [""]


def _bullets(title: str, items: Sequence[str]) -> list[str]:
    if not items:
        return []
    return [f"### {title}", ""] + [f"- {_text(item)}" for item in items] + [""]


def _table(header: Sequence[str], aligns: str, rows: Sequence[Sequence[str]]) -> list[str]:
    rule = ["--:" if a == "r" else ":--" for a in aligns]
    return ["| " + " | ".join(cells) + " |" for cells in [list(header), rule, *rows]]


def _emphasize(word: str, verdict: VerdictKind) -> str:
    return f"**{word}**" if verdict is VerdictKind.REGRESSION else word


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _code(text: str) -> str:
    # In a GFM table a pipe ends the cell even inside a code span unless escaped; a backtick
    # would end the span, so it is replaced (test ids rarely carry one).
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _text(text: str) -> str:
    out = text.replace("\\", "\\\\").replace("|", "\\|")
    for ch in "*_<>[]`":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")

