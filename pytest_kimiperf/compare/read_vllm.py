"""vLLM's ``bench serve --save-result`` JSON, with or without ``--save-detailed``.

The fields are those vllm/benchmarks/serve.py writes (``benchmark`` builds ``result``, ``main``
adds the traffic settings): ``completed``, ``failed``, ``duration``, ``output_throughput``,
``request_throughput``, ``request_goodput`` (null without ``--goodput``), and per selected
percentile metric (``--percentile-metrics``, by default ttft,tpot,itl) ``median_<m>_ms`` and
``p<q>_<m>_ms`` for each ``--metric-percentiles`` (by default 99). ``--save-detailed`` keeps
the per-request lists (``ttfts``, ``itls``, ``output_lens``, ``errors``, ...), which must agree
with the counts. The file carries no vLLM version.

Figures keep vLLM's definitions: TPOT is (latency - TTFT) / (output tokens - 1) per request, its
median over requests; ITL pools every gap of every request. Decode tok/s is 1000 / median TPOT,
the plugin's per-request decode (measure/results.py) taken at vLLM's median TPOT.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kimiperf.compare.runs import (
    CONCURRENCY, REQUEST_RATE, SINGLE_STREAM, ResultFileError, RunFigure, ToolRun, count, load_words, number,
)

TOOL = "vllm bench serve"
_MEDIANS = {"ttft_ms": "median_ttft_ms", "tpot_ms": "median_tpot_ms", "itl_ms": "median_itl_ms",
            "e2el_ms": "median_e2el_ms"}
_TAILS = ("ttft_ms", "itl_ms", "tpot_ms", "e2el_ms")
_DETAIL = ("ttfts", "itls", "output_lens", "input_lens", "errors")


def looks_like(data: Any) -> bool:
    """Whether ``data`` is a bench serve result: the setup fields ``main`` writes first (the counts
    may be what is damaged, and the reader says so)."""
    return isinstance(data, Mapping) and "num_prompts" in data and ("backend" in data or "endpoint_type" in data)


def read(path: Path, data: Mapping[str, Any]) -> list[ToolRun]:
    """The file's one run; ResultFileError for a field missing, damaged, or moved."""
    completed = count(data, "completed", path)
    failed = count(data, "failed", path) if "failed" in data else 0
    if completed == 0:
        raise ResultFileError(f"{path}: field 'completed' is 0: no request of this run succeeded "
                              f"({failed} failed), so it measured nothing")
    _check_detail(path, data, completed, failed)
    kind, level = _load(path, data)
    # ITL pools every gap of every request: its figures rest on the gaps, not the requests.
    gaps = int(number(data, "total_output_tokens", path)) - completed if "total_output_tokens" in data else completed
    figures: dict[str, RunFigure] = {}
    for metric, key in _MEDIANS.items():
        if key in data:
            figures[metric] = RunFigure(number(data, key, path, positive=True), gaps if metric == "itl_ms" else completed, key)
    if not figures:
        raise ResultFileError(f"{path}: none of the fields {', '.join(repr(k) for k in _MEDIANS.values())} is there: "
                              "a bench serve result has them (--percentile-metrics); a version whose fields moved "
                              "is not read")
    if "tpot_ms" in figures:
        figures["decode_tok_s"] = RunFigure(1000.0 / figures["tpot_ms"].value, completed, "median_tpot_ms")
    for metric in _TAILS:
        for q in (90, 95, 99):
            key = f"p{q}_{metric}"
            if key in data:
                n = gaps if metric == "itl_ms" else completed
                figures[f"p{q}_{metric}"] = RunFigure(number(data, key, path, positive=True), n, key)
    for metric in ("output_throughput", "request_throughput"):
        figures[metric] = RunFigure(number(data, metric, path, positive=True), completed, metric)
    if data.get("request_goodput") is not None:
        figures["request_goodput"] = RunFigure(number(data, "request_goodput", path), completed, "request_goodput")
    return [ToolRun(path=str(path), tool=TOOL, version="", load=load_words(kind, level), load_kind=kind,
                    figures=figures, requests=completed + failed, failed_requests=failed,
                    label=str(data.get("label") or data.get("date") or path.name))]


def _load(path: Path, data: Mapping[str, Any]) -> tuple[str, float | None]:
    for key in ("request_rate", "max_concurrency"):
        if key not in data:
            raise ResultFileError(f"{path}: field {key!r} is missing (bench serve writes it with every result)")
    rate, concurrency = data["request_rate"], data["max_concurrency"]
    if concurrency is not None:
        concurrency = number(data, "max_concurrency", path, positive=True)
    if rate in ("inf", None) or (isinstance(rate, float) and rate == float("inf")):
        if concurrency == 1:
            return SINGLE_STREAM, 1.0
        return CONCURRENCY, concurrency
    return REQUEST_RATE, number(data, "request_rate", path, positive=True)


def _check_detail(path: Path, data: Mapping[str, Any], completed: int, failed: int) -> None:
    """``--save-detailed`` lists: all there or none, one entry per request, errors as counted."""
    present = [key for key in _DETAIL if key in data]
    if not present:
        return
    missing = [key for key in _DETAIL if key not in data]
    if missing:
        raise ResultFileError(f"{path}: per-request field {missing[0]!r} is missing while {present[0]!r} is there: "
                              "a --save-detailed result has all of them")
    for key in _DETAIL:
        if not isinstance(data[key], list) or len(data[key]) != completed + failed:
            size = len(data[key]) if isinstance(data[key], list) else type(data[key]).__name__
            raise ResultFileError(f"{path}: per-request field {key!r} holds {size} entries, but 'completed' + 'failed' "
                                  f"say {completed + failed} requests: the file was cut or edited")
    errored = sum(1 for error in data["errors"] if error)
    if "failed" in data and errored != failed:
        raise ResultFileError(f"{path}: field 'errors' lists {errored} failed requests, field 'failed' says {failed}")
