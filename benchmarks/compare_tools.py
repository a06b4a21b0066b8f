"""The plugin's measurement held against vLLM's bench serve, AIPerf and guidellm on the same server.

The data sets, made by scripts/compare_data.sh against tiny-cpu:

* benchmarks/data/compare_same_boots (issue 58): the plugin (normal priority, bench serve's
  request body) and bench serve on 3 boots, 3 rounds each, interleaved, at 1, 4 and 32 streams,
  paired over boots against the issue's targets; and both against the paced truth server
  (tests/fakes/paced_server.py): whose TTFT is closer to the truth, by how much, and why. Its
  run, alone on a quiet host, takes about an hour on 2 cores (timed on a busy one: the paced
  server's rounds about 5 minutes each; a boot 2-3 minutes, then about 4.5 minutes a round, most
  of it the 32-stream runs and each tool's start-up):

      ROUNDS=3 STREAMS="1 4 32" TOOLS="kimiperf vllm" PROMPT=128 OUTPUT=64 REQUESTS=30 \
        VLLM_DETAIL=summary UNIQUE_PROMPTS=1 TRUTH=1 OUT=benchmarks/data/compare_same_boots \
        flock /tmp/kimiperf-engine.lock bash scripts/compare_data.sh 3
      python benchmarks/compare_tools.py > benchmarks/compare_tools.md

* benchmarks/data/compare_interleaved (before issue 58, a shared 2-core host): on each of several boots, every tool ran several rounds,
  interleaved (a round runs the tools in one order, the next in the other), one stream and a
  closed loop of four, with the same prompt and output lengths. The plugin's column is its own
  report (its definitions) and, from the same requests, its bench-serve export (vLLM's
  definitions), so a difference splits into a part of definition and a part of client.
  The paired comparison against bench serve takes, per boot, the mean over rounds of
  log(tool / bench serve) on the same round: what the host did to the boot as a whole cancels.
* tests/data/compare: four boots, one run of each other tool each (the readers' test data).

Run: python benchmarks/compare_tools.py > benchmarks/compare_tools.md
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shlex
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimiperf.compare.readers import read_run_file  # noqa: E402
from pytest_kimiperf.config.metric_specs import METRICS  # noqa: E402

INTERLEAVED = ROOT / "benchmarks" / "data" / "compare_interleaved"
ONE_RUN_A_BOOT = ROOT / "tests" / "data" / "compare"
REFERENCE = "vllm bench serve"
PLUGIN, PLUGIN_AS_VLLM = "pytest-kimiperf", "pytest-kimiperf, bench serve's rules"
MIN_TOKENS = "bench serve + min_tokens"
# tool -> (folder, file name after boot<B>[-c<N>]-r<R>)
SOURCES = {PLUGIN: ("kimiperf", ".json"), PLUGIN_AS_VLLM: ("kimiperf", ".bench-serve.json"),
           REFERENCE: ("vllm", "-summary.json"), MIN_TOKENS: ("vllm_min_tokens", "-summary.json"),
           "aiperf": ("aiperf", ".json"), "guidellm": ("guidellm", ".json")}
# scripts/compare_data.sh's tool names, as server.tsv records them
SCRIPT_TOOLS = {"kimiperf": PLUGIN, "vllm": REFERENCE, "vllm_min_tokens": MIN_TOKENS, "aiperf": "aiperf",
                "guidellm": "guidellm"}
SHOWN = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "decode_tok_s", "output_throughput", "request_throughput")
LEVEL = 0.95
# Tags: boot<B>[-c<N>][-r<R>] (a call of one round writes no -r).
_NAME = re.compile(r"boot(?P<boot>\d+)(?:-c(?P<streams>\d+))?(?:-r(?P<round>\d+))?$")


@dataclass(frozen=True)
class Paired:
    """A tool against the reference over boots: each boot's mean log ratio over its rounds."""

    per_boot: tuple[float, ...]

    @property
    def mean(self) -> float:
        """The mean over boots of the within-boot log ratio."""
        return statistics.fmean(self.per_boot)

    @property
    def sd(self) -> float:
        """The log ratio's spread from boot to boot (nan with one boot)."""
        return statistics.stdev(self.per_boot) if len(self.per_boot) > 1 else math.nan

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        """The mean's t interval over boots, in log ratio (boots are the unit)."""
        n = len(self.per_boot)
        if n < 2:
            return (math.nan, math.nan)
        half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * self.sd / math.sqrt(n)
        return (self.mean - half, self.mean + half)


