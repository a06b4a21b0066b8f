"""Find and end every process of a server we launched, now or after an earlier run was killed.

The zombie problem: vLLM's API server starts an ``EngineCore`` process and, with tensor
parallelism, one ``Worker_TP<n>`` process per GPU.  When pytest is SIGKILLed (OOM killer, CI
cancel, a second Ctrl-C) nothing stops them; they are reparented to init and keep the GPUs'
memory, so the next run cannot boot.  Each launch is therefore recorded in a state directory
(one JSON file per launch) with everything needed to recognise its processes later without
guessing from names:

- the server's pid together with its start time (a reused pid has another start time);
- ``KIMIPERF_LAUNCH_ID=<uuid>`` in the server's environment, which every child inherits;
- its own process group (the server starts a new session), matched only together with a start
  time no earlier than the launch, because a process group id is reused once its members die;
- the pytest process that owns it, so a launch of another pytest session still running on the
  same host is left alone.

Only psutil is used to look at processes (no parsing of /proc by hand).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.gpu import gpu_memory_by_pid
from pytest_kimiperf.names import check_safe_name

LAUNCH_ID_ENV = "KIMIPERF_LAUNCH_ID"
# psutil derives create_time from boot time + start ticks; the same process reads the same value,
# so a tight tolerance only absorbs float formatting while still telling a reused pid apart.
CREATE_TIME_TOLERANCE_S = 0.05
# Children are started after the server; 1 s of slack covers clock-tick rounding of create_time.
GROUP_START_SLACK_S = 1.0
KILL_WAIT_S = 5.0
_POLL_S = 0.05
_MAX_STOP_ROUNDS = 3
_RECORD_PREFIX = "launch-"


def _text_field(data: Mapping[str, object], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} is {value!r}, expected a string")
    return value


def _int_field(data: Mapping[str, object], name: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"field {name!r} is {value!r}, expected a positive integer")
    return value


def _time_field(data: Mapping[str, object], name: str) -> float:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"field {name!r} is {value!r}, expected seconds since the epoch")
    return float(value)


@dataclass(frozen=True)
class LaunchRecord:
    """Everything needed to recognise the processes of one server launch later."""

    launch_id: str
    pid: int
    pgid: int
    create_time: float
    cmdline: tuple[str, ...]
    deployment: str
    profile: str
    log_path: str
    started_at: float
    owner_pid: int
    owner_create_time: float

    def to_json(self) -> dict[str, object]:
        """The record as stored in its state file."""
        data = asdict(self)
        data["cmdline"] = list(self.cmdline)
        return data

    @classmethod
    def from_json(cls, data: object) -> LaunchRecord:
        """Rebuild a record from ``to_json`` data; ValueError saying which field is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        cmdline = data.get("cmdline")
        if not isinstance(cmdline, list) or not all(isinstance(arg, str) for arg in cmdline):
            raise ValueError(f"field 'cmdline' is {cmdline!r}, expected a list of strings")
        launch_id = _text_field(data, "launch_id")
        check_safe_name("launch id", launch_id, source="state file")
        return cls(
            launch_id=launch_id,
            pid=_int_field(data, "pid"),
            pgid=_int_field(data, "pgid"),
            create_time=_time_field(data, "create_time"),
            cmdline=tuple(cmdline),
            deployment=_text_field(data, "deployment"),
            profile=_text_field(data, "profile"),
            log_path=_text_field(data, "log_path"),
            started_at=_time_field(data, "started_at"),
            owner_pid=_int_field(data, "owner_pid"),
            owner_create_time=_time_field(data, "owner_create_time"),
        )

    def describe(self) -> str:
        """One line for reports: launch id, deployment/profile, pid, start time."""
        started = datetime.fromtimestamp(self.started_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"launch {self.launch_id} ({self.deployment}/{self.profile}, pid {self.pid}, started {started}, "
            f"owner pid {self.owner_pid})"
        )


