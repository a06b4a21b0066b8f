"""The server's own view of a run, from vLLM's Prometheus ``/metrics`` read before and after.

The deltas over exactly the measured requests give the server's mean TTFT and ITL
(vllm/v1/metrics/loggers.py; ITL is one observation per streamed output, so a chunk of several
tokens counts once) and its generated tokens, reported next to the client's figures: the client's
TTFT also holds HTTP, queueing in the API server and detokenization, so the gap says where time
goes. The prefix-cache counters (in prompt *tokens*, counted when a request is scheduled:
vllm/v1/core/kv_cache_manager.py ``record_prefix_cache_stats``) say whether a measured prefill was
really computed: the workload's prompts are unique, so hits mean a request was served from
another's prefill (:func:`unexpected_prefix_hits`). Older names (the ITL metric before vLLM 0.11,
removed in 0.13 by vllm-project/vllm PRs #24110 and #32661; the ``gpu_`` prefix-cache counters of
earlier V1 releases, which dashboards still read) are read only where the new ones are absent.

**The engine's own clock.** The engine core stamps each finished request's phases
(vllm/v1/metrics/stats.py ``update_from_finished_request``). Queue plus prefill time is the
engine's side of TTFT (``time_to_first_token_seconds`` runs on the API server's clock, which a
starved API server inflates as it inflates the client's); decode time over the tokens after each
request's first is its time per output token, token-weighted, with each request's own mean TPOT
where decode time is not exported (:meth:`ServerView.engine_figures`). A name the server does not
export is named in ``engine_missing``; a server with none of them (not vLLM) leaves the verdicts
to the client's clock alone.

The exposition is parsed by prometheus_client's own parser (the library vLLM exports with).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kimiperf.measure.results import RunResult

import httpx

TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"
ITL_METRIC_BEFORE_0_11 = "vllm:time_per_output_token_seconds"
GENERATION_TOKENS_METRIC = "vllm:generation_tokens_total"
# prometheus_client exposes a Counter named X as X_total (and X_created).
PREFIX_CACHE_QUERIES_METRIC = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS_METRIC = "vllm:prefix_cache_hits_total"
PREFIX_CACHE_QUERIES_METRIC_GPU_NAME = "vllm:gpu_prefix_cache_queries_total"
PREFIX_CACHE_HITS_METRIC_GPU_NAME = "vllm:gpu_prefix_cache_hits_total"
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
# The engine core's own stamps of each finished request (histograms; see the module's docstring).
QUEUE_TIME_METRIC = "vllm:request_queue_time_seconds"
PREFILL_TIME_METRIC = "vllm:request_prefill_time_seconds"
DECODE_TIME_METRIC = "vllm:request_decode_time_seconds"
GENERATION_PER_REQUEST_METRIC = "vllm:request_generation_tokens"
TPOT_PER_REQUEST_METRIC = "vllm:request_time_per_output_token_seconds"
ENGINE_METRICS: tuple[str, ...] = (QUEUE_TIME_METRIC, PREFILL_TIME_METRIC, DECODE_TIME_METRIC,
                                   GENERATION_PER_REQUEST_METRIC, TPOT_PER_REQUEST_METRIC)
# vLLM's KV block size on GPUs (CacheConfig.block_size default), for a server that does not say;
# the CPU engine uses 128 (tests/data/server_metrics). A prefix-cache hit is a whole number of
# blocks ("the computed blocks must be full", KVCacheManager.get_computed_blocks).
DEFAULT_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: series name, labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_prometheus_text(text: str) -> Iterator[Sample]:
    """The samples of a Prometheus text exposition, read by prometheus_client's own parser.

    That parser rejects the whole text at the first malformed line; a server's one bad line
    must not cost the run its server view, so then the text is read again line by line and
    only the malformed lines are skipped.
    """
    try:
        samples = list(_parse(text))
    except ValueError:
        samples = []
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                with contextlib.suppress(ValueError):
                    samples.extend(_parse(line + "\n"))
    yield from samples


def _parse(text: str) -> Iterator[Sample]:
    # Imported here: prometheus_client is a dependency of the plugin (and of vLLM), but an
    # environment that lacks it should still import the plugin and fail only where /metrics is read.
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield Sample(sample.name, dict(sample.labels), float(sample.value))


@dataclass(frozen=True)
class Histogram:
    """A histogram summed over engines: total, count and cumulative ``(le, count)`` buckets."""

    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...]

    def minus(self, before: Histogram) -> Histogram:
        """What was observed between ``before`` and this one."""
        before_buckets = dict(before.buckets)
        return Histogram(
            sum=self.sum - before.sum,
            count=self.count - before.count,
            buckets=tuple((le, n - before_buckets.get(le, 0.0)) for le, n in self.buckets),
        )

    @property
    def mean(self) -> float | None:
        """Mean observation, None without observations."""
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Estimated q-quantile (0..1), interpolated inside its bucket as PromQL's histogram_quantile."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_le, lower_count = 0.0, 0.0
        for le, count in self.buckets:
            if count >= rank:
                if math.isinf(le):
                    return lower_le  # beyond the last finite bound: its lower edge is all we know
                if count == lower_count:
                    return le
                return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
            lower_le, lower_count = le, count
        return lower_le


@dataclass(frozen=True)
class VllmMetrics:
    """The metrics this module reads: at one moment (:class:`Snapshot`) or between two
    (:class:`ServerView`)."""

    ttft: Histogram | None
    itl: Histogram | None
    itl_metric: str
    generation_tokens: float | None
    # Prompt tokens looked up in vLLM's prefix cache and found there (None: not exported).
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    # The KV block size the server reports (None: not reported).
    block_tokens: int | None = None
    # The engine core's per-request histograms (ENGINE_METRICS), those the server exports.
    engine: Mapping[str, Histogram] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot(VllmMetrics):
    """The metrics this module reads, at one moment."""


def _matches(labels: Mapping[str, str], model: str | None) -> bool:
    return model is None or labels.get("model_name") == model


def _histogram(samples: list[Sample], name: str, model: str | None) -> Histogram | None:
    total = count = 0.0
    buckets: dict[float, float] = {}
    seen = False
    for sample in samples:
        if not _matches(sample.labels, model):
            continue
        if sample.name == f"{name}_sum":
            total += sample.value
            seen = True
        elif sample.name == f"{name}_count":
            count += sample.value
            seen = True
        elif sample.name == f"{name}_bucket" and "le" in sample.labels:
            le = float(sample.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + sample.value
    if not seen:
        return None
    return Histogram(total, count, tuple(sorted(buckets.items())))


def snapshot_from_text(text: str, *, model: str | None = None) -> Snapshot:
    """TTFT, ITL, generated tokens and prefix-cache tokens of an exposition (summed over engines).

    ``model`` keeps only series whose ``model_name`` label is it; when no series has that
    label value (a served-model alias, say) every series counts: vLLM serves one model.
    """
    samples = list(parse_prometheus_text(text))
    if model is not None and not any(s.labels.get("model_name") == model for s in samples):
        model = None
    itl_metric = ITL_METRIC
    itl = _histogram(samples, ITL_METRIC, model)
    if itl is None:
        older = _histogram(samples, ITL_METRIC_BEFORE_0_11, model)
        if older is not None:
            itl, itl_metric = older, ITL_METRIC_BEFORE_0_11
    queries = _counter(samples, PREFIX_CACHE_QUERIES_METRIC, model)
    hits = _counter(samples, PREFIX_CACHE_HITS_METRIC, model)
    if queries is None and hits is None:
        queries = _counter(samples, PREFIX_CACHE_QUERIES_METRIC_GPU_NAME, model)
        hits = _counter(samples, PREFIX_CACHE_HITS_METRIC_GPU_NAME, model)
    return Snapshot(
        ttft=_histogram(samples, TTFT_METRIC, model),
        itl=itl,
        itl_metric=itl_metric,
        generation_tokens=_counter(samples, GENERATION_TOKENS_METRIC, model),
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        block_tokens=_block_tokens(samples),
        engine={name: hist for name in ENGINE_METRICS if (hist := _histogram(samples, name, model)) is not None},
    )


def _block_tokens(samples: list[Sample]) -> int | None:
    for sample in samples:
        if sample.name == CACHE_CONFIG_METRIC and sample.labels.get("block_size", "").isdigit():
            return int(sample.labels["block_size"])
    return None


def _counter(samples: list[Sample], name: str, model: str | None) -> float | None:
    values = [s.value for s in samples if s.name == name and _matches(s.labels, model)]
    return sum(values) if values else None


def fetch_snapshot(
    base_url: str, *, model: str | None = None, api_key: str | None = None, timeout_s: float = 10.0
) -> Snapshot:
    """GET ``<base_url>/metrics`` and read it; raises httpx errors when the server has none."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(f"{base_url.rstrip('/')}/metrics", headers=headers, timeout=timeout_s)
    response.raise_for_status()
    return snapshot_from_text(response.text, model=model)