def paired(tool: Mapping[tuple[int, int], float], reference: Mapping[tuple[int, int], float]) -> Paired:
    """Pair a tool's figures with the reference's by (boot, round); a boot counts with any pair."""
    by_boot: dict[int, list[float]] = {}
    for key in sorted(set(tool) & set(reference)):
        by_boot.setdefault(key[0], []).append(math.log(tool[key] / reference[key]))
    return Paired(tuple(statistics.fmean(logs) for _, logs in sorted(by_boot.items())))


def load_interleaved(root: Path) -> dict[int, dict[str, dict[str, dict[tuple[int, int], float]]]]:
    """streams -> tool -> metric -> (boot, round) -> figure, as the compare readers read each file."""
    figures: dict[int, dict[str, dict[str, dict[tuple[int, int], float]]]] = {}
    for tool, (folder, suffix) in SOURCES.items():
        for path in sorted((root / folder).glob(f"boot*{suffix}")):
            match = _NAME.match(path.name[: -len(suffix)])
            if match is None:
                continue  # another tool's suffix in the same folder (the plugin's two files)
            streams, key = int(match["streams"] or 1), (int(match["boot"]), int(match["round"] or 1))
            for run in read_run_file(path):
                for metric, figure in run.figures.items():
                    figures.setdefault(streams, {}).setdefault(tool, {}).setdefault(metric, {})[key] = figure.value
    return figures


def load_host(root: Path) -> dict[int, tuple[float, float]]:
    """boot -> the lowest and highest 1-minute load average seen around its runs."""
    seen: dict[int, list[float]] = {}
    with (root / "host.tsv").open() as stream:
        for row in csv.DictReader(stream, delimiter="\t"):
            for column in ("loadavg_before", "loadavg_after"):
                seen.setdefault(int(row["boot"]), []).append(float(row[column].split()[0]))
    return {boot: (min(values), max(values)) for boot, values in seen.items()}


def load_server(root: Path) -> dict[int, dict[str, dict[tuple[int, int], float]]]:
    """streams -> tool -> (boot, round) -> the server's decode ms per generated token over the
    run (its /metrics counters before and after: decode seconds / (tokens - requests))."""
    path = root / "server.tsv"
    out: dict[int, dict[str, dict[tuple[int, int], float]]] = {}
    if not path.is_file():
        return out
    with path.open() as stream:
        for row in csv.DictReader(stream, delimiter="\t"):
            before, after = ([float(x) for x in row[c].split()] for c in ("before", "after"))
            seconds, requests, tokens = (a - b for a, b in zip(after, before))
            if requests > 0 and tokens > requests:
                key = (int(row["boot"]), int(row["round"]))
                out.setdefault(int(row["streams"]), {}).setdefault(SCRIPT_TOOLS[row["tool"]], {})[key] = (
                    1000 * seconds / (tokens - requests))
    return out


def _geo(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values]
    return math.exp(statistics.fmean(logs))


def _boot_figures(by_key: Mapping[tuple[int, int], float]) -> dict[int, float]:
    """boot -> the geometric mean of its rounds."""
    rounds: dict[int, list[float]] = {}
    for (boot, _), value in by_key.items():
        rounds.setdefault(boot, []).append(value)
    return {boot: _geo(values) for boot, values in sorted(rounds.items())}


def _boot_list(boots: Sequence[int]) -> str:
    return f"{boots[0]}-{boots[-1]}" if boots == list(range(boots[0], boots[-1] + 1)) and len(boots) > 1 else \
        ", ".join(map(str, boots))


def _pct(log_ratio: float) -> str:
    return f"{100 * math.expm1(log_ratio):+.1f}%"


def _summary_table(tools: Mapping[str, Mapping[str, Mapping[tuple[int, int], float]]]) -> list[str]:
    names = list(tools)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for metric in SHOWN:
        cells = []
        for tool in names:
            boots = _boot_figures(tools[tool].get(metric, {}))
            cells.append(f"{_geo(boots.values()):.4g} ({min(boots.values()):.4g}-{max(boots.values()):.4g})"
                         if boots else "not reported")
        lines.append(f"| {METRICS[metric].heading} | " + " | ".join(cells) + " |")
    return lines


