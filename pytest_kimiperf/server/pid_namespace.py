"""Which of this process's pids NVML means: the driver reports the host's, a container sees its own.

NVML names the processes on a GPU by their pid in the host's (the initial) PID namespace; psutil
and /proc inside a container name them by the container's. Compared as they are, our own eight
workers would count as foreign GPU processes (every window INVALID) and the zombie sweep's GPU
check would match nothing. :func:`read_pid_view` says how to translate: not at all in the host's
namespace; through ``NSpid`` in ``/proc/<pid>/status`` where this /proc is an ancestor
namespace's (``NSpid`` lists a process's pid in the namespace of the /proc it is read from
first, then in each nested namespace down to its own; proc(5)); and not at all where the
container mounted its own /proc, which shows no host pid: then callers turn the GPU-process
bound off and say so. gVisor's /proc has a pid namespace link but no ``NSpid`` line at all
(google/gvisor pkg/sentry/fsimpl/proc/task_files.go, ``statusData.Generate``); there the pids
NVML names are taken as ours only where each one is a process here that holds an NVIDIA device
open (``/proc/<pid>/fd`` links to ``/dev/nvidia*``), which is what a CUDA process does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["INIT_PID_NS_INODE", "MAPPED", "SAME", "UNMAPPABLE", "PidView", "read_pid_view"]

# The initial PID namespace's inode (PROC_PID_INIT_INO, include/linux/proc_ns.h: 0xEFFFFFFC,
# fixed since Linux 3.8): /proc/self/ns/pid points at it only outside every container.
INIT_PID_NS_INODE = 0xEFFFFFFC

SAME, MAPPED, UNMAPPABLE = "same", "mapped", "unmappable"


@dataclass(frozen=True)
class PidView:
    """How NVML's (host) pids relate to the pids this process sees."""

    mode: str  # SAME, MAPPED or UNMAPPABLE
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


def read_pid_view(proc_root: Path = Path("/proc"), nvml_pids: Iterable[int] = ()) -> PidView:
    """How to read NVML's pids here (see the module docstring); ``nvml_pids``, the pids NVML
    reported, decide where /proc has no ``NSpid`` line to map them with."""
    try:
        inode = os.stat(proc_root / "self" / "ns" / "pid").st_ino
    except OSError:  # no /proc of this kind (a recorded /proc tree in the tests): as before
        return PidView(SAME)
    if inode == INIT_PID_NS_INODE:
        return PidView(SAME)
    own_nspid = _nspid(proc_root / "self" / "status")
    if not own_nspid:
        reported = sorted(set(nvml_pids))
        if reported and all(_holds_nvidia_device(proc_root, pid) for pid in reported):
            return PidView(SAME, note=(
                f"no NSpid in {proc_root}/self/status (a sandbox such as gVisor): each of the {len(reported)} "
                "pid(s) NVML reports is a process here holding an NVIDIA device, so NVML's pids are ours"))
        return PidView(UNMAPPABLE, note=(
            f"no NSpid in {proc_root}/self/status (a sandbox such as gVisor) and NVML's pids "
            f"{reported[:8]} are not all processes here holding an NVIDIA device: NVML's process list "
            "cannot be matched with our processes, so the bound on other GPU processes is off and the "
            "sweep cannot see GPU memory"))
    depth = len(own_nspid) - 1
    if depth < 1:
        return PidView(UNMAPPABLE, note=(
            "this process runs in a PID namespace of its own (a container) whose /proc shows no host "
            "pids, so NVML's process list (host pids) cannot be matched with our processes: the bound "
            "on other GPU processes is off and the sweep cannot see GPU memory; run with the host's "
            "PID namespace (docker --pid=host) to have both"))
    mapping: dict[int, int] = {}
    for status in proc_root.glob("[0-9]*/status"):
        nspid = _nspid(status)
        # Only our own namespace's processes: a sibling container's, seen through the same
        # /proc, has a pid at our depth too, in another namespace (its pid 1 is not ours).
        if len(nspid) > depth and _pid_ns_inode(status.parent) == inode:
            mapping[nspid[0]] = nspid[depth]
    return PidView(MAPPED, mapping, note=(
        f"in a container: NVML's host pids are mapped to ours through NSpid ({len(mapping)} processes)"))
