"""The host watch: a real busy process is named, our own load is not, /proc and NVML recordings parse."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kimiperf.config import deployments
from pytest_kimiperf.measure import hostwatch
from pytest_kimiperf.errors import ConfigError, KimiperfError
from pytest_kimiperf.measure.hostwatch import CpuCounters, ForeignProcess, GpuReading, HostSnapshot, ProcessCpu
from pytest_kimiperf.config.deployments import HostBounds
from pytest_kimiperf.measure.hostwatch import HostReading, HostWatch
from pytest_kimiperf.measure.runner import host_busy
from pytest_kimiperf.reports.sentences import say_invalid, say_measured_again
from tests import helpers

DATA = helpers.DATA / "hostwatch"
RECORDED_WALL_S = 2.000330  # tests/data/hostwatch/README.md
# Long enough that one busy core shows as tens of percent despite 10 ms ticks, short enough for a unit test.
WINDOW_S = 1.5


@pytest.fixture
def busy_process() -> Iterator[subprocess.Popen[bytes]]:
    # Two threads a core outside the GIL: among the busiest processes whatever else the host runs.
    process = subprocess.Popen([sys.executable, "-c", helpers.BUSY, str(2 * (os.cpu_count() or 2))])
    time.sleep(0.2)  # past interpreter start-up, into the loop
    yield process
    process.kill()
    process.wait()


def watch_window(own: list[int]) -> HostReading:
    watch = HostWatch(own_pids=lambda: own)
    watch.start()
    time.sleep(WINDOW_S)
    return watch.stop()


# --------------------------------------------------------------------------- real processes


def test_a_busy_process_beside_the_measurement_is_named_and_flags_the_window(
    busy_process: subprocess.Popen[bytes],
) -> None:
    reading = watch_window(own=[])
    bounds = HostBounds()
    # Two busy threads a core take most of the host; other load on this shared VM only adds.
    assert reading.foreign_cpu_share > bounds.max_foreign_cpu_share
    busy = [p for p in reading.top_foreign if p.pid == busy_process.pid]
    assert busy, reading.top_foreign
    assert busy[0].cpu_share > 0.05
    assert "hashlib.sha256(block)" in busy[0].cmdline
    assert any(f"pid {busy_process.pid} " in line for line in reading.disturbances(bounds))
    message = reading.describe_busy(bounds)
    assert message.startswith("host busy: other processes used ")
    assert f"pid {busy_process.pid} " in message
    assert reading.cpu_count >= 1 and reading.wall_s == pytest.approx(WINDOW_S, abs=0.5)


def test_a_busy_process_that_is_ours_is_neither_named_nor_blamed(busy_process: subprocess.Popen[bytes]) -> None:
    reading = watch_window(own=[busy_process.pid])
    # Whether the host is otherwise quiet depends on other engineers' load on this VM; what must
    # hold is that our own load is never what makes the window "busy".
    assert busy_process.pid not in [p.pid for p in reading.top_foreign]
    assert f"pid {busy_process.pid} " not in reading.describe_busy(HostBounds())


def test_a_window_where_only_our_processes_ran_is_quiet() -> None:
    start = snapshot(0.0, busy_s=100.0, processes={10: ProcessCpu(1.0, 50.0, 0.0)})
    stop = snapshot(2.0, busy_s=103.0, processes={10: ProcessCpu(1.0, 52.0, 1.0)})
    reading = hostwatch.compare_snapshots(start, stop, own_pids=[10])
    assert reading.foreign_cpu_share == 0.0
    assert reading.top_foreign == ()
    assert reading.disturbances(HostBounds()) == []
    assert reading.describe_busy(HostBounds()).startswith("host quiet: other processes used 0%")


def test_cpu_the_process_listing_missed_still_counts_as_foreign() -> None:
    # 1.5 s of host busy time, 0.5 s ours, no foreign process alive at the end: a short-lived job.
    start = snapshot(0.0, busy_s=10.0, processes={10: ProcessCpu(1.0, 5.0, 0.0), 20: ProcessCpu(1.0, 1.0, 0.0)})
    stop = snapshot(2.0, busy_s=11.5, processes={10: ProcessCpu(1.0, 5.5, 0.0), 30: ProcessCpu(1.5, 0.2, 0.0)})
    reading = hostwatch.compare_snapshots(start, stop, [10], describe_process=lambda pid: ("make", "make -j2"))
    assert reading.foreign_cpu_share == pytest.approx(1.0 / 4.0)
    # pid 30 was born inside the window: all its time is the window's.
    assert reading.top_foreign == (ForeignProcess(30, "make", "make -j2", pytest.approx(0.2 / 4.0)),)


def test_a_reused_pid_is_a_new_process_not_a_negative_delta() -> None:
    start = snapshot(0.0, busy_s=0.0, processes={40: ProcessCpu(1.0, 90.0, 0.0)})
    stop = snapshot(1.0, busy_s=0.5, processes={40: ProcessCpu(1.7, 0.4, 0.0)})
    reading = hostwatch.compare_snapshots(start, stop, own_pids=[])
    assert reading.top_foreign[0].cpu_share == pytest.approx(0.4 / 2.0)


def test_a_process_that_exits_between_calls_is_left_out_quietly() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()  # reaped: its pid is gone
    assert process.pid not in hostwatch.read_processes()
    assert hostwatch.describe_pid(process.pid) == ("?", "")


def snapshot(t_s: float, busy_s: float, processes: dict[int, ProcessCpu]) -> HostSnapshot:
    return HostSnapshot(t_s, CpuCounters(busy_s=busy_s, steal_s=0.0, cpu_count=2), {}, processes)


# --------------------------------------------------------------------------- recorded /proc files


def test_steal_and_psi_are_read_from_recorded_proc_files() -> None:
    start_cpu, start_psi, start_notes = hostwatch.read_host_counters(str(DATA / "busy_2s" / "start"))
    stop_cpu, stop_psi, _ = hostwatch.read_host_counters(str(DATA / "busy_2s" / "stop"))
    assert start_notes == ()
    assert start_cpu.cpu_count == 2
    assert stop_cpu.busy_s - start_cpu.busy_s == pytest.approx(3.89)
    assert stop_cpu.steal_s - start_cpu.steal_s == pytest.approx(0.10)
    assert start_psi == {"cpu": 14286162, "io": 6168304, "memory": 0}
    reading = hostwatch.compare_snapshots(
        HostSnapshot(0.0, start_cpu, start_psi, {}), HostSnapshot(RECORDED_WALL_S, stop_cpu, stop_psi, {}), []
    )
    assert reading.steal_share == pytest.approx(0.10 / (2 * RECORDED_WALL_S))
    cpu_some = 9376e-6 / RECORDED_WALL_S  # 9376 us of 'some' stall in the window
    assert reading.psi == pytest.approx({"cpu_some": cpu_some, "io_some": 0.0, "memory_some": 0.0})
    assert reading.foreign_cpu_share == pytest.approx(3.89 / (2 * RECORDED_WALL_S))


def test_the_watch_reads_proc_root_and_notes_a_kernel_without_psi(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    root.mkdir()
    shutil.copy(DATA / "busy_2s" / "start" / "stat", root / "stat")
    clock = iter([100.0, 100.0 + RECORDED_WALL_S])
    watch = HostWatch(own_pids=list, proc_root=str(root), clock=lambda: next(clock))
    watch.start()
    shutil.copy(DATA / "busy_2s" / "stop" / "stat", root / "stat")
    reading = watch.stop()
    assert reading.wall_s == pytest.approx(RECORDED_WALL_S)
    assert reading.steal_share == pytest.approx(0.10 / (2 * RECORDED_WALL_S))
    assert reading.psi == {}
    assert reading.notes == (f"no PSI for cpu, io, memory under {root / 'pressure'}",)
    assert reading.gpus == ()


def test_a_sandbox_whose_proc_stat_never_advances_is_called_unwatched_never_quiet(tmp_path: Path) -> None:
    # gVisor's /proc/stat: every cpu column 0, at both ends (google/gvisor#9967, #1336), no PSI.
    root = tmp_path / "proc"
    root.mkdir()
    shutil.copy(DATA / "gvisor_zeros" / "stat", root / "stat")
    clock = iter([100.0, 102.0])
    watch = HostWatch(own_pids=list, proc_root=str(root), clock=lambda: next(clock))
    watch.start()
    reading = watch.stop()
    assert reading.cpu_count == 8 and reading.foreign_cpu_share == 0.0
    assert reading.disturbances(HostBounds()) == []  # nothing seen is not something seen
    assert reading.describe_busy(HostBounds()) == (
        "host unwatched: /proc/stat's cpu counters did not advance in 2.0 s (a sandbox such as gVisor exports "
        "zeros): other processes' CPU and steal were not measured; no PSI either")
    assert HostReading.from_json(reading.to_json()) == reading


def test_a_real_kernels_window_is_watched() -> None:
    ends = [hostwatch.read_host_counters(str(DATA / "busy_2s" / end))[0] for end in ("start", "stop")]
    reading = hostwatch.compare_snapshots(HostSnapshot(0.0, ends[0], {}, {}),
                                          HostSnapshot(RECORDED_WALL_S, ends[1], {}, {}), [])
    assert reading.blind == () and reading.describe_busy(HostBounds()).startswith("host busy: ")


def test_steal_over_its_bound_and_psi_bounds_are_reported() -> None:
    reading = HostReading(2.0, 2, 0.0, 0.25, {"cpu_some": 0.5, "io_some": 0.01}, ())
    bounds = HostBounds(max_psi_cpu_some=0.2, max_psi_io_some=0.2, max_psi_memory_some=0.2)
    assert reading.disturbances(bounds) == [
        "the hypervisor stole 25% of the host's CPU (bound 10%)",
        "some task waited for cpu 50% of the time (PSI, bound 20%)",
    ]
    assert reading.disturbances(HostBounds(max_steal_share=None)) == []


def test_a_busy_host_is_a_fact_with_its_pids_and_shares_and_says_the_same_sentence() -> None:
    hog = ForeignProcess(pid=4242, name="stress", cmdline="stress -c 2", cpu_share=0.6)
    here = HostReading(2.0, 2, 0.6, 0.0, {}, (hog,))
    far = dataclasses.replace(here, foreign_cpu_share=0.01, top_foreign=(), node="far")  # quiet
    busy = host_busy((here, far), HostBounds(), attempts=3)
    assert busy is not None and busy.readings == (here,) and busy.attempts == 3
    assert busy.foreign_processes == [("", 4242, "stress", 0.6)]
    assert say_invalid(busy) == (
        "host busy: other processes used 60% of the host's CPU (bound 20%): pid 4242 stress (60%); "
        "measured 3 times, disturbed every time: no verdict from a busy host")
    # An attempt thrown out for it says what disturbed the host, without the verdict.
    assert say_measured_again(busy) == (
        "host busy: other processes used 60% of the host's CPU (bound 20%): pid 4242 stress (60%)")
    assert host_busy((far,), HostBounds(), attempts=1) is None


def test_unreadable_proc_stat_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KimiperfError, match="cannot read the host's CPU counters"):
        hostwatch.read_host_counters(str(tmp_path))
    with pytest.raises(KimiperfError, match="no usable cpu lines"):
        hostwatch.parse_proc_stat("intr 1 2 3\n", 100.0)


# --------------------------------------------------------------------------- bounds


def test_bounds_from_a_config_table_accept_none_and_reason_lists() -> None:
    bounds = HostBounds.from_mapping(
        {"max_foreign_cpu_share": 0.3, "max_steal_share": "none", "forbidden_throttle_reasons": ["hw_slowdown"]},
        source="deployment cpu-tiny",
    )
    assert bounds.max_foreign_cpu_share == 0.3
    assert bounds.max_steal_share is None
    assert bounds.forbidden_throttle_reasons == ("hw_slowdown",)
    assert bounds.max_foreign_gpu_processes == 0


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"max_cpu": 0.2}, ["unknown host bound 'max_cpu'", "max_foreign_cpu_share"]),
        ({"max_foreign_cpu_share": 20}, ["max_foreign_cpu_share = 20", "share from 0 to 1"]),
        ({"max_steal_share": True}, ["max_steal_share = True", "share from 0 to 1"]),
        ({"max_psi_io_some": "high"}, ["max_psi_io_some = 'high'", "share from 0 to 1"]),
        ({"max_foreign_gpu_processes": -1}, ["max_foreign_gpu_processes = -1", "integer >= 0"]),
        ({"max_foreign_gpu_processes": 1.5}, ["max_foreign_gpu_processes = 1.5", "integer >= 0"]),
        ({"forbidden_throttle_reasons": "hw_slowdown"}, ["forbidden_throttle_reasons = 'hw_slowdown'", "list"]),
        ({"forbidden_throttle_reasons": ["hot"]}, ["unknown reasons ['hot']", "sw_power_cap"]),
    ],
)
def test_a_bad_bound_names_key_value_source_and_what_is_allowed(data: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        HostBounds.from_mapping(data, source="pyproject.toml [tool.kimiperf.deployments.cpu-tiny]")
    message = str(error.value)
    assert message.startswith("pyproject.toml [tool.kimiperf.deployments.cpu-tiny]: ")
    for word in words:
        assert word in message


def test_bounds_built_in_code_are_checked_too() -> None:
    with pytest.raises(ConfigError, match="HostBounds: host bound max_steal_share = -0.1"):
        HostBounds(max_steal_share=-0.1)


# --------------------------------------------------------------------------- NVML


class FakeNvml:
    """Replays recorded NVML answers: each nvmlDeviceGetHandleByIndex call moves a GPU to its next sample."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_ERROR_NOT_SUPPORTED = 3

    class NVMLError(Exception):
        pass

    def __init__(self, recording: dict[str, Any], *, has_event_reasons: bool = True) -> None:
        self.samples = {int(index): list(samples) for index, samples in recording["gpus"].items()}
        self.calls = {index: 0 for index in self.samples}
        self.live = 0
        if not has_event_reasons:  # pynvml before the "clocks event" rename (driver < 535)
            self.nvmlDeviceGetCurrentClocksEventReasons = None

    def nvmlInit(self) -> None:
        self.live += 1

    def nvmlShutdown(self) -> None:
        self.live -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        if index not in self.samples:
            raise self.NVMLError("Invalid Argument")
        sample = self.samples[index][min(self.calls[index], len(self.samples[index]) - 1)]
        self.calls[index] += 1
        return sample

    def _value(self, handle: dict[str, Any], key: str) -> Any:
        if handle[key] is None:
            raise self.NVMLError("Not Supported")
        return handle[key]

    def nvmlDeviceGetClockInfo(self, handle: dict[str, Any], clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self._value(handle, "sm_clock_mhz")

    def nvmlDeviceGetTemperature(self, handle: dict[str, Any], sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._value(handle, "temperature_c")

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "power_mw")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "clocks_event_reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "clocks_event_reasons")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_gpu_memory_bytes"])
            for p in handle["compute_processes"]
        ]


