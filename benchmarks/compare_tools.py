"""Three tools on one server, side by side: what vLLM's bench serve, AIPerf and guidellm each
report for the same load (one stream, 20 requests, 64 prompt and 32 output tokens, EOS ignored)
on the same tiny-cpu boots, read by `kimiperf compare`'s readers from tests/data/compare
(scripts/compare_data.sh made them: per boot, bench serve ran first, AIPerf second, guidellm last).

A part of issue 50's item 3: the plugin's own single-stream run is not in these files yet, so its
column is missing. Prints a Markdown table of each tool's median per metric (geometric mean over
the boots, and the boots' range) and, under it, why the figures differ by definition.

Run: python benchmarks/compare_tools.py > benchmarks/compare_tools.md
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimiperf.compare.readers import read_run_file  # noqa: E402
from pytest_kimiperf.config.metric_specs import METRICS  # noqa: E402

DATA = ROOT / "tests" / "data" / "compare"
TOOLS = {"vllm bench serve": "vllm/boot*-summary.json", "aiperf": "aiperf/boot*.json", "guidellm": "guidellm/boot*.json"}
SHOWN = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "decode_tok_s", "output_throughput", "request_throughput")
WHY = """
Why they differ, by definition and by client (each reader's docstring cites the tool's source):

- **Which tokens.** bench serve and guidellm count the server's tokens (32 a request, EOS
  ignored). AIPerf's `inter_token_latency` divides by `output_sequence_length`, the output
  *re-tokenized* from its text: {osl} tokens a request here (median) against the server's
  {usage} (`usage_completion_tokens`), so its TPOT is {ratio:.2f}x what the server's count gives and
  its decode tok/s {inverse:.2f}x higher.
- **Which gaps.** ITL: bench serve pools every gap between stream chunks of every request;
  AIPerf's `inter_chunk_latency` is the same gap; guidellm has no chunk-gap metric (its
  `inter_token_latency_ms` is a request's (latency - TTFT) / (tokens - 1), read here as TPOT).
- **Which distribution.** guidellm's per-token metrics weight each request by its tokens (the
  `count` is the tokens); all requests here have 32, so the medians agree with per-request ones.
- **Which clock for throughput.** bench serve divides the tokens by the run's duration; AIPerf
  likewise over its profiling phase; guidellm reports the mean of its rate over the run, with no
  warm-up requests (its first request carries the server's first-request cost).
- **Which client.** On this 2-core host the client shares the cores with the server. AIPerf's
  end-to-end latency is {e2e:.1f}x bench serve's for the same 32 tokens: its client is several
  processes (workers, record processors, a dataset manager, joined by ZMQ: its logs name them),
  and their CPU time is taken from the server it measures. On a GPU server with cores to spare
  this term shrinks; here it dominates.
"""


def main() -> int:
    """Print the table."""
    figures: dict[str, dict[str, list[float]]] = {}
    for tool, pattern in TOOLS.items():
        for path in sorted(DATA.glob(pattern)):
            for run in read_run_file(path):
                for metric in SHOWN:
                    if metric in run.figures:
                        figures.setdefault(tool, {}).setdefault(metric, []).append(run.figures[metric].value)
    tools = list(figures)
    print("# Three tools on one server\n")
    print("Made by `python benchmarks/compare_tools.py > benchmarks/compare_tools.md` from tests/data/compare "
          "(scripts/compare_data.sh: tiny-cpu, 4 boots, on a 2-core host shared with other work). Each cell: the "
          "geometric mean of the boots' medians, their range. The plugin's own column is not measured yet.\n")
    print("| metric | " + " | ".join(tools) + " |")
    print("|---|" + "---|" * len(tools))
    for metric in SHOWN:
        cells = []
        for tool in tools:
            values = figures[tool].get(metric)
            if not values:
                cells.append("not reported")
                continue
            mean = math.exp(sum(math.log(v) for v in values) / len(values))
            cells.append(f"{mean:.4g} ({min(values):.4g}-{max(values):.4g}, {len(values)} boots)")
        print(f"| {METRICS[metric].heading} | " + " | ".join(cells) + " |")
    raw = [json.loads(p.read_text()) for p in sorted(DATA.glob(TOOLS["aiperf"]))]
    osl = statistics.median(d["output_sequence_length"]["p50"] for d in raw)
    usage = statistics.median(d["usage_completion_tokens"]["p50"] for d in raw)
    e2e = statistics.median(figures["aiperf"]["e2el_ms"]) / statistics.median(figures["vllm bench serve"]["e2el_ms"])
    print(WHY.format(osl=f"{osl:g}", usage=f"{usage:g}", ratio=(usage - 1) / (osl - 1),
                     inverse=(osl - 1) / (usage - 1), e2e=e2e).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
