"""Single-stream decode: the number the 81.4-vs-81.9 question is about."""

from .workloads import SINGLE_STREAM_DECODE


def test_single_stream_decode(perf):
    """Median decode tok/s meets the deployment's floor and holds against the baseline; so does
    the p99 of every inter-token gap (pooled, as bench serve pools them: 20 x 127 gaps a boot)."""
    run = perf.measure(SINGLE_STREAM_DECODE)
    perf.check(run, ["decode_tok_s", "itl_ms", "tpot_ms", "p99_itl_ms"], floor=True)
