"""Exports other tools read (``--kimiperf-export DIR``): bench-serve result files and request records.

Per test and profile (and boot), one file in the shape of ``vllm bench serve --save-result``
(vllm/benchmarks/serve.py: ``result_json`` of ``main`` merged with the ``result`` dict of
``benchmark``): same top-level field names and units (durations in s, latencies in ms,
per-request arrays in s), so a dashboard that reads bench serve's files reads ours unchanged.
With ``--kimiperf-export-detailed`` the per-request arrays (``input_lens``, ``output_lens``,
``ttfts``, ``itls``, ``start_times``, ``errors``, ...) are kept, as ``--save-detailed`` keeps them.

Beside them, ``requests.jsonl``: one JSON object per measured request of the session (profile,
boot, test, send time, TTFT, every token chunk's arrival, tokens, status, error), the raw data
behind every figure, as AIPerf's profile export gives.

The figures are computed here from the request records, by bench serve's rules
(``calculate_metrics``): every statistic over successful requests, ``itl`` pools every gap of
every request, a failed request has output length 0, std is the population std. Pure: no pytest.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.numbers import json_safe
from pytest_kimiperf.reports.model import SessionReport

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
            _write(path, json.dumps(data, allow_nan=False) + "\n")
            written.append(path)
        lines = [json.dumps(json_safe(line), allow_nan=False)
                 for res in report.results for line in _request_lines(res)]
        path = out_dir / REQUESTS_FILE
        _write(path, "".join(f"{line}\n" for line in lines))
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


def _write(path: Path, text: str) -> None:
    write_atomically(path, text)

