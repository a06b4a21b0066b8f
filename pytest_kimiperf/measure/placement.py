"""Where the client runs: at normal priority, on CPUs the server's processes do not use.

The instrument must not move what it measures: why the client runs at the server's priority, and
what sharing two cores costs, measured: docs/explanation/measurement.md, "How the client is
placed". A server thread pinned to some CPUs claims them; one the scheduler may move anywhere
claims the CPU it last ran on while the warm-up was served (:func:`place_client` compares two
:func:`read_threads` samples around it). The decision is pure; :func:`read_threads` and
:func:`placed` touch the host.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# Below this many CPUs the client shares them with the server: two for the server's busy threads
# (vLLM's engine and its API server) and one for the rest of the host leave one for the client.
MIN_CPUS_TO_PLACE = 4


@dataclass(frozen=True)
class ThreadCpu:
    """One server thread at one moment: the CPUs it may run on, the CPU it last ran on, and
    its CPU time so far (seconds)."""

    allowed: frozenset[int]
    last_cpu: int
    cpu_s: float


def parse_task_stat(text: str, ticks_per_s: float) -> tuple[int, float]:
    """The CPU a task last ran on and its user + system seconds, from ``/proc/<pid>/stat`` text
    (proc(5): ``processor`` is field 39, ``utime`` and ``stime`` 14 and 15, counted after the
    command name in parentheses, which may hold spaces)."""
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): field n is fields[n - 3].
    return int(fields[39 - 3]), (int(fields[14 - 3]) + int(fields[15 - 3])) / ticks_per_s


def read_threads(pids: Iterable[int], proc_root: str = "/proc") -> dict[int, ThreadCpu]:
    """Every thread of ``pids``, by thread id; threads that exit while read are left out."""
    ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
    threads: dict[int, ThreadCpu] = {}
    for pid in pids:
        try:
            tids = [int(name) for name in os.listdir(Path(proc_root, str(pid), "task"))]
        except (OSError, ValueError):
            continue
        for tid in tids:
            try:
                last_cpu, cpu_s = parse_task_stat(Path(proc_root, str(pid), "task", str(tid), "stat").read_text(),
                                                  ticks_per_s)
                allowed = frozenset(os.sched_getaffinity(tid))
            except (OSError, ValueError, IndexError):
                continue
            threads[tid] = ThreadCpu(allowed, last_cpu, cpu_s)
    return threads


# Why the client is where it is.
ISOLATED = "isolated"  # on CPUs the server's processes neither are pinned to nor ran on
TOO_SMALL = "too-small"  # fewer than MIN_CPUS_TO_PLACE CPUs: shared with the server
NO_SPARE = "no-spare"  # the server used (or may use) every CPU the client may: shared
NOT_KNOWN = "not-known"  # the server's processes are not known here: not placed


@dataclass(frozen=True)
class Placement:
    """Where the client's measured rounds run and why: ``client_cpus`` empty means not placed
    (the scheduler decides, on every CPU in ``allowed``). ``server_cpus`` are the CPUs the
    server's threads are pinned to or ran on in the warm-up; ``server_busy_cpus`` the CPU time
    it used over the warm-up's wall time, rounded up (0 where not watched)."""

    how: str
    allowed: frozenset[int]
    client_cpus: frozenset[int] = frozenset()
    server_cpus: frozenset[int] = frozenset()
    server_busy_cpus: int = 0

    def describe(self) -> str:
        """The placement as one clause of a report line."""
        mine = cpu_list(self.allowed)
        if self.how == ISOLATED:
            return (f"client on CPU {cpu_list(self.client_cpus)} at normal priority, off the server's "
                    f"(its processes are pinned to or ran on {cpu_list(self.server_cpus)})")
        if self.how == TOO_SMALL:
            return (f"client not isolated: {len(self.allowed)} CPUs ({mine}) are too few to keep one from the "
                    f"server (it takes {MIN_CPUS_TO_PLACE}); normal priority, the self-check guards the stamps")
        if self.how == NO_SPARE:
            return (f"client not isolated: the server's processes are pinned to or ran on every CPU it may use "
                    f"({mine}); normal priority, the self-check guards the stamps")
        return f"client not placed: the server's processes are not known here; normal priority on CPU {mine}"

    def to_json(self) -> dict[str, object]:
        """This placement as JSON-ready data (the run's ``client_placement``)."""
        return {"how": self.how, "allowed": sorted(self.allowed), "client_cpus": sorted(self.client_cpus),
                "server_cpus": sorted(self.server_cpus), "server_busy_cpus": self.server_busy_cpus,
                "said": self.describe()}


def place_client(allowed: Iterable[int], before: Mapping[int, ThreadCpu] | None, after: Mapping[int, ThreadCpu],
                 window_s: float, *, min_cpus: int | None = None) -> Placement:
    """Where the client goes, from the server's threads ``before`` and ``after`` a window of
    ``window_s`` in which the server was busy (the warm-up); ``before`` None: not watched, so
    a thread that may run anywhere is taken to run everywhere. Fewer CPUs than ``min_cpus``
    (:data:`MIN_CPUS_TO_PLACE`) are too few to place the client."""
    mine = frozenset(allowed)
    if len(mine) < (MIN_CPUS_TO_PLACE if min_cpus is None else min_cpus):
        return Placement(TOO_SMALL, mine)
    server: set[int] = set()
    busy_s = 0.0
    for tid, now in after.items():
        then = before.get(tid) if before is not None else None
        ran_s = now.cpu_s - (then.cpu_s if then is not None else 0.0)
        busy_s += max(0.0, ran_s)
        if not now.allowed >= mine:  # pinned narrower than this client's CPUs
            server |= now.allowed
        elif before is None:
            server |= now.allowed
        elif ran_s > 0:
            server.add(now.last_cpu)
    busy = math.ceil(busy_s / window_s) if before is not None and window_s > 0 else 0
    spare = mine - server
    # The server keeps at least the CPUs it kept busy: a client that took them would queue it.
    if not spare or len(mine - spare) < busy:
        return Placement(NO_SPARE, mine, server_cpus=frozenset(server), server_busy_cpus=busy)
    return Placement(ISOLATED, mine, client_cpus=frozenset(spare), server_cpus=frozenset(server),
                     server_busy_cpus=busy)


def not_known() -> Placement:
    """The placement of a run whose server's processes are not known (attached, or a script)."""
    return Placement(NOT_KNOWN, frozenset(os.sched_getaffinity(0)))


@contextlib.contextmanager
def placed(cpus: frozenset[int]) -> Iterator[None]:
    """Run the calling thread (and the threads it starts) on ``cpus`` (empty: where it is), then
    put it back. Linux applies affinity per thread, so the event loop's thread is what moves."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_list(cpus: Iterable[int]) -> str:
    """``0-3,8,10-11``: CPUs as the kernel lists them (cpuset(7))."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(runs) or "none"
