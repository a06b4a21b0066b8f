"""The files a run writes from its session report: JSON, Markdown and exports, one Output each, in the order written.

* The JSON report (``--kimiperf-json``): every sample, statistic and verdict, its schema in
  ``docs/reference/json-report.md`` (``SCHEMA_VERSION`` changes when a field changes meaning or
  disappears). It comes last: it records where the others went.
* The Markdown summary (``--kimiperf-markdown``, and appended to ``$GITHUB_STEP_SUMMARY``, which
  each step of a GitHub job appends to).
* The exports (``--kimiperf-export DIR``): per test, profile and boot, one file in the shape of
  ``vllm bench serve --save-result`` (vllm/benchmarks/serve.py; same field names and units,
  figures by its ``calculate_metrics`` rules, the per-request arrays kept only with
  ``--kimiperf-export-detailed``), and ``requests.jsonl``, every measured request, as AIPerf's
  profile export gives.

A new format is its renderer here, one entry in :data:`OUTPUTS`, and its option's row
(config/options.py). One output that fails does not stop the others: its error is listed and
its place left out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
import hashlib
import json
import math
import os
from pathlib import Path
import re
from typing import Any, Protocol

import numpy as np

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.judge.baselines import BaselineFile
from pytest_kimiperf.judge.engine_clock import two_clocks_of
from pytest_kimiperf.judge.notes import FloorResult, HistorySteps
from pytest_kimiperf.judge.profiles import INTERVAL_LEGEND
from pytest_kimiperf.judge.stats import Comparison, VerdictKind
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.measure.results import RequestRecord, RunSummary
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_value, json_safe
from pytest_kimiperf.reports.answers import measured_lines, outcome_line, spread_line
from pytest_kimiperf.reports.model import (
    ProfileFacts, SessionReport, boot_label, figure_legend, fmt_range, profile_verdict, range_names,
)
from pytest_kimiperf.reports.nccl import DIFFERENT
from pytest_kimiperf.reports.sentences import (
    comparison_line, floor_line, joined, level_spread_text, note_text, note_texts, say_run_invalid, source_text,
    unrecordable_text, warning_lines,
)


SCHEMA_VERSION = 1


def comparison_json(c: Comparison) -> dict[str, object]:
    """A comparison as the JSON report holds it: its fields, its notes as one ``note`` line,
    the history's ``steps`` it was judged after, and its ``message``."""
    out: dict[str, object] = {}
    for key, value in c.to_dict().items():
        if key == "notes":
            out["note"] = joined(c.notes)
        elif key == "spread_source":
            out[key] = source_text(c.spread_source)
        elif key == "levels":
            out[key] = [{"name": t.name, "var_log": t.var_log, "df": t.df if math.isfinite(t.df) else None,
                         "weight": t.weight, "text": level_spread_text(t.level)} for t in c.levels]
        else:
            out[key] = value
    out["steps"] = [step.plain() for note in c.notes if isinstance(note, HistorySteps) for step in note.steps]
    out["message"] = comparison_line(c)
    return out


def _floor_json(fr: FloorResult) -> dict[str, object]:
    """The floor check as the JSON report holds it."""
    return {"median": fr.median, "floor": fr.floor, "target": fr.target, "status": fr.status.value,
            "message": floor_line(fr)}


def build_json_report(report: SessionReport) -> dict[str, Any]:
    """The report as a JSON-ready dict (non-finite numbers already turned into null)."""
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "generator": report.generator,
        "created_at": report.created_at,
        "deployment": dict(report.deployment),
        "fingerprint": None if report.fingerprint is None else dict(report.fingerprint),
        "reference_profile": report.reference_profile,
        # --kimiperf-control: the reference is the recorded build, and a REGRESSION against it fails.
        "control": report.control,
        "profiles": {facts.name: _profile_json(facts) for facts in report.profiles},
        "tests": [_test_json(res) for res in report.results],
        "profile_comparisons": [
            {
                "test": row.test, "metric": row.metric, "profile": row.profile,
                "reference_profile": row.reference_profile, "error": row.error,
                **(comparison_json(row.comparison) if row.comparison is not None else {}),
            }
            for row in report.profile_comparisons
        ],
        "baselines": {
            "path": report.baselines_path,
            "updated": report.baselines_update is not None,
            "entries_written": report.baselines_update.entries if report.baselines_update else None,
            "not_recorded": list(report.baselines_update.not_recorded) if report.baselines_update else [],
            "appended_on_pass": report.baselines_update.on_pass if report.baselines_update else False,
            "not_appended": note_text(report.not_appended) if report.not_appended is not None else None,
        },
        "roofline": report.roofline.to_json() if report.roofline is not None else None,
        "outputs": dict(report.outputs),
        "plot_files": list(report.plot_files),
        "errors": list(report.errors),
    }
    if report.weight_cache is not None:
        data["weight_cache"] = report.weight_cache.to_json()
    if report.time_account is not None:  # where the session's wall clock went (measure/time_account.py)
        data["time_account"] = report.time_account.to_json()
    cleaned: dict[str, Any] = json_safe(data)
    return cleaned


