"""Whether a host can run a deployment, decided on real recorded nvidia-smi outputs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import pytest

from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8, TINY_CPU, Deployment
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES, NcclProfile
from pytest_kimiperf.errors import HardwareMissingError, KimiperfError
from pytest_kimiperf.server import hardware_check, nvidia_smi
from pytest_kimiperf.server.gpu import GpuProbe
from pytest_kimiperf.server.gpu_memory import GpuHolder, GpuHolders
from pytest_kimiperf.server.nvidia_smi import GpuInfo
from tests import helpers

DATA = helpers.DATA / "gpu"
GIB = 1024**3
LL128_EVERYWHERE = NcclProfile("ll128", "LL128 forced on every collective", {"NCCL_PROTO": "LL128"})


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def production_host() -> GpuProbe:
    """The recorded 8x RTX PRO 6000 host, as NVML would have answered, with MIG off (it was
    recorded in MIG mode: test_the_recorded_host_in_mig_mode_is_a_clear_hardware_problem)."""
    gpus = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))
    return GpuProbe(gpus=tuple(dataclasses.replace(g, mig_mode="Disabled") for g in gpus), source="NVML")


def test_the_recorded_host_in_mig_mode_is_a_clear_hardware_problem() -> None:
    recorded_host = GpuProbe(gpus=tuple(nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))),
                             source="NVML")
    problem = hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=lambda: recorded_host)
    assert problem is not None and "are in MIG mode (mig.mode.current = Enabled)" in problem


def never_asked() -> NoReturn:
    raise AssertionError("the driver was asked although the answer could not matter")


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No checkpoint is on this host unless a test puts one there; every GPU is visible, and the
    recorded hosts' memory use is unknown unless a test gives it (never this host's GPUs')."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(hardware_check, "gpu_memory_used_mib", dict)


def kimi_with_checkpoint(folder: Path, gib_per_gpu: float, **changes: object) -> Deployment:
    """Kimi with a local checkpoint of ``gib_per_gpu`` per TP rank (a sparse file: no disk used),
    quantized to fp8 unless ``changes`` say otherwise: its own INT4 (compressed-tensors) weights
    turn the weight cache off before any fit is asked (weight_cache.IPC_QUANT_UNSUPPORTED)."""
    folder.mkdir()
    with (folder / "model.safetensors").open("wb") as weights:
        weights.truncate(int(gib_per_gpu * KIMI_K25_INT4_TP8.tensor_parallel_size * GIB))
    changes = {"quantization": "fp8", **changes}
    return dataclasses.replace(KIMI_K25_INT4_TP8, model=str(folder), **changes)  # type: ignore[arg-type]


def test_the_recorded_production_host_runs_kimi() -> None:
    assert hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=production_host) is None


def test_a_cpu_deployment_needs_no_gpu() -> None:
    assert hardware_check.hardware_problem(TINY_CPU, probe=never_asked) is None


def test_a_host_without_gpus_says_why_in_one_message() -> None:
    probe = GpuProbe(gpus=(), source="none",
                     notes=("NVML: NVML Shared Library Not Found", "nvidia-smi not found on PATH"))
    assert hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=lambda: probe) == (
        "deployment 'kimi-k25-int4-tp8' needs 8x NVIDIA GPU whose name contains 'RTX PRO 6000'; "
        "found no NVIDIA GPU (NVML: NVML Shared Library Not Found; nvidia-smi not found on PATH). "
        "Run here with --kimiperf-deployment tiny-cpu, or on a host that has those GPUs (a deployment that runs on the CPU "
        "says gpu_count = 0; unless given, gpu_count follows its parallel layout)."
    )


def test_too_few_gpus_of_the_kind_are_named() -> None:
    seven = GpuProbe(gpus=production_host().gpus[:7], source="NVML")
    problem = hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=lambda: seven)
    assert problem is not None
    assert "found 7x NVIDIA RTX PRO 6000 Blackwell Server Edition (97887 MiB)." in problem


def test_a_weight_cache_that_leaves_the_engine_no_room_is_a_hardware_problem(tmp_path: Path) -> None:
    kimi = kimi_with_checkpoint(tmp_path / "kimi", gib_per_gpu=83.0)
    problem = hardware_check.hardware_problem(kimi, probe=production_host)
    assert problem == (
        "the weight cache does not fit: daemons hold 83.0 GiB per GPU of 95.6; the engine keeps "
        "3.0 GiB for activations and KV cache, under the 4.0 GiB an engine needs; use GPUs with more "
        "memory or set weight_cache = \"off\" in the deployment"
    )
    with pytest.raises(HardwareMissingError, match="the weight cache does not fit"):
        hardware_check.check_weight_cache_fit(kimi, production_host().gpus)


def test_a_weight_cache_that_fits_or_is_off_is_no_problem(tmp_path: Path) -> None:
    assert hardware_check.hardware_problem(
        kimi_with_checkpoint(tmp_path / "fits", gib_per_gpu=68.4), probe=production_host
    ) is None
    off = kimi_with_checkpoint(tmp_path / "off", gib_per_gpu=83.0, weight_cache="off")
    assert hardware_check.hardware_problem(off, probe=production_host) is None
    hardware_check.check_weight_cache_fit(off, production_host().gpus)
    hardware_check.check_weight_cache_fit(kimi_with_checkpoint(tmp_path / "no-gpus", gib_per_gpu=83.0), ())
    # Kimi's own INT4 checkpoint: no daemons, so nothing to fit, however large.
    int4 = kimi_with_checkpoint(tmp_path / "int4", gib_per_gpu=83.0, quantization=KIMI_K25_INT4_TP8.quantization)
    assert hardware_check.hardware_problem(int4, probe=production_host) is None


def h100_host() -> GpuProbe:
    """8x H100 80GB as recorded (name and memory; the rest as NVML would fill it)."""
    rows = [line.split(", ") for line in recorded("query_gpu_8x_h100_name_memory.csv").splitlines()[1:]]
    return GpuProbe(gpus=tuple(nvidia_smi.GpuInfo(int(i), name, None, int(mib.removesuffix(" MiB")), "unknown", None,
                                                  None, None, "Disabled") for i, name, mib in rows), source="NVML")


def test_kimi_on_gpus_of_another_name_says_how_to_run_it_there() -> None:
    problem = hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=h100_host)
    assert problem == (
        "deployment 'kimi-k25-int4-tp8' needs 8x NVIDIA GPU whose name contains 'RTX PRO 6000'; found 8x NVIDIA "
        "H100 80GB HBM3 (81559 MiB), of which 0 qualify. There are enough GPUs here, of another kind: to run it on "
        "them, extend it in pyproject.toml with [tool.kimiperf.deployments.kimi-k25-int4-tp8-h100-80gb-hbm3] "
        'extends = "kimi-k25-int4-tp8" gpu_name_contains = "H100 80GB HBM3" and run with --kimiperf-deployment '
        'kimi-k25-int4-tp8-h100-80gb-hbm3 (docs/how-to/own-deployment.md, "The same model on other GPUs": check '
        "first that the weights fit).")
    # The recipe, followed: the override takes the same host.
    h100 = dataclasses.replace(KIMI_K25_INT4_TP8, name="kimi-k25-int4-tp8-h100-80gb-hbm3",
                               gpu_name_contains="H100 80GB HBM3")
    assert hardware_check.hardware_problem(h100, probe=h100_host) is None


def test_only_the_gpus_cuda_visible_devices_leaves_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    problem = hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=production_host)
    assert problem is not None and ("found 4x NVIDIA RTX PRO 6000 Blackwell Server Edition (97887 MiB) "
                                    "(CUDA_VISIBLE_DEVICES='0,1,2,3' leaves the server 4 of the host's 8). "
                                    "Run here with --kimiperf-deployment tiny-cpu") in problem
    # The deployment's own env is what the server gets, over the shell's.
    kimi = dataclasses.replace(KIMI_K25_INT4_TP8, env={"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"})
    assert hardware_check.hardware_problem(kimi, probe=production_host) is None


def test_the_hardware_check_never_judges_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """What holds memory before the first boot may be a killed run's engine, which the sweep ends
    first: free memory is judged after it (await_free_memory), never here."""
    monkeypatch.setattr(hardware_check, "gpu_memory_used_mib", never_asked)
    monkeypatch.setattr(hardware_check, "gpu_holders", never_asked)
    assert hardware_check.hardware_problem(KIMI_K25_INT4_TP8, probe=production_host) is None


def _gpus() -> list[GpuInfo]:
    return list(production_host().gpus)


# GPU 1 of the recorded T4 pair held 13395 MiB (memory_used_2gpu_one_busy.csv); on the production
# host GPU 5 holds as much, by a stranger's process.
STRANGER = GpuHolders((GpuHolder(gpu=5, pid=4242, nvml_pid=4242, mib=13392, name="python3"),))


def test_gpus_without_the_free_memory_vllm_asks_at_startup_are_named_with_what_holds_them() -> None:
    used = {index: 3 for index in range(8)} | {5: 13395}
    with pytest.raises(HardwareMissingError) as caught:
        hardware_check.check_free_memory(KIMI_K25_INT4_TP8, _gpus(), used, STRANGER)
    assert str(caught.value) == (
        "deployment 'kimi-k25-int4-tp8': GPU 5 (NVIDIA RTX PRO 6000 Blackwell Server Edition) has 84492 of 97887 MiB "
        "free, vLLM asks 88099: held by pid 4242 python3 (13392 MiB) (--gpu-memory-utilization 0.9 of each GPU must "
        "be free when the engine starts). These are no processes of an earlier kimiperf run (the sweep ended those), "
        "so they are never signalled: end them (`nvidia-smi --query-compute-apps=pid,process_name,used_memory "
        "--format=csv`), choose free GPUs with CUDA_VISIBLE_DEVICES, or lower --gpu-memory-utilization in a "
        "deployment that extends this one.")
    low = dataclasses.replace(KIMI_K25_INT4_TP8, command=(*KIMI_K25_INT4_TP8.command, "--gpu-memory-utilization", "0.8"))
    hardware_check.check_free_memory(low, _gpus(), used, STRANGER)  # 84492 free >= 78310 asked


def test_a_holder_nvml_gives_no_figure_for_is_named_as_such_and_explains_none_of_the_memory() -> None:
    # NVML_VALUE_NOT_AVAILABLE: the process is listed, its memory is unknown (not 0 MiB).
    unknown = GpuHolders((GpuHolder(gpu=5, pid=4242, nvml_pid=4242, mib=None, name="python3"),))
    used = {index: 3 for index in range(8)} | {5: 13395}
    with pytest.raises(HardwareMissingError, match=r"vLLM asks 88099: held by pid 4242 python3 \(memory not reported "
                       r"by NVML\), 13395 MiB that no listed process is known to hold \(another container"):
        hardware_check.check_free_memory(KIMI_K25_INT4_TP8, _gpus(), used, unknown)
    assert unknown.by_pid() == {4242: None} and unknown.known_mib_on(5) == 0
    # One GPU of two without a figure leaves the process's total unknown.
    both = GpuHolders((GpuHolder(0, 7, 7, 300), GpuHolder(1, 7, 7, None), GpuHolder(1, 8, 8, 20)))
    assert both.by_pid() == {7: None, 8: 20} and [h.pid for h in both.on(1)] == [8, 7]


def test_memory_no_live_process_holds_is_waited_for_and_named_per_gpu_at_the_deadline() -> None:
    """A swept engine's memory comes back as the driver tears its context down: the first boot
    waits for it; what never comes back is named by GPU once the wait is over."""
    readings = iter([{i: 90000 for i in range(8)}, {i: 40000 for i in range(8)}, {i: 3 for i in range(8)}])
    said: list[str] = []
    used = hardware_check.await_free_memory(KIMI_K25_INT4_TP8, _gpus(), deadline_s=5, poll_s=0.01,
                                            used=lambda: next(readings), holders=GpuHolders, announce=said.append)
    assert used == dict.fromkeys(range(8), 3)
    assert said and said[0].startswith("GPU memory came back after ")
    started = time.monotonic()
    with pytest.raises(HardwareMissingError, match=r"GPU 0 \(NVIDIA RTX PRO 6000 Blackwell Server Edition\) has 7887 "
                       r"of 97887 MiB free, vLLM asks 88099: held by 90000 MiB that no listed process holds"):
        hardware_check.await_free_memory(KIMI_K25_INT4_TP8, _gpus(), deadline_s=0.2, poll_s=0.01,
                                         used=lambda: dict.fromkeys(range(8), 90000), holders=GpuHolders)
    assert time.monotonic() - started >= 0.2


def test_memory_live_processes_hold_fails_at_once_without_waiting() -> None:
    readings: list[dict[int, int]] = []

    def used() -> dict[int, int]:
        readings.append({index: 3 for index in range(8)} | {5: 13395})
        return readings[-1]

    with pytest.raises(HardwareMissingError, match="held by pid 4242 python3"):
        hardware_check.await_free_memory(KIMI_K25_INT4_TP8, _gpus(), deadline_s=60, poll_s=0.01,
                                         used=used, holders=lambda: STRANGER)
    assert len(readings) == 1, "memory a live process holds is not waited for"


def test_ll128_forced_on_a_pcie_only_host_warns() -> None:
    topology = nvidia_smi.parse_topology(recorded("topo_8x_rtx_pro_6000_sys.txt"))
    (warning,) = hardware_check.topology_warnings(
        KIMI_K25_INT4_TP8, [BUILTIN_PROFILES["default"], LL128_EVERYWHERE], topology=lambda: topology
    )
    assert warning.startswith(
        "NCCL profile 'll128' (from built-in): NCCL_PROTO='LL128' turns LL128 on (every collective) on a "
        "PCIe-only host"
    )


def test_an_algorithm_the_pcie_host_lacks_is_said_before_any_boot() -> None:
    # NVLS needs NVSwitch: valid where the hardware is unknown, nothing left on this PCIe host.
    topology = nvidia_smi.parse_topology(recorded("topo_8x_rtx_pro_6000_sys.txt"))
    nvls = NcclProfile("nvls", "NVLS everywhere", {"NCCL_ALGO": "NVLS"})
    (warning,) = hardware_check.topology_warnings(KIMI_K25_INT4_TP8, [nvls], topology=lambda: topology)
    assert "leaves AllGather and AllReduce with no algorithm/protocol on a PCIe-only node" in warning
    assert warning.endswith("this profile's server cannot serve on this host")


@pytest.mark.parametrize("name", ["topo_4x_h100_nv6_nics.txt", "topo_2x_nv12_mlx5_tabs.txt"])
def test_ll128_on_nvlink_hosts_is_fine(name: str) -> None:
    topology = nvidia_smi.parse_topology(recorded(name))
    assert hardware_check.topology_warnings(KIMI_K25_INT4_TP8, [LL128_EVERYWHERE], topology=lambda: topology) == []


def test_without_a_topology_there_is_nothing_to_warn_about() -> None:
    def smi_fails() -> None:
        raise KimiperfError("nvidia-smi topo -m exited with 9: no driver")

    assert hardware_check.topology_warnings(KIMI_K25_INT4_TP8, [LL128_EVERYWHERE], topology=lambda: None) == []
    assert hardware_check.topology_warnings(KIMI_K25_INT4_TP8, [LL128_EVERYWHERE], topology=smi_fails) == []


def test_external_servers_and_cpu_deployments_ask_the_driver_nothing() -> None:
    assert hardware_check.hardware_problem(KIMI_K25_INT4_TP8, external=True, probe=never_asked) is None
    assert hardware_check.topology_warnings(
        KIMI_K25_INT4_TP8, [LL128_EVERYWHERE], external=True, topology=never_asked
    ) == []
    assert hardware_check.topology_warnings(TINY_CPU, [LL128_EVERYWHERE], topology=never_asked) == []


def test_module_does_not_import_pytest() -> None:
    code = "import sys, pytest_kimiperf.server.hardware_check; sys.exit('pytest' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=helpers.ROOT, timeout=60)
    assert done.returncode == 0
