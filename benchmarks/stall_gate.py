"""Does the gate blame the right side? Issue 70's acceptance run, through pytest, per case.

A user repository (made in a temporary folder) gates one decode test against a baseline the
paced server (tests/fakes/paced_server.py: 20 ms TTFT, 2.5 ms a token, 128 tokens, 20 requests)
recorded while smooth. Then the gate runs (``--kimiperf-gate``, the client's self-check on, as a
user has it) against the same server made to misbehave, one case at a time:

* ``smooth``: unchanged (the control: passes);
* ``stall-all``: every stream writes its first token on time, stalls, and writes the rest in one
  send 100 ms after the last one's due time (the user waits 100 ms longer for every answer);
* ``stall-half``: every 2nd stream so;
* ``slower``: 20% slower, smooth;
* ``two-a-chunk``: 2 tokens a chunk at the same token pace (vLLM's ``--stream-interval 2``);
* ``client-stopped``: smooth, the measuring pytest process SIGSTOPped 120 ms in every 400 at
  seeded random phases (tests/fakes/client_stopper.py).

Per case it prints the server's truth (the median decode its write stamps give), the plugin's
figure (the run's decode median, from its JSON), the worst per-request decode error, the exit
status, the verdict, and what the answer said of the stream. The issue asks: the stalls flagged
(exit 1 or 76) with decode within 1% of the truth and the answer saying the server stalled,
never exit 75; a stopped client passes or is INVALID naming the client, never a regression; two
tokens a chunk unchanged within its tolerance.

The truth is the paced server's own stamps, taken in user space by another process on the same
host: run this alone on a quiet host (a busy one delays the truth itself), and say which.

Run: ``.venv/bin/python benchmarks/stall_gate.py [--case stall-all ...] [--json out.json]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_kimiperf.measure.results import RequestRecord  # noqa: E402
from tests.paced_truth import client_stopped, paced_server, server_truth  # noqa: E402

PACE = ("--ttft-ms", "20", "--itl-ms", "2.5")
CASES: dict[str, tuple[str, ...]] = {
    "smooth": PACE,
    "stall-all": (*PACE, "--stall-every", "1", "--stall-ms", "100"),
    "stall-half": (*PACE, "--stall-every", "2", "--stall-ms", "100"),
    "slower": ("--ttft-ms", "20", "--itl-ms", "3.125"),
    "two-a-chunk": (*PACE, "--tokens-per-chunk", "2"),
    "client-stopped": PACE,
}
STOP_MS, PERIOD_MS = 120.0, 400.0

USER_TEST = """
from pytest_kimiperf import SingleStream

def test_decode(perf):
    perf.check(perf.measure(SingleStream(prompt_tokens=8, output_tokens=128, requests=20)), ["decode_tok_s"])
"""

PYPROJECT = """
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider --kimiperf-deployment paced"

[tool.kimiperf.deployments.paced]
server_hardware = "paced server here"
tolerances = { decode_tok_s = 0.10 }
"""


def _pytest(repo: Path, url: str, *args: str, stopped_seed: int | None = None) -> tuple[int, str, dict[str, Any]]:
    report = repo / "report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "--kimiperf-server-url", url, "--kimiperf-json", str(report), *args]
    proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop = (client_stopped(stop_ms=STOP_MS, period_ms=PERIOD_MS, seed=stopped_seed, pid=proc.pid)
            if stopped_seed is not None else contextlib.nullcontext())
    with stop:
        out, _ = proc.communicate(timeout=600)
    return proc.returncode, out, json.loads(report.read_text()) if report.exists() else {}


def _truth_decode(truth: dict[str, dict[str, Any]], request_id: str) -> float | None:
    wrote = truth.get(request_id)
    if not wrote or len(wrote["write_ns"]) < 2 or wrote["write_ns"][-1] == wrote["write_ns"][0]:
        return None
    tokens = wrote["output_tokens"] - wrote["tokens_per_chunk"]
    return tokens * 1e9 / (wrote["write_ns"][-1] - wrote["write_ns"][0])


def _answer(lines: list[str]) -> str:
    """The answer line against the baseline, its wrapped lines joined."""
    start = next((i for i, line in enumerate(lines) if "vs its baseline" in line), None)
    if start is None:
        return ""
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")), len(lines))
    return " ".join(" ".join(lines[start:end]).split())


def one_case(repo: Path, case: str) -> dict[str, Any]:
    """The gate against the smooth baseline, the server as ``case`` makes it."""
    with paced_server(*CASES[case]) as url:
        code, out, data = _pytest(repo, url, "--kimiperf-gate",
                                  stopped_seed=7 if case == "client-stopped" else None)
        truth = server_truth(url)
    (test,) = data.get("tests") or [{}]
    run = test.get("run") or {}
    errors, true_values = [], []
    for record in run.get("requests") or []:
        true = _truth_decode(truth, record["request_id"])
        if true is not None:
            true_values.append(true)
    decode = (test.get("metrics") or {}).get("decode_tok_s") or {}
    samples = decode.get("samples") or []
    # Each sample is its request's decode, computed from the record the JSON keeps: set each
    # beside the truth of the request whose record gives exactly that value.
    of_value = {RequestRecord.from_json(r).decode_tok_s: r["request_id"] for r in run.get("requests") or []}
    for value in samples:
        true = _truth_decode(truth, of_value.get(value, ""))
        if true is not None:
            errors.append(100.0 * (value - true) / true)
    said = " ".join(out.split())
    stream = ((run.get("measured") or {}).get("stream")) or {}
    return {
        "case": case, "exit": code,
        "truth_decode_median": round(statistics.median(true_values), 1) if true_values else None,
        "plugin_decode_median": round(decode.get("summary", {}).get("median") or 0.0, 1) or None,
        "decode_measured": len(samples), "sent": len(run.get("requests") or []),
        "max_decode_error_pct": round(max((abs(e) for e in errors), default=0.0), 3),
        "matched": len(errors),
        "invalid_cause": test.get("invalid_cause"),
        "stalled_requests": stream.get("stalled_requests"),
        "says_stalled": "the server stalled" in said, "says_exit_75": "exit status 75" in said,
        "answer": _answer(out.splitlines()),
    }


@contextlib.contextmanager
def user_repo() -> Iterator[Path]:
    """A user's repository with the decode test and its baseline recorded on the smooth server."""
    with tempfile.TemporaryDirectory(prefix="stall-gate-") as folder:
        repo = Path(folder)
        (repo / "pyproject.toml").write_text(PYPROJECT)
        (repo / "test_decode.py").write_text(USER_TEST)
        with paced_server(*PACE) as url:
            code, out, _ = _pytest(repo, url, "--kimiperf-update-baselines")
        if code != 0:
            raise SystemExit(f"recording the smooth baseline failed (exit {code}):\n{out[-3000:]}")
        yield repo


def main() -> int:
    """Record once, run every case, print a row each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", choices=tuple(CASES), help="default: every case")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    with user_repo() as repo:
        for case in args.case or CASES:
            row = one_case(repo, case)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
