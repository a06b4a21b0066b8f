"""The simulated GPU host's one state: its GPUs, and the real processes that hold their memory.

Everything the fake NVML (``nvml/pynvml.py``) and the fake ``nvidia-smi`` (``bin/nvidia-smi``)
answer comes from here, read afresh at every call, so both tools always agree with each other
and with what the test's processes are doing. Standard library only: the stub server, its
children and the fake tools import it by path.

The state lives in a directory (``$SIMGPU_STATE``):

* ``host.json``: the GPUs as the driver would describe them (name, UUID, memory, PCIe link,
  clocks, temperature, power, clock-event reasons) and how the driver names processes
  (``pid_mode``); written once by the test (:func:`write_host`).
* ``holders/<pid>.json``: one per process holding GPU memory (:func:`hold`): how many MiB on which
  GPU, and the process's start time in clock ticks, so a reused pid is never taken for it. A
  holder's memory is released when its process ends (a zombie has ended: the driver frees a
  context when the process exits, not when it is reaped), or ``linger_s`` seconds later, when the
  test wants memory that is slow to come back (the driver still tearing a context down); while it
  lingers it is used on the device but listed for no process, as on a real GPU.
* ``busy/<pid>``: a process serving a request (:func:`busy`); while one exists every GPU that
  some live process holds memory on is under load, and its load clocks, power, temperature,
  PCIe link and clock-event reasons apply. ``busy.log`` keeps each busy interval, from which the
  cumulative counters (energy, throttled time) and the driver's clock samples are derived.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_ENV = "SIMGPU_STATE"
# A driver that reports the host's pids to a process in a container (pid_mode "foreign"): the
# pids NVML names are none of this namespace's. Above Linux's largest pid_max (2**22).
FOREIGN_PID_OFFSET = 1 << 22
# The bits of nvmlClocksEventReason* (nvml.h), as pytest_kimiperf.config.deployments reads them.
REASON_BITS = {
    "gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
    "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100,
}
_THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")


@dataclass
class Gpu:
    """One simulated GPU: what the driver reports of it, idle and under load."""

    index: int
    name: str
    uuid: str
    memory_total_mib: int
    serial: str = "[N/A]"
    pci_bus_id: str = ""
    reserved_mib: int = 0  # used with no process: the driver's own
    pcie_max_gen: int = 5
    pcie_max_width: int = 16
    pcie_idle_gen: int = 1  # an idle GPU trains its link down to save power
    pcie_load_gen: int | None = None  # None: the max
    pcie_load_width: int | None = None
    link_idle_after_s: float = 2.0  # how long after the last load the link stays trained up
    sm_clock_idle_mhz: int = 180
    sm_clock_load_mhz: int = 2430
    temperature_idle_c: int = 32
    temperature_load_c: int = 61
    power_idle_w: float = 35.0
    power_load_w: float = 540.0
    # Clock-event reasons while under load (e.g. hw_thermal_slowdown), and at every moment
    # (a power brake the PSU holds asserted); gpu_idle is added when idle.
    reasons_under_load: tuple[str, ...] = ()
    reasons_always: tuple[str, ...] = ()
    mig_mode: str = "Disabled"
    compute_capability: tuple[int, int] = (12, 0)
    persistence_mode: bool = True
    power_limit_w: float = 600.0

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["reasons_under_load"] = list(self.reasons_under_load)
        data["reasons_always"] = list(self.reasons_always)
        data["compute_capability"] = list(self.compute_capability)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Gpu:
        values = dict(data)
        for key in ("reasons_under_load", "reasons_always"):
            values[key] = tuple(values.get(key, ()))
        values["compute_capability"] = tuple(values.get("compute_capability", (12, 0)))
        return cls(**values)


@dataclass
class Host:
    """The simulated host: its GPUs, the driver and how it names processes."""

    gpus: list[Gpu]
    driver_version: str = "580.95.05"
    cuda_version: str = "13.0"
    # "local": NVML names processes by the pids this namespace sees; "foreign": by pids of
    # another namespace (a driver reporting host pids to a container), none of which is here.
    pid_mode: str = "local"
    # The link code between every two GPUs in `nvidia-smi topo -m` (SYS: PCIe only; NV18: NVLink),
    # or the name of a recorded topology under tests/data/gpu to print as it was recorded.
    link: str = "SYS"
    topology_recording: str | None = None
    # "reported": NVML gives each process's memory; "not-available": it names the processes but
    # gives usedGpuMemory = NVML_VALUE_NOT_AVAILABLE (nvml.h: always so under WDDM; some containers
    # too), which nvidia-smi prints as [N/A]. Used memory per GPU is reported either way.
    process_memory: str = "reported"
    created_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "gpus"}, "gpus": [g.to_json() for g in self.gpus]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Host:
        return cls(**{**data, "gpus": [Gpu.from_json(g) for g in data["gpus"]]})


# The production hardware class, as recorded (tests/data/gpu/query_gpu_8x_rtx_pro_6000.csv and
# topo_8x_rtx_pro_6000_sys.txt): 8x RTX PRO 6000 Blackwell Server Edition, 97887 MiB each, PCIe
# Gen5 x16, no NVLink. The recording's UUIDs; its MIG mode was Enabled, a serving host's is not.
RTX_PRO_6000_UUIDS = (
    "GPU-8b89b58e-b427-108d-ac50-06138d78fe78", "GPU-03a041b7-8abf-360a-d1a2-dfd70188cd5f",
    "GPU-ba09367f-dd50-32ca-e988-7ff66bece885", "GPU-30512c46-708b-f374-5698-ee24be6cd626",
    "GPU-4c395b7a-a7e6-d90f-1ced-d96e8dd68288", "GPU-04dc48d7-7048-aef5-ad36-f5db716e7668",
    "GPU-f4f5db98-143f-0a8d-47ce-956fab39a736", "GPU-f4c61521-240a-da09-2787-e576034e197e",
)


def rtx_pro_6000_host(count: int = 8, **host: Any) -> Host:
    """The recorded 8x RTX PRO 6000 Blackwell Server Edition host (the first ``count`` GPUs)."""
    gpus = [Gpu(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", uuid=RTX_PRO_6000_UUIDS[i],
                memory_total_mib=97887, pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0", reserved_mib=0)
            for i in range(count)]
    recording = "topo_8x_rtx_pro_6000_sys.txt" if count == 8 and host.get("link", "SYS") == "SYS" else None
    return Host(gpus=gpus, driver_version="610.43.02", cuda_version="13.1", topology_recording=recording, **host)


def h100_host(count: int = 8, **host: Any) -> Host:
    """The recorded 8x H100 80GB HBM3 (tests/data/gpu/query_gpu_8x_h100_name_memory.csv), NVLink."""
    gpus = [Gpu(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{i:08x}-5a1e-4d00-b100-0000000000{i:02d}",
                memory_total_mib=81559, pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                compute_capability=(9, 0), power_load_w=690.0, power_limit_w=700.0)
            for i in range(count)]
    return Host(gpus=gpus, link="NV18", **{"driver_version": "570.133.20", "cuda_version": "12.8", **host})


# --------------------------------------------------------------------------- the state directory


def state_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """The state directory: the one given, else ``$SIMGPU_STATE``."""
    if directory is not None:
        return Path(directory)
    value = os.environ.get(STATE_ENV)
    if not value:
        raise RuntimeError(f"the simulated GPU has no state: ${STATE_ENV} is not set")
    return Path(value)


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_host(host: Host, directory: str | os.PathLike[str] | None = None) -> Path:
    """Write (or replace) the host's description; returns the state directory."""
    where = state_dir(directory)
    _write_json(where / "host.json", host.to_json())
    (where / "holders").mkdir(exist_ok=True)
    (where / "busy").mkdir(exist_ok=True)
    return where


