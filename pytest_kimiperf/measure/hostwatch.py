"""What else used the host during a measured window, so no verdict is drawn from a disturbed run.

On the 2-core CPU host a run beside other work reported ring-ll 75-137% "better", and the client's
timing self-check cannot see other processes. So :class:`HostWatch` reads the host at both ends of
each measured round (what it reads, and the bounds: docs/explanation/measurement.md, "The host is
watched"). Foreign CPU is the host's busy time from ``/proc/stat`` less our own processes' time,
not a sum over the other processes: that also catches short-lived ones, such as compiler jobs that
start and exit between two process listings. The arithmetic (:func:`compare_snapshots`, the
parsers) is pure and tested on recorded ``/proc`` files and a fake NVML.

Nodes reached only through a launch template are read by :class:`NodeWatch` through the node agent
(``python -m pytest_kimiperf.node_agent snapshot``): everything on a node that does not carry its
launch's marker is foreign. Each end costs an ssh or srun round trip (tens of ms on a LAN) outside
the measured requests; the agent's own process is foreign load of a few ms, far below any bound.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from pytest_kimiperf.config.deployments import CLOCK_EVENT_REASON_BITS, HostBounds
from pytest_kimiperf.config.nodes import Node
from pytest_kimiperf.measure.cgroup_quota import QuotaWatch, QuotaWindow
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.server.cluster import agent_argv, run_agent
from pytest_kimiperf.server.gpu import nvml_failures
from pytest_kimiperf.server.gpu_memory import DEVICE_TOLERANCE_MIB
from pytest_kimiperf.server.pid_namespace import read_pid_view
from pytest_kimiperf.server.zombies import boot_id

# Readings of the host: /proc counters, processes through psutil, GPUs through NVML.
_PSI_RESOURCES: tuple[str, ...] = ("cpu", "io", "memory")
_TOP_FOREIGN_COUNT = 5
# Enough of a command line to recognise it in a report without letting one process fill the JSON.
_CMDLINE_CHARS = 240


@dataclass(frozen=True)
class ForeignProcess:
    """A process outside the measurement and its share of host CPU capacity during the window."""

    pid: int
    name: str
    cmdline: str
    cpu_share: float


@dataclass(frozen=True)
class GpuReading:
    """One watched GPU over the window: lowest SM clock, highest temperature and power seen."""

    index: int
    sm_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    throttle_reasons: tuple[str, ...]
    foreign_processes: tuple[tuple[int, int], ...]  # (pid, used_memory_bytes)
    # NVML's cumulative counters: in a sample, totals since the driver loaded; in a window's
    # reading (merge_gpu_samples), what accrued between its first and last sample. Reasons are
    # instantaneous and the window's ends are idle moments; these see the load in between.
    power_violation_ms: float | None = None  # clocks held back by the power limit
    thermal_violation_ms: float | None = None  # clocks held back by temperature
    energy_j: float | None = None
    # The median SM clock of the driver's own samples inside the window (nvmlDeviceGetSamples),
    # where the two ends' readings see only idle moments; None where not asked or not kept.
    sm_clock_under_load_mhz: int | None = None
    # The PCIe link: current generation and width (nvmlDeviceGetCurrPcieLinkGeneration/Width; in
    # a window's reading the highest seen, as an idle GPU trains its link down to save power),
    # and the most the GPU and its slot allow (nvmlDeviceGetMaxPcieLinkGeneration/Width). A TP=8
    # box whose link trained to x8 or a lower generation is another machine.
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    # Device-level accounting (nvmlDeviceGetMemoryInfo.used, MiB), which no container hides: in a
    # sample, used and the sum NVML lists per process (None where one says "not available");
    # in a window's reading, how much more was used at its end than at its start beyond what
    # the listed processes gained: memory of a process NVML cannot name here (another
    # container's, under a driver that converts pids: server/pid_namespace.py).
    memory_used_mib: int | None = None
    listed_memory_mib: int | None = None
    unlisted_growth_mib: int | None = None

    def pcie_shortfall(self) -> str | None:
        """``GPU 3's PCIe link ran at Gen4 x8 (Gen5 x16 possible)``; None where it ran at its
        most or NVML did not say."""
        gen, width, most_gen, most_width = self.pcie_gen, self.pcie_width, self.pcie_max_gen, self.pcie_max_width
        if not ((gen is not None and most_gen is not None and gen < most_gen)
                or (width is not None and most_width is not None and width < most_width)):
            return None
        return (f"GPU {self.index}'s PCIe link ran at Gen{self.pcie_gen} x{self.pcie_width} "
                f"(Gen{self.pcie_max_gen} x{self.pcie_max_width} possible)")


# --------------------------------------------------------------------------- /proc and psutil


@dataclass(frozen=True)
class CpuCounters:
    """Host-wide CPU time from the ``cpu`` line of /proc/stat, in seconds since boot."""

    busy_s: float
    steal_s: float
    cpu_count: int
    # Every column of the ``cpu`` line (idle included), which a real kernel advances by
    # ``cpu_count`` seconds a second; None where not read (a node agent's snapshot).
    total_s: float | None = None


def parse_proc_stat(text: str, ticks_per_s: float) -> CpuCounters:
    """Read busy and steal time and the online core count from /proc/stat text."""
    totals: list[int] | None = None
    cpu_count = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name == "cpu":
            totals = [int(v) for v in rest.split()]
        elif name.startswith("cpu") and name[3:].isdigit():
            cpu_count += 1
    if totals is None or len(totals) < 8 or cpu_count == 0:
        raise KimiperfError(f"/proc/stat has no usable cpu lines: {text[:120]!r}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = totals[:8]
    # Guest time is already inside user and nice (kernel account_guest_time), so it is not added;
    # steal is the hypervisor's, reported on its own.
    busy = user + nice + system + irq + softirq
    total = sum(totals[:8])
    return CpuCounters(busy_s=busy / ticks_per_s, steal_s=steal / ticks_per_s, cpu_count=cpu_count,
                       total_s=total / ticks_per_s)


def _parse_pressure_some_us(text: str) -> int:
    """The ``some ... total=`` microseconds from one /proc/pressure file."""
    match = re.search(r"^some .*\btotal=(\d+)", text, re.MULTILINE)
    if match:
        return int(match.group(1))
    raise KimiperfError(f"no 'some ... total=' line in pressure file: {text[:120]!r}")


@dataclass(frozen=True)
class ProcessCpu:
    """One process's CPU time so far; ``children_s`` is that of its children it has reaped."""

    create_time: float
    cpu_s: float
    children_s: float