def _per_boot_table(tools: Mapping[str, Mapping[str, Mapping[tuple[int, int], float]]], metric: str,
                    host: Mapping[int, tuple[float, float]]) -> list[str]:
    names = [tool for tool in tools if tools[tool].get(metric)]
    boots = sorted({boot for tool in names for boot, _ in tools[tool][metric]})
    lines = ["| boot | load average (1 min) | rounds | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for boot in boots:
        cells = []
        for tool in names:
            values = [v for (b, _), v in sorted(tools[tool][metric].items()) if b == boot]
            cells.append(f"{_geo(values):.4g} ({', '.join(f'{v:.4g}' for v in values)})" if values else "-")
        rounds = max(len([1 for (b, _) in tools[tool][metric] if b == boot]) for tool in names)
        low, high = host.get(boot, (math.nan, math.nan))
        lines.append(f"| {boot} | {low:.2f}-{high:.2f} | {rounds} | " + " | ".join(cells) + " |")
    return lines


PAIRED_HEADER = ["| metric | tool | per boot (tool / bench serve, rounds paired) | mean over boots | "
                 f"{LEVEL:.0%} interval (t, boots) | boot-to-boot sd |", "|---|---|---|---|---|---|"]


def _paired_row(label: str, tool: str, values: Mapping[tuple[int, int], float],
                reference: Mapping[tuple[int, int], float]) -> list[str]:
    pair = paired(values, reference)
    if not pair.per_boot:
        return []
    low, high = pair.interval()
    interval = f"{_pct(low)} to {_pct(high)}" if not math.isnan(low) else "one boot"
    sd = f"{100 * pair.sd:.1f}%" if not math.isnan(pair.sd) else "-"
    return [f"| {label} | {tool} | {', '.join(_pct(d) for d in pair.per_boot)} | **{_pct(pair.mean)}** | "
            f"{interval} | {sd} |"]


def _paired_table(tools: Mapping[str, Mapping[str, Mapping[tuple[int, int], float]]],
                  against: Sequence[str]) -> list[str]:
    reference = tools[REFERENCE]
    lines = list(PAIRED_HEADER)
    for metric in SHOWN:
        for tool in against:
            if metric in tools.get(tool, {}) and metric in reference:
                lines += _paired_row(METRICS[metric].heading, tool, tools[tool][metric], reference[metric])
    return lines


def _same_requests(own: Mapping[tuple[int, int], float], export: Mapping[tuple[int, int], float]) -> tuple[float, float]:
    """The plugin's own figure against its export of the same requests: the largest and the mean
    absolute log difference over runs (definitions alone: the requests are the same)."""
    diffs = [abs(math.log(own[key] / export[key])) for key in set(own) & set(export)]
    return (max(diffs), statistics.fmean(diffs)) if diffs else (math.nan, math.nan)


def _said(pair: Paired) -> str:
    low, high = pair.interval()
    if math.isnan(low):
        return f"{_pct(pair.mean)} (one boot)"
    shown = "a difference" if low > 0 or high < 0 else "no difference shown"
    return f"{_pct(pair.mean)}, {LEVEL:.0%} interval {_pct(low)} to {_pct(high)} over {len(pair.per_boot)} boots: {shown}"


def _findings(figures: Mapping[int, Mapping[str, Mapping[str, Mapping[tuple[int, int], float]]]],
              server: Mapping[int, Mapping[str, Mapping[tuple[int, int], float]]]) -> list[str]:
    """What the pairs say, each with its numbers; the words follow the intervals."""
    lines = ["## What the pairs say\n"]
    for streams, tools in sorted(figures.items()):
        if PLUGIN not in tools or REFERENCE not in tools:
            continue
        where = "one stream" if streams == 1 else f"{streams} streams"
        same = {m: _same_requests(tools[PLUGIN][m], tools[PLUGIN_AS_VLLM][m]) for m in SHOWN
                if m in tools[PLUGIN] and m in tools.get(PLUGIN_AS_VLLM, {})}
        alike = [m for m, (largest, _) in same.items() if largest < 0.01]
        lines.append(f"- **{where}, definitions alone** (the plugin's two columns, the same requests): "
                     + ", ".join(METRICS[m].heading for m in alike) + " agree within 1% on every run"
                     + "".join(f"; {METRICS[m].heading} differs by {100 * mean:.1f}% on average (at most "
                               f"{100 * largest:.1f}%)" for m, (largest, mean) in same.items() if m not in alike)
                     + ".")
        for metric in ("ttft_ms", "tpot_ms", "decode_tok_s", "output_throughput"):
            if metric in tools.get(PLUGIN_AS_VLLM, {}) and metric in tools[REFERENCE]:
                pair = paired(tools[PLUGIN_AS_VLLM][metric], tools[REFERENCE][metric])
                typical = _geo(tools[REFERENCE][metric].values())
                size = (f" (about {typical * abs(math.expm1(pair.mean)):.1f} ms {'less' if pair.mean < 0 else 'more'} "
                        f"than bench serve's {typical:.1f} ms)" if metric == "ttft_ms" else "")
                lines.append(f"- **{where}, same definitions, other client and request body** ({PLUGIN_AS_VLLM} / "
                             f"bench serve), {METRICS[metric].heading}: {_said(pair)}{size}.")
        on_server = server.get(streams, {})
        if PLUGIN in on_server and REFERENCE in on_server:
            boots = {boot for boot, _ in on_server[REFERENCE]}
            client = {k: v for k, v in tools[PLUGIN]["tpot_ms"].items() if k[0] in boots}
            lines.append(f"- **{where}, the server's clock**: its decode time per token during the plugin's runs "
                         f"against bench serve's: {_said(paired(on_server[PLUGIN], on_server[REFERENCE]))}; the "
                         f"clients' TPOT on the same boots: {_said(paired(client, tools[REFERENCE]['tpot_ms']))}.")
        if MIN_TOKENS in tools:
            lines.append(f"- **{where}, the request body**: bench serve with the plugin's `min_tokens` against "
                         f"bench serve without, TPOT: {_said(paired(tools[MIN_TOKENS]['tpot_ms'], tools[REFERENCE]['tpot_ms']))}"
                         + (f"; on the server's clock: {_said(paired(on_server[MIN_TOKENS], on_server[REFERENCE]))}"
                            if MIN_TOKENS in on_server and REFERENCE in on_server else "") + ".")
    return lines


def _one_run_a_boot() -> list[str]:
    files = {REFERENCE: "vllm/boot*-summary.json", "aiperf": "aiperf/boot*.json", "guidellm": "guidellm/boot*.json"}
    tools: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    for tool, pattern in files.items():
        for boot, path in enumerate(sorted(ONE_RUN_A_BOOT.glob(pattern)), start=1):
            for run in read_run_file(path):
                for metric, figure in run.figures.items():
                    tools.setdefault(tool, {}).setdefault(metric, {})[(boot, 1)] = figure.value
    return _summary_table(tools)


def _aiperf_tokens(root: Path) -> tuple[float, float]:
    """AIPerf's re-tokenized output length against the server's count, medians over its runs."""
    raw = [json.loads(p.read_text()) for p in sorted((root / "aiperf").glob("boot*.json"))]
    return (statistics.median(d["output_sequence_length"]["p50"] for d in raw),
            statistics.median(d["usage_completion_tokens"]["p50"] for d in raw))


@dataclass(frozen=True)
class DataSet:
    """One folder of scripts/compare_data.sh runs, with how it was made when its calls.txt does
    not say (the runs before the script recorded its calls)."""

    folder: Path
    title: str
    commands: tuple[str, ...] = ()
    load: str = ""
    made: str = ""


SAME_BOOTS = ROOT / "benchmarks" / "data" / "compare_same_boots"
# Newest first: each present folder is one part of compare_tools.md.
DATA_SETS = (
    DataSet(SAME_BOOTS, "The plugin against bench serve on the same boots, since issue 58"),
    DataSet(INTERLEAVED, "Before issue 58: the plugin (SCHED_FIFO, min_tokens) against bench serve, AIPerf and "
            "guidellm",
            commands=('export ROUNDS=3 STREAMS="1 4" VLLM_DETAIL=summary OUT=benchmarks/data/compare_interleaved',
                      'TOOLS="kimiperf vllm aiperf guidellm" flock /tmp/kimiperf-engine.lock nice -n 19 bash '
                      'scripts/compare_data.sh 3',
                      'TOOLS="kimiperf vllm vllm_min_tokens" FIRST_BOOT=4 flock /tmp/kimiperf-engine.lock nice -n 19 '
                      'bash scripts/compare_data.sh 3'),
            load="64 prompt and 32 output tokens, EOS ignored; one stream, 20 requests after 2 warm-up requests; a "
                 "closed loop of 4 streams (bench serve and the plugin), 96 requests after 4 warm-up (the plugin: 3 "
                 "rounds of 32)",
            made="two calls of scripts/compare_data.sh (AIPERF and GUIDELLM naming those tools' commands, each in "
                 "its own virtualenv)"),
)
# The targets: the plugin against bench serve on the same boots, by metric and streams.
TARGETS = ((1, "decode_tok_s"), (1, "tpot_ms"), (4, "decode_tok_s"), (4, "tpot_ms"), (32, "output_throughput"))
TARGET_MEAN, TARGET_INTERVAL = 0.02, 0.03


def read_calls(root: Path) -> list[dict[str, str]]:
    """The settings of each scripts/compare_data.sh call into ``root`` (its calls.txt)."""
    path = root / "calls.txt"
    if not path.is_file():
        return []
    return [dict(token.split("=", 1) for token in shlex.split(line)) for line in path.read_text().splitlines()
            if line.strip()]


def _load_of(calls: Sequence[Mapping[str, str]]) -> str:
    first = calls[0]
    prompt, output, requests, warmup = (first.get(k, d) for k, d in
                                        (("PROMPT", "64"), ("OUTPUT", "32"), ("REQUESTS", "20"), ("WARMUP", "2")))
    loops = [int(n) for n in first.get("STREAMS", "1").split() if n != "1"]
    text = f"{prompt} prompt and {output} output tokens, EOS ignored; one stream, {requests} requests after {warmup} warm-up"
    return text + "".join(f"; a closed loop of {n} streams, {24 * n} requests after {n} warm-up (the plugin: 3 rounds "
                          f"of {8 * n})" for n in loops)


def _shown(folder: Path) -> Path:
    return folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder


def _host_cpus(calls: Sequence[Mapping[str, str]]) -> str:
    cpus = {call.get("CPUS") for call in calls} - {None}
    return f"{cpus.pop()} CPUs" if len(cpus) == 1 else "2 cores"


def _command(call: Mapping[str, str]) -> str:
    boots = call.get("BOOTS", "3")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in call.items() if k not in ("BOOTS", "CPUS") and v)
    return f"{env} flock /tmp/kimiperf-engine.lock bash scripts/compare_data.sh {boots}"


