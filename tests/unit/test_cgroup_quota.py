"""The CPU quota: its files read on recordings (v1 and v2), and a real quota throttling a process.

The recordings are in tests/data/cgroup (its README says how each was made); the real test makes a
cgroup held to half a CPU where this host lets it (root, a writable cpu controller) and skips,
saying why, where not.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_kimiperf.config.deployments import HostBounds
from pytest_kimiperf.measure.cgroup_quota import (
    CgroupDir,
    CgroupLevel,
    CpuStat,
    Quota,
    QuotaWatch,
    QuotaWindow,
    cpu_cgroup_dirs,
    parse_cpu_max,
    parse_cpu_stat,
    parse_quota_v1,
    quota_in_force,
    read_quota_in_force,
)
from pytest_kimiperf.measure.hostwatch import HostReading, HostWatch
from pytest_kimiperf.measure.invalid_causes import InvalidCause, advice
from pytest_kimiperf.measure.runner import cause_of, host_busy
from pytest_kimiperf.reports.sentences import say_invalid
from tests import helpers

DATA = helpers.DATA / "cgroup"
HALF_V1, HALF_V2, HOST = DATA / "v1_half_core", DATA / "v2_half_core", DATA / "host_v1_root"


def text(path: Path) -> str:
    return path.read_text()


# --------------------------------------------------------------------------- the files


def test_v1_counters_read_throttled_time_in_nanoseconds() -> None:
    start = parse_cpu_stat(text(HALF_V1 / "cpu.stat.start"), version=1)
    stop = parse_cpu_stat(text(HALF_V1 / "cpu.stat.stop"), version=1)
    assert start == CpuStat(nr_periods=5, nr_throttled=1, throttled_us=6030.879)
    assert stop == CpuStat(nr_periods=26, nr_throttled=10, throttled_us=20103.299)
    assert parse_cpu_stat(text(HOST / "cpu.stat"), version=1) == CpuStat(0, 0, 0.0)


def test_v2_counters_read_throttled_usec_and_a_cgroup_without_the_cpu_controller_has_none() -> None:
    assert parse_cpu_stat(text(HALF_V2 / "cpu.stat.stop"), version=2) == CpuStat(26, 10, 20103.0)
    assert parse_cpu_stat(text(DATA / "v2_no_cpu_controller" / "cpu.stat"), version=2) is None


def test_quotas_read_as_cpus_and_no_quota_reads_none() -> None:
    half = parse_quota_v1(text(HALF_V1 / "cpu.cfs_quota_us"), text(HALF_V1 / "cpu.cfs_period_us"))
    assert half == Quota(50_000, 100_000) and half.cpus == 0.5
    assert parse_quota_v1(text(HOST / "cpu.cfs_quota_us"), text(HOST / "cpu.cfs_period_us")) is None  # -1
    assert parse_cpu_max(text(HALF_V2 / "cpu.max")) == Quota(50_000, 100_000)
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("150000 100000\n").cpus == 1.5


def test_a_process_cgroup_and_its_ancestors_are_found_through_the_mounts() -> None:
    mounts = text(HOST / "proc_pid_mountinfo")
    # This host: cgroup v1's cpu controller at /sys/fs/cgroup/cpu beside a v2 hierarchy without it.
    assert cpu_cgroup_dirs(text(HOST / "proc_pid_cgroup"), mounts) == (CgroupDir(1, "/", "/sys/fs/cgroup/cpu"),)
    assert cpu_cgroup_dirs(text(HALF_V1 / "proc_pid_cgroup"), mounts) == (
        CgroupDir(1, "/kimiperf-record-17870", "/sys/fs/cgroup/cpu/kimiperf-record-17870"),
        CgroupDir(1, "/", "/sys/fs/cgroup/cpu"))
    assert [d.name for d in cpu_cgroup_dirs(text(HALF_V2 / "proc_pid_cgroup"), text(HALF_V2 / "proc_pid_mountinfo"))] \
        == ["/kimiperf.slice/run-1.scope", "/kimiperf.slice", "/"]
    # A container that mounts only its own part of the hierarchy (mount root /docker/abc).
    container = "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n"
    assert cpu_cgroup_dirs("4:cpu,cpuacct:/docker/abc/run\n", container) == (
        CgroupDir(1, "/docker/abc/run", "/sys/fs/cgroup/cpu/run"), CgroupDir(1, "/docker/abc", "/sys/fs/cgroup/cpu"))
    assert cpu_cgroup_dirs("4:cpu,cpuacct:/elsewhere\n", container) == ()
    assert cpu_cgroup_dirs("1:cpu:/\n", "") == ()


def test_the_quota_in_force_is_the_tightest_on_the_way_up() -> None:
    inner, outer = CgroupDir(2, "/a/b", "/x/a/b"), CgroupDir(2, "/a", "/x/a")
    levels = [CgroupLevel(inner, Quota(150_000, 100_000), None), CgroupLevel(outer, Quota(50_000, 100_000), None)]
    in_force = quota_in_force(levels)
    assert in_force.quota == Quota(50_000, 100_000) and in_force.cgroup == "/a"
    assert in_force.describe() == ("CPU quota: the CPU quota of 0.5 CPU on cgroup /a (v2: cpu.max 50000 100000) "
                                   "holds this run; a measured window it throttles is INVALID")
    assert quota_in_force([CgroupLevel(inner, None, None)]).describe() == "CPU quota: none on cgroup v2 /a/b or above it"
    assert quota_in_force([]).describe().startswith("CPU quota: not known")


@pytest.fixture
def recorded_hierarchy(tmp_path: Path) -> Path:
    """A /proc and a cgroup v1 tree under ``tmp_path`` holding the recorded half-core cgroup, at
    its first reading: the client (pid 100) and the server (pid 200) in it."""
    cgroup = tmp_path / "cg" / "kimiperf-record-17870"
    cgroup.mkdir(parents=True)
    for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"):
        shutil.copy(HALF_V1 / name, cgroup / name)
    shutil.copy(HALF_V1 / "cpu.stat.start", cgroup / "cpu.stat")
    for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.stat"):
        shutil.copy(HOST / name, tmp_path / "cg" / name)
    for pid in ("100", "200"):
        (tmp_path / "proc" / pid).mkdir(parents=True)
        shutil.copy(HALF_V1 / "proc_pid_cgroup", tmp_path / "proc" / pid / "cgroup")
    (tmp_path / "proc" / "self").mkdir()
    (tmp_path / "proc" / "self" / "mountinfo").write_text(f"32 31 0:29 / {tmp_path / 'cg'} rw - cgroup cgroup rw,cpu\n")
    return tmp_path


def test_a_window_counts_what_the_quota_throttled_in_it(recorded_hierarchy: Path) -> None:
    clock = iter([0.0, 2.0])
    watch = QuotaWatch(lambda: [100, 200], client=lambda: [100], proc_root=str(recorded_hierarchy / "proc"),
                       clock=lambda: next(clock))
    watch.start()
    shutil.copy(HALF_V1 / "cpu.stat.stop", recorded_hierarchy / "cg" / "kimiperf-record-17870" / "cpu.stat")
    (window,) = watch.stop()  # the root level has no quota: only the half-core cgroup counts
    assert window == QuotaWindow(cgroup="/kimiperf-record-17870", version=1, whose="the client and the server",
                                 quota_us=50_000, period_us=100_000, nr_throttled=9,
                                 throttled_ms=pytest.approx(14.07242), wall_s=2.0)
    assert window.describe() == (
        "the CPU quota of 0.5 CPU on cgroup /kimiperf-record-17870 (v1: cpu.cfs_quota_us 50000 per cpu.cfs_period_us "
        "100000), which holds the client and the server, throttled them in 9 period(s) for 14 ms of the 2.0 s window")


def test_a_throttled_window_is_invalid_naming_the_quota_and_a_quiet_one_says_the_quota_held(
        recorded_hierarchy: Path) -> None:
    throttled = QuotaWindow("/kimiperf-record-17870", 1, "the client", 50_000, 100_000, 9, 14.1, 2.0)
    reading = HostReading(wall_s=2.0, cpu_count=2, foreign_cpu_share=0.01, steal_share=0.0, psi={}, top_foreign=(),
                          cpu_quota=(throttled,))
    bounds = HostBounds()
    busy = host_busy([reading], bounds, attempts=3)
    assert busy is not None and not reading.busy(bounds)
    assert say_invalid(busy) == (
        "CPU quota: the CPU quota of 0.5 CPU on cgroup /kimiperf-record-17870 (v1: cpu.cfs_quota_us 50000 per "
        "cpu.cfs_period_us 100000), which holds the client, throttled them in 9 period(s) for 14 ms of the 2.0 s "
        "window; measured 3 times, throttled every time: no verdict from a run its CPU quota held back")
    # A quota is a cause of its own: its advice is to raise it, never to retry under the same quota.
    assert cause_of(busy) is InvalidCause.CPU_QUOTA
    assert advice(InvalidCause.CPU_QUOTA).startswith("raise the CPU quota (a container's CPU limit) or measure a lighter")
    # Busy and throttled: both named, the busy host's ending.
    both = HostReading(wall_s=2.0, cpu_count=2, foreign_cpu_share=0.5, steal_share=0.0, psi={}, top_foreign=(),
                       cpu_quota=(throttled,))
    said = say_invalid(host_busy([both], bounds, attempts=3))  # type: ignore[arg-type]
    assert said.startswith("host busy: other processes used 50% of the host's CPU (bound 20%); CPU quota: the CPU ")
    assert said.endswith("disturbed every time: no verdict from a busy host")
    assert cause_of(host_busy([both], bounds, attempts=3)) is InvalidCause.BUSY_HOST  # type: ignore[arg-type]
    quiet = HostReading.from_json(HostReading(
        wall_s=2.0, cpu_count=2, foreign_cpu_share=0.0, steal_share=0.0, psi={}, top_foreign=(),
        cpu_quota=(QuotaWindow("/q", 2, "the server", 150_000, 100_000, 0, 0.0, 2.0),)).to_json())
    assert host_busy([quiet], bounds, attempts=1) is None
    assert quiet.quota_remarks() == ["the CPU quota of 1.5 CPU on cgroup /q (v2: cpu.max 150000 100000), which "
                                     "holds the server, throttled nothing in the 2.0 s window"]


# --------------------------------------------------------------------------- a real quota


@pytest.fixture
def starved_cgroup() -> Iterator[tuple[Path, str]]:
    """A cgroup allowed 1 ms of CPU per 100 ms (the smallest quota): a busy process in it is
    throttled in every period however busy the rest of this shared host is."""
    made = helpers.quota_cgroup(1_000, 100_000)
    if isinstance(made, str):
        pytest.skip(made)
    try:
        yield made
    finally:
        helpers.remove_cgroup(made[0])


def test_a_real_quota_that_throttles_a_busy_server_makes_its_window_invalid(
        starved_cgroup: tuple[Path, str]) -> None:
    folder, name = starved_cgroup
    busy = subprocess.Popen([sys.executable, "-c", helpers.BUSY, "1"])
    try:
        (folder / "cgroup.procs").write_text(str(busy.pid))
        assert read_quota_in_force(busy.pid).quota == Quota(1_000, 100_000)
        watch = HostWatch(own_pids=lambda: [busy.pid])
        watch.start()
        time.sleep(1.0)
        reading = watch.stop()
    finally:
        busy.kill()
        busy.wait()
    (window,) = [w for w in reading.cpu_quota if w.cgroup == name]
    assert window.whose == "the server" and window.quota_us == 1_000
    assert window.nr_throttled >= 5 and window.throttled_ms > 0, window
    line = reading.describe_busy(HostBounds(max_foreign_cpu_share=None))
    assert line.startswith(f"CPU quota: the CPU quota of 0.01 CPU on cgroup {name} (v")
    assert "which holds the server, throttled them in" in line


def test_this_process_reads_its_own_cgroup_and_every_level_above_it() -> None:
    in_force = read_quota_in_force()
    if not in_force.levels:
        pytest.skip("no cpu cgroup controller is mounted here")
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    own = next((line.split(":", 2)[2] for line in lines if "cpu" in line.split(":")[1].split(",")),
               next(line.split(":", 2)[2] for line in lines if line.startswith("0::")))
    assert in_force.levels[0].name == own
    assert all(Path(level.folder, "cpu.stat").is_file() for level in in_force.levels)
    assert [level.name for level in in_force.levels][1:] == [str(Path(own).parents[i])
                                                             for i in range(len(in_force.levels) - 1)]


def test_an_attached_servers_run_is_invalid_when_its_clients_quota_throttled_every_attempt(
        starved_cgroup: tuple[Path, str]) -> None:
    from pytest_kimiperf.config.deployments import TINY_CPU
    from pytest_kimiperf.measure.results import RunResult
    from pytest_kimiperf.measure.runner import measure_watched
    from pytest_kimiperf.server.process import ServerHandle

    folder, name = starved_cgroup
    attached = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="default",
                            log_path=None, external=True)

    def play(attempt: int) -> RunResult:
        time.sleep(0.5)
        return RunResult(scenario_name=f"attempt-{attempt}", rounds=())

    # A worker of this client's that the starved quota holds for the whole measurement.
    busy = subprocess.Popen([sys.executable, "-c", helpers.BUSY, "1"])
    try:
        (folder / "cgroup.procs").write_text(str(busy.pid))
        watched = measure_watched(play, attached, TINY_CPU)
    finally:
        busy.kill()
        busy.wait()
    assert watched.run.scenario_name == "attempt-2" and watched.readings == []  # the host itself is not watched
    assert watched.busy is not None and watched.busy.attempts == 3
    said = say_invalid(watched.busy)
    assert said.startswith(f"CPU quota: the CPU quota of 0.01 CPU on cgroup {name} (v") and "holds the client," in said
    assert said.endswith("throttled every time: no verdict from a run its CPU quota held back")
    assert cause_of(watched.busy) is InvalidCause.CPU_QUOTA
