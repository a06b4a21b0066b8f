"""One pytest session at a time boots servers on a host.

Two sessions that both boot the deployment's servers (8 GPUs each for Kimi, or the two cores of
a CPU runner) must not run side by side: the second would fail to fit, or both would measure a
shared machine. CI's concurrency group covers CI jobs only; an engineer at a terminal is the
common case. So the first session to boot takes an exclusive ``flock`` on ``host.lock`` in the
launch-state directory and holds it until its servers are stopped; the kernel drops it if the
session dies. A second session waits, saying who holds the host (pid, command, for how long),
up to a bound, then fails naming the holder.

The lock lives beside the launch records (``$KIMIPERF_STATE_DIR``, else the user's cache), so it
serializes the sessions of one user; users who share a host's GPUs point ``KIMIPERF_STATE_DIR``
at one shared directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.errors import ServerError

LOCK_NAME = "host.lock"
HOLDER_NAME = "host-holder.json"
# How often a waiting session repeats who it waits for (a 36-minute boot is long to watch).
_REMIND_S = 60.0


@dataclass(frozen=True)
class Holder:
    """The session holding the host, as it described itself."""

    pid: int
    command: str
    since: float

    def describe(self, now: float) -> str:
        """``pid 123 (pytest perf_tests ...), holding the host for 4m12s``."""
        held_s = max(0, int(now - self.since))
        return f"pid {self.pid} ({self.command}), holding the host for {held_s // 60}m{held_s % 60:02d}s"


def _read_holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Holder(pid=int(data["pid"]), command=str(data["command"]), since=float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_holder(path: Path) -> None:
    try:
        command = " ".join(psutil.Process().cmdline())
    except psutil.Error:
        command = "?"
    command = command if len(command) <= 200 else command[:197] + "..."
    write_atomically(path, json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))


class HostClaim:
    """This session's hold on the host; :meth:`release` (or death) hands it on."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        """Let the next session boot."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def claim_host(
    state_dir: Path, *, wait_s: float, say: Callable[[str], None], poll_s: float = 0.25,
) -> HostClaim:
    """Take the host for this session's servers, waiting up to ``wait_s`` for another session.

    Raises ServerError naming the holder when the wait runs out.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    start = time.monotonic()
    next_word = start
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            now = time.monotonic()
            holder = _read_holder(state_dir / HOLDER_NAME)
            who = holder.describe(time.time()) if holder else "a session that has not said who it is"
            if now - start >= wait_s:
                raise ServerError(
                    f"another pytest session on this host is using it for its servers: {who}; "
                    f"waited {now - start:.0f}s (--kimiperf-host-wait {wait_s:g}). Let it finish, stop "
                    "it, or wait longer with --kimiperf-host-wait"
                )
            if now >= next_word:
                say(f"kimiperf: waiting for another pytest session on this host to finish with its "
                    f"servers: {who}; waiting up to {wait_s:g}s (--kimiperf-host-wait)")
                next_word = now + _REMIND_S
            time.sleep(poll_s)
    except BaseException:
        os.close(fd)
        raise
    if time.monotonic() - start > poll_s:
        say(f"kimiperf: the host is free after {time.monotonic() - start:.0f}s of waiting")
    with contextlib.suppress(OSError):
        _write_holder(state_dir / HOLDER_NAME)
    return HostClaim(fd)


__all__ = ["HOLDER_NAME", "LOCK_NAME", "Holder", "HostClaim", "claim_host"]
