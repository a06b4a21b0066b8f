"""The perf suite's workloads, sized once for every deployment.

Sample counts are set for the noisier target: on the 2-core CPU deployment per-request decode
tok/s varies by tens of percent (README, "Numbers"), and the gate needs at least 5 valid samples
a side. One sample is one request for latency metrics and one round for throughputs.
"""

from pytest_kimiperf.scenarios import Concurrency, SingleStream

PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128

# 20 requests: about a minute on Kimi at 80 tok/s, seconds on the tiny CPU model.
# max_rounds: an inconclusive baseline comparison may take up to two more rounds of samples.
SINGLE_STREAM_DECODE = SingleStream(
    prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, requests=20, warmup_requests=3,
    max_rounds=3,
)

# TTFT is mostly prefill: a longer prompt and a short answer.
TTFT_PROMPT_TOKENS = 1024
TTFT = SingleStream(prompt_tokens=TTFT_PROMPT_TOKENS, output_tokens=8, requests=20, warmup_requests=3,
                    max_rounds=3)


def throughput_at(concurrency: int) -> Concurrency:
    """Output throughput at ``concurrency`` streams: 5 rounds, each two requests per stream."""
    return Concurrency(
        concurrency=concurrency, prompt_tokens=PROMPT_TOKENS, output_tokens=64,
        requests=2 * concurrency, rounds=5, warmup_requests=concurrency, max_rounds=8,
    )
