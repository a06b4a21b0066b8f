"""Which of this process's pids NVML means: the driver reports the host's, a container sees its own.

Compared as they are, our own eight workers would count as foreign GPU processes and the zombie
sweep's GPU check would match nothing. :func:`read_pid_view` says how to translate: not at all in
the host's namespace; through ``NSpid`` (proc(5)) where this /proc is an ancestor namespace's;
else a pid NVML reports is taken as ours only where it is a process here holding ``/dev/nvidia*``
open (:data:`TRUSTED`), and what cannot be named is left to device-level accounting. Which pids
each driver reports, and gVisor's /proc: docs/explanation/reliability.md, "NVML's pids in a
container".
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

# The initial PID namespace's inode (PROC_PID_INIT_INO, include/linux/proc_ns.h: 0xEFFFFFFC,
# fixed since Linux 3.8): /proc/self/ns/pid points at it only outside every container.
INIT_PID_NS_INODE = 0xEFFFFFFC

SAME, MAPPED, TRUSTED, UNMAPPABLE = "same", "mapped", "trusted", "unmappable"


@dataclass(frozen=True)
class PidView:
    """How NVML's (host) pids relate to the pids this process sees."""

    mode: str  # SAME, MAPPED, TRUSTED or UNMAPPABLE
    # MAPPED: NVML's pid -> ours through NSpid; TRUSTED: NVML's pids that are processes here
    # holding an NVIDIA device, each to itself (the rest NVML reported cannot be named).
    host_to_local: Mapping[int, int] = field(default_factory=dict)
    note: str | None = None

    def local(self, host_pid: int) -> int | None:
        """The pid this process knows ``host_pid`` by; None where it cannot say."""
        if self.mode == SAME:
            return host_pid
        return self.host_to_local.get(host_pid)

    def local_pids(self, by_host_pid: Mapping[int, int]) -> dict[int, int]:
        """``{host pid: value}`` re-keyed by local pid, dropping what this view cannot name."""
        result: dict[int, int] = {}
        for host_pid, value in by_host_pid.items():
            pid = self.local(host_pid)
            if pid is not None:
                result[pid] = value
        return result

    def host_pids(self, local_pids: Iterable[int]) -> set[int]:
        """The host pids of ``local_pids`` (those this view can name)."""
        wanted = set(local_pids)
        if self.mode == SAME:
            return wanted
        return {host for host, local in self.host_to_local.items() if local in wanted}

    def unnamed(self, nvml_pids: Iterable[int]) -> set[int]:
        """The pids NVML reported that this view cannot tell from ours: none where NVML's pids
        are ours or mapped (an unmapped host pid is another namespace's process: foreign), and
        every pid it could not trust otherwise (a host pid of ours under an old driver, say)."""
        if self.mode in (SAME, MAPPED):
            return set()
        return {pid for pid in nvml_pids if pid not in self.host_to_local}


def _nspid(status: Path) -> list[int]:
    """The ``NSpid:`` line of a /proc/<pid>/status file; [] when absent or unreadable."""
    try:
        text = status.read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            return [int(part) for part in line.split()[1:] if part.isdigit()]
    return []


def _pid_ns_inode(proc_dir: Path) -> int | None:
    """The inode of a process's PID namespace; None when it cannot be read (the process is gone,
    or belongs to another user). Only processes of our own namespace are mapped: those of a
    namespace nested in ours, and those whose link we may not read, are left out (NVML's pids
    of them go unnamed, as a host pid outside our namespace does)."""
    try:
        return os.stat(proc_dir / "ns" / "pid").st_ino
    except OSError:
        return None


