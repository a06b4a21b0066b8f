"""One request's timeline and the per-request figures read from it (pure: no I/O, no pytest).

Definitions follow vLLM's ``bench serve`` (vllm/benchmarks/serve.py ``calculate_metrics`` and
vllm/benchmarks/lib/endpoint_request_func.py), so numbers line up with what vLLM users know:

* TTFT: request sent -> first chunk that carries choices.
* E2EL: request sent -> last chunk that carries choices (the trailing usage chunk is not a token).
* ITL: gaps between consecutive chunks that carry choices (a chunk may hold several tokens).
* TPOT: (E2EL - TTFT) / (output_tokens - 1), output_tokens from ``usage.completion_tokens``.
* decode tok/s (ours): (output_tokens - 1) / (last chunk - first chunk): the decode rate one
  stream sees, excluding prefill. It is ``1000 / TPOT`` when the first chunk holds one token.

Also the percentile every figure of the plugin's runs is summarized with (numpy's default method).
The run-level figures built from many records are in results.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimiperf.config.metric_specs import SampleKind, metrics_of
from pytest_kimiperf.errors import ConfigError

PER_REQUEST_METRICS: tuple[str, ...] = metrics_of(SampleKind.REQUEST)

NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default method."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r} is outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def median(values: Sequence[float]) -> float:
    """The median (the 50th percentile)."""
    return percentile(values, 50)


@dataclass(frozen=True)
class RequestRecord:
    """One request's timeline, in ``perf_counter_ns`` (CLOCK_MONOTONIC, comparable across processes)."""

    ok: bool
    error: str
    prompt_tokens: int
    output_tokens: int
    t_send_ns: int
    # Arrival of each chunk that carries choices, in order.
    chunk_ns: tuple[int, ...]
    t_done_ns: int
    # When the load pattern wanted it sent (None: no schedule, e.g. a lone test request).
    scheduled_send_ns: int | None = None
    request_id: str = ""
    # When the client started handling it (before building the HTTP request).
    t_start_ns: int = 0
    # The client gave up waiting for a token (its first-token or inter-chunk deadline): the
    # fact engine.py counts stalls in a row by; ``error`` says it in words.
    stalled: bool = False

    @property
    def ttft_ms(self) -> float | None:
        """Send -> first chunk carrying choices."""
        if not self.chunk_ns:
            return None
        return (self.chunk_ns[0] - self.t_send_ns) / NS_PER_MS

    @property
    def e2el_ms(self) -> float | None:
        """Send -> last chunk carrying choices."""
        if not self.chunk_ns:
            return None
        return (self.chunk_ns[-1] - self.t_send_ns) / NS_PER_MS

    @property
    def itl_ms(self) -> list[float]:
        """Gaps between consecutive chunks carrying choices."""
        chunks = self.chunk_ns
        return [(b - a) / NS_PER_MS for a, b in itertools.pairwise(chunks)]

    @property
    def median_itl_ms(self) -> float | None:
        """This request's median gap (its one ``itl_ms`` sample)."""
        gaps = self.itl_ms
        return median(gaps) if gaps else None

    @property
    def tpot_ms(self) -> float | None:
        """(E2EL - TTFT) / (output_tokens - 1); None with fewer than two output tokens."""
        if self.output_tokens < 2 or not self.chunk_ns:
            return None
        return (self.chunk_ns[-1] - self.chunk_ns[0]) / NS_PER_MS / (self.output_tokens - 1)

    @property
    def decode_tok_s(self) -> float | None:
        """(output_tokens - 1) / (last chunk - first chunk); None when that span is empty."""
        if self.output_tokens < 2 or len(self.chunk_ns) < 2:
            return None
        span_ns = self.chunk_ns[-1] - self.chunk_ns[0]
        if span_ns <= 0:
            return None
        return (self.output_tokens - 1) * _NS_PER_S / span_ns

    @property
    def send_lag_ms(self) -> float | None:
        """How late the request went out versus its schedule."""
        if self.scheduled_send_ns is None:
            return None
        return (self.t_send_ns - self.scheduled_send_ns) / NS_PER_MS

    def value(self, metric_name: str) -> float | None:
        """This request's one sample of a per-request metric (None when undefined for it)."""
        if metric_name == "itl_ms":
            return self.median_itl_ms
        if metric_name not in PER_REQUEST_METRICS:
            raise ConfigError(
                f"{metric_name!r} is not a per-request metric; per-request metrics: "
                f"{', '.join(PER_REQUEST_METRICS)}"
            )
        result: float | None = getattr(self, metric_name)
        return result

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """Inverse of :meth:`to_json` (a run's ``requests`` in the JSON it travels as)."""
        scheduled = data.get("scheduled_send_ns")
        return cls(ok=bool(data["ok"]), error=str(data.get("error") or ""), prompt_tokens=int(data["prompt_tokens"]),
                   output_tokens=int(data["output_tokens"]), t_send_ns=int(data["t_send_ns"]),
                   chunk_ns=tuple(int(c) for c in data.get("chunk_ns") or ()), t_done_ns=int(data["t_done_ns"]),
                   scheduled_send_ns=None if scheduled is None else int(scheduled),
                   request_id=str(data.get("request_id") or ""), t_start_ns=int(data.get("t_start_ns") or 0),
                   stalled=bool(data.get("stalled")))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps kept in ns)."""
        return {
            "ok": self.ok, "error": self.error, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "t_send_ns": self.t_send_ns,
            "chunk_ns": list(self.chunk_ns), "t_done_ns": self.t_done_ns,
            "scheduled_send_ns": self.scheduled_send_ns, "request_id": self.request_id,
            "t_start_ns": self.t_start_ns, **({"stalled": True} if self.stalled else {}),
        }
