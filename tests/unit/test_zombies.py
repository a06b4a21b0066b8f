"""The zombie sweep on real process trees: a fake server that forks, an owner that gets SIGKILLed,
and the processes it must never touch (a recycled group id, another uid, another host's record)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers import gone
from pytest_kimiperf.server import zombies as process_sweep
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.server.zombies import LaunchRecord
from pytest_kimiperf.server.zombies import LAUNCH_ID_ENV
from tests import helpers

REPO = helpers.ROOT

# The command line of every worker: the decoy runs exactly this too, without the marker.
WORKER = (
    "import signal, sys, time\n"
    "if 'stubborn' in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if 'say-ready' in sys.argv: print('ready', flush=True)\n"
    "time.sleep(120)\n"
)

# A stand-in for `vllm serve`: forks two workers like EngineCore/Worker_TP, then waits.
#  - worker A starts its own session but inherits the marker (found by the environment);
#  - worker B stays in the server's process group, has the marker removed from its environment
#    and ignores SIGTERM (found by group and start time; needs SIGKILL).
SERVER = f"""
import os, subprocess, sys, time
env_b = {{k: v for k, v in os.environ.items() if k != {LAUNCH_ID_ENV!r}}}
a = subprocess.Popen([sys.executable, "-c", {WORKER!r}, "a"], start_new_session=True)
b = subprocess.Popen([sys.executable, "-c", {WORKER!r}, "b", "stubborn"], env=env_b)
with open(sys.argv[1] + ".tmp", "w") as out:
    out.write(f"{{a.pid}} {{b.pid}}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
"""

# A stand-in for the pytest session that launched the server and recorded it.
OWNER = f"""
import dataclasses, os, subprocess, sys, time
from pytest_kimiperf.server import zombies as process_sweep
state_dir, launch_id, pids_file = sys.argv[1:4]
env = dict(os.environ, {LAUNCH_ID_ENV}=launch_id)
server = subprocess.Popen([sys.executable, "-c", {SERVER!r}, pids_file], env=env, start_new_session=True)
record = process_sweep.record_for_popen(server.pid, launch_id=launch_id, deployment="tiny-cpu",
                                        profile="default", log_path="/dev/null")
if os.environ.get("CLOCK_STEP_S"):
    # What a clock step does to a start time read in wall-clock seconds.
    record = dataclasses.replace(record, owner_create_time=record.owner_create_time - float(os.environ["CLOCK_STEP_S"]))
held = process_sweep.record_launch(state_dir, record)
print("RECORDED", flush=True)
time.sleep(120)
"""


def wait_for(path: Path, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"{path} did not appear within {timeout_s}s"
        time.sleep(0.02)


Started = list[subprocess.Popen[bytes] | int]


@pytest.fixture
def cleanup() -> Iterator[Started]:
    """Processes to SIGKILL (and reap, for our children) after the test, whatever happened."""
    started: Started = []
    yield started
    for item in started:
        if isinstance(item, int):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(item).kill()
        else:
            item.kill()
            item.wait()
            if item.stdout is not None:
                item.stdout.close()


def start_decoy(cleanup: Started) -> subprocess.Popen[bytes]:
    """An unrelated process with the workers' exact command line and no marker."""
    decoy = subprocess.Popen([sys.executable, "-c", WORKER, "a"], start_new_session=True)
    cleanup.append(decoy)
    return decoy


def test_sweep_ends_the_orphans_of_a_killed_run_and_nothing_else(tmp_path: Path, cleanup: Started) -> None:
    state_dir, pids_file, launch_id = tmp_path / "state", tmp_path / "pids", uuid.uuid4().hex
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(state_dir), launch_id, str(pids_file)],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    cleanup.append(owner)
    wait_for(pids_file)
    wait_for(state_dir / f"launch-{launch_id}.json")
    worker_a, worker_b = map(int, pids_file.read_text().split())
    cleanup.extend([worker_a, worker_b])
    (record,) = process_sweep.load_launches(state_dir).records
    cleanup.append(record.pid)
    decoy = start_decoy(cleanup)

    # The run dies hard: pytest is SIGKILLed. The launch's leader still runs, so its group is
    # trusted: worker B (no marker) is found by it, worker A (own session) by the marker.
    owner.kill()
    owner.wait()

    found = {p.pid for p in process_sweep.find_launch_processes(record)}
    assert found == {record.pid, worker_a, worker_b}

    report = process_sweep.sweep_stale_launches(state_dir, grace_s=1.0, gpu_probe=lambda: {worker_a: 512})
    assert {p.pid for p in report.ended} == {record.pid, worker_a, worker_b}
    # Summaries are taken before the signals: the orphan's command line is still reported.
    assert [p.cmdline[-1] for p in report.ended if p.pid == worker_b] == ["stubborn"]
    assert report.survivors == ()
    assert report.gpu_memory_mib == {worker_a: 512}
    assert gone(worker_a) and gone(worker_b)
    assert decoy.poll() is None, "the decoy with the same command line but no marker was touched"
    assert process_sweep.load_launches(state_dir).records == ()
    assert any(line.startswith("ended stale launch " + launch_id) for line in report.describe())


