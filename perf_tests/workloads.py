"""The perf suite's workloads, sized once for every deployment.

The boot is the unit the gate judges (pytest_kimiperf/judge/stats.py): requests within one boot only
fix that boot's median, so a boot needs few of them (at least 3 valid samples); more boots, not
more requests, make a verdict surer. One sample is one request for latency metrics and one round
for throughputs.
"""

from pytest_kimiperf import Concurrency, SingleStream

PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128

# 20 requests: about a minute on Kimi at 80 tok/s, seconds on the tiny CPU model.
SINGLE_STREAM_DECODE = SingleStream(
    prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, requests=20, warmup_requests=3,
)

# TTFT is mostly prefill: a longer prompt and a short answer.
TTFT_PROMPT_TOKENS = 1024
# 40 requests: the p90 gate needs 30 a boot (boots.tail_min_samples); a p99 would need 300.
TTFT = SingleStream(prompt_tokens=TTFT_PROMPT_TOKENS, output_tokens=8, requests=40, warmup_requests=3)


def throughput_at(concurrency: int) -> Concurrency:
    """Output throughput at ``concurrency`` streams: 3 rounds, each two requests per stream."""
    return Concurrency(
        concurrency=concurrency, prompt_tokens=PROMPT_TOKENS, output_tokens=64,
        requests=2 * concurrency, rounds=3, warmup_requests=concurrency,
    )