def recorded_nvml(**options: bool) -> FakeNvml:
    return FakeNvml(json.loads((DATA / "nvml_power_capped_two_engines.json").read_text()), **options)


OUR_ENGINE, OTHER_ENGINE = 3858903, 3880364  # tests/data/gpu/compute_apps_vllm_enginecore.csv


@pytest.mark.parametrize("has_event_reasons", [True, False])
def test_a_power_capped_gpu_with_a_foreign_engine_is_a_disturbed_window(has_event_reasons: bool) -> None:
    nvml = recorded_nvml(has_event_reasons=has_event_reasons)
    watch = HostWatch(own_pids=lambda: [OUR_ENGINE], gpu_indices=[0, 1], nvml=nvml)
    watch.start()
    reading = watch.stop()
    assert nvml.live == 0
    assert reading.gpus == (
        GpuReading(0, 1500, 74, 314.0, ("sw_power_cap",), ((OTHER_ENGINE, 5530 * 1024 * 1024),)),
        GpuReading(1, 915, 42, None, ("gpu_idle",), ()),
    )
    lines = [line for line in reading.disturbances(HostBounds()) if "GPU" in line]
    assert lines == [
        f"1 other process(es) held memory on the watched GPUs (bound 0): pid {OTHER_ENGINE} on GPU 0 (5530 MiB)",
        "GPU 0 clocks held back by sw_power_cap (SM 1500 MHz, 74 C, 314 W)",
    ]
    relaxed = HostBounds(max_foreign_gpu_processes=1, forbidden_throttle_reasons=("hw_slowdown",))
    assert [line for line in reading.disturbances(relaxed) if "GPU" in line] == []


