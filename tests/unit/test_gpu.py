"""GPU discovery, nvidia-smi parsers and hardware checks, on real recorded nvidia-smi outputs."""

from __future__ import annotations

import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_kimiperf.server import gpu, nvidia_smi
from pytest_kimiperf.errors import ConfigError, HardwareMissingError, ServerError
from tests import helpers

DATA = helpers.DATA / "gpu"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def nvml_loads() -> bool:
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


needs_no_nvml = pytest.mark.skipif(
    nvml_loads(), reason="NVML works on this host: it answers before nvidia-smi"
)


# --------------------------------------------------------------------------- topo -m


@pytest.mark.parametrize(
    ("name", "gpu_count", "nvlink", "codes"),
    [
        ("topo_8x_rtx_pro_6000_sys.txt", 8, False, {"SYS"}),
        ("topo_4x_h100_nv6_nics.txt", 4, True, {"NV6"}),
        ("topo_2x_nv12_mlx5_tabs.txt", 2, True, {"NV12"}),
        ("topo_2x_rtx5090_phb_tabs.txt", 2, False, {"PHB"}),
        ("topo_2x_1080ti_phb_spaces.txt", 2, False, {"PHB"}),
    ],
)
def test_parse_topology_on_recorded_outputs(name: str, gpu_count: int, nvlink: bool, codes: set[str]) -> None:
    topology = nvidia_smi.parse_topology(recorded(name))
    assert topology.gpu_labels == tuple(f"GPU{i}" for i in range(gpu_count))
    assert topology.nvlink is nvlink
    assert topology.link_codes() == codes
    assert [row[i] for i, row in enumerate(topology.matrix)] == ["X"] * gpu_count
    assert all(len(row) == gpu_count for row in topology.matrix)


def test_topology_ignores_nic_columns_and_rows() -> None:
    # NIC0 is PHB to GPU1 on the RTX PRO host; it must not leak into the GPU matrix.
    topology = nvidia_smi.parse_topology(recorded("topo_8x_rtx_pro_6000_sys.txt"))
    assert topology.matrix[1] == ("SYS", "X", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS")
    assert topology.describe() == "PCIe only (SYS)"
    assert nvidia_smi.parse_topology(recorded("topo_4x_h100_nv6_nics.txt")).describe() == "NVLink (NV6)"


def test_topology_header_without_leading_whitespace() -> None:
    # vLLM's collect_env prints the matrix with the header's leading whitespace stripped.
    stripped = "\n".join(line.lstrip() for line in recorded("topo_4x_h100_nv6_nics.txt").splitlines())
    assert nvidia_smi.parse_topology(stripped) == nvidia_smi.parse_topology(recorded("topo_4x_h100_nv6_nics.txt"))


def test_topology_unknown_link_code_is_an_error_naming_it() -> None:
    text = recorded("topo_2x_rtx5090_phb_tabs.txt").replace("GPU1\tPHB", "GPU1\tC2C", 1)
    with pytest.raises(ValueError, match=r"unknown link code 'C2C' between GPU1 and GPU0"):
        nvidia_smi.parse_topology(text)


def test_topology_without_header_or_with_missing_rows() -> None:
    with pytest.raises(ValueError, match="no header row starting with GPU0"):
        nvidia_smi.parse_topology("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    text = "\n".join(
        line for line in recorded("topo_2x_rtx5090_phb_tabs.txt").splitlines() if not line.startswith("GPU1")
    )
    with pytest.raises(ValueError, match=r"names GPUs \['GPU0', 'GPU1'\] but rows are \['GPU0'\]"):
        nvidia_smi.parse_topology(text)


# --------------------------------------------------------------------------- --query-gpu


def test_parse_query_gpu_csv_with_header_and_units() -> None:
    gpus = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert {g.memory_total_mib for g in gpus} == {97887}
    assert {g.driver_version for g in gpus} == {"610.43.02"}
    assert gpus[0].uuid == "GPU-8b89b58e-b427-108d-ac50-06138d78fe78"
    # That query asked for no PCIe fields.
    assert gpus[0].pcie_gen is None and gpus[0].pcie_width is None


def test_parse_query_gpu_csv_noheader_nounits_with_caller_fields() -> None:
    fields = recorded("query_gpu_rtx2080_noheader_nounits.fields").strip().split(",")
    (card,) = nvidia_smi.parse_query_gpu_csv(
        recorded("query_gpu_rtx2080_noheader_nounits.csv"), fields, cuda_version="10.2"
    )
    assert card == nvidia_smi.GpuInfo(
        index=0,
        name="GeForce RTX 2080",
        uuid="GPU-22b2c6ac-2d49-4863-197c-9c469071178a",
        memory_total_mib=7979,
        driver_version="440.64",
        cuda_version="10.2",
        pcie_gen=None,
        pcie_width=8,
    )


def test_parse_query_gpu_csv_default_fields_without_header() -> None:
    # The same rows as the fallback query prints them (csv,noheader,nounits; our field order).
    rows = [line.split(", ") for line in recorded("query_gpu_8x_rtx_pro_6000.csv").splitlines()[1:]]
    text = "\n".join(
        f"{i}, {name}, {uuid}, {mib.removesuffix(' MiB')}, {drv}, 5, 16"
        for i, name, uuid, drv, mib, _ in rows
    )
    gpus = nvidia_smi.parse_query_gpu_csv(text)
    assert len(gpus) == 8 and gpus[7].memory_total_mib == 97887
    assert (gpus[7].pcie_gen, gpus[7].pcie_width) == (5, 16)


def test_parse_query_gpu_csv_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"lack \['memory.total'\]"):
        nvidia_smi.parse_query_gpu_csv("0, NVIDIA H100, 550.54.15", ("index", "name", "driver_version"))
    with pytest.raises(ValueError, match="row has 3 values for 7 fields"):
        nvidia_smi.parse_query_gpu_csv("0, 1, 2")
    with pytest.raises(ValueError, match=r"memory\.total is not reported"):
        nvidia_smi.parse_query_gpu_csv("0, NVIDIA H100, GPU-1, [N/A], 550.54.15, 5, 16")


