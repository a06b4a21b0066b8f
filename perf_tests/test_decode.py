"""Single-stream decode: the number the 81.4-vs-81.9 question is about."""

from .workloads import SINGLE_STREAM_DECODE


def test_single_stream_decode(perf):
    """Median decode tok/s meets the deployment's floor and holds against the baseline."""
    run = perf.measure(SINGLE_STREAM_DECODE)
    perf.check(run, ["decode_tok_s", "itl_ms", "tpot_ms"], floor=True)
