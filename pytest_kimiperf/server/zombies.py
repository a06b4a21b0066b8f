"""Find and end every process of a server we launched, now or after an earlier run was killed.

When pytest is SIGKILLed, vLLM's ``EngineCore`` and ``Worker_TP<n>`` processes are reparented to
init and keep the GPUs' memory. Each launch is therefore recorded in a state directory (one JSON
file, :class:`LaunchRecord`, whose owner holds an exclusive ``flock`` on it for the launch's
life) with what recognises its processes later without guessing from names and without ever
touching a process that is not ours: the leader's pid, start ticks and boot, the launch marker in
the environment, and the host, boot, pid namespace and uid it was made in. Why each of these is
needed: docs/explanation/reliability.md, "How a launch's processes are recognised".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.server.agent_wire import agent_payload
from pytest_kimiperf.server.gpu_memory import gpu_memory_by_pid

_RECORD_PREFIX = "launch-"
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
LAUNCH_ID_ENV = "KIMIPERF_LAUNCH_ID"
KILL_WAIT_S = 5.0
_POLL_S = 0.05
_MAX_STOP_ROUNDS = 3
_NEVER: Callable[[], bool] = lambda: False  # noqa: E731 - the default "no escalation asked"


def boot_id() -> str:
    """This boot's id (changes at every reboot); empty where the kernel has none."""
    try:
        return Path(_BOOT_ID_PATH).read_text(encoding="ascii").strip()
    except OSError:
        return ""


def pid_namespace(pid: int | str = "self") -> str:
    """The pid namespace of ``pid`` as the kernel names it (``pid:[4026531836]``)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22); None if gone.
    Exact and monotonic, unlike psutil's create_time, which moves when the clock is stepped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall: 20th after the name and state
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class LaunchPlace:
    """The host, boot, pid namespace and uid a launch happened in."""

    host: str
    boot_id: str
    pid_ns: str
    uid: int

    @classmethod
    def here(cls) -> LaunchPlace:
        """Where this process runs."""
        return cls(host=socket.gethostname(), boot_id=boot_id(), pid_ns=pid_namespace(), uid=os.getuid())


def _text_field(data: Mapping[str, object], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} is {value!r}, expected a string")
    return value


def _texts_field(data: Mapping[str, object], name: str, default: object = None) -> tuple[str, ...]:
    value = data.get(name, default)
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise ValueError(f"field {name!r} is {value!r}, expected a list of strings")
    return tuple(value)


def _int_field(data: Mapping[str, object], name: str, *, minimum: int = 1) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"field {name!r} is {value!r}, expected {expected}")
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
    # Identity of the leader beyond its pid, and where the launch happened. Records written
    # before these existed read as "" / 0 and are never acted on (see foreign_reason).
    start_ticks: int = 0
    host: str = ""
    boot_id: str = ""
    pid_ns: str = ""
    uid: int = -1
    # A node behind a launch template (cluster.py): the node agent's command that stops this
    # launch's processes there.
    node_stop: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The record as stored in its state file."""
        data = asdict(self)
        data["cmdline"] = list(self.cmdline)
        data["node_stop"] = list(self.node_stop)
        if not self.node_stop:
            del data["node_stop"]  # a one-machine launch's file is as before
        return data

    @classmethod
    def from_json(cls, data: object) -> LaunchRecord:
        """Rebuild a record from ``to_json`` data; ValueError saying which field is wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        launch_id = _text_field(data, "launch_id")
        check_safe_name("launch id", launch_id, source="state file")
        place_known = "boot_id" in data
        return cls(
            launch_id=launch_id,
            pid=_int_field(data, "pid"),
            pgid=_int_field(data, "pgid"),
            create_time=_time_field(data, "create_time"),
            cmdline=_texts_field(data, "cmdline"),
            deployment=_text_field(data, "deployment"),
            profile=_text_field(data, "profile"),
            log_path=_text_field(data, "log_path"),
            started_at=_time_field(data, "started_at"),
            owner_pid=_int_field(data, "owner_pid"),
            owner_create_time=_time_field(data, "owner_create_time"),
            start_ticks=_int_field(data, "start_ticks", minimum=0) if place_known else 0,
            host=_text_field(data, "host") if place_known else "",
            boot_id=_text_field(data, "boot_id") if place_known else "",
            pid_ns=_text_field(data, "pid_ns") if place_known else "",
            uid=_int_field(data, "uid", minimum=0) if place_known else -1,
            node_stop=_texts_field(data, "node_stop", default=[]),
        )

    def foreign_reason(self, here: LaunchPlace) -> str | None:
        """Why this record is not ours to act on from ``here`` (None when it is)."""
        if not self.boot_id:
            return "written by an older pytest-kimiperf without host and boot identity"
        if self.host != here.host:
            return f"launched on host {self.host!r}, this is {here.host!r}"
        if self.boot_id != here.boot_id:
            return f"launched in boot {self.boot_id}, before this host's last reboot"
        if self.pid_ns != here.pid_ns:
            return f"launched in pid namespace {self.pid_ns}, this is {here.pid_ns} (another container)"
        if self.uid != here.uid:
            return f"launched by uid {self.uid}, this is uid {here.uid}: left for its owner"
        return None

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
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
        # It died at once: with start_new_session the group id is the pid, and without start
        # ticks the group is never trusted, so only the marker can find what it started.
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
        start_ticks=start_ticks(pid) or 0,
        **asdict(LaunchPlace.here()),
    )


def _record_path(state_dir: Path, launch_id: str) -> Path:
    check_safe_name("launch id", launch_id)
    return Path(state_dir) / f"{_RECORD_PREFIX}{launch_id}.json"


class HeldLock:
    """An exclusive flock held on the open file ``path`` until :meth:`release`; the kernel drops it
    when this process dies, however it dies (a launch record's owner lock, the host claim). Not
    inherited by the processes this one starts, so a server cannot keep a dead owner's lock."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (a launch's record file stays unless forgotten)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def record_launch(state_dir: str | os.PathLike[str], record: LaunchRecord) -> HeldLock:
    """Write the launch's state file atomically and hold its owner lock for the launch's life
    (taken on the temporary file before the rename: no sweep sees the record without it)."""
    path = _record_path(Path(state_dir), record.launch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps(record.to_json(), indent=2, sort_keys=True).encode())
        os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return HeldLock(path, fd)


