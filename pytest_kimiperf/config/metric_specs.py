"""What each measured metric is: unit, which direction is better, default tolerance, and what one
sample of it is (:class:`SampleKind`): the one table a new metric is declared in.

Field names follow vLLM's ``bench serve`` result JSON where the metric is the same
(``median_ttft_ms``, ``output_throughput``, ...), so dashboards that read it read ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from pytest_kimiperf.errors import ConfigError


class Direction(str, Enum):
    """Which way is better for a metric."""

    HIGHER_IS_BETTER = "higher_is_better"
    LOWER_IS_BETTER = "lower_is_better"


# Within-boot: a boot's median needs this many samples (requests, or rounds for throughputs) to count.
MIN_SAMPLES_PER_BOOT = 3


class SampleKind(str, Enum):
    """What one sample of a metric is, and so where its samples come from."""

    REQUEST = "request"  # one per valid request (measure/results.RequestRecord.value)
    ROUND = "round"  # one per measured round (measure/results.RoundResult)
    TAIL = "tail"  # its base's samples pooled; a boot is summarized by their quantile
    GOODPUT = "goodput"  # one per round, counted against the SLOs perf.check(goodput=...) gives
    BOOT = "boot"  # one per server boot: the boot's own seconds (server/progress.py)

    @property
    def per_round(self) -> bool:
        """Whether a run gives one sample per measured round (so a verdict needs rounds)."""
        return self in (SampleKind.ROUND, SampleKind.GOODPUT)


@dataclass(frozen=True)
class MetricSpec:
    """A metric's identity, and what one sample of it is (``sample``)."""

    name: str
    label: str
    unit: str
    direction: Direction
    default_tolerance: float
    # Prefix vLLM's bench serve uses for summary fields (median_<x>, p99_<x>), or its field name.
    bench_serve_name: str | None = None
    # Tail metrics: a boot is this quantile of ``base``'s samples, not their median.
    quantile: float | None = None
    base: str | None = None
    sample: SampleKind = SampleKind.REQUEST
    # A boot metric: the boot-account phase it is (None: the whole boot, to ready).
    boot_phase: str | None = None

    @property
    def heading(self) -> str:
        """The metric as every report names it: label and unit, e.g. ``decode tok/s``."""
        return f"{self.label} {self.unit}".strip()


METRICS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec("decode_tok_s", "decode", "tok/s", Direction.HIGHER_IS_BETTER, 0.03, None),
        MetricSpec("itl_ms", "inter-token latency", "ms", Direction.LOWER_IS_BETTER, 0.03, "itl_ms"),
        MetricSpec("tpot_ms", "time per output token", "ms", Direction.LOWER_IS_BETTER, 0.03, "tpot_ms"),
        MetricSpec("ttft_ms", "time to first token", "ms", Direction.LOWER_IS_BETTER, 0.05, "ttft_ms"),
        MetricSpec("e2el_ms", "end-to-end latency", "ms", Direction.LOWER_IS_BETTER, 0.05, "e2el_ms"),
        MetricSpec(
            "output_throughput", "output throughput", "tok/s", Direction.HIGHER_IS_BETTER, 0.05,
            "output_throughput", sample=SampleKind.ROUND,
        ),
        MetricSpec(
            "request_throughput", "request throughput", "req/s", Direction.HIGHER_IS_BETTER, 0.05,
            "request_throughput", sample=SampleKind.ROUND,
        ),
        MetricSpec(
            "request_goodput", "request goodput", "req/s", Direction.HIGHER_IS_BETTER, 0.05,
            "request_goodput", sample=SampleKind.GOODPUT,
        ),
        # One sample per boot but the session's first, which fills the page and compile caches for all
        # that follow: a load that got slower after a driver, vLLM or disk change is a regression too.
        *(MetricSpec(name, label, "s", Direction.LOWER_IS_BETTER, tol, None, sample=SampleKind.BOOT, boot_phase=phase)
          for name, label, phase, tol in (("boot_ready_s", "seconds to ready", None, 0.10),
                                          ("boot_weights_s", "weight load", "loading weights", 0.15),
                                          ("boot_compile_s", "compile", "compiling", 0.15),
                                          ("boot_graphs_s", "CUDA graph capture", "capturing CUDA graphs", 0.15))),
        # Tails: noisier than medians (fewer samples carry them), so wider default tolerances.
        # p99 ITL pools every gap of the boot, as bench serve pools them.
        *(MetricSpec(f"p{q}_{base}", f"p{q} {label}", "ms", Direction.LOWER_IS_BETTER, tol, None,
                     quantile=q / 100, base=base, sample=SampleKind.TAIL)
          for base, label in (("ttft_ms", "time to first token"), ("itl_ms", "inter-token latency"),
                              ("tpot_ms", "time per output token"), ("e2el_ms", "end-to-end latency"))
          for q, tol in ((90, 0.05), (95, 0.08), (99, 0.10))),
    )
}


# The metric whose verdict answers a test's question, by its load: one stream asks "how fast does it
# decode?", a closed loop "how much does it serve?", an open loop at a set rate "how soon does it answer?".
PRIMARY_METRICS: dict[str, str] = {
    "single-stream": "decode_tok_s",
    "concurrency": "output_throughput",
    "request-rate": "ttft_ms",
}


def primary_metric(load_kind: str, checked: Sequence[str]) -> str:
    """The primary metric of a test that offers ``load_kind`` and gates ``checked`` (in the
    test's order): the table's, where the test gates it, else the first it gates."""
    if not checked:
        raise ValueError("a test without gated metrics has no primary metric")
    primary = PRIMARY_METRICS.get(load_kind)
    return primary if primary is not None and primary in checked else checked[0]


def metrics_of(kind: SampleKind) -> tuple[str, ...]:
    """The metrics whose samples are of ``kind``, in table order."""
    return tuple(name for name, spec in METRICS.items() if spec.sample is kind)


def metric_spec(name: str) -> MetricSpec:
    """Look a metric up by name; an unknown one is a ConfigError listing the known ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise ConfigError(
            f"unknown metric {name!r}; known metrics: {', '.join(sorted(METRICS))}"
        ) from None