def test_sweep_leaves_launches_of_a_live_session_alone(tmp_path: Path, cleanup: Started) -> None:
    launch_id = uuid.uuid4().hex
    server = subprocess.Popen(
        [sys.executable, "-c", WORKER, "a"],
        env=dict(os.environ, **{LAUNCH_ID_ENV: launch_id}),
        start_new_session=True,
    )
    cleanup.append(server)
    record = process_sweep.record_for_popen(
        server.pid, launch_id=launch_id, deployment="tiny-cpu", profile="default", log_path="/dev/null"
    )
    held = process_sweep.record_launch(tmp_path, record)

    # This very process owns it (and holds its lock), so it is not stale.
    report = process_sweep.sweep_stale_launches(tmp_path, grace_s=1.0, gpu_probe=dict)
    assert report.ended == () and len(report.skipped) == 1
    assert server.poll() is None
    assert process_sweep.load_launches(tmp_path).records == (record,)

    # The session's own teardown path stops it.
    stopped = process_sweep.stop_launch(record, grace_s=2.0)
    assert [p.pid for p in stopped.terminated] == [server.pid] and stopped.survivors == ()
    server.wait(timeout=5)
    held.release()


def test_is_current_keeps_a_launch_even_if_its_owner_is_gone(tmp_path: Path, cleanup: Started) -> None:
    decoy = start_decoy(cleanup)
    record = LaunchRecord(
        launch_id="abc",
        pid=decoy.pid,
        pgid=decoy.pid,
        create_time=psutil.Process(decoy.pid).create_time(),
        cmdline=(),
        deployment="tiny-cpu",
        profile="default",
        log_path="/dev/null",
        started_at=time.time(),
        owner_pid=decoy.pid,
        owner_create_time=0.0,
    )
    process_sweep.record_launch(tmp_path, record).release()
    report = process_sweep.sweep_stale_launches(
        tmp_path, grace_s=1.0, is_current=lambda r: r.launch_id == "abc"
    )
    assert report.ended == () and decoy.poll() is None


def test_a_reused_pid_is_not_mistaken_for_the_server(cleanup: Started) -> None:
    decoy = start_decoy(cleanup)
    started = psutil.Process(decoy.pid).create_time()
    stale = LaunchRecord(
        launch_id=uuid.uuid4().hex,
        pid=decoy.pid,
        pgid=decoy.pid,
        # The recorded server started a minute before this pid's current owner.
        create_time=started + 60,
        cmdline=(),
        deployment="tiny-cpu",
        profile="default",
        log_path="/dev/null",
        started_at=time.time(),
        owner_pid=1,
        owner_create_time=0.0,
    )
    assert process_sweep.find_launch_processes(stale) == []