def _holds_nvidia_device(proc_root: Path, pid: int) -> bool:
    """True if ``pid`` here has a ``/dev/nvidia*`` file open (a CUDA context keeps
    /dev/nvidiactl and /dev/nvidia<N> open for its lifetime)."""
    try:
        fds = list((proc_root / str(pid) / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd).startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def _trusted(proc_root: Path, reported: Iterable[int], path_pid: Mapping[int, int] | None = None) -> dict[int, int]:
    """``{pid: pid}`` for each reported pid that is a process here holding an NVIDIA device
    (``path_pid`` gives the /proc entry of a pid where this /proc is an ancestor namespace's)."""
    return {pid: pid for pid in reported
            if (path_pid is None or pid in path_pid) and _holds_nvidia_device(proc_root, (path_pid or {}).get(pid, pid))}


def _trusted_view(proc_root: Path, reported: set[int], why: str,
                  path_pid: Mapping[int, int] | None = None) -> PidView:
    """TRUSTED where some reported pid is a local process holding an NVIDIA device (or none was
    reported: nothing to name); UNMAPPABLE where NVML named processes and none is one here."""
    trusted = _trusted(proc_root, reported, path_pid)
    unnamed = sorted(reported - set(trusted))
    if reported and not trusted:
        return PidView(UNMAPPABLE, note=(
            f"{why}, and none of NVML's pids {unnamed[:8]} is a process here holding an NVIDIA device (a driver "
            "that reports host pids, such as 550 and older): NVML's process list cannot be matched with our "
            "processes, so the bound on other GPU processes is off and the sweep cannot see GPU memory; run "
            "with the host's PID namespace (docker --pid=host) to have both; device-level accounting "
            "(memory used on each GPU) still finds memory left behind"))
    left = (f"; {len(unnamed)} pid(s) NVML reports are no process here and are left unnamed: {unnamed[:8]}"
            if unnamed else "")
    return PidView(TRUSTED, trusted, note=(
        f"{why}: NVML's pids are taken as ours where each is a process here holding an NVIDIA device "
        f"({len(trusted)} of {len(reported)}){left}; a driver that converts pids into this namespace hides "
        "other containers' processes, which device-level accounting (memory used on each GPU) still sees"))


def read_pid_view(proc_root: Path = Path("/proc"), nvml_pids: Iterable[int] = ()) -> PidView:
    """How to read NVML's pids here (see the module docstring); ``nvml_pids``, the pids NVML
    reported, decide where /proc cannot map them or the driver already converted them."""
    try:
        inode = os.stat(proc_root / "self" / "ns" / "pid").st_ino
    except OSError:  # no /proc of this kind (a recorded /proc tree in the tests): as before
        return PidView(SAME)
    if inode == INIT_PID_NS_INODE:
        return PidView(SAME)
    reported = set(nvml_pids)
    own_nspid = _nspid(proc_root / "self" / "status")
    if not own_nspid:
        return _trusted_view(proc_root, reported, f"no NSpid in {proc_root}/self/status (a sandbox such as gVisor)")
    depth = len(own_nspid) - 1
    if depth < 1:
        return _trusted_view(proc_root, reported, "this process runs in a PID namespace of its own (a container) "
                             "whose /proc shows no host pids")
    mapping: dict[int, int] = {}
    for status in proc_root.glob("[0-9]*/status"):
        nspid = _nspid(status)
        # Only our own namespace's processes: a sibling container's, seen through the same
        # /proc, has a pid at our depth too, in another namespace (its pid 1 is not ours).
        if len(nspid) > depth and _pid_ns_inode(status.parent) == inode:
            mapping[nspid[0]] = nspid[depth]
    local_to_path = {local: host for host, local in mapping.items()}
    if reported and not reported & mapping.keys() and reported <= local_to_path.keys():
        # None is a host pid of ours and each is one of our namespace's pids: the driver
        # converted them (os_find_ns_pid), so /proc/<host pid> is where each one is found.
        return _trusted_view(proc_root, reported, "in a container whose driver names processes by this "
                             "namespace's pids", local_to_path)
    return PidView(MAPPED, mapping, note=(
        f"in a container: NVML's host pids are mapped to ours through NSpid ({len(mapping)} processes)"))