@dataclass(frozen=True)
class HostSnapshot:
    """The host's counters at one instant: the two ends of a window are compared."""

    t_s: float
    cpu: CpuCounters
    psi_some_us: Mapping[str, int]
    processes: Mapping[int, ProcessCpu]


def read_processes() -> dict[int, ProcessCpu]:
    """CPU time of every process psutil can read; ones that exit or deny access are left out."""
    table: dict[int, ProcessCpu] = {}
    # With attrs, process_iter turns NoSuchProcess/AccessDenied/ZombieProcess into None values.
    for process in psutil.process_iter(["create_time", "cpu_times"]):
        info = process.info
        times = info.get("cpu_times")
        if times is None or info.get("create_time") is None:
            continue
        children_s = getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)
        table[process.pid] = ProcessCpu(info["create_time"], times.user + times.system, children_s)
    return table


def describe_pid(pid: int) -> tuple[str, str]:
    """Name and (shortened) command line of a process, ``("?", "")`` once it is gone."""
    try:
        process = psutil.Process(pid)
        name = process.name()
        cmdline = " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?", ""
    return name, cmdline[:_CMDLINE_CHARS]


def read_host_counters(proc_root: str) -> tuple[CpuCounters, dict[str, int], tuple[str, ...]]:
    """/proc/stat and /proc/pressure under ``proc_root``; notes say which PSI files were missing."""
    root = Path(proc_root)
    ticks_per_s = float(os.sysconf("SC_CLK_TCK"))
    try:
        cpu = parse_proc_stat((root / "stat").read_text(), ticks_per_s)
    except OSError as error:
        raise KimiperfError(f"cannot read the host's CPU counters: {error}") from None
    psi: dict[str, int] = {}
    missing = []
    for resource in _PSI_RESOURCES:
        try:
            psi[resource] = _parse_pressure_some_us((root / "pressure" / resource).read_text())
        except OSError:
            # No file without CONFIG_PSI; EOPNOTSUPP on read when booted with psi=0.
            missing.append(resource)
    notes = (f"no PSI for {', '.join(missing)} under {root / 'pressure'}",) if missing else ()
    return cpu, psi, notes


# --------------------------------------------------------------------------- NVML


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """Names of the bits set in an NVML clock-event (throttle) reason mask, lowest bit first."""
    return tuple(CLOCK_EVENT_REASON_BITS.get(1 << i, f"unknown_0x{1 << i:x}") for i in range(64) if mask >> i & 1)


def _nvml_optional(nvml: Any, getter_name: str, *args: Any) -> Any | None:
    getter = getattr(nvml, getter_name, None)
    if getter is None:
        return None
    try:
        return getter(*args)
    except nvml_failures(nvml):
        return None


def _temperature_c(nvml: Any, handle: Any) -> int | None:
    """The GPU's temperature: nvmlDeviceGetTemperatureV where the bindings and driver have it
    (nvmlDeviceGetTemperature is "DEPRECATED ... will be removed in CUDA 14.0", pynvml 13.615)."""
    sensor = nvml.NVML_TEMPERATURE_GPU
    value = _nvml_optional(nvml, "nvmlDeviceGetTemperatureV", handle, sensor)
    return value if value is not None else _nvml_optional(nvml, "nvmlDeviceGetTemperature", handle, sensor)