def forget_launch(state_dir: str | os.PathLike[str], launch_id: str) -> None:
    """Remove the launch's state file; a file already gone is fine (another session swept it)."""
    with contextlib.suppress(FileNotFoundError):
        _record_path(Path(state_dir), launch_id).unlink()


@contextlib.contextmanager
def owner_gone(state_dir: str | os.PathLike[str], launch_id: str) -> Iterator[bool]:
    """Yields whether the launch's owner is gone, holding its record's lock meanwhile if so (which
    keeps a second sweeping session off the record while its processes are stopped)."""
    path = _record_path(Path(state_dir), launch_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield False  # vanished (its owner forgot it) or unreadable: not ours to judge
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


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
        except FileNotFoundError:
            continue  # forgotten by its owner between the listing and the read
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError, KimiperfError) as error:
            problems.append(
                f"state file {path} is not a launch record ({error}); left in place: delete it once "
                "no server from an earlier run is still running"
            )
            continue
        records.append(record)
    return LoadedLaunches(records=tuple(records), problems=tuple(problems))


def leader_alive(record: LaunchRecord) -> bool:
    """Whether the launch's recorded leader provably still runs: same boot, pid and start ticks."""
    if not record.start_ticks or not record.boot_id or record.boot_id != boot_id():
        return False
    return start_ticks(record.pid) == record.start_ticks