@dataclass(frozen=True)
class ServerView(VllmMetrics):
    """What the server saw between two snapshots."""

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> ServerView:
        """The delta from ``before`` to ``after``."""
        def delta(a: Histogram | None, b: Histogram | None) -> Histogram | None:
            return a.minus(b) if a is not None and b is not None else None

        def counted(a: float | None, b: float | None) -> float | None:
            return a - b if a is not None and b is not None else None

        itl_before = before.itl if before.itl_metric == after.itl_metric else None
        return cls(
            delta(after.ttft, before.ttft), delta(after.itl, itl_before), after.itl_metric,
            counted(after.generation_tokens, before.generation_tokens),
            counted(after.prefix_cache_queries, before.prefix_cache_queries),
            counted(after.prefix_cache_hits, before.prefix_cache_hits),
            after.block_tokens,
            {name: hist.minus(before.engine[name]) for name, hist in after.engine.items() if name in before.engine},
        )

    def engine_figures(self) -> EngineFigures:
        """The engine's own figures over the window (its clock, not the API server's)."""
        h = self.engine
        missing = tuple(name for name in ENGINE_METRICS if name not in h)
        requests = h[DECODE_TIME_METRIC].count if DECODE_TIME_METRIC in h else None
        tpot_s = None
        decode, generated = h.get(DECODE_TIME_METRIC), h.get(GENERATION_PER_REQUEST_METRIC)
        if decode is not None and generated is not None and generated.sum - generated.count > 0:
            tpot_s = decode.sum / (generated.sum - generated.count)
        elif (per_request := h.get(TPOT_PER_REQUEST_METRIC)) is not None:
            tpot_s = per_request.mean
        ttft_s = None
        queue, prefill = h.get(QUEUE_TIME_METRIC), h.get(PREFILL_TIME_METRIC)
        if queue is not None and prefill is not None and prefill.count > 0:
            ttft_s = (queue.sum + prefill.sum) / prefill.count
        tokens = generated.sum - generated.count if generated is not None else None
        return EngineFigures(
            tpot_ms=_ms(tpot_s) if tpot_s else None, ttft_ms=_ms(ttft_s),
            requests=requests, missing=missing, tokens=tokens)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Share of the queried prompt tokens found in the prefix cache; None without queries."""
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    def to_json(self) -> dict[str, Any]:
        """Means and estimated p50/p99 in ms, observation counts, generated tokens, prefix-cache tokens."""
        out: dict[str, Any] = {
            "itl_metric": self.itl_metric, "generation_tokens": self.generation_tokens,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "kv_block_tokens": self.block_tokens,
            **self.engine_figures().to_json(),
        }
        for key, hist in (("ttft", self.ttft), ("itl", self.itl)):
            out[f"{key}_count"] = hist.count if hist else None
            out[f"mean_{key}_ms"] = _ms(hist.mean) if hist else None
            out[f"p50_{key}_ms"] = _ms(hist.quantile(0.5)) if hist else None
            out[f"p99_{key}_ms"] = _ms(hist.quantile(0.99)) if hist else None
        return out


@dataclass(frozen=True)
class EngineFigures:
    """The engine core's own figures over a window: its time per output token (``tpot_ms``, and
    the decode rate it makes), its side of TTFT (queue plus prefill), the requests it finished,
    the ENGINE_METRICS names the server did not export, and the decode tokens its time per token
    rests on (those after each request's first)."""

    tpot_ms: float | None
    ttft_ms: float | None
    requests: float | None = None
    missing: tuple[str, ...] = ()
    tokens: float | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """The engine's decode rate, tokens per second of its own decode time."""
        return 1000.0 / self.tpot_ms if self.tpot_ms else None

    def to_json(self) -> dict[str, Any]:
        """The ``engine_*`` fields of a server view's JSON."""
        return {"engine_tpot_ms": self.tpot_ms, "engine_decode_tok_s": self.decode_tok_s,
                "engine_ttft_ms": self.ttft_ms, "engine_requests": self.requests,
                "engine_tokens": self.tokens, "engine_missing": list(self.missing)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineFigures:
        """The engine's figures from a server view's JSON (None fields where it had none)."""
        return cls(tpot_ms=data.get("engine_tpot_ms"), ttft_ms=data.get("engine_ttft_ms"),
                   requests=data.get("engine_requests"), tokens=data.get("engine_tokens"),
                   missing=tuple(data.get("engine_missing") or ENGINE_METRICS))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


@dataclass(frozen=True)
class PrefixReuse:
    """The prefix cache served whole blocks of a run whose prompts are unique: the tokens it
    served and the tokens it was asked for (0 where the server did not count them)."""

    hit_tokens: float
    queried_tokens: float


def unexpected_prefix_hits(
    views: Sequence[Mapping[str, Any]], *, endpoint: str, reused_requests: int = 0,
) -> PrefixReuse | None:
    """What the prefix cache served of a run whose prompts were all unique, else None.

    ``views`` are the run's ``ServerView.to_json()`` (one per run or extension). On the
    completions endpoint, hits of one KV block or more (the server's block size, else
    ``DEFAULT_BLOCK_TOKENS``) are unexpected: two of the workload's prompts share at most the BOS
    token and a chance word or two, and vLLM counts hits in whole blocks, so an honest run hits 0
    tokens. No wider allowance: a request served from another's prefill hits just one block when
    its prompt is under two blocks long. The chat endpoint is never flagged (every prompt starts
    with the same chat template, whose blocks hit legitimately), nor is a run that re-sent its own
    prompts (``reused_requests``: a seconds budget that outran the distinct prompts).
    """
    if endpoint == "chat" or reused_requests > 0 or not views:
        return None
    hits = [h for v in views if (h := v.get("prefix_cache_hits")) is not None]
    if len(hits) != len(views):
        return None
    block = max((int(v.get("kv_block_tokens") or 0) for v in views), default=0) or DEFAULT_BLOCK_TOKENS
    total_hits = float(sum(hits))
    if total_hits < block:
        return None
    return PrefixReuse(total_hits, float(sum(v.get("prefix_cache_queries") or 0.0 for v in views)))


def run_cross_checks(run: RunResult) -> list[PrefixReuse]:
    """The server's view against what the client sent: each surprise (an unexpected prefix-cache
    hit), for the gate to show beside the verdict."""
    from pytest_kimiperf.measure.workload import reused_prompt_requests

    hits = unexpected_prefix_hits(run.server_metrics, endpoint=run.load.get("endpoint", "completions"),
                                  reused_requests=reused_prompt_requests(run.records))
    return [hits] if hits else []
