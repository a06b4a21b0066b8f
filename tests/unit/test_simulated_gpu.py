"""The simulated GPU (tests/fakes/simgpu) answers as the real tools do: nvidia-smi in the layouts
of the recorded outputs (tests/data/gpu), NVML through nvidia-ml-py's own bindings, both from one
state that real processes feed and that releases their memory when they end."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kimiperf.server import gpu, gpu_memory, nvidia_smi
from tests.fakes.simgpu import BIN_DIR, SimulatedGpus, state
from tests.helpers import DATA

RECORDED = DATA / "gpu"


def smi(sim: SimulatedGpus, *args: str) -> str:
    done = subprocess.run([str(BIN_DIR / "nvidia-smi"), *args], capture_output=True, text=True, env=sim.env(),
                          timeout=30, check=False)
    return done.stdout


@pytest.fixture
def sim(tmp_path: Path) -> SimulatedGpus:
    gpus = SimulatedGpus(tmp_path / "state")
    yield gpus
    gpus.close()


def test_nvidia_smi_prints_the_recorded_rtx_pro_6000_host_byte_for_byte(sim: SimulatedGpus) -> None:
    for index in range(8):
        sim.update_gpu(index, mig_mode="Enabled")  # as the recorded host was (a HAMi MIG write-up)
    assert smi(sim, "--query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current", "--format=csv") \
        == (RECORDED / "query_gpu_8x_rtx_pro_6000.csv").read_text()
    assert smi(sim, "topo", "-m") == (RECORDED / "topo_8x_rtx_pro_6000_sys.txt").read_text()
    assert smi(sim, "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory", "--format=csv") \
        == (RECORDED / "compute_apps_header_only.csv").read_text()


def test_nvidia_smi_headers_and_banner_are_the_recorded_ones(sim: SimulatedGpus) -> None:
    sim.update(driver_version="535.54.03", cuda_version="12.2")
    banner = smi(sim).splitlines()[:2]
    assert banner == (RECORDED / "smi_header_535.txt").read_text().splitlines()[:2]
    first_line = {"compute_apps_pid_used_memory.csv": ("--query-compute-apps=pid,used_memory", "--format=csv"),
                  "memory_used_2gpu_one_busy.csv": ("--query-gpu=index,memory.used,memory.total", "--format=csv")}
    for recording, args in first_line.items():
        assert smi(sim, *args).splitlines()[0] == (RECORDED / recording).read_text().splitlines()[0]


def test_nvidia_smi_refuses_what_it_does_not_know_as_the_real_tool_does(sim: SimulatedGpus) -> None:
    done = subprocess.run([str(BIN_DIR / "nvidia-smi"), "--query-gpu=bogus", "--format=csv"], capture_output=True,
                          text=True, env=sim.env(), timeout=30, check=False)
    assert (done.returncode, done.stdout) == (2, 'Field "bogus" is not a valid field to query.\n')
    gone = subprocess.run([str(BIN_DIR / "nvidia-smi")], capture_output=True, text=True, timeout=30, check=False,
                          env={**sim.env(), state.STATE_ENV: str(sim.directory / "nowhere")})
    assert gone.returncode == 9 and gone.stdout.startswith("NVIDIA-SMI has failed")


HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from simgpu import state
state.hold({int(sys.argv[2]): int(sys.argv[3])}, linger_s=float(sys.argv[4]))
print("held", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def holder_of(sim: SimulatedGpus, gpu_index: int, mib: int, linger_s: float = 0.0) -> Iterator[subprocess.Popen[str]]:
    """A real process holding ``mib`` on ``gpu_index`` until the block ends (SIGKILL)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(BIN_DIR.parent.parent), str(gpu_index), str(mib),
                             str(linger_s)], stdout=subprocess.PIPE, text=True, env=sim.env())
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == "held\n"
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def test_a_process_memory_is_listed_until_it_ends_then_released(sim: SimulatedGpus,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in sim.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(BIN_DIR.parent / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)  # the real bindings, if a test loaded them
    with holder_of(sim, 3, 4096) as holder:
        # Through the plugin's own readers: NVML first (the fake bindings), nvidia-smi as they parse it.
        assert gpu_memory.gpu_memory_by_pid() == {holder.pid: 4096}
        assert gpu_memory.gpu_memory_used_mib()[3] == 4096
        held = gpu_memory.gpu_holders()
        assert [(h.gpu, h.pid, h.mib) for h in held.holders] == [(3, holder.pid, 4096)] and held.note is None
        rows = nvidia_smi.parse_compute_apps_by_gpu(
            smi(sim, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv"), ())
        assert rows == [(state.RTX_PRO_6000_UUIDS[3], holder.pid, 4096)]
        assert gpu.probe_gpus().source == "NVML"
    assert gpu_memory.gpu_memory_by_pid() == {} and sim.used_mib()[3] == 0


def test_a_process_nvml_names_without_a_figure_holds_an_unknown_amount_not_0(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # nvml.h: usedGpuMemory is NVML_VALUE_NOT_AVAILABLE under WDDM (and in some containers);
    # nvidia-ml-py's own bindings turn it into None, nvidia-smi prints [N/A]. A 0 read as "holds
    # nothing" and left the lent run's orphan step without its device-level fallback.
    sim = SimulatedGpus(tmp_path / "sim", state.rtx_pro_6000_host(process_memory="not-available"))
    for name, value in sim.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(BIN_DIR.parent / "nvml"))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    with contextlib.closing(sim), holder_of(sim, 3, 4096) as holder:
        assert gpu_memory.gpu_memory_by_pid() == {holder.pid: None}
        held = gpu_memory.gpu_holders()
        assert [(h.gpu, h.pid, h.mib) for h in held.holders] == [(3, holder.pid, None)]
        assert held.holders[0].describe().endswith("(memory not reported by NVML)")
        assert held.known_mib_on(3) == 0 and gpu_memory.gpu_memory_used_mib()[3] == 4096
        text = smi(sim, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv")
        assert f"{holder.pid}, [N/A]" in text
        assert nvidia_smi.parse_compute_apps_by_gpu(text, ()) == [(state.RTX_PRO_6000_UUIDS[3], holder.pid, None)]


def test_memory_of_an_ended_process_lingers_unlisted_for_its_linger_time(sim: SimulatedGpus) -> None:
    with holder_of(sim, 0, 2048, linger_s=1.0):
        pass
    reading = sim.read()
    assert reading.used_mib(reading.host.gpus[0]) == 2048 and reading.processes(reading.host.gpus[0]) == []
    time.sleep(1.1)
    assert sim.used_mib()[0] == 0


def test_load_drives_the_counters_clocks_and_link(sim: SimulatedGpus) -> None:
    sim.update_gpu(1, reasons_under_load=("hw_thermal_slowdown",), pcie_load_gen=4)
    with holder_of(sim, 1, 1024):
        before = sim.read()
        g = before.host.gpus[1]
        assert before.reasons(g) == ("gpu_idle",) and before.thermal_violation_ns(g) == 0
        assert before.link(g, time.time()) == (1, 16)
        with state.busy(sim.directory):
            time.sleep(0.2)
            during = sim.read()
            assert during.reasons(g) == ("hw_thermal_slowdown",) and during.sm_clock_mhz(g) == g.sm_clock_load_mhz
            assert during.link(g, time.time()) == (4, 16)
        after = sim.read()
        assert after.thermal_violation_ns(g) >= 0.2e9 and after.power_violation_ns(g) == 0
        assert after.link(g, time.time()) == (4, 16), "the link stays trained up for a moment after the load"
        assert after.energy_mj(g, time.time()) > before.energy_mj(g, time.time())


def test_foreign_pid_mode_names_pids_of_no_process_here(sim: SimulatedGpus) -> None:
    sim.update(pid_mode="foreign")
    with holder_of(sim, 2, 512) as holder:
        (holding,) = sim.read().holdings
        assert holding.pid == holder.pid + state.FOREIGN_PID_OFFSET and holding.name == "[Not Found]"
        assert not os.path.exists(f"/proc/{holding.pid}")
