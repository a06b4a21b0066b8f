"""NVML's host pids against ours, in real PID namespaces made with unshare(1) (root only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import psutil
import pytest

from pytest_kimiperf.server.pid_namespace import MAPPED, SAME, UNMAPPABLE, read_pid_view
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


def test_a_container_with_its_own_proc_cannot_map_and_says_the_bound_is_off() -> None:
    seen, _ = _in_new_pid_namespace("--mount-proc")
    assert seen["mode"] == UNMAPPABLE and seen["host_of_self"] == []
    assert "the bound on other GPU processes is off" in str(seen["note"])
