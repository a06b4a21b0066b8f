"""What a run reports against what the paced server wrote, request by request and gap by gap.

tests/fakes/paced_server.py records when it wrote every chunk and when each request reached it
(``/paced/truth``); a run's records carry the client's stamps of the same chunks, by request id.
:func:`check` sets every decode, TTFT and inter-token gap the run reports beside the truth of
the same request or gap, so a test can assert that each figure the run gives is true and each
one it does not give is withheld with a reason (measure/coverage.py).

:func:`paced_server` and :func:`client_stopped` start the truth server and the SIGSTOP helper
(tests/fakes/client_stopper.py) as processes of their own. Shared by tests/plugin/test_server_stalls.py
and benchmarks/shared_reads.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_kimiperf.measure.coverage import stamps as judge_stamps
from pytest_kimiperf.measure.coverage import true_gaps as kept_gaps
from pytest_kimiperf.measure.results import RunResult, percentile
from tests.helpers import FAKES, PACED_SERVER

MODEL = "paced-model"
CLIENT_STOPPER = FAKES / "client_stopper.py"
_NS_PER_MS = 1_000_000


@contextlib.contextmanager
def paced_server(*args: str) -> Iterator[str]:
    """The truth server in its own process, started with ``args`` (its command line); yields its URL."""
    proc = subprocess.Popen([sys.executable, str(PACED_SERVER), "--port", "0", "--model", MODEL, *args],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "port=" not in line:
            raise RuntimeError(f"paced server did not start: {line!r}")
        yield f"http://127.0.0.1:{line.split('port=')[1].strip()}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def server_truth(base_url: str) -> dict[str, dict[str, Any]]:
    """The server's record of every stream it served, by request id."""
    streams = httpx.get(f"{base_url}/paced/truth", timeout=10).json()["streams"]
    return {s["request_id"]: s for s in streams}


@dataclass
class Stops:
    """The stops a :func:`client_stopped` helper made: ``[stop_ns, cont_ns]`` each, known once it ended."""

    intervals: list[list[int]] = field(default_factory=list)


@contextlib.contextmanager
def client_stopped(*, stop_ms: float, period_ms: float, seed: int, pid: int | None = None) -> Iterator[Stops]:
    """This process (or ``pid``) SIGSTOPped for ``stop_ms`` in every ``period_ms`` at seeded random
    phases, by a helper process, for the length of the block. The helper's last signal is always
    SIGCONT: it ends on end of file on its stdin, and SIGTERM (sent if it does not) ends it too."""
    stops = Stops()
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT_STOPPER), "--pid", str(os.getpid() if pid is None else pid),
         "--stop-ms", str(stop_ms), "--period-ms", str(period_ms), "--seed", str(seed)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        yield stops
    finally:
        try:
            out, _ = proc.communicate(timeout=10)  # closes its stdin: the helper's end of file
        except subprocess.TimeoutExpired:
            proc.terminate()
            out, _ = proc.communicate(timeout=10)
        stops.intervals = json.loads(out or "[]")


@dataclass(frozen=True)
class TruthCheck:
    """A run's figures set beside the truth: one error per figure it reported, and what it withheld.

    Errors are measured minus true: ``decode_error_pct`` per request that gave a decode figure,
    ``ttft_error_ms`` per request that gave a TTFT, ``gap_error_ms`` per gap the run measured;
    ``p99_gap_ms`` is the p99 the run reports and ``p99_true_gap_ms`` the p99 of the same gaps as
    written (the near-zero gaps inside a server's one send included). ``false`` lists figures the
    run gave where the truth has none (a decode rate of a stream written in one send) and records
    whose chunks do not match the writes.
    """

    sent: int
    decode_error_pct: Mapping[str, float]
    ttft_error_ms: Mapping[str, float]
    gap_error_ms: tuple[float, ...]
    p99_gap_ms: float | None
    p99_true_gap_ms: float | None
    false: tuple[str, ...]

    @property
    def max_decode_error_pct(self) -> float:
        """The worst |error| of a decode figure the run gave (0 when it gave none)."""
        return max((abs(e) for e in self.decode_error_pct.values()), default=0.0)

    @property
    def max_ttft_error_ms(self) -> float:
        """The worst |error| of a TTFT the run gave (0 when it gave none)."""
        return max((abs(e) for e in self.ttft_error_ms.values()), default=0.0)

    @property
    def p99_gap_error_ms(self) -> float:
        """The run's p99 gap minus the p99 of the same gaps as written (0 when it measured none)."""
        if self.p99_gap_ms is None or self.p99_true_gap_ms is None:
            return 0.0
        return self.p99_gap_ms - self.p99_true_gap_ms

    def row(self) -> dict[str, Any]:
        """The figures a benchmark prints."""
        return {"sent": self.sent, "decode_measured": len(self.decode_error_pct),
                "ttft_measured": len(self.ttft_error_ms), "gaps_measured": len(self.gap_error_ms),
                "max_decode_error_pct": round(self.max_decode_error_pct, 3),
                "max_ttft_error_ms": round(self.max_ttft_error_ms, 3),
                "p99_gap_ms": self.p99_gap_ms, "p99_true_gap_ms": self.p99_true_gap_ms,
                "p99_gap_error_ms": round(self.p99_gap_error_ms, 3),
                "max_gap_error_ms": round(max((abs(e) for e in self.gap_error_ms), default=0.0), 3),
                "false": list(self.false)}


def check(run: RunResult, truth: Mapping[str, Mapping[str, Any]]) -> TruthCheck:
    """Every decode, TTFT and gap ``run`` reports against ``truth`` (:func:`server_truth`)."""
    decode: dict[str, float] = {}
    ttft: dict[str, float] = {}
    measured_gaps: list[float] = []
    true_gaps: list[float] = []
    false: list[str] = []
    holds = run.holds
    for record in run.valid_records:
        wrote = truth[record.request_id]
        writes: list[int] = wrote["write_ns"]
        stamps = record.chunk_ns
        if len(stamps) != len(writes):
            false.append(f"{record.request_id}: {len(stamps)} chunks read of {len(writes)} written")
            continue
        if (value := record.value("decode_tok_s", holds)) is not None:
            span_ns = writes[-1] - writes[0]
            if span_ns <= 0:
                false.append(f"{record.request_id}: decode {value:.1f} tok/s of a stream written in one send")
            else:
                true = (wrote["output_tokens"] - wrote["tokens_per_chunk"]) * 1e9 / span_ns
                decode[record.request_id] = 100.0 * (value - true) / true
        if (value := record.value("ttft_ms", holds)) is not None:
            ttft[record.request_id] = value - (writes[0] - wrote["t_arrival_ns"]) / _NS_PER_MS
        for i in kept_gaps(record, judge_stamps(record, holds)):  # the gaps the run measures
            measured_gaps.append((stamps[i + 1] - stamps[i]) / _NS_PER_MS)
            true_gaps.append((writes[i + 1] - writes[i]) / _NS_PER_MS)
    if sorted(measured_gaps) != sorted(run.itl_timeline_ms()):
        false.append("the gaps set beside the truth are not the gaps the run measured")
    reported = run.percentiles("itl_ms")
    return TruthCheck(
        sent=len(run.records), decode_error_pct=decode, ttft_error_ms=ttft,
        gap_error_ms=tuple(m - t for m, t in zip(measured_gaps, true_gaps, strict=True)),
        p99_gap_ms=reported.get(99), p99_true_gap_ms=percentile(true_gaps, 99) if true_gaps else None,
        false=tuple(false),
    )