def sample_gpu(nvml: Any, index: int, *, since_us: int | None = None) -> GpuReading:
    """Read one GPU now; ``foreign_processes`` holds every compute process (no pid filter yet).

    With ``since_us`` (CPU time in microseconds, the window's start) it also reads the SM clock
    the driver sampled since then (:func:`_clock_samples_mhz`)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    under_load = _clock_samples_mhz(nvml, handle, since_us) if since_us is not None else []
    # nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons (deprecated, "will be
    # removed in CUDA 14.0" per pynvml); older drivers have only the old name, with the same bits.
    mask = _nvml_optional(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask = _nvml_optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    milliwatts = _nvml_optional(nvml, "nvmlDeviceGetPowerUsage", handle)
    processes: dict[int, int] = {}
    listed = _nvml_optional(nvml, "nvmlDeviceGetComputeRunningProcesses", handle)
    for process in listed or []:
        # usedGpuMemory is None where the driver cannot attribute memory (as in gpu.py).
        processes[int(process.pid)] = max(processes.get(int(process.pid), 0), int(process.usedGpuMemory or 0))
    memory = _nvml_optional(nvml, "nvmlDeviceGetMemoryInfo", handle)
    known = listed is not None and all(process.usedGpuMemory is not None for process in listed)
    return GpuReading(
        index=index,
        sm_clock_mhz=_nvml_optional(nvml, "nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM),
        temperature_c=_temperature_c(nvml, handle),
        power_w=None if milliwatts is None else milliwatts / 1000.0,
        throttle_reasons=decode_clock_event_reasons(int(mask or 0)),
        foreign_processes=tuple(sorted(processes.items())),
        power_violation_ms=_violation_ms(nvml, handle, "NVML_PERF_POLICY_POWER"),
        thermal_violation_ms=_violation_ms(nvml, handle, "NVML_PERF_POLICY_THERMAL"),
        energy_j=_energy_j(nvml, handle),
        sm_clock_under_load_mhz=sorted(under_load)[len(under_load) // 2] if under_load else None,
        pcie_gen=_nvml_optional(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        pcie_width=_nvml_optional(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle),
        pcie_max_gen=_nvml_optional(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        pcie_max_width=_nvml_optional(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle),
        memory_used_mib=None if memory is None else int(memory.used) // 2**20,
        listed_memory_mib=sum(processes.values()) // 2**20 if known else None,
    )


def _clock_samples_mhz(nvml: Any, handle: Any, since_us: int) -> list[int]:
    """The SM clock values the driver sampled after ``since_us`` (nvmlDeviceGetSamples with
    NVML_PROCESSOR_CLK_SAMPLES: (value type, [nvmlSample_t(timeStamp us, sampleValue)]); clocks
    are unsigned ints). The driver keeps a short buffer, so a long window gets its latest part;
    [] where the GPU does not keep samples."""
    kind = getattr(nvml, "NVML_PROCESSOR_CLK_SAMPLES", None)
    answer = _nvml_optional(nvml, "nvmlDeviceGetSamples", handle, kind, since_us) if kind is not None else None
    if not answer:
        return []
    _value_type, samples = answer
    return [int(sample.sampleValue.uiVal) for sample in samples if int(sample.timeStamp) > since_us]


# The perf-policy counters as field values (ids 74 and 75, the same in every nvml.h since they
# were added; the newer CLOCKS_EVENT_REASON_*_SLOWDOWN ids moved between headers, 251-253 against
# 269-271, so they are not used). Like nvmlViolationTime_t.violationTime they count nanoseconds.
_VIOLATION_FIELDS = {"NVML_PERF_POLICY_POWER": "NVML_FI_DEV_PERF_POLICY_POWER",
                     "NVML_PERF_POLICY_THERMAL": "NVML_FI_DEV_PERF_POLICY_THERMAL"}


def _violation_field_ns(nvml: Any, handle: Any, policy: str) -> int | None:
    """One counter through nvmlDeviceGetFieldValues (which pynvml names as the replacement of
    nvmlDeviceGetViolationStatus, "will be removed in CUDA 14.0"); None where not answered."""
    field = getattr(nvml, _VIOLATION_FIELDS[policy], None)
    values = _nvml_optional(nvml, "nvmlDeviceGetFieldValues", handle, [field]) if field is not None else None
    if not values or int(values[0].nvmlReturn) != getattr(nvml, "NVML_SUCCESS", 0):
        return None
    return int(values[0].value.ullVal)


def _violation_ms(nvml: Any, handle: Any, policy: str) -> float | None:
    """Total time NVML says the clocks were held back by ``policy``, in ms: the field value, else
    nvmlDeviceGetViolationStatus (nvmlViolationTime_t.violationTime, ns, nvml.h) on a driver
    without it; None where the GPU does not say."""
    if (ns := _violation_field_ns(nvml, handle, policy)) is not None:
        return ns / 1e6
    if not hasattr(nvml, policy):
        return None
    status = _nvml_optional(nvml, "nvmlDeviceGetViolationStatus", handle, getattr(nvml, policy))
    return None if status is None else int(status.violationTime) / 1e6


def _energy_j(nvml: Any, handle: Any) -> float | None:
    """Energy since the driver loaded (nvmlDeviceGetTotalEnergyConsumption, mJ; Volta and later)."""
    millijoules = _nvml_optional(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
    return None if millijoules is None else int(millijoules) / 1000.0


def _accrued(first: float | None, last: float | None) -> float | None:
    """What a cumulative counter gained between two samples; None if either is missing or it went
    back (a driver reload resets it)."""
    return None if first is None or last is None or last < first else last - first


def merge_gpu_samples(samples: Sequence[GpuReading], own_pids: Iterable[int]) -> GpuReading:
    """One GPU over a window from its samples: lowest SM clock, highest temperature and power,
    every reason seen, every process not ours with the most memory it held, and what the
    cumulative counters (throttled time, energy) gained from the first sample to the last."""
    own = set(own_pids)
    sm = [s.sm_clock_mhz for s in samples if s.sm_clock_mhz is not None]
    temperature = [s.temperature_c for s in samples if s.temperature_c is not None]
    power = [s.power_w for s in samples if s.power_w is not None]
    order = {name: bit for bit, name in CLOCK_EVENT_REASON_BITS.items()}
    reasons = sorted({r for s in samples for r in s.throttle_reasons}, key=lambda r: (order.get(r, 1 << 64), r))
    foreign: dict[int, int] = {}
    for pid, used in (item for s in samples for item in s.foreign_processes):
        if pid not in own:
            foreign[pid] = max(foreign.get(pid, 0), used)
    first, last = samples[0], samples[-1]
    return GpuReading(
        index=samples[0].index,
        sm_clock_mhz=min(sm) if sm else None,
        temperature_c=max(temperature) if temperature else None,
        power_w=max(power) if power else None,
        throttle_reasons=tuple(reasons),
        foreign_processes=tuple(sorted(foreign.items())),
        power_violation_ms=_accrued(first.power_violation_ms, last.power_violation_ms),
        thermal_violation_ms=_accrued(first.thermal_violation_ms, last.thermal_violation_ms),
        energy_j=_accrued(first.energy_j, last.energy_j),
        sm_clock_under_load_mhz=last.sm_clock_under_load_mhz,
        pcie_gen=_highest(s.pcie_gen for s in samples), pcie_width=_highest(s.pcie_width for s in samples),
        pcie_max_gen=_highest(s.pcie_max_gen for s in samples),
        pcie_max_width=_highest(s.pcie_max_width for s in samples),
        memory_used_mib=_highest(s.memory_used_mib for s in samples),
        unlisted_growth_mib=_unlisted_growth(first, last),
    )


def _unlisted_growth(first: GpuReading, last: GpuReading) -> int | None:
    """Used memory gained from ``first`` to ``last`` beyond what the listed processes gained;
    None where either sample lacks a figure."""
    used_then, used_now = first.memory_used_mib, last.memory_used_mib
    listed_then, listed_now = first.listed_memory_mib, last.listed_memory_mib
    if used_then is None or used_now is None or listed_then is None or listed_now is None:
        return None
    return (used_now - used_then) - (listed_now - listed_then)


def _highest(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


# One window: two snapshots compared against the deployment's bounds, and the watch that takes them.

def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


# Clock events the measured load causes itself. sw_power_cap is the driver holding clocks so the
# board stays inside its power limit (nvml.h, nvmlClocksEventReasonSwPowerCap): a bf16 GEMM or a
# large prefill batch reaches it on any datacenter GPU, every run alike, so it is part of what is
# measured, reported, and a disturbance only where another process shares the GPU. The power
# violation counter is the same event's time: pynvml defines NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
# as NVML_FI_DEV_PERF_POLICY_POWER. Power brake, HW slowdown and thermal events come from the
# board, the PSU or the cooling, not from the load: they stay disturbances.
_OWN_LOAD_REASONS = frozenset({"sw_power_cap"})


def _blamed(gpu: GpuReading, reasons: Iterable[str], bounds: HostBounds) -> list[str]:
    """The ``reasons`` the bounds forbid that the measured load did not cause itself."""
    return [r for r in reasons if r in bounds.forbidden_throttle_reasons
            and (r not in _OWN_LOAD_REASONS or gpu.foreign_processes)]


@dataclass(frozen=True)
class HostReading:
    """What else used the host during one measured window."""

    wall_s: float
    cpu_count: int
    foreign_cpu_share: float
    steal_share: float
    psi: Mapping[str, float]
    top_foreign: tuple[ForeignProcess, ...]
    gpus: tuple[GpuReading, ...] = ()
    notes: tuple[str, ...] = ()  # what could not be read (no PSI, NVML failed), for the report
    # What the watch could not see at all in this window (a sandbox's /proc/stat that never
    # advances): such a window is neither busy nor quiet, and says so.
    blind: tuple[str, ...] = ()
    # "" for this machine; else the node of a multi-node deployment it was read on (the node watch, below).
    node: str = ""
    # Every CPU quota on the client's and the server's cgroups and what it throttled in the window.
    cpu_quota: tuple[QuotaWindow, ...] = ()

    @classmethod
    def of_quota(cls, windows: Sequence[QuotaWindow]) -> HostReading:
        """A reading of the CPU quota alone: an attached server's run, whose host is not watched
        but whose client's cgroup is."""
        wall_s = max((w.wall_s for w in windows), default=0.0)
        return cls(wall_s=wall_s, cpu_count=0, foreign_cpu_share=0.0, steal_share=0.0, psi={}, top_foreign=(),
                   cpu_quota=tuple(windows))

    def disturbances(self, bounds: HostBounds) -> list[str]:
        """One human line per bound this window exceeded and per CPU quota that throttled it;
        [] when the host was quiet enough."""
        found = [*self._disturbances(bounds), *self.quota_throttling()]
        return [f"on node {self.node}, {line}" for line in found] if self.node else found

    def busy(self, bounds: HostBounds) -> bool:
        """Did other work break a bound (a CPU quota's throttling aside)?"""
        return bool(self._disturbances(bounds))

    def only_gpu_clocks(self, bounds: HostBounds) -> bool:
        """Whether every bound this window broke was a GPU's clocks held back (no other work)."""
        found = self._disturbances(bounds)
        return bool(found) and len(self.gpu_clocks_held(bounds)) == len(found)

    def quota_throttling(self) -> list[str]:
        """One line per CPU quota that throttled the window's processes: any throttling counts,
        since a throttled period stops every process of the cgroup until the next one."""
        return [window.describe() for window in self.cpu_quota if window.throttled()]

    def quota_remarks(self) -> list[str]:
        """The quotas in force that did not throttle the window: part of the measurement's
        conditions, said beside it."""
        return [window.describe() for window in self.cpu_quota if not window.throttled()]

    def _disturbances(self, bounds: HostBounds) -> list[str]:
        found: list[str] = []
        if bounds.max_foreign_cpu_share is not None and self.foreign_cpu_share > bounds.max_foreign_cpu_share:
            named = "".join(f", pid {p.pid} {p.name} ({_pct(p.cpu_share)})" for p in self.top_foreign)
            found.append(
                f"other processes used {_pct(self.foreign_cpu_share)} of the host's CPU "
                f"(bound {_pct(bounds.max_foreign_cpu_share)})" + (f": {named[2:]}" if named else "")
            )
        if bounds.max_steal_share is not None and self.steal_share > bounds.max_steal_share:
            stolen, bound_text = _pct(self.steal_share), _pct(bounds.max_steal_share)
            found.append(f"the hypervisor stole {stolen} of the host's CPU (bound {bound_text})")
        for resource in _PSI_RESOURCES:
            bound, share = getattr(bounds, f"max_psi_{resource}_some"), self.psi.get(f"{resource}_some")
            if bound is not None and share is not None and share > bound:
                found.append(f"some task waited for {resource} {_pct(share)} of the time (PSI, bound {_pct(bound)})")
        on_gpus = sorted((pid, gpu.index, used) for gpu in self.gpus for pid, used in gpu.foreign_processes)
        pids = {pid for pid, _, _ in on_gpus}
        if bounds.max_foreign_gpu_processes is not None and len(pids) > bounds.max_foreign_gpu_processes:
            named = ", ".join(f"pid {pid} on GPU {index} ({used // 2**20} MiB)" for pid, index, used in on_gpus)
            found.append(
                f"{len(pids)} other process(es) held memory on the watched GPUs "
                f"(bound {bounds.max_foreign_gpu_processes}): {named}"
            )
        if bounds.max_foreign_gpu_processes is not None:
            found.extend(f"GPU {gpu.index} used {gpu.unlisted_growth_mib} MiB more at the window's end than at its "
                         "start beyond what the processes NVML lists gained: a process NVML cannot name here (another "
                         "container's) or a leak" for gpu in self.gpus
                         if gpu.unlisted_growth_mib is not None and gpu.unlisted_growth_mib > DEVICE_TOLERANCE_MIB)
        found.extend(self.gpu_clocks_held(bounds))
        return found

    def gpu_clocks_held(self, bounds: HostBounds) -> list[str]:
        """One line per GPU whose clocks something other than the measured load held back."""
        found = self._throttled_under_load(bounds)
        for gpu in self.gpus:
            if forbidden := _blamed(gpu, gpu.throttle_reasons, bounds):
                shown = [f"SM {gpu.sm_clock_mhz} MHz"] if gpu.sm_clock_mhz is not None else []
                shown += [f"{gpu.temperature_c} C"] if gpu.temperature_c is not None else []
                shown += [f"{gpu.power_w:.0f} W"] if gpu.power_w is not None else []
                state = ", ".join(shown) or "no readings"
                found.append(f"GPU {gpu.index} clocks held back by {', '.join(forbidden)} ({state})")
        return found

    def _load_state(self, gpu: GpuReading) -> str:
        power = f", average {gpu.energy_j / self.wall_s:.0f} W" if gpu.energy_j is not None else ""
        if gpu.sm_clock_under_load_mhz is not None:
            power += f", SM clock {gpu.sm_clock_under_load_mhz} MHz under load"
        return power

    def _throttled_under_load(self, bounds: HostBounds) -> list[str]:
        """The window's throttled time from NVML's violation counters, where :func:`_blamed`
        blames that kind of clock event (pynvml aliases NVML_FI_DEV_CLOCKS_EVENT_REASON_* to the
        perf-policy ids), with the window's average power."""
        found = []
        kinds = (("power_violation_ms", "the power limit", ("sw_power_cap",)),
                 ("thermal_violation_ms", "temperature", ("sw_thermal_slowdown", "hw_thermal_slowdown")))
        for gpu in self.gpus:
            for field_name, cause, reasons in kinds:
                held_ms = getattr(gpu, field_name)
                if held_ms and _blamed(gpu, reasons, bounds):
                    found.append(f"GPU {gpu.index} clocks held back by {cause} for {held_ms:.0f} ms of the "
                                 f"{self.wall_s:.1f} s window (NVML violation counters{self._load_state(gpu)})")
        return found

    def own_throttling(self) -> list[str]:
        """The clock events the measured load caused itself (_OWN_LOAD_REASONS on a GPU no other
        process shared): part of the measurement, reported with it, never a disturbance."""
        found = []
        for gpu in self.gpus:
            if gpu.foreign_processes:
                continue
            if gpu.power_violation_ms:
                found.append(f"GPU {gpu.index} ran at its power limit for {gpu.power_violation_ms:.0f} ms of the "
                             f"{self.wall_s:.1f} s window{self._load_state(gpu)}")
            elif "sw_power_cap" in gpu.throttle_reasons:
                found.append(f"GPU {gpu.index} ran at its power limit ({gpu.power_w or 0:.0f} W)")
        return found

    def describe_busy(self, bounds: HostBounds) -> str:
        """One line for a verdict: ``host busy: ...`` naming every bound exceeded and ``CPU
        quota: ...`` every quota that throttled, else ``host quiet: ...``."""
        busy, quota = self._disturbances(bounds), self.quota_throttling()
        if busy or quota:
            where = f"on node {self.node}, " if self.node else ""
            parts = [f"host busy: {where}" + "; ".join(busy)] if busy else []
            return "; ".join(parts + ([f"CPU quota: {where}" + "; ".join(quota)] if quota else []))
        if self.blind:
            return "host unwatched: " + "; ".join(self.blind)
        cpu, steal = _pct(self.foreign_cpu_share), _pct(self.steal_share)
        own = "".join(f"; {line}" for line in self.own_throttling())
        return f"host quiet: other processes used {cpu} of the host's CPU, steal {steal}{own}"

    def to_json(self) -> dict[str, object]:
        """This reading as JSON-ready data (the report's ``host`` entry)."""
        data = asdict(self)
        data["psi"] = dict(self.psi)
        return data

    @classmethod
    def from_json(cls, data: Any) -> HostReading:
        """Read back what :meth:`to_json` wrote; KimiperfError if it is not such data."""
        try:
            gpus = tuple(
                GpuReading(**{**g, "throttle_reasons": tuple(g["throttle_reasons"]),
                              "foreign_processes": tuple((int(p), int(m)) for p, m in g["foreign_processes"])})
                for g in data.get("gpus", ())
            )
            top = tuple(ForeignProcess(**p) for p in data["top_foreign"])
            psi = {str(k): float(v) for k, v in data["psi"].items()}
            notes, blind = tuple(data.get("notes", ())), tuple(data.get("blind", ()))
            quota = tuple(QuotaWindow(**w) for w in data.get("cpu_quota", ()))
            return cls(**{**data, "psi": psi, "top_foreign": top, "gpus": gpus, "notes": notes, "blind": blind,
                          "cpu_quota": quota})
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise KimiperfError(f"not a host reading ({type(error).__name__}: {error}): {data!r:.200}") from None