def main(argv: Sequence[str] = ()) -> int:
    """Print the tables and what explains their differences, one part per data set present
    (``--data DIR``: that folder's runs alone, such as a smoke run's)."""
    parser = argparse.ArgumentParser(description="The plugin against bench serve: compare_tools.md's tables.")
    parser.add_argument("--data", type=Path, help="a folder of scripts/compare_data.sh runs (default: the committed ones)")
    args = parser.parse_args(argv)
    present = ([DataSet(args.data.resolve(), f"The runs in {args.data}")] if args.data is not None
               else [data for data in DATA_SETS if (data.folder / "host.tsv").is_file()])
    print("# The plugin held against vLLM's bench serve (and AIPerf, guidellm) on the same server\n")
    print("Made by `python benchmarks/compare_tools.py > benchmarks/compare_tools.md` from the runs of "
          "scripts/compare_data.sh in " + ", ".join(f"`{_shown(d.folder)}`" for d in present) + ".\n")
    aiperf = None
    for data in present:
        aiperf = _render(data) or aiperf
    if aiperf is not None:
        osl, usage = aiperf
        print(WHY.format(osl=f"{osl:g}", usage=f"{usage:g}", ratio=(usage - 1) / (osl - 1)).strip() + "\n")
    print("## The readers' test data: four boots, one run of each tool a boot\n")
    print("`tests/data/compare` (scripts/compare_data.sh, the default settings): bench serve, AIPerf and "
          "guidellm one after another on each of four boots. Geometric mean over boots (range).\n")
    print("\n".join(_one_run_a_boot()))
    return 0


