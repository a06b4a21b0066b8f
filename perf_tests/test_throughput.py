"""Output throughput under concurrent load."""

import pytest
from .workloads import throughput_at


@pytest.mark.parametrize("concurrency", [8, 32, 64])
def test_output_throughput(perf, concurrency):
    """Aggregate output tok/s at a fixed number of concurrent streams holds against the baseline."""
    run = perf.measure(throughput_at(concurrency))
    perf.check(run, ["output_throughput", "request_throughput"])