# --------------------------------------------------------------------------- two snapshots, one reading


def compare_snapshots(
    start: HostSnapshot, stop: HostSnapshot, own_pids: Iterable[int],
    describe_process: Callable[[int], tuple[str, str]] = lambda pid: ("?", ""),
) -> HostReading:
    """What else used the host between two snapshots, given the pids that are the measurement.

    Our processes' time includes that of children they reaped inside the window, so client
    workers that exit before the window ends are not counted as foreign (a reaped child's time
    from before the window is counted too: that errs towards "quiet"). A process is seen only if
    alive at the end; one of ours that exits unreaped counts as foreign.
    """
    wall_s = max(stop.t_s - start.t_s, 1e-9)
    capacity_s = wall_s * stop.cpu.cpu_count
    own = set(own_pids)
    own_s = 0.0
    foreign: list[tuple[float, int]] = []
    for pid, now in stop.processes.items():
        before = start.processes.get(pid)
        if before is None or before.create_time != now.create_time:
            before = ProcessCpu(now.create_time, 0.0, 0.0)  # born inside the window (or a reused pid)
        cpu_s, children_s = max(0.0, now.cpu_s - before.cpu_s), max(0.0, now.children_s - before.children_s)
        if pid in own:
            own_s += cpu_s + children_s
        elif cpu_s > 0:
            foreign.append((cpu_s, pid))
    foreign.sort(reverse=True)
    top = [ForeignProcess(pid, *describe_process(pid), cpu_s / capacity_s) for cpu_s, pid in foreign[:_TOP_FOREIGN_COUNT]]
    busy_s = stop.cpu.busy_s - start.cpu.busy_s
    psi = {
        f"{resource}_some": max(0, stop.psi_some_us[resource] - start.psi_some_us[resource]) / 1e6 / wall_s
        for resource in _PSI_RESOURCES
        if resource in start.psi_some_us and resource in stop.psi_some_us
    }
    return HostReading(
        wall_s=wall_s,
        cpu_count=stop.cpu.cpu_count,
        foreign_cpu_share=max(0.0, busy_s - own_s) / capacity_s,
        steal_share=max(0.0, stop.cpu.steal_s - start.cpu.steal_s) / capacity_s,
        psi=psi,
        top_foreign=tuple(top),
        blind=_cpu_blindness(start, stop, wall_s, psi),
    )