def record_for_popen(
    pid: int, *, launch_id: str, deployment: str, profile: str, log_path: str
) -> LaunchRecord:
    """Build the LaunchRecord of a server just started with ``start_new_session=True`` by this process."""
    check_safe_name("launch id", launch_id)
    owner = psutil.Process()
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            create_time, cmdline = process.create_time(), tuple(process.cmdline())
        pgid = os.getpgid(pid)
    except (psutil.NoSuchProcess, ProcessLookupError):
        # It died at once: its children (if any) are still found by the environment marker, and
        # with start_new_session the group id is the pid.
        create_time, cmdline, pgid = time.time(), (), pid
    except psutil.AccessDenied:
        create_time, cmdline, pgid = time.time(), (), pid
    return LaunchRecord(
        launch_id=launch_id,
        pid=pid,
        pgid=pgid,
        create_time=create_time,
        cmdline=cmdline,
        deployment=deployment,
        profile=profile,
        log_path=log_path,
        started_at=time.time(),
        owner_pid=owner.pid,
        owner_create_time=owner.create_time(),
    )


# --------------------------------------------------------------------------- state files


def _record_path(state_dir: Path, launch_id: str) -> Path:
    check_safe_name("launch id", launch_id)
    return Path(state_dir) / f"{_RECORD_PREFIX}{launch_id}.json"


def record_launch(state_dir: str | os.PathLike[str], record: LaunchRecord) -> Path:
    """Write the launch's state file atomically (a reader never sees half a record)."""
    path = _record_path(Path(state_dir), record.launch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record.to_json(), out, indent=2, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def forget_launch(state_dir: str | os.PathLike[str], launch_id: str) -> None:
    """Remove the launch's state file; a file already gone is fine (another session swept it)."""
    with contextlib.suppress(FileNotFoundError):
        _record_path(Path(state_dir), launch_id).unlink()


@dataclass(frozen=True)
class LoadedLaunches:
    """The readable launch records of a state directory, and one line per file that is not."""

    records: tuple[LaunchRecord, ...]
    problems: tuple[str, ...]


def load_launches(state_dir: str | os.PathLike[str]) -> LoadedLaunches:
    """Read every launch record in ``state_dir``; corrupt files are reported and left in place."""
    directory = Path(state_dir)
    if not directory.is_dir():
        return LoadedLaunches(records=(), problems=())
    records: list[LaunchRecord] = []
    problems: list[str] = []
    for path in sorted(directory.glob(f"{_RECORD_PREFIX}*.json")):
        try:
            record = LaunchRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
            if path.name != f"{_RECORD_PREFIX}{record.launch_id}.json":
                raise ValueError(f"holds launch {record.launch_id!r}, which does not match its file name")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, KimiperfError) as error:
            problems.append(
                f"state file {path} is not a launch record ({error}); left in place: delete it once "
                "no server from an earlier run is still running"
            )
            continue
        records.append(record)
    return LoadedLaunches(records=tuple(records), problems=tuple(problems))


# --------------------------------------------------------------------------- finding processes


def _same_start(process: psutil.Process, create_time: float) -> bool:
    return abs(process.create_time() - create_time) <= CREATE_TIME_TOLERANCE_S