def test_parse_cuda_version_from_banner_and_query_log() -> None:
    assert nvidia_smi.parse_cuda_version(recorded("smi_header_535.txt")) == "12.2"
    # `-q` on a host where no CUDA driver is visible says "Not Found": not a version.
    assert nvidia_smi.parse_cuda_version(recorded("smi_q_cuda_not_found.txt")) is None
    assert nvidia_smi.parse_cuda_version("") is None


# --------------------------------------------------------------------------- --query-compute-apps


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("compute_apps_pid_used_memory.csv", {2624394: 164, 3664501: 2804}),
        ("compute_apps_vllm_enginecore.csv", {3858903: 6265, 3880364: 5530}),
        ("compute_apps_header_only.csv", {}),
        (
            "compute_apps_8gpu_after_release.csv",
            {1328667: 130004, 1328668: 130044, 1328669: 129984, 1758887: 58060},
        ),
    ],
)
def test_parse_compute_apps_on_recorded_outputs(name: str, expected: dict[int, int]) -> None:
    assert nvidia_smi.parse_compute_apps(recorded(name)) == expected


def test_parse_compute_apps_noheader_nounits_and_summing() -> None:
    # csv,noheader,nounits of the default query; a pid on two GPUs (one context each) is summed.
    assert nvidia_smi.parse_compute_apps("3858903, 6265\n3880364, 5530\n3858903, 100\n") == {
        3858903: 6365,
        3880364: 5530,
    }
    assert nvidia_smi.parse_compute_apps("") == {}
    assert nvidia_smi.parse_compute_apps("12, [N/A]\n") == {12: 0}


def test_parse_compute_apps_process_name_with_commas() -> None:
    # A browser GPU process's name can hold commas; they belong to process_name, not new columns.
    text = (
        "pid, process_name, used_gpu_memory [MiB]\n4242, /opt/chrome --type=gpu-process --a=1,2,3, 120 MiB\n"
    )
    assert nvidia_smi.parse_compute_apps(text) == {4242: 120}