def test_terminate_processes_reports_what_needed_sigkill(cleanup: Started) -> None:
    polite = subprocess.Popen([sys.executable, "-c", WORKER, "polite", "say-ready"], stdout=subprocess.PIPE)
    stubborn = subprocess.Popen([sys.executable, "-c", WORKER, "stubborn", "say-ready"], stdout=subprocess.PIPE)
    cleanup.extend([polite, stubborn])
    for proc in (polite, stubborn):  # both started; the stubborn one ignores SIGTERM by now
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.stdout.close()
    report = process_sweep.terminate_processes(
        [psutil.Process(polite.pid), psutil.Process(stubborn.pid)], grace_s=0.5
    )
    assert [p.pid for p in report.terminated] == [polite.pid]
    assert [p.pid for p in report.killed] == [stubborn.pid]
    assert report.survivors == ()
    assert polite.wait(timeout=5) == -signal.SIGTERM and stubborn.wait(timeout=5) == -signal.SIGKILL
    assert f"needed SIGKILL: pid {stubborn.pid} python" in "\n".join(report.describe())


# --------------------------------------------------------------------------- state files


def sample_record(launch_id: str = "0123abcd") -> LaunchRecord:
    return LaunchRecord(
        launch_id=launch_id,
        pid=4242,
        pgid=4242,
        create_time=1700000000.25,
        cmdline=("vllm", "serve", "tiny"),
        deployment="tiny-cpu",
        profile="ring-ll",
        log_path="/tmp/server.log",
        started_at=1700000000.5,
        owner_pid=4000,
        owner_create_time=1699999990.0,
        start_ticks=123456,
        host="vm-a",
        boot_id="b0075e1f-0000-4000-8000-000000000000",
        pid_ns="pid:[4026531836]",
        uid=1000,
    )


def test_state_files_round_trip_and_leave_no_temporaries(tmp_path: Path) -> None:
    record = sample_record()
    held = process_sweep.record_launch(tmp_path / "state", record)
    held.release()
    path = held.path
    assert path == tmp_path / "state" / "launch-0123abcd.json"
    assert sorted(p.name for p in path.parent.iterdir()) == ["launch-0123abcd.json"]
    assert process_sweep.load_launches(tmp_path / "state") == process_sweep.LoadedLaunches(
        records=(record,), problems=()
    )
    process_sweep.forget_launch(tmp_path / "state", "0123abcd")
    process_sweep.forget_launch(tmp_path / "state", "0123abcd")  # already gone: fine
    assert process_sweep.load_launches(tmp_path / "state").records == ()
    assert process_sweep.load_launches(tmp_path / "missing") == process_sweep.LoadedLaunches(
        records=(), problems=()
    )


def test_corrupt_state_files_are_reported_not_fatal(tmp_path: Path) -> None:
    process_sweep.record_launch(tmp_path, sample_record("good")).release()
    (tmp_path / "launch-torn.json").write_text('{"launch_id": "torn", "pid": 1')
    data = sample_record("other").to_json()
    (tmp_path / "launch-renamed.json").write_text(json.dumps(data))
    data = dict(sample_record("badpid").to_json(), pid="4242")
    (tmp_path / "launch-badpid.json").write_text(json.dumps(data))
    loaded = process_sweep.load_launches(tmp_path)
    assert [r.launch_id for r in loaded.records] == ["good"]
    problems = "\n".join(loaded.problems)
    assert "launch-torn.json is not a launch record (Expecting" in problems
    assert "launch-renamed.json is not a launch record (holds launch 'other'" in problems
    assert (
        "launch-badpid.json is not a launch record (field 'pid' is '4242', expected a positive integer)"
        in problems
    )
    report = process_sweep.sweep_stale_launches(tmp_path, grace_s=0.1, gpu_probe=dict)
    assert len(report.problems) == 3 and (tmp_path / "launch-torn.json").exists()