def read_host(directory: str | os.PathLike[str] | None = None) -> Host:
    """The host as the test described it."""
    where = state_dir(directory)
    data = _read_json(where / "host.json")
    if data is None:
        raise RuntimeError(f"the simulated GPU's state {where} has no readable host.json")
    return Host.from_json(data)


# --------------------------------------------------------------------------- processes


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (``/proc/PID/stat`` field 22); None when it has ended (a zombie too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    if not fields or fields[0] == b"Z":
        return None
    return int(fields[19])


def process_name(pid: int) -> str:
    """What nvidia-smi prints as a process's name: its command (the title setproctitle gave it)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "[Not Found]"
    first = raw.split(b"\0")[0].decode(errors="replace").strip()
    return first.split(" ")[0] if first else "[Not Found]"


def visible_gpus(host: Host, env: Mapping[str, str] | None = None) -> list[int]:
    """The indices of the GPUs a CUDA process sees under CUDA_VISIBLE_DEVICES (CUDA's rules:
    indices or UUID prefixes, the list ends at the first entry that names no GPU)."""
    visible = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [gpu.index for gpu in host.gpus]
    found: list[int] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit() and int(entry) < len(host.gpus):
            index = int(entry)
        else:
            matching = [g.index for g in host.gpus if entry.startswith("GPU-") and g.uuid.startswith(entry)]
            if len(matching) != 1:
                break
            index = matching[0]
        if index in found:
            break
        found.append(index)
    return found


def hold(mib_by_gpu: Mapping[int, int], *, linger_s: float = 0.0, pid: int | None = None,
         directory: str | os.PathLike[str] | None = None) -> None:
    """Say that process ``pid`` (this one by default) holds ``mib_by_gpu`` (MiB by NVML index),
    from now until it ends (and ``linger_s`` after)."""
    pid = os.getpid() if pid is None else pid
    ticks = start_ticks(pid)
    if ticks is None:
        raise RuntimeError(f"pid {pid} is not a running process")
    _write_json(state_dir(directory) / "holders" / f"{pid}.json",
                {"pid": pid, "start_ticks": ticks, "mib": {str(k): int(v) for k, v in mib_by_gpu.items()},
                 "linger_s": float(linger_s)})


@contextlib.contextmanager
def busy(directory: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Mark this process as serving (the GPUs it and its fellows hold are under load) while inside."""
    where = state_dir(directory) / "busy"
    mark = where / f"{os.getpid()}-{threading.get_ident()}"
    started = time.time()
    mark.write_text(str(started), encoding="ascii")
    try:
        yield
    finally:
        ended = time.time()
        with open(where.parent / "busy.log", "a", encoding="ascii") as log:
            log.write(f"{started:.6f} {ended:.6f}\n")
        with contextlib.suppress(FileNotFoundError):
            mark.unlink()


@dataclass(frozen=True)
class Holding:
    """One process's memory on one GPU as the driver would list it."""

    pid: int  # as NVML names it (pid_mode)
    local_pid: int
    gpu: int
    mib: int
    name: str


@dataclass(frozen=True)
class Reading:
    """The host at one moment: who holds what, what is used, and the load so far."""

    host: Host
    holdings: tuple[Holding, ...]
    lingering_mib: Mapping[int, int]  # by GPU: memory of ended processes not yet given back
    under_load: bool
    last_load_end: float | None  # when the last busy interval ended (wall clock)
    busy_s: float  # every busy interval so far, summed
    intervals: tuple[tuple[float, float], ...]

    def used_mib(self, gpu: Gpu) -> int:
        """Memory used on ``gpu``: the driver's own, every holder's and what lingers."""
        held = sum(h.mib for h in self.holdings if h.gpu == gpu.index)
        return gpu.reserved_mib + held + self.lingering_mib.get(gpu.index, 0)

    def processes(self, gpu: Gpu) -> list[Holding]:
        """The processes NVML lists on ``gpu``, by pid."""
        return sorted((h for h in self.holdings if h.gpu == gpu.index), key=lambda h: h.pid)

    def loaded(self, gpu: Gpu) -> bool:
        """Whether ``gpu`` is under load now: someone serves and a live process holds memory on it."""
        return self.under_load and any(h.gpu == gpu.index for h in self.holdings)

    def link(self, gpu: Gpu, now: float) -> tuple[int, int]:
        """The PCIe link's current generation and width: trained up under load and for a while after."""
        warm = self.loaded(gpu) or (self.last_load_end is not None and now - self.last_load_end < gpu.link_idle_after_s
                                    and any(h.gpu == gpu.index for h in self.holdings))
        if not warm:
            return gpu.pcie_idle_gen, gpu.pcie_load_width or gpu.pcie_max_width
        return gpu.pcie_load_gen or gpu.pcie_max_gen, gpu.pcie_load_width or gpu.pcie_max_width

    def reasons(self, gpu: Gpu) -> tuple[str, ...]:
        """The clock-event reasons in force now."""
        found = list(gpu.reasons_always)
        found += list(gpu.reasons_under_load) if self.loaded(gpu) else ["gpu_idle"]
        return tuple(dict.fromkeys(found))

    def reason_mask(self, gpu: Gpu) -> int:
        mask = 0
        for reason in self.reasons(gpu):
            mask |= REASON_BITS[reason]
        return mask

    def load_s(self, gpu: Gpu) -> float:
        """How long the host has served since the driver loaded (every busy interval): the time
        a GPU's load-only counters (throttled time, energy above idle) advance by."""
        return self.busy_s

    def power_violation_ns(self, gpu: Gpu) -> int:
        """NVML_PERF_POLICY_POWER: the time the power limit held the clocks back."""
        return int(self.load_s(gpu) * 1e9) if "sw_power_cap" in gpu.reasons_under_load else 0

    def thermal_violation_ns(self, gpu: Gpu) -> int:
        """NVML_PERF_POLICY_THERMAL: the time temperature held the clocks back."""
        return int(self.load_s(gpu) * 1e9) if any(r in gpu.reasons_under_load for r in _THERMAL) else 0

    def energy_mj(self, gpu: Gpu, now: float) -> int:
        """Energy since the driver loaded, in mJ: idle power all along, load power while busy."""
        idle_j = gpu.power_idle_w * max(0.0, now - self.host.created_at)
        return int((idle_j + (gpu.power_load_w - gpu.power_idle_w) * self.load_s(gpu)) * 1000)

    def sm_clock_mhz(self, gpu: Gpu) -> int:
        return gpu.sm_clock_load_mhz if self.loaded(gpu) else gpu.sm_clock_idle_mhz

    def clock_samples(self, gpu: Gpu, since_us: int, now: float) -> list[tuple[int, int]]:
        """The driver's SM clock samples after ``since_us`` (µs): one at each busy interval's end
        (the load clock), and one now."""
        found = [(int(end * 1e6), gpu.sm_clock_load_mhz) for _start, end in self.intervals if end * 1e6 > since_us]
        found.append((int(now * 1e6), self.sm_clock_mhz(gpu)))
        return found

    def temperature_c(self, gpu: Gpu) -> int:
        return gpu.temperature_load_c if self.loaded(gpu) else gpu.temperature_idle_c

    def power_w(self, gpu: Gpu) -> float:
        return gpu.power_load_w if self.loaded(gpu) else gpu.power_idle_w


def read(directory: str | os.PathLike[str] | None = None) -> Reading:
    """The host now: each holder alive or not (a dead one's file goes, or lingers), the load."""
    where = state_dir(directory)
    host = read_host(where)
    now = time.time()
    holdings: list[Holding] = []
    lingering: dict[int, int] = {}
    for path in sorted((where / "holders").glob("*.json")):
        data = _read_json(path)
        if data is None:
            continue
        pid = int(data["pid"])
        mib = {int(k): int(v) for k, v in data["mib"].items()}
        if start_ticks(pid) == data["start_ticks"]:
            reported = pid + FOREIGN_PID_OFFSET if host.pid_mode == "foreign" else pid
            name = "[Not Found]" if host.pid_mode == "foreign" else process_name(pid)
            holdings.extend(Holding(reported, pid, gpu, m, name) for gpu, m in mib.items())
            continue
        dead_at = data.get("dead_at")
        if dead_at is None and data.get("linger_s", 0) > 0:
            dead_at = now
            _write_json(path, {**data, "dead_at": now})
        if dead_at is not None and now < dead_at + data["linger_s"]:
            for gpu, m in mib.items():
                lingering[gpu] = lingering.get(gpu, 0) + m
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    under_load = False
    busy_s = 0.0
    for mark in (where / "busy").glob("*-*"):
        pid = int(mark.name.split("-")[0])
        if start_ticks(pid) is None:
            continue
        under_load = True
        with contextlib.suppress(OSError, ValueError):
            busy_s += max(0.0, now - float(mark.read_text(encoding="ascii")))
    intervals: list[tuple[float, float]] = []
    with contextlib.suppress(FileNotFoundError):
        for line in (where / "busy.log").read_text(encoding="ascii").splitlines():
            parts = line.split()
            if len(parts) == 2:
                intervals.append((float(parts[0]), float(parts[1])))
    busy_s += sum(end - start for start, end in intervals)
    return Reading(host=host, holdings=tuple(holdings), lingering_mib=lingering, under_load=under_load,
                   last_load_end=max((end for _s, end in intervals), default=None), busy_s=busy_s,
                   intervals=tuple(intervals))


def held_by(pids: Sequence[int], directory: str | os.PathLike[str] | None = None) -> dict[int, int]:
    """MiB each of ``pids`` holds now, summed over GPUs (for the tests' own assertions)."""
    reading = read(directory)
    found: dict[int, int] = {}
    for holding in reading.holdings:
        if holding.local_pid in pids:
            found[holding.local_pid] = found.get(holding.local_pid, 0) + holding.mib
    return found
