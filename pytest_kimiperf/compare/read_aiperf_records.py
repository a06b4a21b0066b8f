"""AIPerf's per-request records (``profile_export.jsonl``), read with the summary beside them.

AIPerf writes them into the artifact directory beside ``profile_export_aiperf.json``; with
``--profile-export-prefix NAME`` the two are ``NAME.json`` and ``NAME.jsonl``
(aiperf/config/artifacts.py). Each line is one request, a ``MetricRecordInfo``
(aiperf/common/models/record_models.py): ``metadata`` (``benchmark_phase``), ``metrics`` (each
``{"value", "unit"}``; a list of values for ``inter_chunk_latency``) and ``error``.

The summary's figures are numpy's default percentiles of the profiling requests without an error
(aiperf/metrics/metric_dicts.py ``metric_result_from_array``), so the records are checked against
them as docs/how-to/compare.md says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_kimiperf.compare.runs import ResultFileError, RunFigure, read_text

_SUMMARY_NAME = "profile_export_aiperf.json"
_RECORDS_NAME = "profile_export.jsonl"
_PROFILING = "profiling"
_PHASES = ("warmup", _PROFILING)
# Figures agree with the summary to rounding: AIPerf writes them through float sums and JSON.
_REL_TOL = 1e-9


@dataclass(frozen=True)
class AiperfRecords:
    """The profiling requests of one records file: each good request's metrics, and the failures."""

    path: Path
    good: Sequence[Mapping[str, tuple[float | list[float], str, int]]]
    failed: int


def records_beside(summary: Path) -> Path | None:
    """The records file AIPerf wrote beside ``summary``, if it is there."""
    name = _RECORDS_NAME if summary.name == _SUMMARY_NAME else f"{summary.stem}.jsonl"
    records = summary.with_name(name)
    return records if records.is_file() else None


def is_records_file(path: Path) -> bool:
    """Whether ``path`` looks like AIPerf's records (JSON Lines whose first line has ``metrics``
    and a ``metadata.benchmark_phase``): such a file is read with its summary, never on its own."""
    try:
        with path.open(encoding="utf-8") as stream:
            first = json.loads(stream.readline())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    metadata = first.get("metadata") if isinstance(first, Mapping) else None
    return isinstance(metadata, Mapping) and "benchmark_phase" in metadata and "metrics" in first


def read_records(path: Path) -> AiperfRecords:
    """The file's profiling requests; ResultFileError naming the line and the field of any damage."""
    lines = read_text(path).splitlines()
    good: list[Mapping[str, tuple[float | list[float], str, int]]] = []
    failed = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _line(path, number, line)
        metadata = _object(path, number, record, "metadata")
        phase = metadata.get("benchmark_phase")
        if phase not in _PHASES:
            raise ResultFileError(f"{path}: line {number}: field 'metadata.benchmark_phase' is {phase!r}, not one of "
                                  f"{', '.join(_PHASES)}")
        if phase != _PROFILING:
            continue
        if record.get("error") is not None:
            failed += 1
            continue
        metrics = _object(path, number, record, "metrics")
        good.append({name: _metric(path, number, name, value) for name, value in metrics.items()})
    if not good and not failed:
        raise ResultFileError(f"{path}: holds no profiling request ({len(lines)} lines): a records file of a whole "
                              "run has one line per request")
    return AiperfRecords(path, good, failed)


def check_against_summary(records: AiperfRecords, summary: Path, completed: int, failed: int,
                          figures: Mapping[str, RunFigure], units: Mapping[str, str]) -> None:
    """Raise ResultFileError unless ``records`` are the requests the summary's figures came from:
    the same counts, and each figure (``<metric>.p<q>`` fields) recomputed from them."""
    where = f"{records.path} (the per-request records of {summary.name})"
    if (len(records.good), records.failed) != (completed, failed):
        raise ResultFileError(f"{where}: {len(records.good)} good and {records.failed} failed profiling requests, "
                              f"but the summary's 'request_count.avg' and 'error_summary' say {completed} and "
                              f"{failed}: the records are of another run, or cut")
    for figure in figures.values():
        name, _, stat = figure.field.rpartition(".")
        if not stat.startswith("p") or name not in units:
            continue  # a run-level figure (throughputs over AIPerf's own clock) has no per-request form
        values = _values(records, name, units[name])
        recomputed = float(np.percentile(values, float(stat[1:]))) if values else math.nan
        if not math.isclose(recomputed, figure.value, rel_tol=_REL_TOL, abs_tol=1e-12):
            raise ResultFileError(f"{where}: field 'metrics.{name}.value' of the records gives {stat} {recomputed!r}, "
                                  f"the summary's '{figure.field}' is {figure.value!r}: the records are of another "
                                  "run, or edited")


def _values(records: AiperfRecords, name: str, unit: str) -> list[float]:
    values: list[float] = []
    for metrics in records.good:
        if name not in metrics:
            continue  # AIPerf leaves out a metric a request cannot have (one chunk: no gap)
        value, got_unit, line = metrics[name]
        if got_unit != unit:
            raise ResultFileError(f"{records.path}: line {line}: field 'metrics.{name}.unit' is {got_unit!r}, not "
                                  f"{unit!r} as in the summary")
        values.extend(value if isinstance(value, list) else [value])
    return values


def _line(path: Path, number: int, line: str) -> Mapping[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}: line {number} is not valid JSON (column {exc.colno}: {exc.msg}); a file cut "
                              "short while it was written reads so") from None
    if not isinstance(record, Mapping):
        raise ResultFileError(f"{path}: line {number} is a JSON {type(record).__name__}, not a record object")
    return record


def _object(path: Path, number: int, record: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = record.get(key)
    if not isinstance(value, Mapping):
        found = "missing" if key not in record else f"{type(value).__name__}, not an object"
        raise ResultFileError(f"{path}: line {number}: field {key!r} is {found}")
    return value


def _metric(path: Path, number: int, name: str, metric: Any) -> tuple[float | list[float], str, int]:
    field = f"metrics.{name}"
    if not isinstance(metric, Mapping) or "value" not in metric or not isinstance(metric.get("unit"), str):
        raise ResultFileError(f"{path}: line {number}: field {field!r} is {metric!r}, not a value with its unit")
    value = metric["value"]
    items = value if isinstance(value, list) else [value]
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
            raise ResultFileError(f"{path}: line {number}: field '{field}.value' is {value!r}, not a finite number "
                                  "(nor a list of them)")
    return (list(map(float, value)) if isinstance(value, list) else float(value)), metric["unit"], number
