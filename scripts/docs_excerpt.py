"""Put what `make perf` showed into the docs: its first screen and its throughput plot.

    make perf 2>&1 | tee perf-results/terminal.txt
    python scripts/docs_excerpt.py perf-results        # or: make docs-excerpt (both steps)

reads ``perf-results/terminal.txt`` (the run's terminal output), ``perf-results/report.json`` and
``perf-results/plots/``; writes the summary's first screen (from "kimiperf: answers" to the
servers and files) between the excerpt markers of docs/quickstart.md, with the run's date,
commit and host, and copies the throughput-against-latency plot to docs/images/. ``--check``
only checks that the excerpt in the docs has the summary's current format, and shows no interval
level or verdict word the current code does not print (an excerpt of older code), as
tests/unit/test_docs_excerpt.py does.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"
IMAGE = ROOT / "docs" / "images" / "make-perf-throughput.png"
BEGIN = "<!-- make-perf-excerpt:begin (scripts/docs_excerpt.py writes this block) -->"
END = "<!-- make-perf-excerpt:end -->"

# The summary's sections as pytest's write_sep draws them: "===== kimiperf: answers =====".
_SEP = re.compile(r"^[=!]+ (?P<title>.+?) [=!]+$|^[=!] (?P<bare>.+)$")
FIRST = "kimiperf: answers"
LAST = "kimiperf: servers and files"

# What each line of the first screen looks like now (reports/answers.py, reports/terminal.py).
ANSWER = re.compile(r"^\S+ vs (\S+|its baseline), .+ \(\S+\): [+-]\d+\.\d%, [+-][\d.]+\.\.[+-][\d.]+% \(\d+%\): .+")
RUN = re.compile(r"^run (passed|FAILED \(.+\)): .+")
# Where a comparison's NCCL variables could not reach decode's all-reduces (reports/nccl.py).
REACH = re.compile(r"^\S+ vs \S+, what NCCL could reach: .+")
FLOOR = re.compile(r"^decode (floor \S+ \S+|no floor): .+")
TABLE_HEADER = re.compile(r"^  test +metric +(profile +)?change +interval +verdict$")
ROW = re.compile(r"^  (\S+)? +(\* )?\S+ +(\S+ +)?([+-]\d+\.\d%|) +([+-][\d.]+\.\.[+-][\d.]+% \(\d+%\)|) +\S.*$")
LEGEND = re.compile(r"^  \* the test's primary metric, ")
TITLES = (re.compile(r"^kimiperf: answers$"),
          re.compile(r"^kimiperf: (\S+|profiles) vs \S+, on all boots \(-v: each boot\)$"),
          re.compile(r"^kimiperf: against the baseline, on each profile's boots \(-v: each boot\)$"),
          re.compile(r"^kimiperf: NCCL variables in the server logs \(--kimiperf-nccl-debug\)$"))


def _title(line: str) -> str | None:
    found = _SEP.match(line.rstrip())
    return None if found is None else (found.group("title") or found.group("bare"))


def first_screen(terminal: str) -> list[str]:
    """The summary's lines from its answers to the servers and files (neither pytest's own
    output nor the file paths, which are this machine's)."""
    lines = terminal.splitlines()
    start = next((i for i, line in enumerate(lines) if _title(line) == FIRST), None)
    if start is None:
        raise ValueError(f"no '{FIRST}' section in the terminal output: is it from `make perf` of this version?")
    end = next((i for i, line in enumerate(lines[start + 1:], start + 1) if _title(line) is not None
                and not any(t.match(_title(line) or "") for t in TITLES)), len(lines))
    return [line.rstrip() for line in lines[start:end]]


def problems(excerpt: list[str]) -> list[str]:
    """Where ``excerpt`` departs from the first screen's current format (empty: it has it)."""
    found = []
    if not excerpt or _title(excerpt[0]) != FIRST:
        return [f"the excerpt must open with the '{FIRST}' section"]
    kinds = set()
    for line in excerpt:
        title = _title(line)
        if title is not None:
            if not any(t.match(title) for t in TITLES):
                found.append(f"a section title the summary no longer writes: {title!r}")
            continue
        for kind, pattern in (("answer", ANSWER), ("reach", REACH), ("run", RUN), ("floor", FLOOR), ("header", TABLE_HEADER),
                              ("row", ROW), ("legend", LEGEND)):
            if pattern.match(line):
                kinds.add(kind)
                break
        else:
            if not line.startswith(("    ", "kimiperf: ", "FAILED ", "against the baseline (", "INVALID, no verdict")):
                found.append(f"a line of no known kind: {line!r}")
    for kind in ("answer", "run", "header", "row"):
        if kind not in kinds:
            found.append(f"no {kind} line: the first screen always has one")
    return found + stale(excerpt)


# An interval with its level, then the verdict: a table row's last columns, or an answer's
# "..., -4.8..+5.4% (90%): within tolerance (tolerance 25%, ...)".
_ROW_VERDICT = re.compile(r"[+-][\d.]+\.\.[+-][\d.]+% \((?P<level>\d+)%\) +(?P<verdict>\S.*?)\s*$")
_ANSWER_VERDICT = re.compile(r"[+-][\d.]+\.\.[+-][\d.]+% \((?P<level>\d+)%\): (?P<verdict>.+?) \(tolerance ")


