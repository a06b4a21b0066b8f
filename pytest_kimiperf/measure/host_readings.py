"""Readings of the host for the watch: /proc counters, processes through psutil, GPUs through NVML.

Each reading is a plain value: CPU busy and steal time from ``/proc/stat``, PSI ``some`` totals
from ``/proc/pressure`` where the kernel has them, every process's CPU time (psutil), and per GPU
the SM clock, temperature, power, clock-event (throttle) reasons and other processes. The parsers
are pure and tested on recorded ``/proc`` files and a fake NVML; hostwatch.py turns two
snapshots into a :class:`~pytest_kimiperf.measure.hostwatch.HostReading` and judges it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pytest_kimiperf.config.measure_bounds import CLOCK_EVENT_REASON_BITS
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.server.gpu import nvml_failures

PSI_RESOURCES: tuple[str, ...] = ("cpu", "io", "memory")
TOP_FOREIGN_COUNT = 5
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
    # guest and guest_nice (columns 9-10) are inside user and nice already: not added twice.
    total = sum(totals[:8])
    return CpuCounters(busy_s=busy / ticks_per_s, steal_s=steal / ticks_per_s, cpu_count=cpu_count,
                       total_s=total / ticks_per_s)


def parse_pressure_some_us(text: str) -> int:
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
    for resource in PSI_RESOURCES:
        try:
            psi[resource] = parse_pressure_some_us((root / "pressure" / resource).read_text())
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
    the driver sampled since then (:func:`clock_samples_mhz`)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    under_load = clock_samples_mhz(nvml, handle, since_us) if since_us is not None else []
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


def clock_samples_mhz(nvml: Any, handle: Any, since_us: int) -> list[int]:
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
