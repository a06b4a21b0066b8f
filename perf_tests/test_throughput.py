"""Output throughput under concurrent load."""

import pytest
from .workloads import throughput_at


@pytest.mark.parametrize("concurrency", [8, 32, 64])
def test_output_throughput(perf, concurrency):
    """Aggregate output tok/s at a fixed number of concurrent streams holds against the baseline.
    Request throughput is not checked: every valid request returns exactly its 64 tokens, so a
    round's requests a second are its tokens a second over 64, and the verdict is the same."""
    run = perf.measure(throughput_at(concurrency))
    perf.check(run, ["output_throughput"])
