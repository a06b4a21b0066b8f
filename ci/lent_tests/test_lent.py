"""What ci/gpu-lent.sh measures through the plugin: single-stream decode and output throughput
under concurrent load (the load under which NVML's telemetry is read), at the GPU's size or, in
the dry run on the CPU (LENT_SCALE=cpu), small enough for two cores."""

from __future__ import annotations

import os

from pytest_kimiperf import Concurrency, PerfRecorder, SingleStream

CPU = os.environ.get("LENT_SCALE") == "cpu"
# On the GPU, sized so that four boots fit e2e's 150 s with a third to spare at the slowest rates
# this server may decode at (ci/README.md, "The first GPU run: device time"): 10 requests of 128
# tokens a decode window (4.3 s at 300 tok/s), 128 of 64 tokens a throughput window (8.2 s at
# 1,000 tok/s over 32 streams).
DECODE = SingleStream(prompt_tokens=128, output_tokens=32 if CPU else 128, requests=4 if CPU else 8,
                      warmup_requests=1 if CPU else 2)
LOAD = Concurrency(concurrency=4 if CPU else 32, prompt_tokens=128, output_tokens=16 if CPU else 64,
                   requests=8 if CPU else 32, rounds=3, warmup_requests=4 if CPU else 32)


def test_single_stream_decode(perf: PerfRecorder) -> None:
    """Decode as one user sees it, against the deployment's floor."""
    perf.check(perf.measure(DECODE), ["decode_tok_s", "itl_ms"], floor=True)


def test_output_throughput(perf: PerfRecorder) -> None:
    """Output tok/s with every stream busy: the batched decode the GPU telemetry watches."""
    perf.check(perf.measure(LOAD), ["output_throughput"])