# Below this a window is too short for one clock tick (CLK_TCK 100) on every core to be expected.
_MIN_BLIND_CHECK_S = 0.05


def _cpu_blindness(start: HostSnapshot, stop: HostSnapshot, wall_s: float, psi: Mapping[str, float]) -> tuple[str, ...]:
    """Why this window's CPU figures mean nothing: /proc/stat's ``cpu`` line (idle included)
    did not advance, as in gVisor, which exports zeros there (google/gvisor#1336, #9967)."""
    first, last = start.cpu.total_s, stop.cpu.total_s
    if first is None or last is None or wall_s < _MIN_BLIND_CHECK_S or last > first:
        return ()
    psi_text = "" if psi else "; no PSI either"
    return (f"/proc/stat's cpu counters did not advance in {wall_s:.1f} s (a sandbox such as gVisor exports "
            f"zeros): other processes' CPU and steal were not measured{psi_text}",)


# --------------------------------------------------------------------------- the watch


class HostWatch:
    """Watches the host during one measured window.

    ``own_pids`` is asked at start and at stop (children come and go) and the union is ours;
    the process running the watch is always ours; ``client_pids`` says which of them are the
    client (by default this process), the rest being the server, when a CPU quota is named.
    NVML reports pids of the host PID namespace: in a container ours are mapped to them through
    NSpid, and where the container's /proc shows no host pid the bound on other GPU processes is
    off, with a note (server/pid_namespace.py). GPU values are sampled at the two ends of the
    window.
    """

    def __init__(
        self,
        *,
        own_pids: Callable[[], Iterable[int]],
        gpu_indices: Sequence[int] = (),
        nvml: Any | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        client_pids: Callable[[], Iterable[int]] | None = None,
    ) -> None:
        self._own_pids = own_pids
        self._gpu_indices = tuple(gpu_indices)
        self._nvml = nvml if self._gpu_indices else None
        self._proc_root = proc_root
        self._clock = clock
        self._start: HostSnapshot | None = None
        self._own_at_start: set[int] = set()
        self._gpu_samples: dict[int, list[GpuReading]] | None = None
        self._started_us = 0
        self._notes: list[str] = []
        # Which of ours are the client, for naming a quota's cgroup (by default this process).
        self._quota = QuotaWatch(own_pids, client=client_pids or (lambda: [os.getpid()]), proc_root=proc_root)

    def _sample_gpus(self, since_us: int | None = None) -> None:
        assert self._gpu_samples is not None
        for index in self._gpu_indices:
            try:
                sample = sample_gpu(self._nvml, index, since_us=since_us)
            except nvml_failures(self._nvml) as error:
                self._notes.append(f"NVML: GPU {index} not read: {error}")
            else:
                self._gpu_samples.setdefault(index, []).append(sample)

    def _snapshot(self, processes: Mapping[int, ProcessCpu]) -> HostSnapshot:
        cpu, psi, notes = read_host_counters(self._proc_root)
        self._notes.extend(notes)
        return HostSnapshot(t_s=self._clock(), cpu=cpu, psi_some_us=psi, processes=processes)

    def start(self) -> None:
        """Take the window's first snapshot; call right before the measured round begins."""
        self._notes, self._gpu_samples = [], None
        if self._nvml is not None:
            try:
                # nvmlInit/nvmlShutdown are reference counted (nvml.h), so this nests safely
                # inside a caller that already holds NVML.
                self._nvml.nvmlInit()
                self._gpu_samples = {}
                # NVML stamps its own samples in CPU microseconds (nvmlSample_t.timeStamp).
                self._started_us = int(time.time() * 1e6)
                self._sample_gpus()
            except nvml_failures(self._nvml) as error:
                self._notes.append(f"NVML: {error}")
        self._own_at_start = set(self._own_pids())
        self._quota.start()
        # The process table is read outside the /proc/stat reads at both ends, so our own time
        # spans the host window: this timing error leans towards "quiet", by a few ms.
        self._start = self._snapshot(read_processes())

    def stop(self) -> HostReading:
        """Take the last snapshot and say what else used the host since :meth:`start`."""
        if self._start is None:
            raise KimiperfError("HostWatch.stop() called before start()")
        stop = self._snapshot({})
        own = self._own_at_start | set(self._own_pids()) | {os.getpid()}
        stop = replace(stop, processes=read_processes())  # after /proc/stat: see start()
        reading = replace(compare_snapshots(self._start, stop, own, describe_pid), cpu_quota=self._quota.stop())
        self._start = None
        gpus: tuple[GpuReading, ...] = ()
        if self._gpu_samples is not None and self._nvml is not None:
            try:
                self._sample_gpus(since_us=self._started_us)
            finally:
                self._nvml.nvmlShutdown()
            samples = self._gpu_samples
            # NVML names GPU processes by host pid; in a container ours have other pids here.
            reported = {pid for runs in samples.values() for sample in runs for pid, _ in sample.foreign_processes}
            view = read_pid_view(Path(self._proc_root), nvml_pids=reported)
            gpus = tuple(merge_gpu_samples(samples[i], view.host_pids(own)) for i in self._gpu_indices if i in samples)
            if unnamed := view.unnamed(reported):  # no bound on what cannot be told apart from ours
                gpus = tuple(replace(gpu, foreign_processes=tuple(p for p in gpu.foreign_processes if p[0] not in unnamed))
                             for gpu in gpus)
            if view.note:
                self._notes.append(view.note)
        return replace(reading, gpus=gpus, notes=tuple(dict.fromkeys(self._notes)))


