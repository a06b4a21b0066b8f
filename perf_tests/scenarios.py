"""The perf suite's workloads, sized once for every deployment.

Sample counts are set for the noisier target: on the 2-core CPU deployment per-request decode
tok/s varies by tens of percent (README, "Numbers"), and the gate needs at least 5 valid
samples a side; 20 requests give the bootstrap CI a usable width there and cost about a minute
on Kimi at 80 tok/s.
"""

from pytest_kimiperf.scenarios import Concurrency, SingleStream

PROMPT_TOKENS = 128
OUTPUT_TOKENS = 128

SINGLE_STREAM_DECODE = SingleStream(
    prompt_tokens=PROMPT_TOKENS, output_tokens=OUTPUT_TOKENS, requests=20, warmup_requests=3
)