def test_a_gpu_nvml_cannot_read_is_noted_not_fatal() -> None:
    nvml = recorded_nvml()
    watch = HostWatch(own_pids=list, gpu_indices=[0, 7], nvml=nvml)
    watch.start()
    reading = watch.stop()
    assert [gpu.index for gpu in reading.gpus] == [0]
    assert "NVML: GPU 7 not read: Invalid Argument" in reading.notes


def test_without_nvml_or_gpu_indices_there_are_no_gpu_readings() -> None:
    nvml = recorded_nvml()
    for watch in (HostWatch(own_pids=list, nvml=nvml), HostWatch(own_pids=list, gpu_indices=[0])):
        watch.start()
        assert watch.stop().gpus == ()
    assert nvml.calls == {0: 0, 1: 0}


def test_reason_masks_decode_to_names_unknown_bits_kept() -> None:
    assert hostwatch.decode_clock_event_reasons(0) == ()
    names = ("gpu_idle", "sw_power_cap", "hw_thermal_slowdown")
    assert hostwatch.decode_clock_event_reasons(0x1 | 0x4 | 0x40) == names
    assert hostwatch.decode_clock_event_reasons(0x800) == ("unknown_0x800",)


def test_reason_bits_match_the_installed_nvml_constants() -> None:
    pynvml = pytest.importorskip("pynvml")
    for bit, name in deployments.CLOCK_EVENT_REASON_BITS.items():
        camel = "".join(part.capitalize() for part in name.split("_"))
        assert getattr(pynvml, f"nvmlClocksEventReason{camel}") == bit
        assert getattr(pynvml, f"nvmlClocksThrottleReason{camel}") == bit
    # The "event" set (nvml.h's) is exactly these bits: nvmlClocksEventReasonAll ORs them all.
    assert sum(deployments.CLOCK_EVENT_REASON_BITS) == pynvml.nvmlClocksEventReasonAll


