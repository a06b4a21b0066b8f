"""What reading the running token count in every chunk costs the client, per chunk.

The client asks vLLM for ``stream_options.continuous_usage_stats`` (measure/client.py), so every
token chunk carries ``usage`` and the client reads ``completion_tokens`` out of it with a byte
search (measure/sse.py). This times ``SSEReader.feed`` on vLLM 0.32's completion chunk as it
serializes it (``model_dump_json(exclude_unset=True)``), without and with the usage, one chunk a
feed as the client's reads bring them, best of ``--repeats`` rounds of ``--chunks`` chunks.
It is CPU time of this process: run it on a quiet host.

Run: ``.venv/bin/python benchmarks/chunk_parse_cost.py [--chunks 20000] [--repeats 7]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kimiperf.measure.sse import SSEReader  # noqa: E402


def _chunk(index: int, usage: bool) -> bytes:
    chunk: dict[str, object] = {
        "id": "cmpl-8e95d2c2f57601f4", "object": "text_completion", "created": 1796476313, "model": "tiny-llama",
        "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None, "stop_reason": None,
                     "prompt_token_ids": None, "token_ids": None}],
    }
    if usage:
        chunk["usage"] = {"prompt_tokens": 64, "total_tokens": 64 + index + 1, "completion_tokens": index + 1}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def per_chunk_us(usage: bool, chunks: int, repeats: int) -> float:
    """The best round's time per chunk, in microseconds."""
    payloads = [_chunk(i, usage) for i in range(chunks)]
    best = float("inf")
    for _ in range(repeats):
        reader = SSEReader(chat=False)
        start = time.perf_counter_ns()
        for i, payload in enumerate(payloads):
            reader.feed(payload, i, i)
        best = min(best, (time.perf_counter_ns() - start) / chunks / 1000)
        assert len(reader.chunk_ns) == chunks
        assert reader.chunk_tokens[-1] == (chunks if usage else -1)
    return best


def main() -> int:
    """Print both figures and their difference."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    plain = per_chunk_us(False, args.chunks, args.repeats)
    counted = per_chunk_us(True, args.chunks, args.repeats)
    print(f"feed per chunk: {plain:.2f} us without usage, {counted:.2f} us with the running count "
          f"(+{counted - plain:.2f} us, {len(_chunk(0, False))} -> {len(_chunk(0, True))} bytes a chunk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