def dumps_json_report(data: Mapping[str, Any]) -> str:
    """The report's text: two-space indent, keys in the order above, strict JSON (no NaN)."""
    try:
        return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        # A pytest_kimiperf_update_json hook may have put something JSON cannot hold.
        raise KimiperfError(
            f"the JSON perf report cannot be serialized: {exc} (check the "
            "pytest_kimiperf_update_json hooks: values must be JSON types, numbers finite)"
        ) from None


def write_json_report(path: Path, data: Mapping[str, Any]) -> None:
    """Write the report to ``path`` (parents created), replacing any old file in one step."""
    text = dumps_json_report(data)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
    except OSError as exc:
        raise KimiperfError(
            f"cannot write the JSON perf report to {path} (from --kimiperf-json): {exc.strerror or exc}"
        ) from None


def _metric_statistics(mres: MetricResult) -> dict[str, float | int | None]:
    """Summary statistics of one metric's finite samples (``std`` is numpy's population std)."""
    values = np.asarray(mres.finite, dtype=float)
    failed = len(mres.samples) - int(values.size)
    if values.size == 0:
        return {"n": 0, "n_failed": failed, "median": None, "q1": None, "q3": None, "iqr": None,
                "mean": None, "std": None, "min": None, "max": None, "p90": None, "p99": None}
    q1, median, q3, p90, p99 = np.percentile(values, [25, 50, 75, 90, 99])
    return {
        "n": int(values.size), "n_failed": failed,
        "median": float(median), "q1": float(q1), "q3": float(q3), "iqr": float(q3 - q1),
        "mean": float(values.mean()), "std": float(values.std()),
        "min": float(values.min()), "max": float(values.max()),
        "p90": float(p90), "p99": float(p99),
    }


def _profile_json(facts: ProfileFacts) -> dict[str, Any]:
    return {
        "description": facts.description,
        "profile_env": dict(facts.profile_env),
        "profile_args": list(facts.profile_args),
        "replaced_args": list(facts.replaced_args),
        "server_env": dict(facts.server_env),
        "overridden_shell_env": {
            var: {"shell": shell, "profile": value}
            for var, (shell, value) in sorted(facts.overridden_shell_env.items())
        },
        "boots": facts.boots,
        "boot_s": facts.boot_s,
        "log_path": facts.log_path,
        "leftovers": list(facts.leftovers),
        "error": facts.error,
        "nccl_debug": facts.nccl_debug.to_json() if facts.nccl_debug is not None else None,
        # Only where this process booted the server, so reports of attached runs keep their shape.
        **({"boot_accounts": [a.to_json() for a in facts.boot_accounts]} if facts.boot_accounts else {}),
        **({"sweep": facts.sweep.to_json()} if facts.sweep is not None else {}),
    }


def run_json(run: RunSummary) -> dict[str, Any]:
    """A run's figures as the JSON report keeps them: why it cannot be trusted in words
    (``invalid_reason``, '' when it can), where the summary keeps the facts."""
    words = say_run_invalid(run.invalid) if run.invalid is not None else ""
    return dict(("invalid_reason", words) if key == "invalid" else (key, value) for key, value in run.to_json().items())


def _test_json(res: TestResult) -> dict[str, Any]:
    return {
        "test": res.test,
        "nodeid": res.nodeid,
        "profile": res.profile,
        "deployment": res.deployment,
        "scenario": res.scenario,
        "invalid": res.invalid, "invalid_cause": res.invalid_cause,
        "boot": res.boot,
        "host": res.host,
        "unrecordable": unrecordable_text(res),
        "failures": note_texts(res.failures),
        "warnings": warning_lines(res),
        "messages": note_texts(res.messages),
        "floor": _floor_json(res.floor) if res.floor is not None else None,
        "run": run_json(res.run) if res.run is not None else {},
        "primary_metric": res.primary,
        "metrics": {name: _metric_json(mres) for name, mres in res.metrics.items()},
        "itl_timeline_ms": list(res.itl_timeline_ms),
        "interval_ns": list(res.interval_ns) if res.interval_ns else None,
        "profile_env": dict(res.profile_env),
        "profile_args": list(res.profile_args),
        "server_env": dict(res.server_env),
    }