def test_parse_compute_apps_needs_pid_and_memory() -> None:
    with pytest.raises(ValueError, match="need pid and used_memory"):
        nvidia_smi.parse_compute_apps("1, python3", ("pid", "process_name"))


# --------------------------------------------------------------------------- hardware check


KIMI = gpu.HardwareRequirement(gpu_count=8, gpu_name_contains="RTX PRO 6000", min_memory_mib=90000)


def test_check_hardware_accepts_the_recorded_production_host() -> None:
    gpu.check_hardware(
        KIMI, nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv")), deployment="kimi-k2.5"
    )


def test_check_hardware_without_gpus_says_why_and_the_way_out() -> None:
    with pytest.raises(HardwareMissingError) as caught:
        gpu.check_hardware(
            KIMI,
            [],
            deployment="kimi-k2.5",
            unavailable_reason="NVML: NVML Shared Library Not Found; nvidia-smi not found on PATH",
        )
    assert str(caught.value) == (
        "deployment 'kimi-k2.5' needs 8x NVIDIA GPU whose name contains 'RTX PRO 6000' with at least "
        "90000 MiB each; found no NVIDIA GPU (NVML: NVML Shared Library Not Found; nvidia-smi not found "
        "on PATH). Run here with --deployment tiny-cpu, or on a host that has those GPUs."
    )


def test_check_hardware_names_what_was_found() -> None:
    fields = recorded("query_gpu_rtx2080_noheader_nounits.fields").strip().split(",")
    card = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_rtx2080_noheader_nounits.csv"), fields)
    with pytest.raises(
        HardwareMissingError, match=r"found 1x GeForce RTX 2080 \(7979 MiB\), of which 0 qualify\."
    ):
        gpu.check_hardware(KIMI, card, deployment="kimi-k2.5")
    seven = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))[:7]
    with pytest.raises(
        HardwareMissingError, match=r"found 7x NVIDIA RTX PRO 6000 Blackwell Server Edition \(97887 MiB\)\."
    ):
        gpu.check_hardware(KIMI, seven, deployment="kimi-k2.5")


