"""What else used the host during a measured window, so no verdict is drawn from a disturbed run.

On the 2-core CPU host a run beside other work reported ring-ll 75-137% "better", and
the client's timing self-check cannot see other processes. So :class:`HostWatch` reads the host
around each measured round: **foreign CPU** (the host's busy time from ``/proc/stat`` minus our
own processes' time, as a share of all cores: unlike summing other processes, this also catches
short-lived ones such as compiler jobs that start and exit between two process listings),
**steal** (``/proc/stat``), **PSI** ``some`` totals (``/proc/pressure``) where the kernel has
them, and on GPU hosts through NVML: other processes on the deployment's GPUs, clock-event
(throttle) reasons, SM clock, temperature and power at the window's two ends. The arithmetic is
pure (:func:`compare_snapshots`, and host_readings.py's parsers) and tested on recorded ``/proc``
files and a fake NVML. This module holds the reading of one window and what in it counts as a
disturbance against the deployment's bounds (config.measure_bounds.HostBounds), and the watch;
host_readings.py reads the host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pytest_kimiperf.config.measure_bounds import HostBounds
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.server.gpu import nvml_failures
from pytest_kimiperf.server.gpu_memory import DEVICE_TOLERANCE_MIB
from pytest_kimiperf.server.pid_namespace import read_pid_view
from pytest_kimiperf.measure.host_readings import (
    PSI_RESOURCES,
    TOP_FOREIGN_COUNT,
    ForeignProcess,
    GpuReading,
    HostSnapshot,
    ProcessCpu,
    describe_pid,
    merge_gpu_samples,
    read_host_counters,
    read_processes,
    sample_gpu,
)


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


# Clock events the measured load causes itself. sw_power_cap is the driver holding clocks so the
# board stays inside its power limit (nvml.h, nvmlClocksEventReasonSwPowerCap): a bf16 GEMM or a
# large prefill batch reaches it on any datacenter GPU, every run alike, so it is part of what is
# measured, reported, and a disturbance only where another process shares the GPU. The power
# violation counter is the same event's time: pynvml defines NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
# as NVML_FI_DEV_PERF_POLICY_POWER. Power brake, HW slowdown and thermal events come from the
# board, the PSU or the cooling, not from the load: they stay disturbances.
OWN_LOAD_REASONS = frozenset({"sw_power_cap"})


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
    # "" for this machine; else the node of a multi-node deployment it was read on (node_watch.py).
    node: str = ""

    def disturbances(self, bounds: HostBounds) -> list[str]:
        """One human line per bound this window exceeded; [] when the host was quiet enough."""
        found = self._disturbances(bounds)
        return [f"on node {self.node}, {line}" for line in found] if self.node else found

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
        for resource in PSI_RESOURCES:
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
        found.extend(self._throttled_under_load(bounds))
        for gpu in self.gpus:
            if forbidden := [r for r in gpu.throttle_reasons if r in bounds.forbidden_throttle_reasons
                             and (r not in OWN_LOAD_REASONS or gpu.foreign_processes)]:
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
        """The window's throttled time from NVML's violation counters (host_readings.GpuReading),
        where the bounds forbid that kind of clock event and the load did not cause it itself
        (OWN_LOAD_REASONS), with the window's average power."""
        found = []
        # NVML_PERF_POLICY_POWER counts sw_power_cap time, NVML_PERF_POLICY_THERMAL the thermal
        # slowdowns (pynvml's NVML_FI_DEV_CLOCKS_EVENT_REASON_* aliases of the perf-policy ids).
        kinds = (("power_violation_ms", "the power limit", ("sw_power_cap",)),
                 ("thermal_violation_ms", "temperature", ("sw_thermal_slowdown", "hw_thermal_slowdown")))
        for gpu in self.gpus:
            for field_name, cause, reasons in kinds:
                held_ms = getattr(gpu, field_name)
                blamed = [r for r in reasons if r in bounds.forbidden_throttle_reasons
                          and (r not in OWN_LOAD_REASONS or gpu.foreign_processes)]
                if held_ms and blamed:
                    found.append(f"GPU {gpu.index} clocks held back by {cause} for {held_ms:.0f} ms of the "
                                 f"{self.wall_s:.1f} s window (NVML violation counters{self._load_state(gpu)})")
        return found

    def own_throttling(self) -> list[str]:
        """The clock events the measured load caused itself (OWN_LOAD_REASONS on a GPU no other
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
        """One line for a verdict: ``host busy: ...`` naming every bound exceeded, else ``host quiet: ...``."""
        if found := self.disturbances(bounds):
            return "host busy: " + "; ".join(found)
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
            return cls(**{**data, "psi": psi, "top_foreign": top, "gpus": gpus, "notes": notes, "blind": blind})
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
    top = [ForeignProcess(pid, *describe_process(pid), cpu_s / capacity_s) for cpu_s, pid in foreign[:TOP_FOREIGN_COUNT]]
    busy_s = stop.cpu.busy_s - start.cpu.busy_s
    psi = {
        f"{resource}_some": max(0, stop.psi_some_us[resource] - start.psi_some_us[resource]) / 1e6 / wall_s
        for resource in PSI_RESOURCES
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
    the process running the watch is always ours. NVML reports pids of the host PID namespace:
    in a container ours are mapped to them through NSpid, and where the container's /proc shows
    no host pid the bound on other GPU processes is off, with a note (server/pid_namespace.py).
    GPU values are sampled at the two ends of the window.
    """

    def __init__(
        self,
        *,
        own_pids: Callable[[], Iterable[int]],
        gpu_indices: Sequence[int] = (),
        nvml: Any | None = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
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
        reading = compare_snapshots(self._start, stop, own, describe_pid)
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
