"""The server's own view of a run, from vLLM's Prometheus ``/metrics`` read before and after.

vLLM (vllm/v1/metrics/loggers.py) exports, per engine and model:

* ``vllm:time_to_first_token_seconds`` (histogram): arrival in the engine -> first token.
* ``vllm:inter_token_latency_seconds`` (histogram): one observation per streamed output, so a
  chunk carrying several tokens counts once. vLLM < 0.11 named it
  ``vllm:time_per_output_token_seconds``; it was deprecated in 0.11 and removed in 0.13
  (vllm-project/vllm PRs #24110, #32661), so the old name is read only when the new one is
  absent.
* ``vllm:generation_tokens_total`` (counter): tokens generated.

The deltas give the server-side mean TTFT and ITL and the token count over exactly the measured
requests, reported next to the client's figures: the client's TTFT also holds HTTP, queueing in
the API server and detokenization, so the gap between the two says where time goes.

The text exposition format is parsed here by hand (a few lines), so the plugin does not need
vLLM or prometheus_client to read it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"
ITL_METRIC_BEFORE_0_11 = "vllm:time_per_output_token_seconds"
GENERATION_TOKENS_METRIC = "vllm:generation_tokens_total"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True)
class Sample:
    """One line of the exposition: series name, labels, value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_prometheus_text(text: str) -> Iterator[Sample]:
    """The samples of a Prometheus text exposition (comments and malformed lines skipped)."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, raw_labels, raw_value = match.groups()
        try:
            value = float(raw_value)
        except ValueError:
            continue
        labels: dict[str, str] = {}
        if raw_labels:
            for label in _LABEL.finditer(raw_labels):
                labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], label.group(2))
        yield Sample(name, labels, value)


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
class Snapshot:
    """The metrics this module reads, at one moment."""

    ttft: Histogram | None
    itl: Histogram | None
    itl_metric: str
    generation_tokens: float | None


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
    """Read TTFT, ITL and generated tokens out of an exposition (summed over engines).

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
    tokens = [s.value for s in samples if s.name == GENERATION_TOKENS_METRIC and _matches(s.labels, model)]
    return Snapshot(
        ttft=_histogram(samples, TTFT_METRIC, model),
        itl=itl,
        itl_metric=itl_metric,
        generation_tokens=sum(tokens) if tokens else None,
    )


def fetch_snapshot(
    base_url: str, *, model: str | None = None, api_key: str | None = None, timeout_s: float = 10.0
) -> Snapshot:
    """GET ``<base_url>/metrics`` and read it; raises httpx errors when the server has none."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.get(f"{base_url.rstrip('/')}/metrics", headers=headers, timeout=timeout_s)
    response.raise_for_status()
    return snapshot_from_text(response.text, model=model)


@dataclass(frozen=True)
class ServerView:
    """What the server saw between two snapshots."""

    ttft: Histogram | None
    itl: Histogram | None
    itl_metric: str
    generation_tokens: float | None

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> ServerView:
        """The delta from ``before`` to ``after``."""
        def delta(a: Histogram | None, b: Histogram | None) -> Histogram | None:
            return a.minus(b) if a is not None and b is not None else None

        tokens = None
        if before.generation_tokens is not None and after.generation_tokens is not None:
            tokens = after.generation_tokens - before.generation_tokens
        itl_before = before.itl if before.itl_metric == after.itl_metric else None
        return cls(delta(after.ttft, before.ttft), delta(after.itl, itl_before), after.itl_metric, tokens)

    def to_json(self) -> dict[str, Any]:
        """Means and estimated p50/p99 in ms, observation counts, generated tokens."""
        out: dict[str, Any] = {"itl_metric": self.itl_metric, "generation_tokens": self.generation_tokens}
        for key, hist in (("ttft", self.ttft), ("itl", self.itl)):
            out[f"{key}_count"] = hist.count if hist else None
            out[f"mean_{key}_ms"] = _ms(hist.mean) if hist else None
            out[f"p50_{key}_ms"] = _ms(hist.quantile(0.5)) if hist else None
            out[f"p99_{key}_ms"] = _ms(hist.quantile(0.99)) if hist else None
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
