"""The machine-readable report (``--kimiperf-json``): every sample, statistic and verdict of the run.

The schema is documented in ``docs/reference/json-report.md``; ``SCHEMA_VERSION`` changes whenever a
field changes meaning or disappears (adding fields does not change it). Run-level figures that
vLLM's ``bench serve`` also reports keep its field names (``completed``, ``median_ttft_ms``,
``p99_itl_ms``, ``output_throughput``, ...; see vllm/benchmarks/serve.py), so a dashboard that
reads bench-serve result files reads each test's ``run`` object unchanged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.numbers import json_safe
from pytest_kimiperf.reports.model import ProfileFacts, SessionReport
from pytest_kimiperf.judge.floors import FloorResult
from pytest_kimiperf.judge.notes import HistorySteps
from pytest_kimiperf.judge.stats import Comparison
from pytest_kimiperf.reports.sentences import (
    comparison_line, floor_line, joined, level_spread_text, note_text, note_texts, source_text, unrecordable_text,
    warning_lines,
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
        "run": res.run.to_json() if res.run is not None else {},
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

