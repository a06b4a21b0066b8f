"""GPU discovery (NVML, else nvidia-smi), the hardware requirement and waiting for GPU memory,
on real recorded nvidia-smi outputs and a stand-in nvidia-smi."""

from __future__ import annotations

import dataclasses

import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_kimiperf.server import gpu, gpu_memory, nvidia_smi
from pytest_kimiperf.errors import ConfigError, HardwareMissingError, KimiperfError, ServerError
from tests import helpers

DATA = helpers.DATA / "gpu"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


needs_no_nvml = pytest.mark.skipif(
    helpers.nvml_loads(), reason="NVML works on this host: it answers before nvidia-smi"
)


# --------------------------------------------------------------------------- hardware check


KIMI = gpu.HardwareRequirement(gpu_count=8, gpu_name_contains="RTX PRO 6000", min_memory_mib=90000)


def whole_gpus() -> list[nvidia_smi.GpuInfo]:
    """The recorded 8x RTX PRO 6000 host with MIG off: it was recorded in MIG mode (a dynamic-MIG
    write-up), where CUDA sees no whole GPU (test_check_hardware_says_mig_mode_keeps_the_gpus)."""
    gpus = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))
    return [dataclasses.replace(g, mig_mode="Disabled") for g in gpus]


def test_check_hardware_accepts_the_recorded_production_host_with_mig_off() -> None:
    gpu.check_hardware(KIMI, whole_gpus(), deployment="kimi-k2.5")


def test_check_hardware_says_mig_mode_keeps_the_gpus() -> None:
    recorded_host = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_8x_rtx_pro_6000.csv"))
    with pytest.raises(HardwareMissingError) as caught:
        gpu.check_hardware(KIMI, recorded_host, deployment="kimi-k2.5")
    message = str(caught.value)
    assert "8 of the matching GPUs (index 0,1,2,3,4,5,6,7: NVIDIA RTX PRO 6000 Blackwell Server Edition) " \
           "are in MIG mode (mig.mode.current = Enabled), which leaves 0 whole GPU(s)" in message
    assert "sudo nvidia-smi -i 0,1,2,3,4,5,6,7 -mig 0" in message
    # One GPU in MIG mode beside eight whole ones: the eight are enough.
    gpu.check_hardware(KIMI, [*whole_gpus(), dataclasses.replace(recorded_host[0], index=8)], deployment="kimi-k2.5")


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
        "on PATH). Run here with --kimiperf-deployment tiny-cpu, or on a host that has those GPUs (a deployment that runs "
        "on the CPU says gpu_count = 0; unless given, gpu_count follows its parallel layout)."
    )


