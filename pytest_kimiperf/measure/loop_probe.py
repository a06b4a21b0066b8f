"""The client's own clock check: how late an event loop runs a callback that was due.

:class:`LoopProbe` is what the self-check of every measured round rests on.
:func:`host_idle_loop_latency_ms` reads what *this host* charges an idle loop to wake, in a fresh
interpreter, so the bounds can follow the host (a host 5x slower than another charges about 5x)
while anything the measuring process does to its loop (a thread holding the GIL, a callback that
blocks) still counts against the run: an idle probe inside that process would be starved by the
same thread and raise the bound with it. The child (``python -m pytest_kimiperf.measure.loop_probe
[CPU ...]``) imports only the standard library, so it starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import threading
import time

PROBE_INTERVAL_S = 0.002
# A reading later than this marks a hold: a stretch the loop did not run, which could have joined
# chunks that arrived apart into one read (measure/coverage.py judges each shared read by the
# holds). A quarter of the interval: an idle loop on this project's hosts wakes in 0.02-0.3 ms,
# and a hold the probe cannot see whole (shorter than an interval and this) joins only chunks
# that arrived within 2.5 ms of each other.
HOLD_MIN_LATENCY_S = 0.0005
_HOLD_MIN_LATENCY_NS = int(HOLD_MIN_LATENCY_S * 1e9)
# How long the idle loop is timed: 125 probe intervals.
IDLE_PROBE_S = 0.25
# A child that has not answered in this long (a host so busy it cannot start Python) leaves the
# deployment's absolute bounds in force.
_IDLE_CHILD_TIMEOUT_S = 30.0


class LoopProbe:
    """Times how late the loop runs a callback that became due at a known moment.

    A thread wakes every ``PROBE_INTERVAL_S`` and posts a callback stamped with the moment it
    was *due* (not when the post happened): the delay then holds everything a socket event
    would wait through before the client reads it, including the GIL held by another
    thread of the process and CPU taken by other processes.

    ``holds_ns`` keeps, for each reading later than ``HOLD_MIN_LATENCY_S``, the stretch in
    ``perf_counter_ns`` the loop surely did not run a callback: from when the callback was due
    to when it ran. measure/coverage.py's ``Holds`` reaches back from there to when the loop
    last ran.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stop = threading.Event()
        self.latencies_ms: list[float] = []
        self.holds_ns: list[tuple[int, int]] = []
        self._thread = threading.Thread(target=self._post, name="kimiperf-loop-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _post(self) -> None:
        _set_thread_timer_slack_ns(1000)
        interval_ns = int(PROBE_INTERVAL_S * 1e9)
        due_ns = time.perf_counter_ns() + interval_ns
        while not self._stop.is_set():
            wait_ns = due_ns - time.perf_counter_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
            try:
                self._loop.call_soon_threadsafe(self._answer, due_ns)
            except RuntimeError:
                return  # loop closed
            due_ns += interval_ns
            now_ns = time.perf_counter_ns()
            if due_ns < now_ns:
                due_ns = now_ns + interval_ns  # fell behind: do not post a burst to catch up

    def _answer(self, due_ns: int) -> None:
        ran_ns = time.perf_counter_ns()
        self.latencies_ms.append((ran_ns - due_ns) / 1e6)
        if ran_ns - due_ns > _HOLD_MIN_LATENCY_NS:
            self.holds_ns.append((due_ns, ran_ns))


def _set_thread_timer_slack_ns(slack_ns: int) -> None:
    # Linux lets sleeps end up to 50 us late by default (timer slack, man 2 prctl); the probe
    # would count that as loop latency. PR_SET_TIMERSLACK applies to the calling thread only.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, slack_ns, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def idle_loop_latency_ms() -> tuple[float, ...]:
    """The probe on a fresh event loop with nothing to do, for ``IDLE_PROBE_S`` (in this
    process: the child's entry point)."""
    loop = asyncio.new_event_loop()
    try:
        probe = LoopProbe(loop)
        probe.start()
        try:
            loop.run_until_complete(asyncio.sleep(IDLE_PROBE_S))
        finally:
            probe.stop()
        return tuple(probe.latencies_ms)
    finally:
        loop.close()


@functools.cache
def host_idle_loop_latency_ms(cpus: tuple[int, ...] = ()) -> tuple[float, ...]:
    """What an idle loop reads on this host, timed once per process (and per placement) in a
    fresh interpreter, on ``cpus`` where the measured rounds are placed (placement.py; empty:
    where the scheduler puts it); empty where the child could not tell (then the absolute
    bounds stay in force). ``host_idle_loop_latency_ms.cache_clear()`` times it again (a
    benchmark that slows the host)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, *map(str, cpus)], capture_output=True, text=True,
            timeout=_IDLE_CHILD_TIMEOUT_S, check=True,
        )
        return tuple(float(x) for x in json.loads(done.stdout))
    except (OSError, subprocess.SubprocessError, ValueError, TypeError):
        return ()


if __name__ == "__main__":
    if sys.argv[1:]:  # the CPUs the measured rounds run on
        os.sched_setaffinity(0, {int(cpu) for cpu in sys.argv[1:]})
    print(json.dumps(idle_loop_latency_ms()))