def _render(data: DataSet) -> tuple[float, float] | None:
    """One data set's part; AIPerf's token counts where it ran."""
    root = data.folder
    figures, host, calls = load_interleaved(root), load_host(root), read_calls(root)
    boots = sorted(host)
    commands = data.commands or tuple(_command(call) for call in calls)
    print(f"## {data.title}\n")
    made = data.made or f"{len(commands)} call(s) of scripts/compare_data.sh"
    print(f"`{_shown(root)}`, made by {made}:\n")
    print("```bash\n" + "\n".join(commands) + "\n```\n")
    load_low, load_high = (min(low for low, _ in host.values()), max(high for _, high in host.values())) if host \
        else (math.nan, math.nan)
    ran = {tool: sorted({boot for values in by_metric.values() for boot, _ in values})
           for tools in figures.values() for tool, by_metric in tools.items()}
    rounds = max((int(call.get("ROUNDS", "1")) for call in calls), default=3)
    print(f"tiny-cpu was booted {len(boots)} time{'s' * (len(boots) != 1)} on a host of {_host_cpus(calls)} whose 1-minute load average "
          f"read {load_low:.2f}-{load_high:.2f} around the runs"
          + (" (other work shared its cores: the server and the tools alone read 2-3 on 2 cores). " if load_high > 4.5
             else " (the server's and the tools' own processes count in it: on 2 cores they alone read 2-3). ")
          + f"On each boot every tool of the call ran {rounds} round(s), "
          "interleaved: a round runs the tools in one order, the next in the reverse, and the first round's order "
          "alternates from boot to boot. Boots per tool: "
          + "; ".join(f"{tool} {_boot_list(b)}" for tool, b in ran.items()) + ". "
          f"Load: {data.load or _load_of(calls)}."
          + (" bench serve + min_tokens is bench serve sending `min_tokens` beside `ignore_eos` (`--extra-body`), "
             "as the plugin's client did before issue 58." if any(MIN_TOKENS in tools for tools in figures.values())
             else "")
          + (" Each boot first played every load once, measured by neither tool (a fresh server's first batches "
             "of a size cost more)." if calls else "")
          + (" bench serve drew prompts of their own for every run (a `--seed` per run), as the plugin's are "
             "unique per request, so neither finds its prefill in the prefix cache."
             if any(call.get("UNIQUE_PROMPTS") for call in calls) else "") + "\n")
    print("Each tool's figure is as its own file states it, read by `kimiperf compare`'s readers. "
          f"`{PLUGIN_AS_VLLM}` is the plugin's `--kimiperf-export` of the same requests, computed by bench serve's "
          "`calculate_metrics` rules: against the plugin's own column it shows the definitions alone (the same "
          "requests); against bench serve, what is left: the clients and what they send (the same definitions).\n")
    print("**Why interleaving.** The host's load can move during the measurement (the load average column). Each "
          "paired difference is taken inside a boot, round by round, between runs seconds apart, so what the host "
          "and the boot did to both tools cancels; what is left varies from boot to boot only by the tools' own "
          "difference and noise, and the interval is over boots.\n")
    server_all = load_server(root)
    for streams, tools in sorted(figures.items()):
        if REFERENCE not in tools:
            continue
        print(f"### {'One stream' if streams == 1 else f'{streams} streams, closed loop'}\n")
        print("Each cell: the geometric mean over boots of each boot's geometric mean over its rounds "
              "(the boots' range).\n")
        print("\n".join(_summary_table(tools)) + "\n")
        primary = "decode_tok_s" if streams == 1 else "output_throughput"
        print(f"Per boot, {METRICS[primary].heading} (the rounds' geometric mean, then each round):\n")
        print("\n".join(_per_boot_table(tools, primary, host)) + "\n")
        print("Paired against bench serve:\n")
        print("\n".join(_paired_table(tools, [t for t in tools if t != REFERENCE])) + "\n")
        server = server_all.get(streams, {})
        if REFERENCE in server:
            print("The server's own clock: its decode seconds per generated token over each run (`/metrics` "
                  "before and after, `vllm:request_decode_time_seconds` over generated tokens less one a "
                  "request), paired the same way:\n")
            print("\n".join(PAIRED_HEADER + [row for tool in server if tool != REFERENCE for row in _paired_row(
                "server decode ms/token", tool, server[tool], server[REFERENCE])]) + "\n")
    if data.folder == SAME_BOOTS or calls:
        print("\n".join(_targets(figures)) + "\n")
    if (root / "truth" / "paced").is_dir():
        print("\n".join(_truth(root / "truth")) + "\n")
    print("\n".join(_findings(figures, server_all)) + "\n")
    return _aiperf_tokens(root) if (root / "aiperf").is_dir() else None