def _metric_json(mres: MetricResult) -> dict[str, Any]:
    spec = METRICS.get(mres.metric)
    return {
        "label": spec.label if spec else mres.metric,
        "unit": mres.unit,
        "direction": mres.direction,
        "tolerance": mres.tolerance,
        "samples": list(mres.samples),
        "summary": _metric_statistics(mres),
        "baseline": comparison_json(mres.baseline) if mres.baseline is not None else None,
        "baseline_message": note_text(mres.baseline_line) if mres.baseline_line is not None else None,
    }


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
    legend = figure_legend(report.has_tails())
    lines = [
        f"### Profiles vs {_code(ref)}", "",
        f"{_text(legend[:1].upper() + legend[1:])}; change vs {_code(ref)}: of the boots' "
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
    missing = Counter(row.message for row in rows if row.baseline is None)
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
        notes.extend(f"{_code(check.profile)}: {_text(note)}" for note in check.said())
    if rows:
        lines += _table(["profile", "variable", "profile value", "NCCL logged", "verdict"], "lllll", rows)
        lines.append("")
    lines += [f"- {note}" for note in dict.fromkeys(notes)]
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


def _code(text: str) -> str:
    # In a GFM table a pipe ends the cell even inside a code span unless escaped; a backtick
    # would end the span, so it is replaced (test ids rarely carry one).
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _text(text: str) -> str:
    out = text.replace("\\", "\\\\").replace("|", "\\|")
    for ch in "*_<>[]`":
        out = out.replace(ch, "\\" + ch)
    return out.replace("\n", " ")


REQUESTS_FILE = "requests.jsonl"
# Percentiles written for each latency (bench serve's --metric-percentiles, default "99").
_EXPORT_PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
# Fields bench serve drops without --save-detailed (vllm/benchmarks/serve.py, main()).
_DETAILED_FIELDS: tuple[str, ...] = (
    "input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors",
)
_BACKEND = {"chat": "openai-chat", "completions": "openai"}

_MAX_SLUG = 80
_NS_PER_S = 1e9
_NS_PER_MS = 1e6


def bench_serve_result(res: TestResult, *, model_id: str, tokenizer_id: str, date: str,
                       detailed: bool = False) -> dict[str, Any]:
    """One test's run under one profile as a ``vllm bench serve --save-result`` dict."""
    # The metric definitions are results.py's (RequestRecord), in bench serve's seconds here.
    records = list(res.run.requests) if res.run is not None else []
    load = dict(res.run.load) if res.run is not None else {}
    endpoint = str(load.get("endpoint") or "completions")
    backend = _BACKEND.get(endpoint, endpoint)
    duration = res.run.duration if res.run is not None else 0.0
    ok = [rec for rec in records if rec.ok]
    output_lens = [rec.output_tokens if rec.ok else 0 for rec in records]
    ttfts = [_s(rec.ttft_ms) for rec in records]
    latencies = [_s(rec.e2el_ms) for rec in records]
    itls = [[gap / 1000 for gap in rec.itl_ms] for rec in records]
    total_input = sum(rec.prompt_tokens for rec in ok)
    total_output = sum(output_lens)
    result: dict[str, Any] = {
        "date": date,
        "endpoint_type": backend,
        "backend": backend,
        "label": f"{res.test} [{res.profile}, boot {res.boot}]",
        "model_id": model_id,
        "tokenizer_id": tokenizer_id,
        "num_prompts": len(records),
        "request_rate": load.get("request_rate", "inf"),
        "burstiness": load.get("burstiness", 1.0),
        "max_concurrency": load.get("max_concurrency"),
        # Not bench serve's: where the run came from, for a reader joining files.
        "kimiperf_test": res.test, "kimiperf_profile": res.profile, "kimiperf_boot": res.boot,
        "kimiperf_scenario": res.scenario, "kimiperf_valid": not res.invalid,
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "request_goodput": None,  # no --goodput SLO given (bench serve writes None then too)
        "output_throughput": total_output / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_input + total_output) / duration if duration > 0 else 0.0,
        "input_lens": [rec.prompt_tokens for rec in records],
        "output_lens": output_lens,
        "ttfts": [t if t is not None else 0.0 for t in ttfts],
        "itls": itls,
        "latencies": [t if t is not None else 0.0 for t in latencies],
        "start_times": [rec.t_send_ns / _NS_PER_S for rec in records],
        # bench serve's client_queue_time: waiting for a --max-concurrency slot before sending.
        "queue_times": [max(0.0, _s(rec.send_lag_ms) or 0.0) for rec in records],
        "generated_texts": ["" for _ in records],  # the client never decodes text
        "errors": [rec.error for rec in records],
        **_peaks(ok),
        "rtfx": 0.0,  # audio input seconds per second; text runs have none
    }
    ok_ttft = [t for rec, t in zip(records, ttfts) if rec.ok and t is not None]
    ok_lat = [t for rec, t in zip(records, latencies) if rec.ok and t is not None]
    tpots = [tpot / 1000 for rec in records if rec.ok and (tpot := rec.tpot_ms) is not None]
    pooled_itl = [gap for rec, gaps in zip(records, itls) if rec.ok for gap in gaps]
    for stem, values in (("ttft", ok_ttft), ("tpot", tpots), ("itl", pooled_itl), ("e2el", ok_lat)):
        result.update(_stats_ms(stem, values))
    if not detailed:
        for name in _DETAILED_FIELDS:
            result.pop(name, None)
    cleaned: dict[str, Any] = json_safe(result)
    return cleaned