def _is_zombie(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def find_launch_processes(record: LaunchRecord) -> list[psutil.Process]:
    """Every live process of this launch: the recorded server, its marked descendants, its group.

    Orphans reparented to init (vLLM's EngineCore and Worker_TP* after the API server was
    SIGKILLed) are found by the marker.  Zombies are left out: they hold no memory and no port,
    and only their parent can reap them.
    """
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        server = psutil.Process(record.pid)
        if _same_start(server, record.create_time):
            found[server.pid] = server
    for process in psutil.process_iter():
        if process.pid in found or process.pid == me:
            continue
        try:
            started = process.create_time()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if (
                    os.getpgid(process.pid) == record.pgid
                    and started >= record.create_time - GROUP_START_SLACK_S
                ):
                    found[process.pid] = process
                    continue
            # environ() shows the environment the process was started with: the marker stays
            # even if the process later changes its own variables.
            if process.environ().get(LAUNCH_ID_ENV) == record.launch_id:
                found[process.pid] = process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [process for pid, process in sorted(found.items()) if not _is_zombie(process)]


# --------------------------------------------------------------------------- ending processes


@dataclass(frozen=True)
class ProcessSummary:
    """Who a process was, captured before it was signalled (a dead process cannot be asked)."""

    pid: int
    name: str
    cmdline: tuple[str, ...]

    def describe(self) -> str:
        """``pid 123 python3 (python3 -m vllm.entrypoints...)``, the command cut at 160 characters."""
        command = " ".join(self.cmdline)
        command = command if len(command) <= 160 else command[:157] + "..."
        return f"pid {self.pid} {self.name}" + (f" ({command})" if command else "")


def _summary(process: psutil.Process) -> ProcessSummary:
    try:
        with process.oneshot():
            return ProcessSummary(pid=process.pid, name=process.name(), cmdline=tuple(process.cmdline()))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ProcessSummary(pid=process.pid, name="?", cmdline=())


@dataclass(frozen=True)
class TerminationReport:
    """What SIGTERM ended, what needed SIGKILL, and what is still running."""

    terminated: tuple[ProcessSummary, ...] = ()
    killed: tuple[ProcessSummary, ...] = ()
    survivors: tuple[ProcessSummary, ...] = ()

    @property
    def ended(self) -> tuple[ProcessSummary, ...]:
        """Every process that is gone now, however it ended."""
        return self.terminated + self.killed

    def merged(self, other: TerminationReport) -> TerminationReport:
        """Both reports together (one launch stopped in several rounds)."""
        return TerminationReport(
            terminated=self.terminated + other.terminated,
            killed=self.killed + other.killed,
            survivors=other.survivors,
        )

    def describe(self) -> list[str]:
        """Report lines: one per process that needed SIGKILL or survived, plus a count."""
        lines = [f"ended {len(self.ended)} process(es), {len(self.killed)} of them with SIGKILL"]
        lines += [f"needed SIGKILL: {p.describe()}" for p in self.killed]
        lines += [f"STILL RUNNING after SIGKILL: {p.describe()}" for p in self.survivors]
        return lines


def _wait_gone(
    processes: Sequence[psutil.Process], timeout_s: float
) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Split into (gone, alive) once all are gone or ``timeout_s`` passed.

    psutil.wait_procs is not used: for a process that is not our child it polls whether the pid
    exists, and a zombie orphan (gone in every way that matters) still exists until init reaps it.
    """
    end = time.monotonic() + timeout_s
    alive = list(processes)
    gone: list[psutil.Process] = []
    while True:
        still = []
        for process in alive:
            if not process.is_running() or _is_zombie(process):
                gone.append(process)
            else:
                still.append(process)
        alive = still
        if not alive or time.monotonic() >= end:
            return gone, alive
        time.sleep(_POLL_S)


def _signal(processes: Iterable[psutil.Process], send: Callable[[psutil.Process], None]) -> None:
    for process in processes:
        # psutil refuses (NoSuchProcess) to signal a pid whose start time changed: a reused pid
        # is never signalled.
        with contextlib.suppress(psutil.NoSuchProcess):
            send(process)


def terminate_processes(procs: Sequence[psutil.Process], *, grace_s: float = 15.0) -> TerminationReport:
    """SIGTERM each process, wait up to ``grace_s``, SIGKILL what remains, and report.

    Each process is signalled by itself, not through ``killpg``: a group id outlives nothing, and
    once the group's members are gone the id can belong to someone else's new group.
    """
    if grace_s < 0:
        raise ValueError(f"grace_s must be >= 0, got {grace_s}")
    summaries = {process.pid: _summary(process) for process in procs}
    _signal(procs, psutil.Process.terminate)
    gone, alive = _wait_gone(procs, grace_s)
    _signal(alive, psutil.Process.kill)
    killed, survivors = _wait_gone(alive, KILL_WAIT_S)
    return TerminationReport(
        terminated=tuple(summaries[p.pid] for p in gone),
        killed=tuple(summaries[p.pid] for p in killed),
        survivors=tuple(summaries[p.pid] for p in survivors),
    )


def stop_launch(record: LaunchRecord, *, grace_s: float = 15.0) -> TerminationReport:
    """End every process of a launch, again for any child spawned while the first ones stopped."""
    report = TerminationReport()
    for _ in range(_MAX_STOP_ROUNDS):
        procs = find_launch_processes(record)
        known = {p.pid for p in report.survivors}
        if not procs or {p.pid for p in procs} <= known:
            break
        report = report.merged(terminate_processes(procs, grace_s=grace_s))
    return report


# --------------------------------------------------------------------------- the sweep


def owner_alive(record: LaunchRecord) -> bool:
    """Whether the pytest process that launched this server still runs (same pid and start)."""
    try:
        owner = psutil.Process(record.owner_pid)
        return _same_start(owner, record.owner_create_time) and not _is_zombie(owner)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@dataclass(frozen=True)
class SweepReport:
    """What a sweep of stale launches did, for the session header and for GPU-memory waiting."""

    swept: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    ended: tuple[ProcessSummary, ...] = ()
    survivors: tuple[ProcessSummary, ...] = ()
    gpu_memory_mib: Mapping[int, int] | None = None
    problems: tuple[str, ...] = ()
    # Survivors of SIGKILL (stuck in the driver, typically) that held GPU memory.
    survivor_gpu_memory_mib: Mapping[int, int] | None = None

    @property
    def gpu_pids(self) -> list[int]:
        """Pids that were ended while holding GPU memory: wait for the driver to free it."""
        return sorted(self.gpu_memory_mib or {})

    def describe(self) -> list[str]:
        """Report lines; empty when there was nothing to do."""
        lines = [f"ended stale {launch}" for launch in self.swept]
        lines += [f"left alone {launch}" for launch in self.skipped]
        lines += [f"ended {p.describe()}" for p in self.ended]
        lines += [
            f"pid {pid} held {mib} MiB of GPU memory"
            for pid, mib in sorted((self.gpu_memory_mib or {}).items())
        ]
        lines += [f"STILL RUNNING after SIGKILL: {p.describe()}" for p in self.survivors]
        return lines + list(self.problems)


def sweep_stale_launches(
    state_dir: str | os.PathLike[str],
    *,
    grace_s: float,
    is_current: Callable[[LaunchRecord], bool] | None = None,
    gpu_probe: Callable[[], Mapping[int, int]] = gpu_memory_by_pid,
) -> SweepReport:
    """End the servers that earlier, dead pytest runs left behind, and forget their records.

    A launch is left alone when ``is_current`` says it belongs to this session or when its owner
    process still runs (another pytest session on this host).  A record whose processes survive
    SIGKILL is kept so the next sweep tries again.
    """
    loaded = load_launches(state_dir)
    problems = list(loaded.problems)
    stale: list[tuple[LaunchRecord, list[psutil.Process]]] = []
    skipped: list[str] = []
    for record in loaded.records:
        if (is_current is not None and is_current(record)) or owner_alive(record):
            skipped.append(f"{record.describe()}: its pytest session is still running")
            continue
        stale.append((record, find_launch_processes(record)))
    gpu_before: Mapping[int, int] = {}
    if any(procs for _, procs in stale):
        try:
            gpu_before = gpu_probe()
        except KimiperfError as error:
            problems.append(f"could not read GPU memory per process before the sweep: {error}")
    swept: list[str] = []
    ended: list[ProcessSummary] = []
    survivors: list[ProcessSummary] = []
    for record, procs in stale:
        report = stop_launch(record, grace_s=grace_s) if procs else TerminationReport()
        ended.extend(report.ended)
        survivors.extend(report.survivors)
        if report.survivors:
            problems.append(
                f"{record.describe()}: kept its state file, {len(report.survivors)} process(es) survive"
            )
        else:
            forget_launch(state_dir, record.launch_id)
            swept.append(record.describe())
    ended_pids = {p.pid for p in ended}
    survivor_pids = {p.pid for p in survivors}
    return SweepReport(
        swept=tuple(swept),
        skipped=tuple(skipped),
        ended=tuple(ended),
        survivors=tuple(survivors),
        gpu_memory_mib={pid: mib for pid, mib in gpu_before.items() if pid in ended_pids},
        problems=tuple(problems),
        survivor_gpu_memory_mib={pid: mib for pid, mib in gpu_before.items() if pid in survivor_pids},
    )


__all__ = [
    "LAUNCH_ID_ENV",
    "LaunchRecord",
    "LoadedLaunches",
    "ProcessSummary",
    "SweepReport",
    "TerminationReport",
    "find_launch_processes",
    "forget_launch",
    "load_launches",
    "owner_alive",
    "record_for_popen",
    "record_launch",
    "stop_launch",
    "sweep_stale_launches",
    "terminate_processes",
]
