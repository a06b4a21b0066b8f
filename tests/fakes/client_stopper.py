"""Holds a process off the CPU at random phases, as a host that deschedules the client does.

In every ``--period-ms`` it sends the process ``SIGSTOP`` at a random phase (``--seed`` seeds
the phases) and ``SIGCONT`` ``--stop-ms`` later, so chunks queue in the stopped process's
sockets and come in one read when it runs again. It is its own process because a stopped
process cannot wake itself.

It stops when its stdin reaches end of file (the parent closed it, or died) or on SIGTERM, and
whatever ends it, the last thing it sends is ``SIGCONT``: a test never leaves its own pytest
stopped. On exit it prints the stops it made as one JSON list of ``[stop_ns, cont_ns]``
(``perf_counter_ns``, the CLOCK_MONOTONIC the client stamps with).

Run: ``python tests/fakes/client_stopper.py --pid PID --stop-ms 120 --period-ms 400 --seed 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import sys
import time
from types import FrameType


def _until(deadline_ns: int) -> bool:
    """Wait until ``deadline_ns``; True when stdin reached end of file meanwhile (time to stop)."""
    while (left_ns := deadline_ns - time.perf_counter_ns()) > 0:
        readable, _, _ = select.select([sys.stdin], [], [], left_ns / 1e9)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return True
    return False


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # through the finally that sends SIGCONT


def main(argv: list[str] | None = None) -> int:
    """Stop and continue ``--pid`` until told to end; print the stops."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--stop-ms", type=float, default=120.0)
    parser.add_argument("--period-ms", type=float, default=400.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.stop_ms < args.period_ms:
        parser.error(f"--stop-ms {args.stop_ms:g}: must be above 0 and below --period-ms {args.period_ms:g}")
    signal.signal(signal.SIGTERM, _terminated)
    rng = random.Random(args.seed)
    stop_ns, period_ns = int(args.stop_ms * 1e6), int(args.period_ms * 1e6)
    stops: list[list[int]] = []
    period_start_ns = time.perf_counter_ns()
    try:
        while True:
            if _until(period_start_ns + int(rng.uniform(0, period_ns - stop_ns))):
                break
            stopped_ns = time.perf_counter_ns()
            os.kill(args.pid, signal.SIGSTOP)
            time.sleep(stop_ns / 1e9)
            os.kill(args.pid, signal.SIGCONT)
            stops.append([stopped_ns, time.perf_counter_ns()])
            period_start_ns += period_ns
            if _until(period_start_ns):
                break
            # A late helper (a busy host) starts its next period now, not in a burst of stops.
            period_start_ns = max(period_start_ns, time.perf_counter_ns())
    except ProcessLookupError:
        pass  # the process ended: nothing left to continue
    finally:
        try:
            os.kill(args.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        print(json.dumps(stops), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