def test_launch_ids_must_be_safe_file_name_parts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid launch id name '\.\./x'"):
        process_sweep.record_launch(tmp_path, sample_record("../x"))


# --------------------------------------------------------------------------- never what is not ours


def _stale_record_for(process_pid: int, launch_id: str, **changes: object) -> LaunchRecord:
    """A record made here by a session that has died (no lock held), for ``process_pid``."""
    record = process_sweep.record_for_popen(process_pid, launch_id=launch_id, deployment="tiny-cpu",
                                            profile="default", log_path="/dev/null")
    return dataclasses.replace(record, **changes)


NEWCOMER = (
    "import subprocess, sys, time\n"
    "job = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(job.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_recycled_process_group_id_is_not_trusted_once_its_leader_is_gone(
    tmp_path: Path, cleanup: Started
) -> None:
    """A later session leader that got the recorded group number (an ssh shell, tmux, another
    user's vLLM) and its group are never signalled: the recorded leader is not provably alive."""
    newcomer = subprocess.Popen([sys.executable, "-c", NEWCOMER], start_new_session=True, stdout=subprocess.PIPE)
    cleanup.append(newcomer)
    assert newcomer.stdout is not None
    member = int(newcomer.stdout.readline())  # a job in the newcomer's group, as a shell's
    cleanup.append(member)
    assert os.getpgid(member) == newcomer.pid
    ticks = process_sweep.start_ticks(newcomer.pid)
    assert ticks is not None
    # The recorded leader had this pid and group, started earlier, and is gone.
    record = _stale_record_for(newcomer.pid, uuid.uuid4().hex, start_ticks=ticks - 500,
                               create_time=psutil.Process(newcomer.pid).create_time() - 5)
    process_sweep.record_launch(tmp_path, record).release()

    assert process_sweep.find_launch_processes(record) == []
    report = process_sweep.sweep_stale_launches(tmp_path, grace_s=1.0, gpu_probe=dict)
    assert report.ended == ()
    assert newcomer.poll() is None and not gone(member)


@pytest.mark.parametrize("field, value, reason", [
    ("host", "another-host", "launched on host 'another-host'"),
    ("boot_id", "00000000-0000-4000-8000-000000000000", "before this host's last reboot"),
    ("pid_ns", "pid:[1]", "(another container)"),
])
def test_records_from_another_host_boot_or_pid_namespace_are_left_alone(
    tmp_path: Path, cleanup: Started, field: str, value: str, reason: str
) -> None:
    """A shared home directory or a mounted cache must not make this run act on another's records."""
    launch_id = uuid.uuid4().hex
    marked = subprocess.Popen([sys.executable, "-c", WORKER, "a"],
                              env=dict(os.environ, **{LAUNCH_ID_ENV: launch_id}), start_new_session=True)
    cleanup.append(marked)
    record = _stale_record_for(marked.pid, launch_id, **{field: value})
    process_sweep.record_launch(tmp_path, record).release()
    report = process_sweep.sweep_stale_launches(tmp_path, grace_s=1.0, gpu_probe=dict)
    assert report.ended == () and marked.poll() is None
    assert reason in "\n".join(report.describe())
    assert process_sweep.load_launches(tmp_path).records == (record,), "another place's record was deleted"


def test_a_live_owner_is_known_by_its_lock_even_after_a_clock_step(tmp_path: Path, cleanup: Started) -> None:
    """The owner's recorded start time is 1 s off (a clock step): its lock still says it runs."""
    state_dir, pids_file, launch_id = tmp_path / "state", tmp_path / "pids", uuid.uuid4().hex
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(state_dir), launch_id, str(pids_file)],
        env=dict(os.environ, PYTHONPATH=str(REPO), CLOCK_STEP_S="1"), stdout=subprocess.PIPE,
    )
    cleanup.append(owner)
    assert owner.stdout is not None and owner.stdout.readline() == b"RECORDED\n"
    wait_for(pids_file)
    cleanup.extend(map(int, pids_file.read_text().split()))
    (record,) = process_sweep.load_launches(state_dir).records
    cleanup.append(record.pid)
    report = process_sweep.sweep_stale_launches(state_dir, grace_s=1.0, gpu_probe=dict)
    assert report.ended == ()
    assert "its pytest session is still running" in "\n".join(report.describe())
    assert psutil.pid_exists(record.pid) and not gone(record.pid)
    owner.kill()
    owner.wait()
    # The kernel dropped the lock with the owner: now the launch is stale and is ended.
    report = process_sweep.sweep_stale_launches(state_dir, grace_s=1.0, gpu_probe=dict)
    assert record.pid in {p.pid for p in report.ended}


_AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="running a process as another uid needs root and setpriv (util-linux)",
)


@needs_root_and_setpriv
def test_a_process_of_another_uid_is_never_signalled(tmp_path: Path, cleanup: Started) -> None:
    """Another user's process carrying our marker (copied environment, a shared job script)."""
    launch_id = uuid.uuid4().hex
    theirs = subprocess.Popen([*_AS_NOBODY, sys.executable, "-c", WORKER, "a"],
                              env=dict(os.environ, **{LAUNCH_ID_ENV: launch_id}), start_new_session=True)
    cleanup.append(theirs)
    deadline = time.monotonic() + 10
    while psutil.Process(theirs.pid).uids().real != 65534:  # setpriv has exec'd python
        assert time.monotonic() < deadline
        time.sleep(0.02)
    record = _stale_record_for(os.getpid(), launch_id, pid=theirs.pid, pgid=theirs.pid,
                               start_ticks=process_sweep.start_ticks(theirs.pid))
    process_sweep.record_launch(tmp_path, record).release()
    assert process_sweep.find_launch_processes(record) == []
    process_sweep.sweep_stale_launches(tmp_path, grace_s=1.0, gpu_probe=dict)
    assert theirs.poll() is None, "another uid's process was signalled"


SWEEP_AS_NOBODY = """
import sys
from pytest_kimiperf.server import zombies as process_sweep
report = process_sweep.sweep_stale_launches(sys.argv[1], grace_s=1.0, gpu_probe=dict)
print("SWEPT", len(report.ended))
"""


