"""guidellm's JSON report (``guidellm run --output kind=json``; report version 2, guidellm 0.8).

The report (guidellm/benchmark/schemas: GenerativeBenchmarksReport) holds ``metadata`` (its
``version`` and ``guidellm_version``) and ``benchmarks``, one per load the run swept; each has its
``config.strategy`` (``type_`` synchronous, concurrent with ``streams``, constant or poisson with
``rate``, throughput), ``metrics.request_totals`` and per metric a distribution for the
``successful`` requests (``median``, ``count``, ``percentiles.p90``...). Each benchmark is one run.

Figures keep guidellm's definitions: its ``time_per_output_token_ms`` and
``inter_token_latency_ms`` are distributions over tokens, not requests (``count`` is the output
tokens); its ITL is a request's (latency - TTFT) / (output tokens - 1), vLLM's TPOT, and this
reads it as the plugin's TPOT; decode tok/s is 1000 / its median. ``request_latency`` is in
seconds. Throughputs are the mean of guidellm's rate over the run (what its console prints).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kimiperf.compare.runs import (
    CONCURRENCY, REQUEST_RATE, SINGLE_STREAM, ResultFileError, RunFigure, ToolRun, count, load_words, mapping,
    number,
)

TOOL = "guidellm"
_REPORT_VERSION = 2
# metric table name -> (guidellm's metric, scale to the table's unit)
_PER_REQUEST = {
    "ttft_ms": ("time_to_first_token_ms", 1.0),
    "tpot_ms": ("inter_token_latency_ms", 1.0),
    "e2el_ms": ("request_latency", 1000.0),
}
_RUN_LEVEL = {"output_throughput": "output_tokens_per_second", "request_throughput": "requests_per_second"}


def looks_like(data: Any) -> bool:
    """Whether ``data`` is a guidellm benchmarks report."""
    meta = data.get("metadata") if isinstance(data, Mapping) else None
    return isinstance(meta, Mapping) and "guidellm_version" in meta and "benchmarks" in data


def read(path: Path, data: Mapping[str, Any]) -> list[ToolRun]:
    """One run per benchmark of the report; ResultFileError for a version or field this does not know."""
    meta = mapping(data, "metadata", path)
    if meta.get("version") != _REPORT_VERSION:
        raise ResultFileError(f"{path}: field 'metadata.version' is {meta.get('version')!r}; this reads guidellm "
                              f"reports of version {_REPORT_VERSION} (guidellm 0.8)")
    benchmarks = data["benchmarks"]
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ResultFileError(f"{path}: field 'benchmarks' holds no benchmark")
    return [_run(path, meta, bench, f"benchmarks[{i}]") for i, bench in enumerate(benchmarks)]


def _run(path: Path, meta: Mapping[str, Any], bench: Any, where: str) -> ToolRun:
    metrics = mapping(bench, "metrics", path, where=where)
    totals = mapping(metrics, "request_totals", path, where=f"{where}.metrics")
    completed = count(totals, "successful", path, where=f"{where}.metrics.request_totals")
    failed = sum(count(totals, key, path, where=f"{where}.metrics.request_totals") for key in ("errored", "incomplete"))
    if completed == 0:
        raise ResultFileError(f"{path}: field '{where}.metrics.request_totals.successful' is 0: no request succeeded")
    figures: dict[str, RunFigure] = {}
    for metric, (name, scale) in _PER_REQUEST.items():
        dist, at = _successful(path, metrics, name, where)
        # A distribution over tokens holds each request's figure once a token: it rests on the requests.
        n = count(dist, "count", path, where=at) if metric == "ttft_ms" or metric == "e2el_ms" else completed
        figures[metric] = RunFigure(scale * number(dist, "median", path, where=at, positive=True), n, f"{at}.median")
        percentiles = mapping(dist, "percentiles", path, where=at)
        for q in (90, 95, 99):
            value = number(percentiles, f"p{q}", path, where=f"{at}.percentiles", positive=True)
            figures[f"p{q}_{metric}"] = RunFigure(scale * value, n, f"{at}.percentiles.p{q}")
    figures["decode_tok_s"] = RunFigure(1000.0 / figures["tpot_ms"].value, figures["tpot_ms"].n,
                                        figures["tpot_ms"].field)
    for metric, name in _RUN_LEVEL.items():
        dist, at = _successful(path, metrics, name, where)
        figures[metric] = RunFigure(number(dist, "mean", path, where=at, positive=True), completed, f"{at}.mean")
    kind, level = _load(path, bench, where)
    return ToolRun(path=str(path), tool=TOOL, version=str(meta.get("guidellm_version") or ""),
                   load=load_words(kind, level), load_kind=kind, figures=figures, requests=completed + failed,
                   failed_requests=failed, label=f"{path.name} {where}")


def _successful(path: Path, metrics: Mapping[str, Any], name: str, where: str) -> tuple[Mapping[str, Any], str]:
    at = f"{where}.metrics.{name}"
    return mapping(mapping(metrics, name, path, where=f"{where}.metrics"), "successful", path, where=at), f"{at}.successful"


def _load(path: Path, bench: Mapping[str, Any], where: str) -> tuple[str, float | None]:
    strategy = mapping(mapping(bench, "config", path, where=where), "strategy", path, where=f"{where}.config")
    at = f"{where}.config.strategy"
    kind = strategy.get("type_")
    if kind == "synchronous":
        return SINGLE_STREAM, 1.0
    if kind == "concurrent":
        streams = number(strategy, "streams", path, where=at, positive=True)
        return (SINGLE_STREAM, 1.0) if streams == 1 else (CONCURRENCY, streams)
    if kind == "throughput":
        limit = strategy.get("max_concurrency")
        return CONCURRENCY, None if limit is None else number(strategy, "max_concurrency", path, where=at, positive=True)
    if kind in ("constant", "poisson", "async"):
        return REQUEST_RATE, number(strategy, "rate", path, where=at, positive=True)
    raise ResultFileError(f"{path}: field '{at}.type_' is {kind!r}; this reads synchronous, concurrent, throughput, "
                          "constant and poisson benchmarks")
