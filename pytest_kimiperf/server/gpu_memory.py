"""Who holds GPU memory, how much each GPU uses, and waiting until a stopped server's is free.

Two views that fail in different places. Per process (:func:`gpu_holders`), NVML's list read
through ``pid_namespace`` names nothing where the driver's pids cannot be matched, and leaves other
containers' processes out under a driver that converts pids. Per device
(:func:`gpu_memory_used_mib`) no container or driver hides anything, so between boots each GPU
must be back to its figure before the first boot (:func:`unexplained_memory`).

A process NVML names without a figure (``usedGpuMemory`` is NVML_VALUE_NOT_AVAILABLE: nvml.h says
WDDM always reports it, and some containers do) holds an unknown amount, None here, never 0: a 0
would hide it from the device-level accounting that can tell.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server.gpu import _MIB, _run_smi, ask_driver
from pytest_kimiperf.server.nvidia_smi import parse_compute_apps_by_gpu, parse_memory_used_csv, parse_query_gpu_csv
from pytest_kimiperf.server.pid_namespace import read_pid_view

# What a GPU may use above its figure before the first boot once our server is gone: the
# driver's own bookkeeping moves by a few MiB; a CUDA context left behind is ~500 MiB.
DEVICE_TOLERANCE_MIB = 256
# Where no process could be named and no figure before the boot is known, memory is taken as
# freed once every GPU's figure held still this many polls in a row.
SETTLED_POLLS = 3


@dataclass(frozen=True)
class GpuHolder:
    """One process's memory on one GPU, as the driver lists it."""

    gpu: int  # NVML index
    pid: int | None  # the pid this process sees; None where NVML's pid names no process here
    nvml_pid: int  # the pid as the driver reported it
    mib: int | None  # None: NVML named the process but gave no figure for its memory
    name: str = "?"

    def describe(self) -> str:
        """``pid 4242 python3 (90000 MiB)``, or the driver's pid where it names no process here."""
        who = f"pid {self.pid} {self.name}" if self.pid is not None else f"NVML pid {self.nvml_pid} (no process here)"
        return f"{who} ({describe_mib(self.mib)})"


def describe_mib(mib: int | None) -> str:
    """``90000 MiB``, or what a holder without a figure holds."""
    return f"{mib} MiB" if mib is not None else "memory not reported by NVML"


@dataclass(frozen=True)
class GpuHolders:
    """Who holds memory on each GPU, and how NVML's pids were read here (pid_namespace.py)."""

    holders: tuple[GpuHolder, ...] = ()
    note: str | None = None  # the pid view's note, where NVML's pids needed reading

    def on(self, gpu: int) -> list[GpuHolder]:
        """The holders of ``gpu``, largest first."""
        return sorted((h for h in self.holders if h.gpu == gpu), key=lambda h: (h.mib is None, -(h.mib or 0), h.nvml_pid))

    def known_mib_on(self, gpu: int) -> int:
        """The MiB the holders of ``gpu`` are known to hold (those without a figure add nothing)."""
        return sum(h.mib for h in self.holders if h.gpu == gpu and h.mib is not None)

    def by_pid(self) -> dict[int, int | None]:
        """MiB each process named here holds, summed over GPUs; None where NVML gave no figure."""
        parts: dict[int, list[int | None]] = {}
        for holder in self.holders:
            if holder.pid is not None:
                parts.setdefault(holder.pid, []).append(holder.mib)
        return {pid: None if None in mibs else sum(m for m in mibs if m is not None) for pid, mibs in parts.items()}

    @property
    def unnamed(self) -> bool:
        """Whether NVML listed processes that cannot be named here (another pid namespace)."""
        return any(h.pid is None for h in self.holders)


# NVML_VALUE_NOT_AVAILABLE as an unsigned long long (nvml.h: -1): nvidia-ml-py turns it into None
# in nvmlDeviceGetComputeRunningProcesses; a binding that passes the raw value on says the same.
_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1