def _request_lines(res: TestResult) -> Iterable[dict[str, Any]]:
    """One JSON object per measured request of ``res`` (times in ns of CLOCK_MONOTONIC and ms)."""
    for rec in res.run.requests if res.run is not None else ():
        send = rec.t_send_ns
        yield {
            "profile": res.profile, "boot": res.boot, "test": res.test, "nodeid": res.nodeid,
            "scenario": res.scenario, "request_id": rec.request_id,
            "status": "ok" if rec.ok else "error", "error": rec.error or None,
            "prompt_tokens": rec.prompt_tokens, "output_tokens": rec.output_tokens,
            "t_start_ns": rec.t_start_ns, "scheduled_send_ns": rec.scheduled_send_ns,
            "t_send_ns": send, "chunk_ns": list(rec.chunk_ns), "t_done_ns": rec.t_done_ns,
            "ttft_ms": rec.ttft_ms,
            "chunk_offsets_ms": [(c - send) / _NS_PER_MS for c in rec.chunk_ns],
        }


def _export_file_name(res: TestResult) -> str:
    """``<test>--<profile>--boot<N>.json``, safe as a file name (a hash keeps long ids apart)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", res.test.replace("::", "--")).strip("._-") or "test"
    if len(slug) > _MAX_SLUG:
        slug = f"{slug[: _MAX_SLUG - 9]}-{hashlib.sha1(res.test.encode()).hexdigest()[:8]}"
    return f"{slug}--{res.profile}--boot{res.boot}.json"


def write_exports(report: SessionReport, out_dir: Path, *, detailed: bool,
                  now: datetime | None = None) -> list[Path]:
    """Write every bench-serve file and the request records into ``out_dir``; the files written."""
    model = str(report.deployment.get("served_model_name") or report.deployment.get("model") or "")
    tokenizer = str(report.deployment.get("model") or model)
    date = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")  # bench serve's format
    written: list[Path] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for res in report.results:
            data = bench_serve_result(res, model_id=model, tokenizer_id=tokenizer, date=date,
                                      detailed=detailed)
            path = out_dir / _export_file_name(res)
            write_atomically(path, json.dumps(data, allow_nan=False) + "\n")
            written.append(path)
        lines = [json.dumps(json_safe(line), allow_nan=False)
                 for res in report.results for line in _request_lines(res)]
        path = out_dir / REQUESTS_FILE
        write_atomically(path, "".join(f"{line}\n" for line in lines))
        written.append(path)
    except OSError as exc:
        raise KimiperfError(
            f"cannot write the exports into {out_dir} (from --kimiperf-export): {exc.strerror or exc}"
        ) from None
    return written


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def _peaks(ok: Sequence[RequestRecord]) -> dict[str, Any]:
    """bench serve's max_output_tokens_per_s and max_concurrent_requests: one-second buckets
    from the first send; each token chunk counts one token there, as bench serve counts its itls."""
    if not ok:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start = min(rec.t_send_ns for rec in ok)
    end = max((rec.chunk_ns or (rec.t_send_ns,))[-1] for rec in ok)
    buckets = int(math.ceil((end - start) / _NS_PER_S)) + 1
    tokens = np.zeros(buckets)
    active = np.zeros(buckets)
    for rec in ok:
        for c in rec.chunk_ns:
            tokens[int((c - start) / _NS_PER_S)] += 1
        last = (rec.chunk_ns or (rec.t_send_ns,))[-1]
        active[int((rec.t_send_ns - start) / _NS_PER_S): int((last - start) / _NS_PER_S) + 1] += 1
    return {"max_output_tokens_per_s": float(tokens.max()), "max_concurrent_requests": int(active.max())}


def _stats_ms(stem: str, values_s: Sequence[float]) -> dict[str, float]:
    # bench serve reports 0 for a metric with no values (np.mean(x or 0)).
    values = np.asarray(values_s or [0.0], dtype=float) * 1000
    out = {f"mean_{stem}_ms": float(values.mean()), f"median_{stem}_ms": float(np.median(values)),
           f"std_{stem}_ms": float(values.std())}
    for q in _EXPORT_PERCENTILES:
        out[f"p{q}_{stem}_ms"] = float(np.percentile(values, q))
    return out


GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


@dataclass(frozen=True)
class OutputContext:
    """What the outputs read besides the report: the settings, the baseline the run was judged
    against (read before --kimiperf-update-baselines replaced it), the environment and the
    ``pytest_kimiperf_update_json`` hook."""

    settings: Settings
    judged_against: BaselineFile | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    update_json: Callable[[dict[str, Any]], None] = lambda data: None


@dataclass(frozen=True)
class Target:
    """One place an output writes to: its key in ``report.outputs`` and its path."""

    kind: str
    path: Path


class Output(Protocol):
    """One report format."""

    # What the summary calls each of its targets, by kind (the key in report.outputs).
    labels: Mapping[str, str]
    # Whether it names its places in report.outputs before it writes (the Markdown lists where it
    # goes); the others are named once written.
    listed_first: bool

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        """Where this run asked it to write (none: not asked)."""
        ...

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        """Write it; a KimiperfError names what could not be written."""
        ...


class Plots:
    labels: Mapping[str, str] = {"plots": "plots"}
    listed_first = False

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        plots = ctx.settings.perf_plots
        return [Target("plots", plots)] if plots and report.results else []

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        from pytest_kimiperf.reports.plots import render_plots

        try:
            files = render_plots(report, target.path, baseline=ctx.judged_against)
        except KimiperfError:
            raise
        except Exception as exc:  # noqa: BLE001 - a drawing bug must not cost the JSON report
            raise KimiperfError(f"drawing plots into {target.path} failed: {type(exc).__name__}: {exc}") from exc
        report.plot_files = [str(path) for path in files]


class Markdown:
    labels: Mapping[str, str] = {"markdown": "Markdown summary",
                                 "github_step_summary": "Markdown appended to $GITHUB_STEP_SUMMARY"}
    listed_first = True

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        found = [Target("markdown", ctx.settings.perf_markdown)] if ctx.settings.perf_markdown else []
        # Only a run that measured something adds to the job summary: the plugin is loaded by every
        # pytest run in the environment, and unit-test jobs should not get an empty perf section.
        if (step_summary := ctx.environ.get(GITHUB_STEP_SUMMARY)) and report.results:
            found.append(Target("github_step_summary", Path(step_summary)))
        return found

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        appended = target.kind == "github_step_summary"
        write_markdown(target.path, render_markdown(report), append=appended,
                       source=f"${GITHUB_STEP_SUMMARY}" if appended else "--kimiperf-markdown")


class BenchServeExport:
    labels: Mapping[str, str] = {"export": "vLLM bench serve results"}
    listed_first = False

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        export = ctx.settings.perf_export
        return [Target("export", export)] if export is not None and report.results else []

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        write_exports(report, target.path, detailed=ctx.settings.perf_export_detailed)


class JsonReport:
    labels: Mapping[str, str] = {"json": "JSON report"}
    listed_first = True

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        return [Target("json", ctx.settings.perf_json)] if ctx.settings.perf_json else []

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        data = build_json_report(report)
        ctx.update_json(data)
        write_json_report(target.path, data)


OUTPUTS: tuple[Output, ...] = (Plots(), Markdown(), BenchServeExport(), JsonReport())


def output_labels() -> dict[str, str]:
    """Every output's label, by kind, in the order the outputs are written."""
    return {kind: label for output in OUTPUTS for kind, label in output.labels.items()}


def write_outputs(report: SessionReport, ctx: OutputContext) -> None:
    """Write every output the run asked for, in :data:`OUTPUTS`' order; what fails is added to
    ``report.errors`` and left out of ``report.outputs``, and the rest is still written."""
    for output in OUTPUTS:
        targets = output.targets(report, ctx)
        if output.listed_first:
            report.outputs.update((t.kind, str(t.path)) for t in targets)
        for target in targets:
            try:
                output.write(report, target, ctx)
            except KimiperfError as exc:
                report.errors.append(str(exc))
                report.outputs.pop(target.kind, None)
            else:
                report.outputs[target.kind] = str(target.path)
