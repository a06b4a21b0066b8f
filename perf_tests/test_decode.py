"""Single-stream decode: the number the 81.4-vs-81.9 question is about."""

from .workloads import SINGLE_STREAM_DECODE


def test_single_stream_decode(perf):
    """Median decode tok/s meets the deployment's floor and holds against the baseline; so do the
    median inter-token gap and the p99 of every gap (pooled, as bench serve pools them: 20 x 127
    gaps a boot). TPOT is not checked: a request's TPOT is its decode tok/s inverted, so its
    verdict is decode's mirror and its row repeats it."""
    run = perf.measure(SINGLE_STREAM_DECODE)
    perf.check(run, ["decode_tok_s", "itl_ms", "p99_itl_ms"], floor=True)