def test_bits_nvml_h_does_not_define_decode_as_unknown_and_cannot_be_bounded() -> None:
    # pynvml's deprecated throttle set names 0x200 and 0x400; nvml.h never did.
    assert hostwatch.decode_clock_event_reasons(0x4 | 0x200 | 0x400) == (
        "sw_power_cap", "unknown_0x200", "unknown_0x400")
    with pytest.raises(ConfigError, match=r"names unknown reasons \['board_limit'\]"):
        HostBounds.from_mapping({"forbidden_throttle_reasons": ["board_limit"]}, source="test")


# --------------------------------------------------------------------------- JSON


def test_a_reading_survives_a_json_round_trip() -> None:
    reading = HostReading(
        wall_s=1.5,
        cpu_count=2,
        foreign_cpu_share=0.48,
        steal_share=0.01,
        psi={"cpu_some": 0.03, "io_some": 0.0},
        top_foreign=(ForeignProcess(1234, "python3", "python3 -c while True: pass", 0.45),),
        gpus=(GpuReading(0, 1500, 74, 314.0, ("sw_power_cap",), ((3880364, 5798625280),)),),
        notes=("no PSI for memory under /proc/pressure",),
    )
    text = json.dumps(reading.to_json())
    assert HostReading.from_json(json.loads(text)) == reading
    assert reading.describe_busy(HostBounds()).startswith(
        "host busy: other processes used 48% of the host's CPU (bound 20%): pid 1234 python3 (45%); "
    )