def _targets(figures: Mapping[int, Mapping[str, Mapping[str, Mapping[tuple[int, int], float]]]]) -> list[str]:
    """The issue's targets: each figure paired against bench serve within +/-2%, its interval
    inside +/-3%."""
    lines = ["### The targets\n",
             f"Issue 58: paired against bench serve on the same boots, each figure within "
             f"+/-{TARGET_MEAN:.0%} and its {LEVEL:.0%} interval over boots inside +/-{TARGET_INTERVAL:.0%}. "
             "The plugin's own figure (what its report says) and its bench-serve export (the same requests by "
             "bench serve's rules):\n",
             "| streams | metric | column | mean over boots | 95% interval | boots | target |",
             "|---|---|---|---|---|---|---|"]
    for streams, metric in TARGETS:
        tools = figures.get(streams, {})
        for column in (PLUGIN, PLUGIN_AS_VLLM):
            if metric not in tools.get(column, {}) or metric not in tools.get(REFERENCE, {}):
                continue
            pair = paired(tools[column][metric], tools[REFERENCE][metric])
            if not pair.per_boot:
                continue
            low, high = pair.interval()
            mean_ok = abs(math.expm1(pair.mean)) <= TARGET_MEAN
            if math.isnan(low):
                verdict, interval = "no interval from one boot", "-"
            else:
                inside = -TARGET_INTERVAL <= math.expm1(low) and math.expm1(high) <= TARGET_INTERVAL
                verdict = "met" if mean_ok and inside else "not met"
                interval = f"{_pct(low)} to {_pct(high)}"
            lines.append(f"| {streams} | {METRICS[metric].heading} | {column} | {_pct(pair.mean)} | {interval} | "
                         f"{len(pair.per_boot)} | {verdict} |")
    return lines


def truth_ttft_ms(truth: Mapping[str, object]) -> dict[str, float]:
    """request id -> true TTFT (ms): the paced server's first chunk write less the kernel's
    arrival stamp of the request's bytes."""
    streams = truth.get("streams", [])
    assert isinstance(streams, list)
    return {s["request_id"]: (s["write_ns"][0] - s["t_arrival_ns"]) / 1e6 for s in streams if s.get("write_ns")}


