"""Time to first token at a fixed prompt length."""

from .workloads import TTFT


def test_ttft(perf):
    """TTFT of a 1024-token prompt holds against the baseline, its median and its p90 (40
    requests a boot: a p90 needs 30, boots.tail_min_samples)."""
    run = perf.measure(TTFT)
    perf.check(run, ["ttft_ms", "p90_ttft_ms"])
