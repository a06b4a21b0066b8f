"""The CPU quota a run measures under, and whether it throttled a measured window.

A container's CPU limit is a CFS bandwidth quota on its cgroup: why a window it throttled is
disturbed like a busy host's, measured: docs/explanation/measurement.md, "A CPU quota". The kernel
counts the throttling exactly, per cgroup, in ``cpu.stat``: cgroup v1 has ``nr_periods``,
``nr_throttled`` and ``throttled_time`` (ns), its quota in ``cpu.cfs_quota_us`` (-1: none) per
``cpu.cfs_period_us``; v2 has ``throttled_usec`` (where the ``cpu`` controller is enabled), its
quota in ``cpu.max`` (``max 100000``: none). A quota on a parent cgroup throttles its children and
is counted in the parent's ``cpu.stat``, so every level up to the hierarchy's visible root is
read. Parsing is pure and tested on recorded files (tests/data/cgroup).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class CpuStat:
    """A cgroup's CFS bandwidth counters: periods with a quota, periods it ran out, time throttled."""

    nr_periods: int
    nr_throttled: int
    throttled_us: float


def parse_cpu_stat(text: str, version: int) -> CpuStat | None:
    """The bandwidth counters of one ``cpu.stat`` file; None where it has none (v2 without the
    cpu controller counts only usage)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = int(value)
        except ValueError:
            continue
    time_key, per_us = ("throttled_time", 1e-3) if version == 1 else ("throttled_usec", 1.0)
    if "nr_throttled" not in values or time_key not in values:
        return None
    return CpuStat(values.get("nr_periods", 0), values["nr_throttled"], values[time_key] * per_us)


@dataclass(frozen=True)
class Quota:
    """A CFS bandwidth limit: ``quota_us`` of CPU time per ``period_us``."""

    quota_us: int
    period_us: int

    @property
    def cpus(self) -> float:
        """The limit in CPUs (0.5: half of one CPU's time)."""
        return self.quota_us / self.period_us


def parse_quota_v1(quota_text: str, period_text: str) -> Quota | None:
    """``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``; None for -1 (no quota)."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return Quota(quota, period) if quota > 0 and period > 0 else None


def parse_cpu_max(text: str) -> Quota | None:
    """v2 ``cpu.max`` (``$MAX $PERIOD``); None for ``max`` (no quota)."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    return Quota(int(fields[0]), int(fields[1]) if len(fields) > 1 else 100_000)


@dataclass(frozen=True)
class CgroupDir:
    """One cgroup of the cpu controller: its version, its path in the hierarchy and its folder."""

    version: int
    name: str
    folder: str


def cpu_cgroup_dirs(cgroup_text: str, mountinfo_text: str) -> tuple[CgroupDir, ...]:
    """A process's cpu cgroup and every ancestor this mount namespace shows, innermost first,
    from its ``/proc/<pid>/cgroup`` and the reader's ``/proc/self/mountinfo``; () where the cpu
    controller is not mounted here. v1's ``cpu`` controller wins where a hybrid host has both
    (v2 cannot then hold it)."""
    v1: dict[str, str] = {}  # controller list -> path
    v2_path = None
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        else:
            v1[parts[1]] = parts[2]
    mounts = [_mount(line) for line in mountinfo_text.splitlines()]
    for controllers, path in v1.items():
        if "cpu" not in controllers.split(","):
            continue
        for fstype, root, point, options in filter(None, mounts):
            if fstype == "cgroup" and "cpu" in options.split(","):
                return _levels(1, path, root, point)
    if v2_path is not None:
        for fstype, root, point, _ in filter(None, mounts):
            if fstype == "cgroup2":
                return _levels(2, v2_path, root, point)
    return ()


def _mount(line: str) -> tuple[str, str, str, str] | None:
    """(fs type, root, mount point, super options) of one mountinfo line (proc(5))."""
    head, sep, tail = line.partition(" - ")
    fields, rest = head.split(), tail.split()
    if not sep or len(fields) < 5 or len(rest) < 3:
        return None
    return rest[0], fields[3], fields[4], rest[2]


def _levels(version: int, path: str, root: str, point: str) -> tuple[CgroupDir, ...]:
    """The cgroup at ``path`` and its ancestors up to the mount's root, as folders under ``point``."""
    cgroup, top = PurePosixPath(path), PurePosixPath(root)
    if cgroup != top and top not in cgroup.parents:
        return ()  # outside what this mount shows
    levels = []
    while True:
        relative = cgroup.relative_to(top)
        levels.append(CgroupDir(version, str(cgroup), str(PurePosixPath(point) / relative)))
        if cgroup == top:
            return tuple(levels)
        cgroup = cgroup.parent


@dataclass(frozen=True)
class CgroupLevel:
    """One level's quota and counters, read now."""

    where: CgroupDir
    quota: Quota | None
    stat: CpuStat | None


def _read_level(where: CgroupDir) -> CgroupLevel:
    """Read one cgroup's quota and ``cpu.stat`` (None for what is not there or not readable)."""
    folder = Path(where.folder)
    quota: Quota | None = None
    stat: CpuStat | None = None
    with contextlib.suppress(OSError, ValueError):
        if where.version == 1:
            quota = parse_quota_v1((folder / "cpu.cfs_quota_us").read_text(), (folder / "cpu.cfs_period_us").read_text())
        else:
            quota = parse_cpu_max((folder / "cpu.max").read_text())
    with contextlib.suppress(OSError):
        stat = parse_cpu_stat((folder / "cpu.stat").read_text(), where.version)
    return CgroupLevel(where, quota, stat)


def process_cgroup_dirs(pid: int | str = "self", proc_root: str = "/proc",
                        mountinfo_text: str | None = None) -> tuple[CgroupDir, ...]:
    """The cpu cgroups of a process (``cpu_cgroup_dirs`` on this host, with this process's
    mounts unless given); () where not readable."""
    try:
        cgroup_text = Path(proc_root, str(pid), "cgroup").read_text()
        if mountinfo_text is None:
            mountinfo_text = Path(proc_root, "self", "mountinfo").read_text()
    except OSError:
        return ()
    return cpu_cgroup_dirs(cgroup_text, mountinfo_text)


@dataclass(frozen=True)
class QuotaWindow:
    """A CPU quota over one measured window: the cgroup that holds it, whose processes it holds
    (``"the client"``, ``"the server"``, or both), the quota, and how often and how long it
    throttled them inside the window."""

    cgroup: str
    version: int
    whose: str
    quota_us: int
    period_us: int
    nr_throttled: int
    throttled_ms: float
    wall_s: float

    def throttled(self) -> bool:
        """Did the quota hold its processes back inside the window?"""
        return self.nr_throttled > 0

    def describe(self) -> str:
        """The quota and what it throttled, as one clause."""
        quota = f"{_quota_text(self.cgroup, self.version, Quota(self.quota_us, self.period_us))}, which holds {self.whose},"
        if not self.throttled():
            return f"{quota} throttled nothing in the {self.wall_s:.1f} s window"
        return (f"{quota} throttled them in {self.nr_throttled} period(s) for {self.throttled_ms:.0f} ms of the "
                f"{self.wall_s:.1f} s window")


def _quota_text(cgroup: str, version: int, quota: Quota) -> str:
    files = ("cpu.cfs_quota_us {q} per cpu.cfs_period_us {p}" if version == 1 else "cpu.max {q} {p}").format(
        q=quota.quota_us, p=quota.period_us)
    return f"the CPU quota of {quota.cpus:.3g} CPU on cgroup {cgroup} (v{version}: {files})"


class QuotaWatch:
    """Reads the CPU quotas of the processes ``pids()`` names at both ends of a window.

    ``client`` are the pids that are the client (this process and its workers); the others
    are the server's. Levels are read once per cgroup whatever number of processes share it. A
    cgroup first seen at the window's end (a process moved into it meanwhile) has no start to
    count from and is left out; processes born inside the window inherit their parent's."""

    def __init__(self, pids: Callable[[], Iterable[int]], *, client: Callable[[], Iterable[int]],
                 proc_root: str = "/proc", clock: Callable[[], float] | None = None) -> None:
        self._pids, self._client, self._proc_root = pids, client, proc_root
        self._clock = clock or time.monotonic
        self._start: dict[str, tuple[CgroupLevel, set[str]]] = {}
        self._t0_s = 0.0

    def _read(self) -> dict[str, tuple[CgroupLevel, set[str]]]:
        client = set(self._client())
        levels: dict[str, tuple[CgroupLevel, set[str]]] = {}
        try:
            mounts = Path(self._proc_root, "self", "mountinfo").read_text()
        except OSError:
            return levels
        for pid in {*self._pids(), *client}:
            whose = "the client" if pid in client else "the server"
            for where in process_cgroup_dirs(pid, self._proc_root, mounts):
                if where.folder not in levels:
                    levels[where.folder] = (_read_level(where), set())
                levels[where.folder][1].add(whose)
        return levels

    def start(self) -> None:
        """Read every level's counters at the window's start."""
        self._start, self._t0_s = self._read(), self._clock()

    def stop(self) -> tuple[QuotaWindow, ...]:
        """Every quota that held one of the processes during the window, with what it throttled."""
        stop, wall_s = self._read(), max(self._clock() - self._t0_s, 1e-9)
        windows = []
        for folder, (level, whose) in stop.items():
            first = self._start.get(folder)
            if level.quota is None or first is None:
                continue
            before, after = first[0].stat, level.stat
            throttled = (after.nr_throttled - before.nr_throttled) if before and after else 0
            throttled_us = (after.throttled_us - before.throttled_us) if before and after else 0.0
            windows.append(QuotaWindow(
                cgroup=level.where.name, version=level.where.version,
                whose=" and ".join(sorted(whose | first[1])), quota_us=level.quota.quota_us,
                period_us=level.quota.period_us, nr_throttled=max(0, throttled),
                throttled_ms=max(0.0, throttled_us) / 1000, wall_s=wall_s))
        return tuple(windows)


@dataclass(frozen=True)
class QuotaInForce:
    """The tightest CPU quota on a process's cgroup or above it (None: no quota), where read."""

    levels: tuple[CgroupDir, ...]
    quota: Quota | None
    cgroup: str = ""

    def describe(self) -> str:
        """The header's clause: the quota in force and what it does to a run."""
        if not self.levels:
            return "CPU quota: not known (no cpu cgroup controller is mounted here)"
        if self.quota is None:
            return f"CPU quota: none on cgroup v{self.levels[0].version} {self.levels[0].name} or above it"
        return (f"CPU quota: {_quota_text(self.cgroup, self.levels[0].version, self.quota)} holds this run; a "
                "measured window it throttles is INVALID")


def quota_in_force(levels: Sequence[CgroupLevel]) -> QuotaInForce:
    """The tightest quota among ``levels`` (a process's cgroup and its ancestors)."""
    limited = [level for level in levels if level.quota is not None]
    if not limited:
        return QuotaInForce(tuple(level.where for level in levels), None)
    tightest = min(limited, key=lambda level: level.quota.cpus if level.quota else float("inf"))
    return QuotaInForce(tuple(level.where for level in levels), tightest.quota, tightest.where.name)


def read_quota_in_force(pid: int | str = "self", proc_root: str = "/proc") -> QuotaInForce:
    """The quota in force on a process of this host (by default this one)."""
    return quota_in_force([_read_level(where) for where in process_cgroup_dirs(pid, proc_root)])
