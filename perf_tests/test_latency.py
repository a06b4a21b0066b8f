"""Time to first token at a fixed prompt length."""

from .workloads import TTFT


def test_ttft(perf):
    """TTFT of a 1024-token prompt holds against the baseline."""
    run = perf.measure(TTFT)
    perf.check(run, ["ttft_ms"])