def test_json_that_is_not_a_reading_is_a_clear_error() -> None:
    with pytest.raises(KimiperfError, match="not a host reading"):
        HostReading.from_json({"wall_s": 1.0})


def _sandbox_proc(tmp_path: Path, cuda_pids: list[int]) -> Path:
    """A gVisor-like /proc (no NSpid; pid_namespace.py) where ``cuda_pids`` hold /dev/nvidia0."""
    root = tmp_path / "proc"
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").write_text("")
    (root / "self" / "status").write_text("Name:\tpython3\nPid:\t1\n")
    shutil.copy(DATA / "gvisor_zeros" / "stat", root / "stat")
    for pid in cuda_pids:
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "fd" / "3").symlink_to("/dev/nvidia0")
    return root


def test_in_a_sandbox_a_reported_pid_that_is_no_process_here_is_not_counted_foreign(tmp_path: Path) -> None:
    # The recorded two engines: ours is a process here holding the GPU; the other engine's pid
    # is none here (a driver that reported a host pid): unnamed, so never a foreign process...
    root = _sandbox_proc(tmp_path, [OUR_ENGINE])
    watch = HostWatch(own_pids=lambda: [OUR_ENGINE], gpu_indices=[0], nvml=recorded_nvml(), proc_root=str(root))
    watch.start()
    reading = watch.stop()
    assert reading.gpus[0].foreign_processes == ()
    assert any(f"left unnamed: [{OTHER_ENGINE}]" in note for note in reading.notes)
    # ... while a process here holding the GPU that is not ours is one, named by its pid.
    root = _sandbox_proc(tmp_path / "second", [OUR_ENGINE, OTHER_ENGINE])
    watch = HostWatch(own_pids=lambda: [OUR_ENGINE], gpu_indices=[0], nvml=recorded_nvml(), proc_root=str(root))
    watch.start()
    assert watch.stop().gpus[0].foreign_processes == ((OTHER_ENGINE, 5530 * 1024 * 1024),)


