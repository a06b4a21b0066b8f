"""Are the figures a run gives true when its reads are shared? Each against the paced truth.

A benchmark, not a test: the truth is the paced server's own stamps of its writes, taken in user
space by another process on the same host, so on a busy 2-core host the "truth" itself runs
milliseconds late (a test that held a figure to it failed a fresh clone's CI: issue 70). The
rules it exercises are tested on virtual time in tests/unit/test_coverage.py. Run it alone on a
quiet host; a figure from a busy one says so. The paced server (tests/fakes/paced_server.py, 20 ms TTFT, 64
tokens at 5 ms) serves the plugin's own client (``run_scenario``) while a helper process
SIGSTOPs this process for 120 ms in every 400 at seeded random phases (``stopped``), while the
server writes every 10th stream in one send (``bursts``, make test's pace: 16 tokens at 2.5 ms),
or both (``both``), or stalls every 2nd stream 100 ms after its first chunk and writes the rest in
one send (``stalls``). Per run: requests sent, how many gave a decode and a TTFT figure, the worst
decode and TTFT error and the p99 gap error of what it gave (tests/paced_truth.py), who the
account says held the stream, and the p99 the raw gaps would read (every chunk's stamp taken
as its own, as before coverage.py).

Run: ``.venv/bin/python benchmarks/shared_reads.py --runs 5 [--case stopped] [--streams 1,4] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402 - after the root is on the path

from pytest_kimiperf.measure.results import RunResult, percentile  # noqa: E402
from pytest_kimiperf.measure.runner import run_scenario  # noqa: E402
from pytest_kimiperf.measure.target import Target  # noqa: E402
from pytest_kimiperf.measure.workload import Concurrency, Scenario, SingleStream  # noqa: E402
from pytest_kimiperf.reports.sentences import say_run_invalid  # noqa: E402
from tests.paced_truth import MODEL, check, client_stopped, paced_server, server_truth  # noqa: E402

STOP_MS, PERIOD_MS = 120.0, 400.0


def scenario(case: str, streams: int) -> Scenario:
    """The test's scenario: 16 tokens for bursts alone, 64 with a stopped client."""
    tokens, requests = (16, 60) if case == "bursts" else (64, 30 if streams == 1 else 60)
    if streams == 1:
        return SingleStream(prompt_tokens=8, output_tokens=tokens, requests=requests, warmup_requests=1)
    return Concurrency(concurrency=streams, prompt_tokens=8, output_tokens=tokens, requests=requests, rounds=1,
                       warmup_requests=streams)


def server_args(case: str) -> list[str]:
    """The server's command line for a case."""
    if case == "bursts":
        return ["--ttft-ms", "20", "--itl-ms", "2.5", "--burst-every", "10"]
    if case == "stalls":
        return ["--ttft-ms", "20", "--itl-ms", "5", "--stall-every", "2", "--stall-ms", "100"]
    return ["--ttft-ms", "20", "--itl-ms", "5", *(["--burst-every", "10"] if case == "both" else [])]


def one_run(url: str, case: str, streams: int, seed: int) -> dict[str, Any]:
    """One run of a case, its figures against the truth."""
    httpx.post(f"{url}/paced/reset", timeout=10).raise_for_status()
    target = Target(url, MODEL, server_metrics=False)
    stops = 0
    if case in ("bursts", "stalls"):
        run = run_scenario(target, scenario(case, streams))
    else:
        with client_stopped(stop_ms=STOP_MS, period_ms=PERIOD_MS, seed=seed) as stopped:
            run = run_scenario(target, scenario(case, streams))
        stops = len(stopped.intervals)
    truth = check(run, server_truth(url))
    account = run.coverage
    return {"case": case, "streams": streams, "seed": seed, "stops": stops, **truth.row(),
            "client_held_requests": account.client_held_requests, "stalled_requests": account.stream.stalled_requests,
            "loop_max_ms": account.loop_max_ms, "gaps_client_held": account.gaps_client_held,
            "raw_p99_gap_ms": raw_p99(run), "invalid": say_run_invalid(run.invalid) if run.invalid is not None else ""}


def raw_p99(run: RunResult) -> float | None:
    """The p99 of every gap between stamps, shared reads and all (what the run read before coverage.py)."""
    gaps = [g for r in run.valid_records for g in r.itl_ms]
    return percentile(gaps, 99) if gaps else None


def main() -> int:
    """Run the cases, print a row per run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--case", choices=("stopped", "bursts", "both", "stalls"), default="stopped")
    parser.add_argument("--streams", default="1,4", help="comma-separated stream counts")
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    args = parser.parse_args()
    rows = []
    with paced_server(*server_args(args.case)) as url:
        for streams in (int(s) for s in args.streams.split(",")):
            for seed in range(args.runs):
                row = one_run(url, args.case, streams, seed)
                rows.append(row)
                print(f"{args.case} c{streams} seed {seed}: sent {row['sent']}, decode {row['decode_measured']}, "
                      f"TTFT {row['ttft_measured']}, gaps {row['gaps_measured']} (+{row['gaps_client_held']} "
                      f"the client held); max error decode {row['max_decode_error_pct']:.3f}%, TTFT "
                      f"{row['max_ttft_error_ms']:.3f} ms, gap {row['max_gap_error_ms']:.3f} ms; p99 gap "
                      f"{row['p99_gap_ms']:.3f} vs true {row['p99_true_gap_ms']:.3f} ms "
                      f"(error {row['p99_gap_error_ms']:+.3f}; raw stamps {row['raw_p99_gap_ms']:.2f}); "
                      f"stops {row['stops']}; {row['client_held_requests']} requests the client held, "
                      f"{row['stalled_requests']} the server stalled (loop max {row['loop_max_ms']:.1f} ms)"
                      + (f"; false: {row['false']}" if row["false"] else ""), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
