"""NVML's host pids against ours, in real PID namespaces made with unshare(1) (root only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pytest_kimiperf.server.pid_namespace import MAPPED, SAME, TRUSTED, UNMAPPABLE, read_pid_view
from tests.helpers import ROOT

# Run inside the namespace: what the view says, and which host pid it gives our own pid 1.
PROBE = """
import json, os
from pytest_kimiperf.server.pid_namespace import read_pid_view
view = read_pid_view()
print(json.dumps({"mode": view.mode, "pid": os.getpid(), "host_of_self": sorted(view.host_pids([os.getpid()])),
                  "note": view.note}), flush=True)
import sys; sys.stdin.read()  # stay alive until the test has looked at us from outside
"""


def _in_new_pid_namespace(*unshare_args: str) -> tuple[dict[str, object], set[int]]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("making a PID namespace needs root and unshare(1)")
    command = ["unshare", "--pid", "--fork", *unshare_args, sys.executable, "-c", PROBE]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        # The probe's host pid, seen from here while it waits: unshare's forked child.
        descendants = {p.pid for p in psutil.Process(child.pid).children(recursive=True)}
        child.communicate(timeout=60)
    if not line:
        pytest.skip(f"unshare could not make a PID namespace here (exit {child.returncode})")
    return json.loads(line), descendants


def test_in_the_hosts_namespace_nvmls_pids_are_ours() -> None:
    view = read_pid_view()
    if view.mode != SAME:
        pytest.skip("these tests run inside a container")
    assert view.local(12345) == 12345 and view.host_pids([1, 2]) == {1, 2} and view.note is None


def test_a_container_that_sees_the_hosts_proc_maps_host_pids_through_nspid() -> None:
    seen, descendants = _in_new_pid_namespace()
    assert seen["mode"] == MAPPED and seen["pid"] == 1
    (host_pid,) = seen["host_of_self"]  # type: ignore[misc]
    assert host_pid in descendants  # the pid NVML would report for it
    assert "mapped to ours through NSpid" in str(seen["note"])


def test_a_container_with_its_own_proc_and_no_gpu_process_names_nothing_and_says_what_still_sees() -> None:
    seen, _ = _in_new_pid_namespace("--mount-proc")
    # NVML reported nothing (no GPU here): nothing to name, and no bound turned off for it.
    assert seen["mode"] == TRUSTED and seen["host_of_self"] == []
    assert "device-level accounting" in str(seen["note"])


# /proc/<pid>/status as gVisor writes it (google/gvisor pkg/sentry/fsimpl/proc/task_files.go,
# statusData.Generate): Tgid and Pid in the sandbox's namespace, no NSpid line.
GVISOR_STATUS = ("Name:\tpython3\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\nTracerPid:\t0\n"
                 "FDSize:\t64\nVmSize:\t1024 kB\nVmRSS:\t512 kB\nVmData:\t256 kB\nThreads:\t4\n"
                 "CapInh:\t0000000000000000\nCapPrm:\t00000000a80425fb\nCapEff:\t00000000a80425fb\n"
                 "CapBnd:\t00000000a80425fb\nSeccomp:\t0\nMems_allowed:\t1\nMems_allowed_list:\t0\n")


def _gvisor_proc(root: Path, *, cuda_pids: list[int], other_pids: list[int]) -> Path:
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").write_text("")  # gVisor fakes the link's inode: not the host's
    (root / "self" / "status").write_text(GVISOR_STATUS.format(pid=1))
    for pid in [*cuda_pids, *other_pids]:
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "status").write_text(GVISOR_STATUS.format(pid=pid))
        (root / str(pid) / "fd" / "0").symlink_to("/dev/null")
        if pid in cuda_pids:
            (root / str(pid) / "fd" / "3").symlink_to("/dev/nvidiactl")
            (root / str(pid) / "fd" / "4").symlink_to("/dev/nvidia0")
    return root


def test_without_nspid_nvmls_pids_are_ours_where_each_holds_an_nvidia_device(tmp_path: Path) -> None:
    root = _gvisor_proc(tmp_path / "proc", cuda_pids=[7, 9], other_pids=[8])
    view = read_pid_view(root, nvml_pids=[7, 9])
    assert view.mode == TRUSTED and view.local(7) == 7 and view.host_pids([7, 8]) == {7}
    assert view.unnamed([7, 9]) == set()
    assert "no NSpid" in str(view.note) and "(2 of 2)" in str(view.note)


def test_without_nspid_a_pid_that_is_no_cuda_process_here_is_left_unnamed_not_the_others(tmp_path: Path) -> None:
    root = _gvisor_proc(tmp_path / "proc", cuda_pids=[7], other_pids=[8])
    # 8 is a process here without a device open; 4101 (the sandbox's host pid, say) is none at all.
    for reported, unnamed in (([7, 8], {8}), ([7, 4101], {4101})):
        view = read_pid_view(root, nvml_pids=reported)
        assert view.mode == TRUSTED and view.local(7) == 7 and view.local(unnamed.copy().pop()) is None
        assert view.unnamed(reported) == unnamed and "left unnamed" in str(view.note)


def test_without_nspid_and_no_reported_pid_held_here_the_bound_is_off(tmp_path: Path) -> None:
    root = _gvisor_proc(tmp_path / "proc", cuda_pids=[7], other_pids=[8])
    view = read_pid_view(root, nvml_pids=[4101, 4102])  # host pids from a driver of 550 or older
    assert view.mode == UNMAPPABLE and view.local(4101) is None and view.unnamed([4101]) == {4101}
    assert "the bound on other GPU processes is off" in str(view.note)


def _own_proc_container(root: Path, *, cuda_pids: list[int], other_pids: list[int]) -> Path:
    """/proc as a container with its own /proc mount shows it: NSpid has one entry, ns/pid is
    not the initial namespace's (proc(5))."""
    _gvisor_proc(root, cuda_pids=cuda_pids, other_pids=other_pids)
    for status in root.glob("*/status"):
        pid = status.parent.name
        status.write_text(status.read_text() + f"NSpid:\t{1 if pid == 'self' else pid}\n")
    return root