class PcieNvml(FakeNvml):
    """The recorded two engines, with GPU 0's link as tests/data/gpu/query_gpu_rtx2080_noheader_nounits.csv
    recorded one (pcie.link.width.current 8, Gen3) on a Gen3 x16 card; GPU 1 at its most."""

    LINKS = {0: (3, 8, 3, 16), 1: (3, 16, 3, 16)}

    def _link(self, handle: dict[str, Any], which: int) -> int:
        index = next(i for i, samples in self.samples.items() if any(handle is s for s in samples))
        return self.LINKS[index][which]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: dict[str, Any]) -> int:
        return self._link(handle, 0)

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: dict[str, Any]) -> int:
        return self._link(handle, 1)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: dict[str, Any]) -> int:
        return self._link(handle, 2)

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: dict[str, Any]) -> int:
        return self._link(handle, 3)


def test_each_gpus_pcie_link_is_recorded_and_a_link_below_its_most_is_said() -> None:
    nvml = PcieNvml(json.loads((DATA / "nvml_power_capped_two_engines.json").read_text()))
    watch = HostWatch(own_pids=lambda: [OUR_ENGINE, OTHER_ENGINE], gpu_indices=[0, 1], nvml=nvml)
    watch.start()
    reading = watch.stop()
    links = [(g.pcie_gen, g.pcie_width, g.pcie_max_gen, g.pcie_max_width) for g in reading.gpus]
    assert links == [(3, 8, 3, 16), (3, 16, 3, 16)]
    assert [g.pcie_shortfall() for g in reading.gpus] == ["GPU 0's PCIe link ran at Gen3 x8 (Gen3 x16 possible)", None]
    assert HostReading.from_json(reading.to_json()) == reading


def test_a_window_keeps_the_highest_link_it_saw() -> None:
    idle = GpuReading(0, 300, 40, 30.0, ("gpu_idle",), (), pcie_gen=1, pcie_width=16, pcie_max_gen=5, pcie_max_width=16)
    busy = dataclasses.replace(idle, pcie_gen=5)
    merged = hostwatch.merge_gpu_samples([idle, busy], own_pids=())
    assert (merged.pcie_gen, merged.pcie_width) == (5, 16) and merged.pcie_shortfall() is None
    assert hostwatch.merge_gpu_samples([idle, idle], own_pids=()).pcie_shortfall() == (
        "GPU 0's PCIe link ran at Gen1 x16 (Gen5 x16 possible)")


class DeviceMemoryNvml(FakeNvml):
    """The recorded two engines, with each GPU's used memory (built: what the processes listed
    hold plus 500 MiB of the driver's, and on GPU 0 ``grown_mib`` more at the window's end)."""

    def __init__(self, grown_mib: int, **options: bool) -> None:
        super().__init__(json.loads((DATA / "nvml_power_capped_two_engines.json").read_text()), **options)
        self.grown_mib = grown_mib

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> SimpleNamespace:
        listed = sum(p["used_gpu_memory_bytes"] or 0 for p in handle["compute_processes"])
        late = handle.get("when") == "window end" and any(handle is s for s in self.samples[0])
        return SimpleNamespace(used=listed + (500 + (self.grown_mib if late else 0)) * 2**20)


def test_memory_no_listed_process_accounts_for_is_a_disturbance() -> None:
    for grown, expected in ((2048, 2048), (100, 100)):
        watch = HostWatch(own_pids=lambda: [OUR_ENGINE, OTHER_ENGINE], gpu_indices=[0, 1], nvml=DeviceMemoryNvml(grown))
        watch.start()
        reading = watch.stop()
        assert [g.unlisted_growth_mib for g in reading.gpus] == [expected, 0]
        lines = [line for line in reading.disturbances(HostBounds()) if "NVML lists" in line]
        assert lines == (["GPU 0 used 2048 MiB more at the window's end than at its start beyond what the processes "
                          "NVML lists gained: a process NVML cannot name here (another container's) or a leak"]
                         if grown > 256 else [])
    relaxed = HostBounds(max_foreign_gpu_processes=None)
    assert not [line for line in reading.disturbances(relaxed) if "NVML lists" in line]