def printed() -> tuple[set[str], set[str]]:
    """The interval levels (``"90%"``) and verdict words the current code prints in the first
    screen's answers and rows, for every verdict kind, between profiles and against a baseline
    (reports/answers.py's CompactRow and interval_level, from the levels the judge gives a
    comparison: judge/stats.py, judge/profiles.py)."""
    import dataclasses

    from pytest_kimiperf.config.metric_specs import Direction
    from pytest_kimiperf.judge.profiles import WITHIN_INTERVAL
    from pytest_kimiperf.judge.stats import EQUIVALENCE_CONFIDENCE, Comparison, VerdictKind
    from pytest_kimiperf.reports.answers import CompactRow, interval_level

    numbers = {f.name: 0.01 for f in dataclasses.fields(Comparison)
               if f.default is dataclasses.MISSING and f.type in ("float", "int")}
    levels, words = set(), set()
    for kind in VerdictKind:
        for confidence in (EQUIVALENCE_CONFIDENCE, WITHIN_INTERVAL):
            c = Comparison(**{**numbers, "metric": "m", "unit": "", "direction": Direction.HIGHER_IS_BETTER,
                              "spread_source": None, "verdict": kind, "equivalence_confidence": confidence})
            for in_session in (True, False):
                levels.add(f"{interval_level(c, in_session=in_session) * 100:.0f}%")
                words.add(CompactRow("t", "m", "p", c, in_session=in_session).verdict)
    return levels, words


def stale(excerpt: list[str]) -> list[str]:
    """Each interval level and verdict word in ``excerpt`` that the current code does not print:
    the excerpt is real output, but of older code (the summary's format may not have changed)."""
    joined: list[str] = []
    for line in excerpt:  # an answer wraps onto indented lines (a table row never does): read it whole
        if line.startswith("    ") and joined and not joined[-1].startswith("  "):
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    levels, words = printed()
    found = []
    for line in joined:
        shown = _ANSWER_VERDICT.search(line) or (_ROW_VERDICT.search(line) if line.startswith("  ") else None)
        if shown is None:
            continue
        level, verdict = shown.group("level") + "%", shown.group("verdict")
        if level not in levels:
            found.append(f"an interval at {level}, a level the summary no longer prints ({', '.join(sorted(levels))}): "
                         f"{line.strip()!r}")
        if verdict not in words:
            found.append(f"the verdict {verdict!r}, which the summary no longer prints: {line.strip()!r}")
    return found


def excerpt_in(page: str) -> list[str]:
    """The first screen as the docs page holds it (inside the markers' code fence)."""
    if BEGIN not in page or END not in page:
        raise ValueError(f"{PAGE.relative_to(ROOT)} has no excerpt markers")
    block = page.split(BEGIN, 1)[1].split(END, 1)[0]
    fence = re.search(r"```text\n(.*?)\n```", block, re.S)
    if fence is None:
        raise ValueError("the excerpt block has no ```text fence")
    return fence.group(1).splitlines()


def write(results: Path) -> None:
    """Take the first screen and the throughput plot of the run in ``results`` into the docs."""
    screen = first_screen((results / "terminal.txt").read_text(encoding="utf-8"))
    wrong = problems(screen)
    if wrong:
        raise ValueError("the run's summary is not in the current format: " + "; ".join(wrong))
    report = json.loads((results / "report.json").read_text(encoding="utf-8"))
    fingerprint = report.get("fingerprint") or {}
    commit = (report.get("deployment") or {}).get("git_commit") or _git_commit()
    source = (f"`make perf` on {report.get('created_at', '?')[:16].replace('T', ' ')} UTC, commit {commit}, "
              f"host {fingerprint.get('key', '?')}")
    plots = sorted((results / "plots").glob("*throughput-vs-latency.png"))
    if not plots:
        raise ValueError(f"no throughput-vs-latency plot in {results / 'plots'}")
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plots[0], IMAGE)
    block = (f"{BEGIN}\nWhat {source} printed first:\n\n```text\n" + "\n".join(screen) + "\n```\n\n"
             f"![Throughput against latency, every boot, with the verdicts](images/{IMAGE.name})\n{END}")
    page = PAGE.read_text(encoding="utf-8")
    head, rest = page.split(BEGIN, 1)
    PAGE.write_text(head + block + rest.split(END, 1)[1], encoding="utf-8")


def _git_commit() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", type=Path, default=ROOT / "perf-results",
                        help="make perf's output folder, with terminal.txt (default: perf-results)")
    parser.add_argument("--check", action="store_true", help="only check the excerpt in the docs")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            write(args.results)
        wrong = problems(excerpt_in(PAGE.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        print(f"docs_excerpt: {exc}", file=sys.stderr)
        return 2
    for problem in wrong:
        print(f"docs_excerpt: {problem}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