def test_a_container_with_its_own_proc_trusts_pids_the_open_driver_converted(tmp_path: Path) -> None:
    # Open kernel modules: pid_vnr() gives the pids of this namespace (os_find_ns_pid); a
    # Blackwell container reports its own pids, and another container's are dropped.
    root = _own_proc_container(tmp_path / "proc", cuda_pids=[12, 13], other_pids=[1])
    view = read_pid_view(root, nvml_pids=[12, 13])
    assert view.mode == TRUSTED and view.local_pids({12: 100, 13: 200}) == {12: 100, 13: 200}
    assert view.host_pids([12, 1]) == {12}


def test_a_container_with_its_own_proc_cannot_map_host_pids_of_an_old_driver(tmp_path: Path) -> None:
    root = _own_proc_container(tmp_path / "proc", cuda_pids=[12], other_pids=[1])
    view = read_pid_view(root, nvml_pids=[881234])
    assert view.mode == UNMAPPABLE and view.local_pids({881234: 100}) == {}


def test_a_sibling_namespaces_processes_seen_through_the_same_proc_are_not_mapped_to_ours(tmp_path: Path) -> None:
    # Two containers at the same depth, both seen through the host's /proc: each has a pid 1.
    # Namespaces are told apart by the inode of ns/pid; hard links give two files one inode.
    root = tmp_path / "proc"
    ours, theirs = tmp_path / "ns-ours", tmp_path / "ns-theirs"
    ours.write_text("")
    theirs.write_text("")
    for pid, ns, nspid in (("self", ours, "4242\t1"), ("4242", ours, "4242\t1"), ("4300", ours, "4300\t7"),
                           ("5151", theirs, "5151\t1")):
        (root / pid / "ns").mkdir(parents=True)
        os.link(ns, root / pid / "ns" / "pid")
        (root / pid / "status").write_text(f"Name:\tpython3\nPid:\t{nspid.split()[0]}\nNSpid:\t{nspid}\n")
    view = read_pid_view(root)
    assert view.mode == MAPPED
    assert view.host_pids([1]) == {4242} and view.host_pids([7]) == {4300}
    assert view.local(5151) is None


def test_a_container_seeing_an_ancestor_proc_trusts_pids_a_converting_driver_gives(tmp_path: Path) -> None:
    # The host's /proc seen from a container (NSpid "host local"), and a driver that already
    # converted: NVML reports 1 and 7, our namespace's pids; /proc/4242 and /proc/4300 hold them.
    root = tmp_path / "proc"
    ours = tmp_path / "ns-ours"
    ours.write_text("")
    for pid, nspid in (("self", "4242\t1"), ("4242", "4242\t1"), ("4300", "4300\t7"), ("4400", "4400\t9")):
        (root / pid / "ns").mkdir(parents=True)
        (root / pid / "fd").mkdir()
        os.link(ours, root / pid / "ns" / "pid")
        (root / pid / "status").write_text(f"Name:\tpython3\nPid:\t{nspid.split()[0]}\nNSpid:\t{nspid}\n")
        if pid in ("4242", "4300"):
            (root / pid / "fd" / "5").symlink_to("/dev/nvidia0")
    view = read_pid_view(root, nvml_pids=[1, 7])
    assert view.mode == TRUSTED and view.local(7) == 7 and view.host_pids([1, 7, 9]) == {1, 7}
    # The same /proc with host pids from an old driver: mapped through NSpid as before.
    assert read_pid_view(root, nvml_pids=[4242, 4300]).mode == MAPPED