def _is_zombie(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _ours(process: psutil.Process, uid: int) -> bool:
    """Whether ``process`` runs as ``uid`` (real and effective): never signal another user's."""
    try:
        uids = process.uids()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return uids.real == uid and uids.effective == uid


def processes_of(launch_id: str, *, uid: int, trusted_pgid: int | None, leader: int | None = None,
                 exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """Every live process of uid ``uid`` in group ``trusted_pgid`` (None unless its leader is known
    to be the launch's own) or carrying the launch marker. Zombies are left out: they hold no memory
    and no port, and only their parent can reap them."""
    skip = {os.getpid(), *exclude}
    found: dict[int, psutil.Process] = {}
    if leader is not None and leader not in skip:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            found[leader] = psutil.Process(leader)
    for process in psutil.process_iter():
        if process.pid in found or process.pid in skip:
            continue
        try:
            if trusted_pgid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if os.getpgid(process.pid) == trusted_pgid:
                        found[process.pid] = process
                        continue
            # environ() shows the environment the process was started with: the marker stays
            # even if the process later changes its own variables.
            if process.environ().get(LAUNCH_ID_ENV) == launch_id:
                found[process.pid] = process
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [p for pid, p in sorted(found.items()) if _ours(p, uid) and not _is_zombie(p)]


def find_launch_processes(record: LaunchRecord) -> list[psutil.Process]:
    """Every live process of this launch: its leader and group while the leader provably runs,
    and whatever carries its marker (orphans reparented to init, once the launcher is gone)."""
    trusted = leader_alive(record)
    return processes_of(
        record.launch_id, uid=record.uid if record.uid >= 0 else os.getuid(),
        trusted_pgid=record.pgid if trusted else None, leader=record.pid if trusted else None,
    )


@dataclass(frozen=True)
class ProcessSummary:
    """Who a process was, captured before it was signalled (a dead process cannot be asked)."""

    pid: int
    name: str
    cmdline: tuple[str, ...]
    # On another node (its pid means nothing here: never matched against this machine's GPUs).
    remote: bool = False

    def describe(self) -> str:
        """``pid 123 python3 (python3 -m vllm.entrypoints...)``, the command cut at 160 characters;
        a process renamed by setproctitle (vLLM's ``VLLM::Worker_TP0``, its title padded with
        spaces over the old arguments) is named once."""
        command = " ".join(self.cmdline).strip()
        if command == self.name:
            return f"pid {self.pid} {self.name}"
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
    # The grace was cut short (a second signal during teardown): everything got SIGKILL.
    escalated: bool = False

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
            escalated=self.escalated or other.escalated,
        )

    def combined(self, other: TerminationReport) -> TerminationReport:
        """Two stops of different processes together (a launch here and its node's, or the
        nodes of one server): every survivor of either is kept."""
        return replace(self.merged(other), survivors=self.survivors + other.survivors)

    def describe(self) -> list[str]:
        """Report lines: one per process that needed SIGKILL or survived, plus a count."""
        lines = [f"ended {len(self.ended)} process(es), {len(self.killed)} of them with SIGKILL"]
        lines += [f"needed SIGKILL: {p.describe()}" for p in self.killed]
        lines += [f"STILL RUNNING after SIGKILL: {p.describe()}" for p in self.survivors]
        return lines


def _wait_gone(
    processes: Sequence[psutil.Process], timeout_s: float, cut_short: Callable[[], bool] = _NEVER,
) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """Split into (gone, alive) once all are gone, ``timeout_s`` passed or ``cut_short()`` says so.
    Not psutil.wait_procs: for a process not our child it polls whether the pid exists, and a
    zombie orphan (gone in every way that matters) exists until init reaps it."""
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
        if not alive or time.monotonic() >= end or cut_short():
            return gone, alive
        time.sleep(_POLL_S)


def _signal(processes: Iterable[psutil.Process], send: Callable[[psutil.Process], None]) -> None:
    for process in processes:
        # psutil refuses (NoSuchProcess) to signal a pid whose start time changed: a reused pid
        # is never signalled. AccessDenied: not ours after all (setuid, or a race with exec);
        # it shows up as a survivor.
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            send(process)


def terminate_processes(procs: Sequence[psutil.Process], *, grace_s: float = 15.0,
                        kill_now: Callable[[], bool] = _NEVER) -> TerminationReport:
    """SIGTERM each process, wait up to ``grace_s`` (cut short by ``kill_now``: a second signal
    during teardown means "stop now"), SIGKILL what remains, and report. Each process is signalled
    by itself, not through ``killpg``: once a group's members are gone its id can be another's."""
    if grace_s < 0:
        raise ValueError(f"grace_s must be >= 0, got {grace_s}")
    summaries = {process.pid: _summary(process) for process in procs}
    if kill_now():
        gone: list[psutil.Process] = []
        alive = list(procs)
    else:
        _signal(procs, psutil.Process.terminate)
        gone, alive = _wait_gone(procs, grace_s, kill_now)
    _signal(alive, psutil.Process.kill)
    killed, survivors = _wait_gone(alive, KILL_WAIT_S)
    return TerminationReport(
        terminated=tuple(summaries[p.pid] for p in gone),
        killed=tuple(summaries[p.pid] for p in killed),
        survivors=tuple(summaries[p.pid] for p in survivors),
        escalated=kill_now(),
    )


_REMOTE_STOP_TIMEOUT_S = 120.0


def _run_remote(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_REMOTE_STOP_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KimiperfError(f"did not run ({exc})") from None
    if done.returncode != 0:
        raise KimiperfError(f"exited with code {done.returncode}: {(done.stderr or done.stdout).strip()[-400:]}")
    return agent_payload(done.stdout, where="the node agent's stop")


def remote_stop(argv: Sequence[str], *, where: str,
                run: Callable[[Sequence[str]], str] = _run_remote) -> TerminationReport:
    """Run the node agent's stop of a launch on another node (through its launch template) and read
    what it ended and what survived there. An agent that cannot run or answers nonsense leaves one
    unverified survivor, so the launch's record is kept and the next sweep tries again."""
    try:
        data = json.loads(run(argv))
        rows = {key: [(int(p["pid"]), str(p["name"]), tuple(p.get("cmdline", ()))) for p in data[key]]
                for key in ("terminated", "killed", "survivors")}
    except (KimiperfError, ValueError, KeyError, TypeError) as exc:
        return TerminationReport(survivors=(ProcessSummary(0, f"on {where}", (f"unverified: {exc}",), remote=True),))

    def summaries(key: str) -> tuple[ProcessSummary, ...]:
        return tuple(ProcessSummary(pid, f"{name} on {where}", cmdline, remote=True) for pid, name, cmdline in rows[key])

    return TerminationReport(terminated=summaries("terminated"), killed=summaries("killed"),
                             survivors=summaries("survivors"))


def stop_launch(record: LaunchRecord, *, grace_s: float = 15.0,
                kill_now: Callable[[], bool] = _NEVER) -> TerminationReport:
    """End every process of a launch, again for any child spawned while the first ones stopped."""
    report = TerminationReport()
    for _ in range(_MAX_STOP_ROUNDS):
        procs = find_launch_processes(record)
        known = {p.pid for p in report.survivors}
        if not procs or {p.pid for p in procs} <= known:
            break
        report = report.merged(terminate_processes(procs, grace_s=grace_s, kill_now=kill_now))
    return report


@dataclass(frozen=True)
class SweepReport:
    """What a sweep of stale launches did, for the session header and for GPU-memory waiting."""

    swept: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    ended: tuple[ProcessSummary, ...] = ()
    survivors: tuple[ProcessSummary, ...] = ()
    # MiB each ended process held; None where NVML named it without a figure.
    gpu_memory_mib: Mapping[int, int | None] | None = None
    problems: tuple[str, ...] = ()
    # Survivors of SIGKILL (stuck in the driver, typically) that held GPU memory.
    survivor_gpu_memory_mib: Mapping[int, int | None] | None = None

    def describe(self) -> list[str]:
        """Report lines; empty when there was nothing to do."""
        lines = [f"ended stale {launch}" for launch in self.swept]
        lines += [f"left alone {launch}" for launch in self.skipped]
        held = self.gpu_memory_mib or {}
        lines += [f"ended {p.describe()}" + (_held_words(held[p.pid]) if p.pid in held else "") for p in self.ended]
        lines += [f"STILL RUNNING after SIGKILL: {p.describe()}" for p in self.survivors]
        return lines + list(self.problems)


def _held_words(mib: int | None) -> str:
    # NVML named the process without a figure: what came back is told per GPU, after the sweep.
    return f", which held {mib} MiB of GPU memory" if mib is not None else (
        ", which held an unknown amount of GPU memory (NVML named it without a figure)")


@dataclass(frozen=True)
class SweepAccount:
    """What the sweep before the first boot ended, and how much GPU memory came back by that boot
    (the server manager fills ``returned_mib``; the reports say it)."""

    launches: tuple[str, ...]  # each stale launch ended (LaunchRecord.describe())
    processes: int  # processes ended
    returned_mib: Mapping[int, int] = field(default_factory=dict)  # by GPU index

    def summary(self) -> str:
        """``before the first boot the sweep ended 9 processes of 1 stale launch of a killed run
        (rtx8/default, pid 4242, ...); 720000 MiB of GPU memory came back on 8 GPUs``."""
        launches = "; ".join(self.launches)
        came_back = sum(mib for mib in self.returned_mib.values() if mib > 0)
        gpus = sum(1 for mib in self.returned_mib.values() if mib > 0)
        memory = (f"; {came_back} MiB of GPU memory came back on {gpus} GPU{'s' * (gpus != 1)}" if came_back else
                  "; no GPU memory came back" if self.returned_mib else "")
        return (f"before the first boot the sweep ended {self.processes} process{'es' * (self.processes != 1)} of "
                f"{len(self.launches)} stale launch{'es' * (len(self.launches) != 1)} of a killed run"
                f"{f' ({launches})' if launches else ''}{memory}")

    def to_json(self) -> dict[str, object]:
        """JSON-able form (travels in a ServerRecord)."""
        return {"launches": list(self.launches), "processes": self.processes,
                "returned_mib": {str(k): v for k, v in self.returned_mib.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepAccount:
        """Inverse of :meth:`to_json`."""
        return cls(launches=tuple(data["launches"]), processes=int(data["processes"]),
                   returned_mib={int(k): int(v) for k, v in (data.get("returned_mib") or {}).items()})


def sweep_stale_launches(
    state_dir: str | os.PathLike[str],
    *,
    grace_s: float,
    is_current: Callable[[LaunchRecord], bool] | None = None,
    gpu_probe: Callable[[], Mapping[int, int | None]] = gpu_memory_by_pid,
) -> SweepReport:
    """End the servers that earlier, dead pytest runs left behind, and forget their records.

    A launch of this session (``is_current``), of a live owner (it holds the record's lock), or of
    another host, boot, pid namespace or uid is left alone; a record whose processes survive
    SIGKILL is kept so the next sweep tries again.
    """
    here = LaunchPlace.here()
    loaded = load_launches(state_dir)
    problems = list(loaded.problems)
    skipped: list[str] = []
    swept: list[str] = []
    ended: list[ProcessSummary] = []
    survivors: list[ProcessSummary] = []
    gpu_before: dict[int, int | None] = {}
    probed = False
    for record in loaded.records:
        if is_current is not None and is_current(record):
            skipped.append(f"{record.describe()}: it belongs to this session")
            continue
        foreign = record.foreign_reason(here)
        if foreign is not None:
            skipped.append(f"{record.describe()}: {foreign}")
            continue
        with owner_gone(state_dir, record.launch_id) as gone:
            if not gone:
                skipped.append(f"{record.describe()}: its pytest session is still running")
                continue
            procs = find_launch_processes(record)
            if procs and not probed:
                probed = True
                try:
                    gpu_before.update(gpu_probe())
                except KimiperfError as error:
                    problems.append(f"could not read GPU memory per process before the sweep: {error}")
            report = stop_launch(record, grace_s=grace_s) if procs else TerminationReport()
            if record.node_stop:  # a node behind a launch template: what the launch left there
                report = report.combined(remote_stop(record.node_stop, where=f"the node of {record.describe()}"))
            ended.extend(report.ended)
            survivors.extend(report.survivors)
            if report.survivors:
                problems.append(
                    f"{record.describe()}: kept its state file, {len(report.survivors)} process(es) survive"
                )
            else:
                forget_launch(state_dir, record.launch_id)
                swept.append(record.describe())
    ended_pids = {p.pid for p in ended if not p.remote}
    survivor_pids = {p.pid for p in survivors if not p.remote}
    return SweepReport(
        swept=tuple(swept),
        skipped=tuple(skipped),
        ended=tuple(ended),
        survivors=tuple(survivors),
        gpu_memory_mib={pid: mib for pid, mib in gpu_before.items() if pid in ended_pids},
        problems=tuple(problems),
        survivor_gpu_memory_mib={pid: mib for pid, mib in gpu_before.items() if pid in survivor_pids},
    )