@needs_root_and_setpriv
def test_a_sweep_that_may_not_signal_a_process_does_not_crash(cleanup: Started) -> None:
    """psutil.AccessDenied (another user's process behind a record of ours) is handled, not raised."""
    hidden = next((p for p in (REPO, *REPO.parents) if not p.stat().st_mode & stat.S_IXOTH), None)
    if hidden is not None:
        pytest.skip(f"uid 65534 cannot reach this checkout ({hidden} is not searchable by others), so it "
                    "cannot import the plugin; clone it under a world-readable directory to run this check")
    state_dir = Path(tempfile.mkdtemp(prefix="kimiperf-shared-state-"))
    try:
        state_dir.chmod(0o777)
        root_process = start_decoy(cleanup)
        # A record that says uid 65534 launched it, but its leader is root's process.
        record = _stale_record_for(root_process.pid, uuid.uuid4().hex, uid=65534)
        process_sweep.record_launch(state_dir, record).release()
        for path in state_dir.iterdir():
            path.chmod(0o666)
        result = subprocess.run([*_AS_NOBODY, sys.executable, "-c", SWEEP_AS_NOBODY, str(state_dir)],
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 0, result.stderr
        assert "SWEPT 0" in result.stdout
        assert root_process.poll() is None
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


# vLLM names EngineCore and its workers the way this child does (utils/system_utils.py:194).
_RENAMED = (
    "import setproctitle, time\n"
    "setproctitle.setproctitle('VLLM::EngineCore')\n"
    "print('renamed', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize("spt_noenv", [None, "1"])
def test_the_marker_survives_vllms_setproctitle_only_under_spt_noenv(spt_noenv: str | None) -> None:
    # The real py-setproctitle: without SPT_NOENV it writes the title over the memory that
    # /proc/PID/environ shows (src/spt_status.c:204-230), so the sweep cannot find the process;
    # ServerProcess therefore starts every server with SPT_NOENV=1 (process.py).
    env = {k: v for k, v in os.environ.items() if k != "SPT_NOENV"}
    env[LAUNCH_ID_ENV] = launch_id = uuid.uuid4().hex
    if spt_noenv:
        env["SPT_NOENV"] = spt_noenv
    child = subprocess.Popen([sys.executable, "-c", _RENAMED], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "renamed\n"
        assert psutil.Process(child.pid).name() == "VLLM::EngineCore"
        found = [p.pid for p in process_sweep.processes_of(launch_id, uid=os.getuid(), trusted_pgid=None)]
        assert found == ([child.pid] if spt_noenv else [])
    finally:
        child.kill()
        child.communicate()


def test_every_server_is_started_with_spt_noenv(tmp_path: Path) -> None:
    from pytest_kimiperf.server.process import ServerProcess

    server = ServerProcess(argv=["true"], env={"SPT_NOENV": ""}, log_path=tmp_path / "log",
                           state_dir=tmp_path, base_url="http://127.0.0.1:1", served_model_name="m",
                           deployment="d", profile="p", deadline_s=1.0)
    assert server.env["SPT_NOENV"] == "1"  # an empty value would leave setproctitle clobbering


def test_a_process_renamed_by_setproctitle_is_named_once() -> None:
    """vLLM names its workers with setproctitle, which pads the title with spaces over the old
    arguments: the sweep's line says ``pid 7 VLLM::Worker_TP0``, not the title twice and 150 spaces."""
    from pytest_kimiperf.server.zombies import ProcessSummary

    worker = ProcessSummary(pid=7, name="VLLM::Worker_TP0", cmdline=("VLLM::Worker_TP0" + " " * 150,))
    assert worker.describe() == "pid 7 VLLM::Worker_TP0"
    api = ProcessSummary(pid=8, name="python3", cmdline=("python3", "-m", "vllm.entrypoints.cli.main", "serve"))
    assert api.describe() == "pid 8 python3 (python3 -m vllm.entrypoints.cli.main serve)"


def test_the_sweep_account_says_what_it_ended_and_what_came_back_and_travels_as_json() -> None:
    from pytest_kimiperf.server.manager import ServerRecord
    from pytest_kimiperf.server.zombies import SweepAccount, SweepReport, ProcessSummary

    account = SweepAccount(launches=("launch ab (rtx8/default, pid 9)",), processes=8,
                           returned_mib=dict.fromkeys(range(8), 90000) | {8: 0})
    assert account.summary() == ("before the first boot the sweep ended 8 processes of 1 stale launch of a killed run "
                                 "(launch ab (rtx8/default, pid 9)); 720000 MiB of GPU memory came back on 8 GPUs")
    assert SweepAccount(launches=(), processes=1).summary() == (
        "before the first boot the sweep ended 1 process of 0 stale launches of a killed run")
    record = ServerRecord("default", sweep=account)
    assert ServerRecord.from_json(record.to_json()).sweep == account
    assert "sweep" not in ServerRecord("default").to_json()  # a run that swept nothing keeps its shape
    report = SweepReport(ended=(ProcessSummary(5, "VLLM::Worker_TP0", ("VLLM::Worker_TP0",)),),
                         gpu_memory_mib={5: 90000})
    assert report.describe() == ["ended pid 5 VLLM::Worker_TP0, which held 90000 MiB of GPU memory"]
    # NVML named it without a figure: an unknown amount, never "held 0 MiB".
    unknown = SweepReport(ended=report.ended, gpu_memory_mib={5: None})
    assert unknown.describe() == ["ended pid 5 VLLM::Worker_TP0, which held an unknown amount of GPU memory (NVML "
                                  "named it without a figure)"]
