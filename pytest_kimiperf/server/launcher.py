"""The small process between pytest and the server: the server must not outlive its session.

``python -m pytest_kimiperf.server.launcher --watch-fd N --grace S -- COMMAND...`` starts COMMAND
as its child in the launcher's own session (so the launch's group has a leader that lives exactly
as long as the launch), and watches a pipe whose only write end pytest holds. When pytest dies
without teardown (SIGKILL, the OOM killer, pytest-timeout's ``os._exit``), the launcher reads EOF
and stops the launch: SIGTERM, ``S`` seconds of grace, SIGKILL. Not ``PR_SET_PDEATHSIG``: it
reaches only the direct child (vLLM's EngineCore and workers would be orphaned), fires when the
*thread* that forked exits, and cannot escalate. When the server exits, the launcher ends what it
left in the group and exits the way the server did, so pytest reports its exit status.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import subprocess
import sys
import time

from pytest_kimiperf.server import zombies as process_sweep

# After the server exited on its own, what it left gets this long before SIGKILL: the server
# is already gone, its engine serves nobody, and pytest is waiting to report the exit.
ORPHAN_GRACE_S = 2.0
# Launcher exit code when the command cannot be started at all (as a shell says it).
_CANNOT_START = 127
# The line the launcher writes to the log when the command ends, with the wall-clock time: the
# nodes of one server (cluster.py) are ordered by it to say which died first.
ENDED = "kimiperf launcher: the command ended with code "


def _end_the_rest(grace_s: float) -> None:
    launch_id = os.environ.get(process_sweep.LAUNCH_ID_ENV, "")
    procs = process_sweep.processes_of(launch_id, uid=os.getuid(), trusted_pgid=os.getpgid(0))
    if procs:
        process_sweep.terminate_processes(procs, grace_s=grace_s)


def _exit_like(code: int) -> None:
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught, nor reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Run the launcher (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kimiperf.server.launcher")
    parser.add_argument("--watch-fd", type=int, required=True)
    parser.add_argument("--grace", type=float, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"kimiperf launcher: could not start {command[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        sys.exit(_CANNOT_START)

    def forward(signum: int, frame: object) -> None:
        # pytest's teardown signals every process of the launch itself; forwarding only makes
        # sure the server hears it even if it were started in a group of its own.
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    selector = selectors.DefaultSelector()
    selector.register(args.watch_fd, selectors.EVENT_READ)
    while child.poll() is None:
        if selector.select(timeout=0.2) and not os.read(args.watch_fd, 1):
            # EOF: pytest is gone without stopping us. Stop the whole launch and leave.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _end_the_rest(args.grace)
            sys.exit(0)
    print(f"{ENDED}{child.returncode} at {time.time():.3f}", file=sys.stderr, flush=True)
    _end_the_rest(ORPHAN_GRACE_S)
    _exit_like(child.returncode)


if __name__ == "__main__":
    main()