def _nvml_holders(pynvml: Any) -> list[tuple[int, int, int | None]]:
    found: list[tuple[int, int, int | None]] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = process.usedGpuMemory
            unknown = used is None or used == _NVML_VALUE_NOT_AVAILABLE
            found.append((index, int(process.pid), None if unknown else int(used) // _MIB))
    return found


def _process_name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def gpu_holders(timeout_s: float = 10.0) -> GpuHolders:
    """Each GPU's processes and the MiB each holds, by the pids this process sees (``pid=None``
    where one cannot be named, the view's note saying why); empty without GPUs. A host whose
    nvidia-smi answers nothing raises ServerError: it must not read as "no process holds memory"."""

    def from_smi(smi: str) -> list[tuple[int, int, int | None]]:
        fields = ("gpu_uuid", "pid", "used_memory")
        apps = _run_smi(smi, [f"--query-compute-apps={','.join(fields)}", "--format=csv,noheader,nounits"],
                        timeout_s)
        indices = {gpu.uuid: gpu.index for gpu in parse_query_gpu_csv(
            _run_smi(smi, ["--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                     timeout_s), ("index", "uuid", "name", "memory.total", "driver_version"))}
        return [(indices.get(uuid, -1), pid, mib) for uuid, pid, mib in parse_compute_apps_by_gpu(apps, fields)]

    answer = ask_driver(_nvml_holders, from_smi)
    if answer.value is None:
        if answer.smi_on_path:
            raise ServerError(
                f"cannot read GPU memory per process: {answer.smi_note}; {'; '.join(answer.nvml_notes)}".rstrip("; ")
            )
        return GpuHolders()
    view = read_pid_view(nvml_pids={pid for _gpu, pid, _mib in answer.value})
    holders = []
    for gpu, nvml_pid, mib in answer.value:
        local = view.local(nvml_pid)
        holders.append(GpuHolder(gpu, local, nvml_pid, mib, _process_name(local) if local is not None else "?"))
    return GpuHolders(tuple(holders), note=view.note if any(h.pid is None for h in holders) else None)


def gpu_memory_by_pid(timeout_s: float = 10.0) -> dict[int, int | None]:
    """:meth:`GpuHolders.by_pid` of :func:`gpu_holders`: a process that cannot be named here is
    left out (the sweep's GPU check then sees nothing, said in the view's note)."""
    return gpu_holders(timeout_s).by_pid()


def _nvml_memory_used(pynvml: Any) -> dict[int, int]:
    return {index: int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used) // _MIB
            for index in range(pynvml.nvmlDeviceGetCount())}


def gpu_memory_used_mib(timeout_s: float = 10.0) -> dict[int, int]:
    """MiB used on each GPU by NVML index; {} without GPUs, and a GPU that does not say (a
    unified-memory board prints ``[N/A]``) is left out."""

    def from_smi(smi: str) -> dict[int, int]:
        text = _run_smi(smi, ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], timeout_s)
        return {index: mib for index, mib in parse_memory_used_csv(text).items() if mib is not None}

    return ask_driver(_nvml_memory_used, from_smi).value or {}


@dataclass(frozen=True)
class DeviceAccount:
    """One GPU: used now against its figure before the first boot and what our processes hold."""

    index: int
    before_mib: int
    now_mib: int
    ours_mib: int = 0

    @property
    def unexplained_mib(self) -> int:
        """Memory neither the figure before the boot nor our processes account for."""
        return self.now_mib - self.before_mib - self.ours_mib

    def describe(self) -> str:
        """``GPU 3: 2560 MiB used, 512 MiB before the first boot, ours 0 MiB: 2048 MiB unexplained``."""
        return (f"GPU {self.index}: {self.now_mib} MiB used, {self.before_mib} MiB before the first boot, "
                f"ours {self.ours_mib} MiB: {self.unexplained_mib} MiB unexplained")


def unexplained_memory(before: Mapping[int, int], now: Mapping[int, int], ours: Mapping[int, int] | None = None,
                       tolerance_mib: int = DEVICE_TOLERANCE_MIB) -> list[DeviceAccount]:
    """The GPUs using more than their figure before the boot plus ours (per GPU) plus the
    tolerance; a GPU missing from either reading is not judged."""
    accounts = [DeviceAccount(index, before[index], now[index], (ours or {}).get(index, 0))
                for index in sorted(before.keys() & now.keys())]
    return [account for account in accounts if account.unexplained_mib > tolerance_mib]


def wait_gpu_memory_freed(
    pids: Iterable[int],
    *,
    deadline_s: float,
    poll_s: float = 1.0,
    probe: Callable[[], Mapping[int, int | None]] = gpu_memory_by_pid,
    before_mib: Mapping[int, int] | None = None,
    devices: Callable[[], Mapping[int, int]] = gpu_memory_used_mib,
) -> None:
    """Wait up to ``deadline_s`` seconds until none of ``pids`` holds GPU memory and, given
    ``before_mib`` (each GPU's figure before the first boot), every GPU is back to it; else
    ServerError naming what still holds memory.

    Ended processes keep their memory until the driver tears their CUDA context down. Where
    nothing of ``pids`` was ever named (pids that cannot be matched) and no figure before the
    boot is known, it waits for each GPU's figure to hold still :data:`SETTLED_POLLS` polls.
    """
    watched = frozenset(int(pid) for pid in pids)
    if deadline_s < 0 or poll_s <= 0:
        raise ValueError(f"deadline_s must be >= 0 and poll_s > 0, got deadline_s={deadline_s}, poll_s={poll_s}")
    end = time.monotonic() + deadline_s
    named_once = False
    history: list[Mapping[int, int]] = []
    while True:
        held = {pid: mib for pid, mib in probe().items() if pid in watched} if watched else {}
        named_once = named_once or bool(held)
        blind = bool(watched) and not named_once and before_mib is None
        now = devices() if before_mib is not None or blind else {}
        history.append(now)
        over = unexplained_memory(before_mib, now) if before_mib is not None else []
        settled = not blind or len(history) >= SETTLED_POLLS and all(h == now for h in history[-SETTLED_POLLS:])
        if not held and not over and settled:
            return
        left = end - time.monotonic()
        if left <= 0:
            raise ServerError(_still_held(deadline_s, held, over, blind))
        time.sleep(min(poll_s, left))


def _still_held(deadline_s: float, held: Mapping[int, int | None], over: list[DeviceAccount], blind: bool) -> str:
    holders = [f"pid {pid} ({describe_mib(mib)})" for pid, mib in sorted(held.items())] + [a.describe() for a in over]
    if blind and not holders:
        holders = ["no process could be named here and the GPUs' used memory kept changing"]
    return (f"GPU memory still held {deadline_s:g} s after stopping the server: {', '.join(holders)}. "
            "Check `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` (and "
            "`nvidia-smi --query-gpu=index,memory.used --format=csv` for memory no process list shows: another "
            "container's process, or a leak) and end those processes before the next run.")


def settle_before_boot(before_mib: Mapping[int, int] | None, *, deadline_s: float = 120.0,
                       announce: Callable[[str], None] = lambda line: None) -> dict[int, int]:
    """The figure to hold every later boot to: this reading on the first boot (``before_mib``
    None); on a later one, wait until each GPU is back to ``before_mib`` (ServerError naming the
    GPUs and what is unexplained at the deadline) and keep it. A wait is said with its length."""
    if before_mib is None:
        return gpu_memory_used_mib()
    started = time.monotonic()
    wait_gpu_memory_freed((), deadline_s=deadline_s, before_mib=before_mib)
    if (waited_s := time.monotonic() - started) >= 1.0:
        announce(f"GPU memory back to its figure before the first boot after {waited_s:.1f} s")
    return dict(before_mib)
