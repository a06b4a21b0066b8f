"""What the plugin runs on another node of a deployment, through that node's launch template.

``facts``, ``snapshot --launch-id ID`` and ``stop --launch-id ID --grace S``, each printing one
marked JSON line last (server/agent_wire.py). The same code that reads this machine reads the node,
so the node needs only this package installed at the interpreter path the deployment's command names.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kimiperf.server.agent_wire import AGENT_MARK


def facts() -> dict[str, Any]:
    """This node's fingerprint facts (hard and soft), without any deployment's."""
    from pytest_kimiperf.measure.host_facts import probe_host_facts

    hard, soft = probe_host_facts()
    return {"hard": dict(hard), "soft": dict(soft)}


def snapshot(launch_id: str) -> dict[str, Any]:
    """The host counters, the process table, and which pids are the launch's, right now."""
    import psutil

    from pytest_kimiperf.measure.hostwatch import read_host_counters, read_processes
    from pytest_kimiperf.server.zombies import LAUNCH_ID_ENV, boot_id

    cpu, psi, notes = read_host_counters("/proc")
    t_s = time.monotonic()
    processes = read_processes()
    own = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(LAUNCH_ID_ENV) == launch_id:
                own.append(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return {"boot_id": boot_id(), "t_s": t_s, "busy_s": cpu.busy_s, "steal_s": cpu.steal_s, "cpu_count": cpu.cpu_count,
            "psi_some_us": psi, "notes": list(notes), "own": own,
            "processes": {str(pid): [p.create_time, p.cpu_s, p.children_s] for pid, p in processes.items()}}


def stop(launch_id: str, grace_s: float) -> dict[str, Any]:
    """End every process of this uid carrying the launch marker; what ended and what survived."""
    from pytest_kimiperf.server.zombies import processes_of, terminate_processes

    report = terminate_processes(processes_of(launch_id, uid=os.getuid(), trusted_pgid=None), grace_s=grace_s)

    def rows(procs: Sequence[Any]) -> list[Mapping[str, Any]]:
        return [{"pid": p.pid, "name": p.name, "cmdline": list(p.cmdline)} for p in procs]

    return {"terminated": rows(report.terminated), "killed": rows(report.killed),
            "survivors": rows(report.survivors)}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one agent command and print its JSON."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kimiperf.node_agent")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("facts", help="the node's fingerprint facts")
    for name in ("snapshot", "stop"):
        sub = commands.add_parser(name)
        sub.add_argument("--launch-id", required=True)
        if name == "stop":
            sub.add_argument("--grace", type=float, default=15.0)
    args = parser.parse_args(argv)
    if args.command == "facts":
        result = facts()
    elif args.command == "snapshot":
        result = snapshot(args.launch_id)
    else:
        result = stop(args.launch_id, args.grace)
    # One marked line, the last: a template may mix the node's stderr and banners in (agent_wire.py).
    print(AGENT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
