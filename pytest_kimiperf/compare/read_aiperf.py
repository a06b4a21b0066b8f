"""AIPerf's ``profile_export_aiperf.json`` (the run's summary, JsonExportData, schema 1.x).

Each metric is an object with its ``unit``, ``avg``, percentiles ``p1``..``p99`` and, from schema
1.1, its ``count`` (aiperf/common/models/export_models.py); ``input_config`` holds the user's
settings, with the load per phase (``phases``, kind ``profiling``). The file AIPerf writes beside
the artifacts is the run's; a phase's directory holds that phase's own (warm-up included).

Figures keep AIPerf's definitions, which are not vLLM's: its ``inter_token_latency`` is a
request's (latency - TTFT) / (output tokens - 1), vLLM's TPOT, with the output tokens counted by
re-tokenizing the text (``output_sequence_length``), not the server's usage count; its
``inter_chunk_latency`` is the gap between stream chunks, vLLM's ITL; decode tok/s is the median
of ``output_token_throughput_per_user`` (1 / that ITL, per request). Medians are ``p50``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kimiperf.compare.read_aiperf_records import check_against_summary, read_records, records_beside
from pytest_kimiperf.compare.runs import (
    CONCURRENCY, REQUEST_RATE, SINGLE_STREAM, ResultFileError, RunFigure, ToolRun, count, load_words, mapping,
    number,
)

TOOL = "aiperf"
_SCHEMA_MAJOR = "1"
# metric table name -> (AIPerf's metric, its unit)
_PER_REQUEST = {
    "ttft_ms": ("time_to_first_token", "ms"),
    "tpot_ms": ("inter_token_latency", "ms"),
    "itl_ms": ("inter_chunk_latency", "ms"),
    "e2el_ms": ("request_latency", "ms"),
}
_DECODE = ("output_token_throughput_per_user", "tokens/sec/user")
_RUN_LEVEL = {"output_throughput": ("output_token_throughput", "tokens/sec"),
              "request_throughput": ("request_throughput", "requests/sec")}


def looks_like(data: Any) -> bool:
    """Whether ``data`` is an AIPerf summary export."""
    return isinstance(data, Mapping) and "aiperf_version" in data and "input_config" in data


def read(path: Path, data: Mapping[str, Any]) -> list[ToolRun]:
    """The file's one run; ResultFileError for a schema, field or unit this does not know."""
    schema = str(data.get("schema_version"))
    if schema.split(".")[0] != _SCHEMA_MAJOR:
        raise ResultFileError(f"{path}: field 'schema_version' is {data.get('schema_version')!r}; this reads AIPerf "
                              f"exports of schema {_SCHEMA_MAJOR}.x (AIPerf 0.x)")
    if data.get("was_cancelled") or data.get("is_complete") is False:
        raise ResultFileError(f"{path}: field 'was_cancelled' or 'is_complete' says the run stopped early "
                              f"({data.get('incomplete_reason') or 'no reason given'}): a part of a run is not read")
    completed = int(_stat(path, data, "request_count", "requests", "avg"))
    failed = sum(count(e, "count", path, where="error_summary[]") for e in data.get("error_summary") or [])
    if completed == 0:
        raise ResultFileError(f"{path}: field 'request_count.avg' is 0: no request succeeded ({failed} failed)")
    figures: dict[str, RunFigure] = {}
    for metric, (name, unit) in _PER_REQUEST.items():
        if name not in data:
            continue
        n = _count(path, data, name, completed)
        figures[metric] = RunFigure(_stat(path, data, name, unit, "p50"), n, f"{name}.p50")
        for q in (90, 95, 99):
            figures[f"p{q}_{metric}"] = RunFigure(_stat(path, data, name, unit, f"p{q}"), n, f"{name}.p{q}")
    if "time_to_first_token" not in figures and "ttft_ms" not in figures:
        raise ResultFileError(f"{path}: field 'time_to_first_token' is missing: an AIPerf export of a streaming "
                              "run has it (--streaming); a version whose fields moved is not read")
    if _DECODE[0] in data:
        figures["decode_tok_s"] = RunFigure(_stat(path, data, *_DECODE, "p50"), _count(path, data, _DECODE[0], completed),
                                            f"{_DECODE[0]}.p50")
    for metric, (name, unit) in _RUN_LEVEL.items():
        figures[metric] = RunFigure(_stat(path, data, name, unit, "avg"), completed, f"{name}.avg")
    records = records_beside(path)
    if records is not None:
        units = {name: mapping(data, name, path)["unit"] for name, _ in (*_PER_REQUEST.values(), _DECODE) if name in data}
        check_against_summary(read_records(records), path, completed, failed, figures, units)
    kind, level = _load(path, data)
    info = data.get("run_info")
    if not isinstance(info, Mapping):
        info = {}
    return [ToolRun(path=str(path), tool=TOOL, version=str(data.get("aiperf_version") or ""),
                    load=load_words(kind, level), load_kind=kind, figures=figures, requests=completed + failed,
                    failed_requests=failed, label=str(info.get("benchmark_id") or data.get("benchmark_id") or path.name))]


def _stat(path: Path, data: Mapping[str, Any], name: str, unit: str, stat: str) -> float:
    metric = mapping(data, name, path)
    if metric.get("unit") != unit:
        raise ResultFileError(f"{path}: field '{name}.unit' is {metric.get('unit')!r}, not {unit!r}: a version whose "
                              "units moved is not read")
    return number(metric, stat, path, where=name)


def _count(path: Path, data: Mapping[str, Any], name: str, completed: int) -> int:
    """The samples a per-request metric rests on: its ``count`` (schema 1.1 on), else the requests."""
    metric = mapping(data, name, path)
    return count(metric, "count", path, where=name) if "count" in metric else completed


def _load(path: Path, data: Mapping[str, Any]) -> tuple[str, float | None]:
    config = mapping(data, "input_config", path)
    phases = config.get("phases")
    if isinstance(phases, list):
        profiling = [p for p in phases if isinstance(p, Mapping) and p.get("kind") == "profiling"]
        if len(profiling) != 1:
            raise ResultFileError(f"{path}: field 'input_config.phases' has {len(profiling)} profiling phases; "
                                  "this reads a run of one")
        settings, where = profiling[0], "input_config.phases[profiling]"
    elif isinstance(config.get("loadgen"), Mapping):
        settings, where = config["loadgen"], "input_config.loadgen"  # AIPerf before phases
    else:
        raise ResultFileError(f"{path}: field 'input_config.phases' is missing (nor 'input_config.loadgen'): "
                              "the load cannot be known")
    rate = settings.get("request_rate", settings.get("rate"))
    if rate is not None:
        return REQUEST_RATE, number({"request_rate": rate}, "request_rate", path, where=where, positive=True)
    if settings.get("concurrency") is None:
        raise ResultFileError(f"{path}: field '{where}.concurrency' is missing (nor a request rate)")
    concurrency = number(settings, "concurrency", path, where=where, positive=True)
    return (SINGLE_STREAM, 1.0) if concurrency == 1 else (CONCURRENCY, concurrency)
