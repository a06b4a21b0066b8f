"""The nvidia-smi parsers on real recorded outputs (tests/data/gpu): topo -m, --query-gpu,
the CUDA version banner and --query-compute-apps."""

from __future__ import annotations

import pytest

from pytest_kimiperf.server import nvidia_smi
from tests import helpers

DATA = helpers.DATA / "gpu"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


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
        f"{i}, {name}, {uuid}, {mib.removesuffix(' MiB')}, {drv}, 5, 16, {mig}"
        for i, name, uuid, drv, mib, mig in rows
    )
    gpus = nvidia_smi.parse_query_gpu_csv(text)
    assert len(gpus) == 8 and gpus[7].memory_total_mib == 97887
    assert (gpus[7].pcie_gen, gpus[7].pcie_width) == (5, 16)
    assert gpus[7].mig_mode == "Enabled" and gpus[7].in_mig_mode


def test_mig_mode_is_read_from_the_recorded_query_and_n_a_means_no_mig() -> None:
    # The recorded 8x RTX PRO 6000 host had MIG on (a dynamic-MIG write-up, tests/data/gpu).
    gpus = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))
    assert {g.mig_mode for g in gpus} == {"Enabled"}
    (card,) = nvidia_smi.parse_query_gpu_csv("0, GeForce RTX 2080, 7979, 440.64, [N/A]",
                                              ("index", "name", "memory.total", "driver_version", "mig.mode.current"))
    assert card.mig_mode is None and not card.in_mig_mode


def test_parse_query_gpu_csv_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"lack \['memory.total'\]"):
        nvidia_smi.parse_query_gpu_csv("0, NVIDIA H100, 550.54.15", ("index", "name", "driver_version"))
    with pytest.raises(ValueError, match="row has 3 values for 8 fields"):
        nvidia_smi.parse_query_gpu_csv("0, 1, 2")
    with pytest.raises(ValueError, match=r"memory\.total is not reported"):
        nvidia_smi.parse_query_gpu_csv("0, NVIDIA H100, GPU-1, [N/A], 550.54.15, 5, 16, Disabled")


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
    # [N/A]: the pid holds a context of a size the driver does not say: unknown, not 0, and it
    # stays unknown summed with a GPU that does say.
    assert nvidia_smi.parse_compute_apps("12, [N/A]\n") == {12: None}
    assert nvidia_smi.parse_compute_apps("12, 300\n12, [N/A]\n13, 5\n") == {12: None, 13: 5}
    assert nvidia_smi.parse_compute_apps_by_gpu("GPU-a, 12, [N/A]\nGPU-b, 12, 300\n", ("gpu_uuid", "pid", "used_memory")) == [
        ("GPU-a", 12, None), ("GPU-b", 12, 300)]


def test_parse_compute_apps_process_name_with_commas() -> None:
    # A browser GPU process's name can hold commas; they belong to process_name, not new columns.
    text = (
        "pid, process_name, used_gpu_memory [MiB]\n4242, /opt/chrome --type=gpu-process --a=1,2,3, 120 MiB\n"
    )
    assert nvidia_smi.parse_compute_apps(text) == {4242: 120}


def test_parse_compute_apps_needs_pid_and_memory() -> None:
    with pytest.raises(ValueError, match="need pid and used_memory"):
        nvidia_smi.parse_compute_apps("1, python3", ("pid", "process_name"))


def test_parse_compute_apps_by_gpu_on_the_recorded_eight_gpu_host() -> None:
    """Per GPU (the first-boot check names holders by GPU): the recorded H200-class host, one
    process on each GPU, the last one in another pid namespace ([Not Found])."""
    rows = nvidia_smi.parse_compute_apps_by_gpu(recorded("compute_apps_8gpu_before_release.csv"), ())
    assert len(rows) == 8
    assert rows[0] == ("GPU-a44622e3-2296-6285-0a86-84d0f6c67900", 1328667, 130004)
    assert rows[-1] == ("GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72", 1758887, 58060)
    assert nvidia_smi.parse_compute_apps_by_gpu("No running processes found\n", ("gpu_uuid", "pid", "used_memory")) == []
    with pytest.raises(ValueError, match="need gpu_uuid, pid and used_memory"):
        nvidia_smi.parse_compute_apps_by_gpu("1, 2\n", ("pid", "used_memory"))