def test_cpu_deployment_needs_nothing() -> None:
    gpu.check_hardware(gpu.HardwareRequirement(gpu_count=0), [], deployment="tiny-cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_count": -1}, "gpu_count must be an integer >= 0, got -1"),
        ({"gpu_count": True}, "gpu_count must be an integer >= 0, got True"),
        ({"gpu_count": 8, "min_memory_mib": 0}, "min_memory_mib must be a positive integer or None, got 0"),
        (
            {"gpu_count": 8, "gpu_name_contains": " "},
            "gpu_name_contains must be a non-empty string or None, got ' '",
        ),
    ],
)
def test_hardware_requirement_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        gpu.HardwareRequirement(**kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- live queries


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A PATH holding only what the test puts there (and nothing named nvidia-smi by default)."""
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))
    yield directory


CAT, SLEEP = shutil.which("cat"), shutil.which("sleep")


def install_nvidia_smi(directory: Path, script: str) -> Path:
    """Stand in for nvidia-smi, which cannot run on a host without the driver (PATH is only ``directory``)."""
    path = directory / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + script.replace("cat ", f"{CAT} ").replace("sleep ", f"{SLEEP} "))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@needs_no_nvml
def test_no_gpu_host_answers_empty_and_fast(bin_dir: Path) -> None:
    started = time.monotonic()
    probe = gpu.probe_gpus()
    assert probe.gpus == () and probe.source == "none"
    assert "nvidia-smi not found on PATH" in probe.notes
    assert gpu.query_gpus() == []
    assert gpu.gpu_memory_by_pid() == {}
    assert gpu.query_topology() is None
    assert time.monotonic() - started < 1.0


@needs_no_nvml
def test_nvidia_smi_fallback_runs_the_query_and_reads_cuda(bin_dir: Path) -> None:
    rows = [line.split(", ") for line in recorded("query_gpu_8x_rtx_pro_6000.csv").splitlines()[1:]]
    (bin_dir / "query.csv").write_text(
        "".join(
            f"{i}, {name}, {uuid}, {mib.removesuffix(' MiB')}, {drv}, 5, 16\n"
            for i, name, uuid, drv, mib, _ in rows
        )
    )
    (bin_dir / "banner.txt").write_text(recorded("smi_header_535.txt"))
    install_nvidia_smi(
        bin_dir,
        f'echo "$@" >> {bin_dir}/calls\n'
        f'case "$1" in\n'
        f"  --query-gpu=*) cat {bin_dir}/query.csv ;;\n"
        f'  "") cat {bin_dir}/banner.txt ;;\n'
        f"  *) exit 2 ;;\n"
        f"esac\n",
    )
    probe = gpu.probe_gpus()
    assert probe.source == "nvidia-smi" and len(probe.gpus) == 8
    assert probe.gpus[3].cuda_version == "12.2" and probe.gpus[3].pcie_gen == 5
    calls = (bin_dir / "calls").read_text().splitlines()
    assert calls[0] == f"--query-gpu={','.join(nvidia_smi.QUERY_GPU_FIELDS)} --format=csv,noheader,nounits"


@needs_no_nvml
def test_nvidia_smi_without_driver_is_reported_not_raised(bin_dir: Path) -> None:
    install_nvidia_smi(
        bin_dir,
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        'Make sure that the latest NVIDIA driver is installed and running."\nexit 9\n',
    )
    probe = gpu.probe_gpus()
    assert probe.gpus == ()
    assert "exited with 9: NVIDIA-SMI has failed because it couldn't communicate" in probe.absence_reason()
    with pytest.raises(ServerError, match="cannot read GPU memory per process"):
        gpu.gpu_memory_by_pid()


@needs_no_nvml
def test_hanging_nvidia_smi_is_cut_off(bin_dir: Path) -> None:
    install_nvidia_smi(bin_dir, "exec sleep 30\n")
    started = time.monotonic()
    probe = gpu.probe_gpus(timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert probe.gpus == () and "did not answer within 0.3 s" in probe.absence_reason()


# --------------------------------------------------------------------------- waiting for memory


def scripted_probe(*answers: dict[int, int]) -> Callable[[], dict[int, int]]:
    """A probe that replays recorded snapshots, then repeats the last one."""
    queue = list(answers)

    def probe() -> dict[int, int]:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return probe


def test_wait_gpu_memory_freed_returns_once_the_pids_are_gone() -> None:
    before = nvidia_smi.parse_compute_apps(recorded("compute_apps_8gpu_before_release.csv"))
    after = nvidia_smi.parse_compute_apps(recorded("compute_apps_8gpu_after_release.csv"))
    released = [1425258, 1425259, 1425260, 1425261]
    gpu.wait_gpu_memory_freed(
        released, deadline_s=5, poll_s=0.01, probe=scripted_probe(before, before, after)
    )


def test_wait_gpu_memory_freed_names_the_holders_at_the_deadline() -> None:
    after = nvidia_smi.parse_compute_apps(recorded("compute_apps_8gpu_after_release.csv"))
    started = time.monotonic()
    with pytest.raises(ServerError) as caught:
        gpu.wait_gpu_memory_freed(
            [1328667, 1758887, 99], deadline_s=0.2, poll_s=0.05, probe=scripted_probe(after)
        )
    assert 0.2 <= time.monotonic() - started < 2
    assert "pid 1328667 (130004 MiB), pid 1758887 (58060 MiB)" in str(caught.value)
    assert "pid 99" not in str(caught.value)


def test_wait_gpu_memory_freed_rejects_bad_timing() -> None:
    with pytest.raises(ValueError, match="deadline_s must be >= 0"):
        gpu.wait_gpu_memory_freed([1], deadline_s=-1, probe=dict)