def truth_decode_tok_s(truth: Mapping[str, object]) -> list[float]:
    """Each request's true decode speed: chunks after the first over the time from the first
    write to the last (one token a chunk, as the paced server writes them)."""
    streams = truth.get("streams", [])
    assert isinstance(streams, list)
    speeds = []
    for s in streams:
        writes, chunks = s.get("write_ns") or [], s.get("chunks", len(s.get("write_ns") or []))
        if chunks > 1 and len(writes) > 1 and writes[-1] > writes[0]:
            speeds.append((chunks - 1) / ((writes[-1] - writes[0]) / 1e9))
    return speeds


def _truth(root: Path) -> list[str]:
    """Both clients against the paced truth server: whose TTFT is closer, by how much, and the
    part of it the plugin's own records explain."""
    rows: dict[int, dict[str, list[tuple[float, float]]]] = {}  # streams -> tool -> (measured, true) medians
    decode: dict[int, dict[str, list[tuple[float, float]]]] = {}  # the same for decode tok/s
    own: dict[int, list[tuple[float, float, float]]] = {}  # streams -> per-request error p50, p99; start->send p50
    for path in sorted((root / "paced").glob("*.json")):
        tool, _, tag = path.stem.partition("-")
        match = _NAME.match(tag)
        if match is None or tool not in ("kimiperf", "vllm"):
            continue
        streams = int(match["streams"] or 1)
        true = truth_ttft_ms(json.loads(path.read_text()))
        measured_file = root / tool / (f"{tag}.json" if tool == "kimiperf" else f"{tag}-summary.json")
        if not true or not measured_file.is_file():
            continue
        (run,) = read_run_file(measured_file)[:1]
        rows.setdefault(streams, {}).setdefault(tool, []).append(
            (run.figures["ttft_ms"].value, statistics.median(true.values())))
        if (speeds := truth_decode_tok_s(json.loads(path.read_text()))) and "decode_tok_s" in run.figures:
            decode.setdefault(streams, {}).setdefault(tool, []).append(
                (run.figures["decode_tok_s"].value, statistics.median(speeds)))
        records = root / tool / f"{tag}.requests.jsonl"
        if tool == "kimiperf" and records.is_file():
            lines = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
            errors = [r["ttft_ms"] - true[r["request_id"]] for r in lines
                      if r.get("status") == "ok" and r["request_id"] in true]
            starts = [(r["t_send_ns"] - r["t_start_ns"]) / 1e6 for r in lines if r.get("t_start_ns")]
            if errors and starts:
                own.setdefault(streams, []).append((_quantile(errors, 0.5), _quantile(errors, 0.99),
                                                    statistics.median(starts)))
    lines = ["### Against the paced truth server\n",
             "tests/fakes/paced_server.py streams every request 20 ms after its bytes reached the server's socket "
             "(the kernel's receive stamp), then one token every 5 ms, and records when it wrote each chunk: the "
             "true TTFT of a request is its first write less its arrival. Both tools ran the same loads against it, "
             "interleaved; each cell is the mean over rounds of the tool's median TTFT less the true median of the "
             "same run.\n",
             "| streams | true TTFT ms | pytest-kimiperf: error ms | vllm bench serve: error ms | closer | by ms | "
             "pytest-kimiperf per request: error p50 / p99 ms | pytest-kimiperf: build and send ms (p50) | "
             "decode tok/s: true / pytest-kimiperf / bench serve |",
             "|---|---|---|---|---|---|---|---|---|"]
    for streams, tools in sorted(rows.items()):
        if "kimiperf" not in tools or "vllm" not in tools:
            continue
        true_ms = statistics.fmean(t for pairs in tools.values() for _, t in pairs)
        plugin = statistics.fmean(m - t for m, t in tools["kimiperf"])
        bench = statistics.fmean(m - t for m, t in tools["vllm"])
        closer = PLUGIN if abs(plugin) < abs(bench) else REFERENCE
        mine = own.get(streams, [])
        per_request = (f"{statistics.fmean(e[0] for e in mine):+.3f} / {statistics.fmean(e[1] for e in mine):+.3f}"
                       if mine else "-")
        start = f"{statistics.fmean(e[2] for e in mine):.3f}" if mine else "-"
        speeds = decode.get(streams, {})
        speed = (f"{statistics.fmean(t for pairs in speeds.values() for _, t in pairs):.2f} / "
                 + " / ".join(f"{statistics.fmean(m for m, _ in speeds[tool]):.2f}" if tool in speeds else "-"
                              for tool in ("kimiperf", "vllm")) if speeds else "-")
        lines.append(f"| {streams} | {true_ms:.2f} | {plugin:+.3f} | {bench:+.3f} | {closer} | "
                     f"{abs(abs(bench) - abs(plugin)):.2f} | {per_request} | {start} | {speed} |")
    lines.append("\nWhy: the plugin's clock starts at the request's `send()` and stops at the kernel's receive stamp "
                 "of the chunk's bytes, so its TTFT is the server's time plus loopback. bench serve's starts at "
                 "`st = time.perf_counter()` before `session.post` (building the request, taking a pooled "
                 "connection and writing it are inside) and stops when its task has read the chunk through aiohttp "
                 "and `json.loads` (vllm/benchmarks/lib/endpoint_request_func.py): at more streams its task waits "
                 "its turn behind the others' chunks. The build-and-send column is the part of the plugin's request that "
                 "bench serve's start would count and the plugin's does not.")
    return lines


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


