"""What ``systemctl restart`` does for a server the tests start themselves: a real restart.

``python restart_server.py --pidfile F --log L -- <server argv>`` stops the server whose pid is in
``F`` (SIGTERM to its process group, SIGKILL after ``--grace`` seconds), waits until it is gone,
starts ``<server argv>`` in a new session with its output appended to ``L``, writes the new pid
to ``F`` and returns: the server is then starting, not yet serving, as after systemctl. Without
a pidfile it only starts. An attached run's ``restart_command`` calls it between boots.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil


def _alive(pid: int) -> bool:
    """Running (a zombie is not: its parent, maybe a subreaper, reaps it when it will)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop(pid: int, grace_s: float) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while _alive(pid):
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pidfile", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        sys.exit("restart_server.py: give the server's argv after --")
    if args.pidfile.exists():
        stop(int(args.pidfile.read_text()), args.grace)
    with args.log.open("a") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    args.pidfile.write_text(str(proc.pid))


if __name__ == "__main__":
    main()
