"""A server launch's record on disk: what it started, where, and whether its owner still runs.

One JSON file per launch in the state directory (``launch-<id>.json``), written atomically by
the session that launched the server and read by any later sweep (``zombies.py``).  A record says
who the launch's leader is beyond its pid (its start time in clock ticks since boot,
``/proc/PID/stat`` field 22, and the boot's id), the host, boot, pid namespace and uid it was
launched in (``Place``), and carries its owner's liveness as an exclusive ``flock`` held on the
file for the launch's whole life: the kernel drops it when the owner dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil

from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.errors import KimiperfError

_RECORD_PREFIX = "launch-"
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


# --------------------------------------------------------------------------- where we are


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

    Exact and monotonic, unlike psutil's create_time (boot time + ticks, in wall-clock seconds,
    which moves when the clock is stepped).
    """
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
class Place:
    """The host, boot, pid namespace and uid a launch happened in."""

    host: str
    boot_id: str
    pid_ns: str
    uid: int

    @classmethod
    def here(cls) -> Place:
        """Where this process runs."""
        return cls(host=socket.gethostname(), boot_id=boot_id(), pid_ns=pid_namespace(), uid=os.getuid())


def _text_field(data: Mapping[str, object], name: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} is {value!r}, expected a string")
    return value


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
    # A node of a multi-node deployment started through a launch template (server/cluster.py):
    # the node agent's command that stops this launch's processes there. Empty for a launch
    # whose processes all run on this machine.
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
        cmdline = data.get("cmdline")
        if not isinstance(cmdline, list) or not all(isinstance(arg, str) for arg in cmdline):
            raise ValueError(f"field 'cmdline' is {cmdline!r}, expected a list of strings")
        launch_id = _text_field(data, "launch_id")
        check_safe_name("launch id", launch_id, source="state file")
        place_known = "boot_id" in data
        node_stop = data.get("node_stop", [])
        if not isinstance(node_stop, list) or not all(isinstance(arg, str) for arg in node_stop):
            raise ValueError(f"field 'node_stop' is {node_stop!r}, expected a list of strings")
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
            start_ticks=_int_field(data, "start_ticks", minimum=0) if place_known else 0,
            host=_text_field(data, "host") if place_known else "",
            boot_id=_text_field(data, "boot_id") if place_known else "",
            pid_ns=_text_field(data, "pid_ns") if place_known else "",
            uid=_int_field(data, "uid", minimum=0) if place_known else -1,
            node_stop=tuple(node_stop),
        )

    @property
    def place(self) -> Place:
        """Where the launch happened."""
        return Place(host=self.host, boot_id=self.boot_id, pid_ns=self.pid_ns, uid=self.uid)

    def foreign_reason(self, here: Place) -> str | None:
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
    here = Place.here()
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
        host=here.host,
        boot_id=here.boot_id,
        pid_ns=here.pid_ns,
        uid=here.uid,
    )


# --------------------------------------------------------------------------- state files


def _record_path(state_dir: Path, launch_id: str) -> Path:
    check_safe_name("launch id", launch_id)
    return Path(state_dir) / f"{_RECORD_PREFIX}{launch_id}.json"


class HeldLaunch:
    """A launch record on disk with its owner's exclusive flock held until :meth:`release`.

    Keep it for the launch's whole life: the lock is how other sessions' sweeps know that the
    owner still runs. The descriptor is not inherited by the processes this one starts
    (Python's default), so a server cannot keep its dead owner's lock alive.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (the record file stays unless forgotten)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def record_launch(state_dir: str | os.PathLike[str], record: LaunchRecord) -> HeldLaunch:
    """Write the launch's state file atomically and hold its owner lock.

    The lock is taken on the temporary file before it is renamed into place, so no sweep can
    ever see the record without the lock.
    """
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
    return HeldLaunch(path, fd)


def forget_launch(state_dir: str | os.PathLike[str], launch_id: str) -> None:
    """Remove the launch's state file; a file already gone is fine (another session swept it)."""
    with contextlib.suppress(FileNotFoundError):
        _record_path(Path(state_dir), launch_id).unlink()


@contextlib.contextmanager
def owner_gone(state_dir: str | os.PathLike[str], launch_id: str) -> Iterator[bool]:
    """Yields whether the launch's owner is gone, holding its record's lock meanwhile if so.

    Holding it while its processes are stopped keeps a second sweeping session off the same
    record.
    """
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


__all__ = [
    "HeldLaunch",
    "LaunchRecord",
    "LoadedLaunches",
    "Place",
    "boot_id",
    "forget_launch",
    "load_launches",
    "owner_gone",
    "pid_namespace",
    "record_for_popen",
    "record_launch",
    "start_ticks",
]