# The watch on remote nodes, through the node agent's snapshots.
_AgentRun = Callable[[Node, list[str]], str]


@dataclass(frozen=True)
class NodeSnapshot:
    """One end of a window on a node: its counters, its launch's pids, the agent's notes, its boot."""

    snapshot: HostSnapshot
    own: frozenset[int]
    notes: tuple[str, ...]
    boot_id: str


def parse_snapshot(text: str, *, node: str) -> NodeSnapshot:
    """The agent's snapshot JSON; KimiperfError naming the node if it is not that."""
    try:
        data: Mapping[str, Any] = json.loads(text)
        snap = HostSnapshot(
            t_s=float(data["t_s"]),
            cpu=CpuCounters(float(data["busy_s"]), float(data["steal_s"]), int(data["cpu_count"])),
            psi_some_us={str(k): int(v) for k, v in data["psi_some_us"].items()},
            processes={int(pid): ProcessCpu(*map(float, row)) for pid, row in data["processes"].items()})
        return NodeSnapshot(snap, frozenset(int(p) for p in data["own"]), tuple(str(n) for n in data.get("notes", ())),
                            str(data.get("boot_id", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise KimiperfError(f"node {node}: the node agent's snapshot is not its JSON ({exc}): {text[:200]!r}") from None


class NodeWatch:
    """Watches the remote nodes of a deployment during one measured window.

    A node whose kernel boot id is this machine's is this machine (a loopback node behind a
    template, as in the CPU twin's test): the local watch reads it, with that launch's processes
    (``here_pids``) among its own, and the node is said to be so instead of being read twice.
    """

    def __init__(self, nodes: Sequence[tuple[Node, str]], *, run: _AgentRun = run_agent,
                 python: str = sys.executable, here_boot_id: str | None = None) -> None:
        self._nodes = tuple(nodes)
        self._run = run
        self._python = python
        self._here = here_boot_id if here_boot_id is not None else boot_id()
        self._start: dict[str, NodeSnapshot] = {}
        self.here: list[str] = []  # nodes found to be this machine
        # Their launches' processes: ours for the local watch (a node reached by `ssh localhost`
        # runs under sshd, not under pytest, so only its marker says it is ours).
        self.here_pids: set[int] = set()

    def _snapshot(self, node: Node, launch_id: str) -> NodeSnapshot:
        text = self._run(node, agent_argv(node, self._python, "snapshot", "--launch-id", launch_id))
        return parse_snapshot(text, node=node.name)

    def start(self) -> None:
        """Take every node's first snapshot."""
        self._start, self.here, self.here_pids = {}, [], set()
        for node, launch_id in self._nodes:
            first = self._snapshot(node, launch_id)
            if first.boot_id and first.boot_id == self._here:
                self.here.append(node.name)
                self.here_pids |= first.own
            else:
                self._start[node.name] = first

    def stop(self) -> list[HostReading]:
        """One reading per node not on this machine: what else used it since :meth:`start`."""
        readings = []
        for node, launch_id in self._nodes:
            if node.name not in self._start:
                continue
            first, last = self._start[node.name], self._snapshot(node, launch_id)
            reading = compare_snapshots(first.snapshot, last.snapshot, first.own | last.own)
            readings.append(replace(reading, notes=last.notes, node=node.name))
        return readings