WHY = """
## Why the figures differ: definitions, clocks, clients

The plugin's definitions are measure/results.py's, bench serve's are vLLM 0.32's
(`vllm/benchmarks/lib/endpoint_request_func.py` times a request, `vllm/benchmarks/serve.py`
`calculate_metrics` summarizes).

- **TTFT: which clock starts.** bench serve starts `st = time.perf_counter()` before
  `session.post`: building the request, taking a pooled connection and writing it are inside its
  TTFT and E2EL (docs/explanation/measurement.md measured that start at 2-80 ms late at 1-128
  streams against a paced server). The plugin starts at the request's `send()`. Both stop at the
  first chunk that carries `choices`, so the plugin's two columns have the same TTFT and its
  TTFT against bench serve's is the clients' start.
- **TPOT and E2EL: the same definition.** Both end at the last chunk carrying `choices`
  (bench serve's `latency = most_recent_timestamp - st`), and TPOT is (E2EL - TTFT) / (tokens - 1)
  with the server's `usage.completion_tokens`, the median over requests. The plugin's
  E2EL starts later (at `send()`) for the reason above.
- **Decode tok/s.** The plugin's is each request's (tokens - 1) / (last chunk - first chunk), the
  median over requests; bench serve writes none, and the reader takes 1000 / median TPOT: the
  same per-request quantity, except that with an even number of requests the median averages the
  two middle ones on different scales (tok/s against ms).
- **ITL: which median.** bench serve pools every gap of every request and takes one median
  (`np.median(itls)`). The plugin takes each request's median gap, then the median over requests,
  so that one slow request counts once and a boot's samples are independent requests; the pooled
  tail is its `p99_itl_ms`. The plugin's two columns differ by this alone.
- **Throughput: which clock divides.** bench serve divides all output tokens by the benchmark's
  wall duration (one figure a run). The plugin takes one figure per round (tokens of the round /
  the round's wall time) and reports the median of its 3 rounds; its bench-serve export divides
  all tokens by the measured rounds' wall time. One stream: the plugin's report has no throughput
  (a throughput is one sample a round and a boot needs three), its export has.
- **AIPerf: which tokens.** Its `inter_token_latency` (read as TPOT) and
  `output_token_throughput_per_user` (decode) divide by `output_sequence_length`, the output
  re-tokenized from its text: {osl} tokens a request here (median) against the server's {usage}
  (`usage_completion_tokens`), so its TPOT is about {ratio:.2f}x what the server's count gives.
  Its client is several processes (workers, record processors, a dataset manager, joined by ZMQ)
  on the same two cores as the server, which slows the server it measures.
- **guidellm: which distribution.** Its per-token metrics weight each request by its tokens (all
  the same here, so the medians agree with per-request ones); it sends no warm-up request, so its
  first request carries the server's first-request cost, and its throughput is the mean of its
  rate over the run.
- **What is left is not definition.** Where the definitions agree (TTFT, TPOT, E2EL and decode:
  the plugin's two columns within 1% on every run), a difference between the plugin and bench
  serve is the clients and what they send, and the host: bench serve sends random-token prompts
  drawn from `--seed 0`, the same in every round of a boot (so later rounds may find their prefill
  in the prefix cache), the plugin prompts built to length with `/tokenize`, unique per request,
  and (before issue 58) `min_tokens` beside `ignore_eos`. The server's clock tells the two kinds of cause apart: a
  client that mismeasures moves only its own figure; a server that really decoded slower during
  one tool's runs moves its own decode time per token too. bench serve + min_tokens tests the last: vLLM's `MinTokensLogitsProcessor`
  (vllm/v1/sample/logits_processor/builtin.py) is not argmax-invariant, so it runs on every
  decode step while a request is short of its `min_tokens`; the pairs above say whether it cost
  time on this server. On a host loaded at 4-10 on two cores by other work, the intervals over
  boots are wide; where one holds zero, these boots do not show a difference.
- **Percentile method.** bench serve, AIPerf and the plugin's summaries all use linear
  interpolation between order statistics (numpy's default; AIPerf's `metric_result_from_array`);
  guidellm reports its own distribution summary. At the medians of 20 requests the methods agree.
"""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
