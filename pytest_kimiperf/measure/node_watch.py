"""The host watch on the nodes of a deployment that this machine reaches only through a launch
template: the node agent's snapshot (``python -m pytest_kimiperf.node_agent snapshot``) at the
window's two ends, compared by the same arithmetic as this machine's (hostwatch.compare_snapshots).

A node running here is this machine: its processes are the server's (watched.own_pids), and
the local HostWatch reads it. A node elsewhere counts as ours every process that carries its
launch's marker; everything else on it is foreign. The agent runs through ssh or srun, so each
end costs a round trip (tens of ms on a LAN) outside the measured requests; its own process is
foreign load of a few ms, far below any bound.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_kimiperf.config.nodes import Node
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.measure.host_readings import CpuCounters, HostSnapshot, ProcessCpu
from pytest_kimiperf.measure.hostwatch import HostReading, compare_snapshots
from pytest_kimiperf.server.cluster import agent_argv, run_agent
from pytest_kimiperf.server.launch_records import boot_id

AgentRun = Callable[[Node, list[str]], str]


@dataclass(frozen=True)
class NodeSnapshot:
    """One end of a window on a node: its counters, its launch's pids, the agent's notes, its boot."""

    snapshot: HostSnapshot
    own: frozenset[int]
    notes: tuple[str, ...]
    boot_id: str


def parse_snapshot(text: str, *, node: str) -> NodeSnapshot:
    """The agent's snapshot JSON; KimiperfError naming the node if it is not that."""
    try:
        data: Mapping[str, Any] = json.loads(text)
        snap = HostSnapshot(
            t_s=float(data["t_s"]),
            cpu=CpuCounters(float(data["busy_s"]), float(data["steal_s"]), int(data["cpu_count"])),
            psi_some_us={str(k): int(v) for k, v in data["psi_some_us"].items()},
            processes={int(pid): ProcessCpu(*map(float, row)) for pid, row in data["processes"].items()})
        return NodeSnapshot(snap, frozenset(int(p) for p in data["own"]), tuple(str(n) for n in data.get("notes", ())),
                            str(data.get("boot_id", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise KimiperfError(f"node {node}: the node agent's snapshot is not its JSON ({exc}): {text[:200]!r}") from None


class NodeWatch:
    """Watches the remote nodes of a deployment during one measured window.

    A node whose kernel boot id is this machine's is this machine (a loopback node behind a
    template, as in the CPU twin's test): the local watch reads it, with that launch's processes
    (``here_pids``) among its own, and the node is said to be so instead of being read twice.
    """

    def __init__(self, nodes: Sequence[tuple[Node, str]], *, run: AgentRun = run_agent,
                 python: str = sys.executable, here_boot_id: str | None = None) -> None:
        self._nodes = tuple(nodes)
        self._run = run
        self._python = python
        self._here = here_boot_id if here_boot_id is not None else boot_id()
        self._start: dict[str, NodeSnapshot] = {}
        self.here: list[str] = []  # nodes found to be this machine
        # Their launches' processes: ours for the local watch (a node reached by `ssh localhost`
        # runs under sshd, not under pytest, so only its marker says it is ours).
        self.here_pids: set[int] = set()

    def _snapshot(self, node: Node, launch_id: str) -> NodeSnapshot:
        text = self._run(node, agent_argv(node, self._python, "snapshot", "--launch-id", launch_id))
        return parse_snapshot(text, node=node.name)

    def start(self) -> None:
        """Take every node's first snapshot."""
        self._start, self.here, self.here_pids = {}, [], set()
        for node, launch_id in self._nodes:
            first = self._snapshot(node, launch_id)
            if first.boot_id and first.boot_id == self._here:
                self.here.append(node.name)
                self.here_pids |= first.own
            else:
                self._start[node.name] = first

    def stop(self) -> list[HostReading]:
        """One reading per node not on this machine: what else used it since :meth:`start`."""
        readings = []
        for node, launch_id in self._nodes:
            if node.name not in self._start:
                continue
            first, last = self._start[node.name], self._snapshot(node, launch_id)
            reading = compare_snapshots(first.snapshot, last.snapshot, first.own | last.own)
            readings.append(replace(reading, notes=last.notes, node=node.name))
        return readings


__all__ = ["NodeSnapshot", "NodeWatch", "parse_snapshot"]