def test_check_hardware_names_what_was_found() -> None:
    fields = recorded("query_gpu_rtx2080_noheader_nounits.fields").strip().split(",")
    card = nvidia_smi.parse_query_gpu_csv(recorded("query_gpu_rtx2080_noheader_nounits.csv"), fields)
    with pytest.raises(
        HardwareMissingError, match=r"found 1x GeForce RTX 2080 \(7979 MiB\), of which 0 qualify\."
    ):
        gpu.check_hardware(KIMI, card, deployment="kimi-k2.5")
    seven = whole_gpus()[:7]
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
def test_no_gpu_host_answers_empty_without_running_anything(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fast because nothing is started that could hang: no process, so no timeout to wait out.
    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a host without nvidia-smi ran {args[:1]}")

    monkeypatch.setattr(subprocess, "run", no_process)
    monkeypatch.setattr(subprocess, "Popen", no_process)
    probe = gpu.probe_gpus()
    assert probe.gpus == () and probe.source == "none"
    assert "nvidia-smi not found on PATH" in probe.notes
    assert gpu.query_gpus() == []
    assert gpu_memory.gpu_memory_by_pid() == {}
    assert gpu.query_topology() is None


@needs_no_nvml
def test_nvidia_smi_fallback_runs_the_query_and_reads_cuda(bin_dir: Path) -> None:
    rows = [line.split(", ") for line in recorded("query_gpu_8x_rtx_pro_6000.csv").splitlines()[1:]]
    (bin_dir / "query.csv").write_text(
        "".join(
            f"{i}, {name}, {uuid}, {mib.removesuffix(' MiB')}, {drv}, 5, 16, {mig}\n"
            for i, name, uuid, drv, mib, mig in rows
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
        gpu_memory.gpu_memory_by_pid()


@needs_no_nvml
def test_hanging_nvidia_smi_is_cut_off(bin_dir: Path) -> None:
    # Cut off, not waited out: a finished sleep would print nothing and exit 0, not this reason.
    install_nvidia_smi(bin_dir, "exec sleep 600\n")
    probe = gpu.probe_gpus(timeout_s=0.3)
    assert probe.gpus == () and "did not answer within 0.3 s" in probe.absence_reason()


@needs_no_nvml
def test_ask_driver_says_why_neither_source_answered(bin_dir: Path) -> None:
    answer = gpu.ask_driver(lambda pynvml: 1, lambda smi: 2)
    assert answer.value is None and answer.source == "none" and not answer.smi_on_path
    assert answer.notes[-1] == "nvidia-smi not found on PATH"
    assert all(note.startswith("NVML: ") for note in answer.notes[:-1])


@needs_no_nvml
def test_ask_driver_gives_nvidia_smi_its_path_and_keeps_its_error(bin_dir: Path) -> None:
    smi = install_nvidia_smi(bin_dir, "exit 0\n")
    answer = gpu.ask_driver(lambda pynvml: "nvml", lambda path: path)
    assert (answer.value, answer.source, answer.smi_note, answer.smi_on_path) == (str(smi), "nvidia-smi", None, True)
    assert answer.notes == answer.nvml_notes  # why NVML did not answer, nothing about nvidia-smi

    def failing(path: str) -> str:
        raise KimiperfError(f"{path} exited with 9: no driver")

    answer = gpu.ask_driver(lambda pynvml: "nvml", failing)
    assert answer.value is None and answer.source == "none" and answer.smi_on_path
    assert answer.smi_note == f"{smi} exited with 9: no driver" and answer.notes[-1] == answer.smi_note


@needs_no_nvml
@pytest.mark.parametrize("exit_code", [0, 255])
def test_a_topology_nvidia_smi_cannot_draw_leaves_the_fingerprint_unknown_not_crashed(
    bin_dir: Path, exit_code: int
) -> None:
    # gVisor without PCI sysfs: the header, then "Failed to run topology matrix"
    # (google/gvisor#14407); the exit code was not published, so both are tried.
    (bin_dir / "topo.txt").write_text(recorded("topo_8x_gvisor_failed.txt"))
    (bin_dir / "query.csv").write_text("".join(f"{i}, NVIDIA H200, GPU-{i}, 143771, 580.95.05, 5, 16, Disabled\n"
                                               for i in range(2)))
    install_nvidia_smi(
        bin_dir,
        f'case "$1" in\n'
        f"  --query-gpu=*) cat {bin_dir}/query.csv ;;\n"
        f"  topo) cat {bin_dir}/topo.txt; exit {exit_code} ;;\n"
        f'  "") exit 0 ;;\n'
        f"esac\n",
    )
    with pytest.raises(KimiperfError, match="topo -m"):
        gpu.query_topology()
    probe = gpu.probe_gpus()
    topology, why_not = gpu.host_topology(probe.gpus)
    assert topology is None and why_not is not None and "topo -m" in why_not
    assert gpu.host_topology(()) == (None, None)  # no GPU: nothing asked

    from pytest_kimiperf import node_agent

    facts = node_agent.facts()
    assert facts["hard"]["gpu.count"] == "2" and facts["hard"]["gpu.interconnect"] == "unknown"
    assert "topo -m" in facts["soft"]["gpu.topology"]


@pytest.mark.parametrize(
    ("visible", "count", "indices"),
    [
        (None, 2, (0, 1)),  # unset: NVML's first GPUs
        ("6,7", 2, (6, 7)),  # a runner that lends GPUs 6 and 7
        ("3,1,5", 2, (3, 1)),  # CUDA's order is the list's; the server takes the first count
        ("", 2, ()),  # an empty value hides every GPU
        ("2,-1,4", 2, (2,)),  # the list ends at the first entry that names no device
        ("MIG-1a2b,0", 1, ()),
    ],
)
def test_the_watched_gpus_are_the_ones_cuda_visible_devices_gives_the_server(
    visible: str | None, count: int, indices: tuple[int, ...]
) -> None:
    assert gpu.visible_nvml_indices(visible, count, gpus=whole_gpus) == indices


def test_cuda_visible_devices_by_uuid_or_unique_prefix_maps_to_nvml_indices() -> None:
    gpus = whole_gpus()
    full, prefix = gpus[5].uuid, (gpus[2].uuid or "")[:12]
    assert full is not None and sum(1 for g in gpus if (g.uuid or "").startswith(prefix)) == 1
    assert gpu.visible_nvml_indices(f"{full},{prefix}", 2, gpus=lambda: gpus) == (5, 2)
    assert gpu.visible_nvml_indices("GPU-,3", 2, gpus=lambda: gpus) == ()  # "GPU-" matches all: ambiguous
    asked: list[int] = []
    gpu.visible_nvml_indices("1,2", 2, gpus=lambda: asked.append(1) or gpus)
    assert asked == []  # indices need no probe


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
    assert set(released) <= set(before) and not set(released) & set(after)  # the recordings show it
    snapshots = [before, before, after]
    polled: list[dict[int, int]] = []

    def probe() -> dict[int, int]:
        polled.append(snapshots[min(len(polled), len(snapshots) - 1)])
        return polled[-1]

    gpu_memory.wait_gpu_memory_freed(released, deadline_s=5, poll_s=0.01, probe=probe)
    assert polled == snapshots  # it polled while the pids held memory, and stopped at the first free read


def test_wait_gpu_memory_freed_names_the_holders_at_the_deadline() -> None:
    after = nvidia_smi.parse_compute_apps(recorded("compute_apps_8gpu_after_release.csv"))
    started = time.monotonic()
    with pytest.raises(ServerError) as caught:
        gpu_memory.wait_gpu_memory_freed(
            [1328667, 1758887, 99], deadline_s=0.2, poll_s=0.05, probe=scripted_probe(after)
        )
    assert time.monotonic() - started >= 0.2  # the deadline was waited for; the raise shows it ended
    assert "pid 1328667 (130004 MiB), pid 1758887 (58060 MiB)" in str(caught.value)
    assert "pid 99" not in str(caught.value)



def test_a_holder_nvml_gives_no_figure_for_is_waited_for_and_named_without_a_size() -> None:
    # [N/A] in nvidia-smi (NVML_VALUE_NOT_AVAILABLE): still a holder, of a size nobody knows.
    with pytest.raises(ServerError, match=r"still held 0.1 s after stopping the server: pid 42 \(memory not reported "
                       r"by NVML\)"):
        gpu_memory.wait_gpu_memory_freed([42], deadline_s=0.1, poll_s=0.05, probe=lambda: {42: None})


def test_wait_gpu_memory_freed_rejects_bad_timing() -> None:
    with pytest.raises(ValueError, match="deadline_s must be >= 0"):
        gpu_memory.wait_gpu_memory_freed([1], deadline_s=-1, probe=dict)


def test_wait_gpu_memory_freed_does_not_take_nothing_named_for_freed() -> None:
    # A container where NVML's pids cannot be matched: the per-process view never names the
    # stopped server's pids. Each GPU's used memory (recorded figures) falls, then holds still.
    falling = [{0: 13395, 1: 3}, {0: 6000, 1: 3}, {0: 3, 1: 3}, {0: 3, 1: 3}, {0: 3, 1: 3}]
    read: list[dict[int, int]] = []
    devices = scripted_probe(*falling)
    gpu_memory.wait_gpu_memory_freed([1425258], deadline_s=5, poll_s=0.01, probe=dict,
                                     devices=lambda: read.append(devices()) or read[-1])
    assert read == falling  # it kept reading until the figure held for SETTLED_POLLS reads
    assert gpu_memory.SETTLED_POLLS == 3


def test_wait_gpu_memory_freed_holds_each_gpu_to_its_figure_before_the_first_boot() -> None:
    before = {0: 3, 1: 3}
    # GPU 0 is back; GPU 1 keeps 2048 MiB that no process list names (another container, a leak).
    with pytest.raises(ServerError) as caught:
        gpu_memory.wait_gpu_memory_freed([], deadline_s=0.1, poll_s=0.02, probe=dict, before_mib=before,
                                         devices=scripted_probe({0: 13395, 1: 2051}, {0: 3, 1: 2051}))
    assert "GPU 1: 2051 MiB used, 3 MiB before the first boot, ours 0 MiB: 2048 MiB unexplained" in str(caught.value)
    assert "GPU 0" not in str(caught.value)
    gpu_memory.wait_gpu_memory_freed([], deadline_s=1, poll_s=0.01, probe=dict, before_mib=before,
                                     devices=scripted_probe({0: 13395, 1: 3}, {0: 3 + 200, 1: 3}))


def test_unexplained_memory_counts_ours_and_a_tolerance() -> None:
    before = {0: 3, 1: 3}
    now = nvidia_smi.parse_memory_used_csv(recorded("memory_used_2gpu_one_busy.csv"))
    assert now == {0: 13395, 1: 3}
    assert [a.index for a in gpu_memory.unexplained_memory(before, now)] == [0]  # type: ignore[arg-type]
    assert gpu_memory.unexplained_memory(before, now, ours={0: 13392}) == []  # type: ignore[arg-type]
    assert gpu_memory.unexplained_memory(before, {0: 3 + 256, 1: 3}) == []  # within the tolerance


def test_memory_used_reads_both_csv_forms_and_leaves_unified_memory_out() -> None:
    assert nvidia_smi.parse_memory_used_csv("0, 13395\n1, 3\n") == {0: 13395, 1: 3}
    assert nvidia_smi.parse_memory_used_csv(recorded("memory_used_unified_na.csv")) == {0: None}
    with pytest.raises(ValueError, match="expected 'index, MiB'"):
        nvidia_smi.parse_memory_used_csv("0\n")


@needs_no_nvml
def test_gpu_memory_used_asks_nvidia_smi_per_gpu(bin_dir: Path) -> None:
    (bin_dir / "used.csv").write_text(recorded("memory_used_2gpu_one_busy.csv") + recorded("memory_used_unified_na.csv")
                                      .splitlines()[1].replace("0,", "2,") + "\n")
    install_nvidia_smi(bin_dir, f'echo "$@" >> {bin_dir}/calls\ncat {bin_dir}/used.csv\n')
    assert gpu_memory.gpu_memory_used_mib() == {0: 13395, 1: 3}  # GPU 2 says [N/A]: left out
    assert (bin_dir / "calls").read_text().split() == ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
