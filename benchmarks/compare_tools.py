"""Three tools on one server, side by side: what vLLM's bench serve, AIPerf and guidellm each
report for the same load (one stream, 20 requests, 64 prompt and 32 output tokens, EOS ignored)
on the same tiny-cpu boots, read by `kimiperf compare`'s readers from tests/data/compare
(scripts/compare_data.sh made them: per boot, bench serve ran first, AIPerf second, guidellm last).

Issue 50's item 3. Prints two Markdown tables: each tool's median per metric over the four boots
of tests/data/compare (geometric mean, and the boots' range), then one fifth boot on which all
three and the plugin's own run of the same load (attached, tests/data/compare/one-boot) measured
the same server one after another; under them, why the figures differ, by definition or client.

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


ONE_BOOT = {"vllm bench serve": "vllm.json", "aiperf": "aiperf.json", "guidellm": "guidellm.json",
            "pytest-kimiperf": "kimiperf.json"}
PLUGIN = """
- **The plugin** (measure/records.py) times TTFT from the send to the first chunk carrying
  choices and decode as (tokens - 1) / (last chunk - first chunk), vLLM's definitions; its ITL is
  each request's median gap, then the median over requests, where bench serve pools every gap of
  every request into one median. Its run here gated only the five latency-side metrics, so its
  throughputs are not in the report's metrics.
- **One run each.** The second table is one run per tool on one boot, one after another: bench
  serve's own decode ranged {low:.0f}-{high:.0f} tok/s over the four boots above, so a gap between two
  columns of like definitions (bench serve and the plugin: {vllm:.0f} against {plugin:.0f} tok/s) is within what
  time and the host move, not a difference of definition. Settling it would take runs
  interleaved on several boots.
"""


def _figures(paths: dict[str, list[Path]]) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {}
    for tool, files in paths.items():
        for path in files:
            for run in read_run_file(path):
                for metric in SHOWN:
                    if metric in run.figures:
                        figures.setdefault(tool, {}).setdefault(metric, []).append(run.figures[metric].value)
    return figures


def _table(figures: dict[str, dict[str, list[float]]]) -> None:
    tools = list(figures)
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
            cells.append(f"{mean:.4g}" if len(values) == 1 else
                         f"{mean:.4g} ({min(values):.4g}-{max(values):.4g}, {len(values)} boots)")
        print(f"| {METRICS[metric].heading} | " + " | ".join(cells) + " |")


def main() -> int:
    """Print the tables."""
    figures = _figures({tool: sorted(DATA.glob(pattern)) for tool, pattern in TOOLS.items()})
    print("# Three tools and the plugin on one server\n")
    print("Made by `python benchmarks/compare_tools.py > benchmarks/compare_tools.md` from tests/data/compare "
          "(scripts/compare_data.sh: tiny-cpu on a 2-core host shared with other work; one stream, 20 requests, "
          "64 prompt and 32 output tokens). Each cell: the geometric mean of the boots' medians, and their range.\n")
    print("## Four boots, three tools\n")
    _table(figures)
    print("\n## One more boot, four tools (the plugin attached to it last)\n")
    one = _figures({tool: [DATA / "one-boot" / name] for tool, name in ONE_BOOT.items()})
    _table(one)
    print()
    raw = [json.loads(p.read_text()) for p in sorted(DATA.glob(TOOLS["aiperf"]))]
    osl = statistics.median(d["output_sequence_length"]["p50"] for d in raw)
    usage = statistics.median(d["usage_completion_tokens"]["p50"] for d in raw)
    e2e = statistics.median(figures["aiperf"]["e2el_ms"]) / statistics.median(figures["vllm bench serve"]["e2el_ms"])
    print(WHY.format(osl=f"{osl:g}", usage=f"{usage:g}", ratio=(usage - 1) / (osl - 1),
                     inverse=(osl - 1) / (usage - 1), e2e=e2e).rstrip())
    decode = figures["vllm bench serve"]["decode_tok_s"]
    print(PLUGIN.format(low=min(decode), high=max(decode), vllm=one["vllm bench serve"]["decode_tok_s"][0],
                        plugin=one["pytest-kimiperf"]["decode_tok_s"][0]).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
