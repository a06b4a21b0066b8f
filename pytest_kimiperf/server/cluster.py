"""The processes of a deployment that spans nodes: one launch per node, booted, watched and
stopped as one server.

Each node's command (config/nodes.py) runs as its own ``ServerProcess``: its own launcher,
log, launch record and marker, so the zombie sweep and the teardown find every node's
processes as they find a one-machine server's. The head (rank 0) is the one that becomes ready
(``/health`` and ``/v1/models``); a worker node has no HTTP endpoint, so it is alive while its
launch runs. A node that exits fails the boot (or the next test) with its name and its log
tail: vLLM's head does not notice an idle worker node's death until its next collective
(measured on the CPU twin: the head answered /health until a request failed with "EngineCore
encountered an issue"), so the node's own exit is the first sign.

A node started through a launch template (ssh, srun) is, on this machine, only the template's
process; its processes on the node are found and stopped there by the node agent
(``python -m pytest_kimiperf.node_agent stop``), run through the same template.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_kimiperf.config.nodes import Node, launch_argv, node_commands
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server import sweep as process_sweep
from pytest_kimiperf.server.process import (
    LAUNCH_ID_ENV,
    SECRET_NAMES,
    SPT_NOENV,
    ProgressCallback,
    ServerHandle,
    ServerProcess,
    tail_lines,
)

AGENT_TIMEOUT_S = 60.0
# How long worker nodes get to finish exiting once the head stopped serving (their launcher gives
# what a node left 2 s: launcher.ORPHAN_GRACE_S).
WORKER_EXIT_WAIT_S = 5.0
# argv (the node's launch template filled with its host) -> the agent's stdout
AgentRunner = Callable[[Node, list[str]], str]


def agent_argv(node: Node, python: str, *args: str) -> list[str]:
    """The node agent's command line, inside ``node``'s launch template (as its server's is)."""
    import shlex

    inner = [python, "-m", "pytest_kimiperf.node_agent", *args]
    values = {"host": node.host, "name": node.name, "command": shlex.join(inner)}
    prefix = [part.format(**values) for part in node.launch]
    return prefix if "{command}" in node.launch else [*prefix, *inner]


def run_agent(node: Node, argv: list[str]) -> str:
    """Run the node agent and return what it printed; ServerError naming the node if it failed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"node {node.describe()}: the node agent did not run ({exc}); command: "
                          f"{' '.join(argv)}") from None
    if done.returncode != 0:
        raise ServerError(f"node {node.describe()}: the node agent exited with code {done.returncode}: "
                          f"{done.stderr.strip()[-800:]}; command: {' '.join(argv)}")
    return done.stdout


def stop_argv(node: Node, python: str, launch_id: str, grace_s: float) -> list[str]:
    """The node agent's stop of one launch on ``node``, inside its launch template."""
    return agent_argv(node, python, "stop", "--launch-id", launch_id, "--grace", f"{grace_s:g}")


@dataclass
class NodeLaunch:
    """One node of the group: its spec, rank and the process this machine started for it."""

    node: Node
    rank: int
    process: ServerProcess

    def describe(self) -> str:
        """``node node1 (127.0.0.1, this machine), worker rank 1``."""
        return f"node {self.node.describe()}, {'head' if self.rank == 0 else 'worker'} rank {self.rank}"


class NodeGroup:
    """Every node of one boot: the head and its worker nodes, managed as one server."""

    def __init__(self, launches: Sequence[NodeLaunch], *, python: str,
                 agent: AgentRunner = lambda node, argv: run_agent(node, argv)) -> None:
        assert launches and launches[0].rank == 0, "the head first"
        self.launches = list(launches)
        self.head = launches[0].process
        self.python = python
        self._agent = agent

    # ServerProcess's face, as the manager uses it
    @property
    def deployment(self) -> str:
        return self.head.deployment

    @property
    def profile(self) -> str:
        return self.head.profile

    @property
    def base_url(self) -> str:
        return self.head.base_url

    @property
    def boot_s(self) -> float | None:
        return self.head.boot_s

    @property
    def record(self) -> object | None:
        """Not None while any node's stop is unverified (so the manager tries again)."""
        return next((n.process.record for n in self.launches if n.process.record is not None), None)

    def start(self) -> None:
        """Start every node, the head first; a node that cannot start stops those already up."""
        started: list[NodeLaunch] = []
        try:
            for launch in self.launches:
                launch.process.start()
                started.append(launch)
        except BaseException:
            for launch in reversed(started):
                launch.process.stop()
            raise

    def wait_ready(self, on_progress: ProgressCallback | None = None) -> ServerHandle:
        """Wait for the head to serve; a worker node that exits meanwhile fails the boot.

        Any exception (a node's death, the deadline, Ctrl-C) stops every node before it
        propagates, as a one-machine server's wait does.
        """
        def progress(state: object, elapsed: float, changed: bool) -> None:
            self._raise_if_a_worker_died("while booting")
            if on_progress is not None:
                on_progress(state, elapsed, changed)  # type: ignore[arg-type]

        try:
            handle = self.head.wait_ready(progress)
        except BaseException:
            self.stop()
            raise
        others = tuple(pid for n in self.launches[1:] if n.node.local and (pid := n.process.server_pid()))
        from dataclasses import replace

        remote = tuple((n.node, n.process.launch_id) for n in self.launches[1:] if not n.node.local)
        return replace(handle, node_pids=others, nodes=tuple(n.node.name for n in self.launches), remote_nodes=remote)

    def _raise_if_a_worker_died(self, when: str) -> None:
        for launch in self.launches[1:]:
            popen = launch.process.popen
            code = popen.poll() if popen is not None else None
            if code is not None:
                raise ServerError(
                    f"{launch.describe()} of the {self.deployment} server ({self.profile}) exited with code "
                    f"{code} {when}; log: {launch.process.log_path}\n{tail_lines(launch.process.log_path)}")

    def ensure_alive(self, *, settle_s: float = WORKER_EXIT_WAIT_S) -> None:
        """ServerError naming the node (with its log tail) unless every node runs and the head serves.

        A head that stopped serving is often the consequence: its engine died at the first
        collective after a worker node's death. So the worker nodes get ``settle_s`` to finish
        exiting (their launcher ends what the node left first), and a dead one is the message.
        """
        self._raise_if_a_worker_died("during the session")
        try:
            self.head.ensure_alive()
        except ServerError as head_error:
            deadline = time.monotonic() + settle_s
            while True:
                try:
                    self._raise_if_a_worker_died("during the session")
                except ServerError as node_error:
                    raise ServerError(f"{node_error}\nthe head then failed too: {str(head_error).splitlines()[0]}") from None
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> process_sweep.TerminationReport | None:
        """Stop the head first (vLLM shuts its engine down), then every worker node; on a node
        behind a launch template, the node agent stops what the launch left there."""
        reports = []
        for launch in self.launches:
            report = launch.process.stop()
            if report is not None:
                reports.append(report)
            if not launch.node.local:
                reports.append(self._stop_there(launch))
        if not reports:
            return None
        total = process_sweep.TerminationReport()
        for report in reports:
            total = total.combined(report)
        return total

    def _stop_there(self, launch: NodeLaunch) -> process_sweep.TerminationReport:
        argv = stop_argv(launch.node, self.python, launch.process.launch_id, launch.process.grace_s)
        return process_sweep.remote_stop(argv, where=launch.node.name,
                                         run=lambda argv: self._agent(launch.node, argv))

    def server_pid(self) -> int | None:
        """The head's server pid."""
        return self.head.server_pid()

    def describe(self) -> str:
        """``2 nodes: node0 (head, ...), node1 (worker, ...; log: ...)``."""
        parts = [f"{n.node.describe()} {'head' if n.rank == 0 else f'worker rank {n.rank}; log: {n.process.log_path}'}"
                 for n in self.launches]
        return f"{len(parts)} nodes: " + ", ".join(parts)


def node_group(head: ServerProcess, nodes: Sequence[Node], engine_argv: Sequence[str], *,
               exported: Mapping[str, str], master_port: int) -> NodeGroup:
    """The group that boots ``nodes`` around ``head`` (the one-machine server the manager built,
    which becomes node 0): each node's command from vLLM's multi-node flags, each worker node a
    process of its own with its own log beside the head's.

    ``exported``: the variables every node must see (the deployment's and the profile's: a
    profile's NCCL settings reach every rank); a node started through a template gets them, its
    own and the launch marker through ``env``, one on this machine through its environment.
    """
    # A template's command line is visible in `ps` on both machines: secrets never travel on it.
    # A remote node that needs one (HF_TOKEN to fetch weights) reads it from its own environment.
    exported = {k: v for k, v in exported.items() if k not in SECRET_NAMES}
    commands = node_commands(nodes, engine_argv, master_port=master_port, env=exported)
    if not nodes[0].local:
        raise ServerError(f"the head node {nodes[0].describe()} must run on this machine (launch = []): "
                          "its API server is measured and its processes watched from here")
    head.argv = list(commands[0].argv)
    head.env.update(nodes[0].env)
    launches = [NodeLaunch(nodes[0], 0, head)]
    for command in commands[1:]:
        node = command.node
        log = head.log_path.with_name(f"{head.log_path.stem}-{node.name}{head.log_path.suffix}")
        process = ServerProcess(
            argv=[], env={k: v for k, v in head.env.items() if k != LAUNCH_ID_ENV}, log_path=log,
            state_dir=head.state_dir, base_url=head.base_url, served_model_name=head.served_model_name,
            deployment=head.deployment, profile=head.profile, deadline_s=head.deadline_s,
            grace_s=head.grace_s, control=head.control)
        if node.local:
            process.env.update(node.env)
        marker = {LAUNCH_ID_ENV: process.launch_id, SPT_NOENV: "1"}
        process.argv = launch_argv(command, marker)
        if not node.local:
            process.node_stop = tuple(stop_argv(node, sys.executable, process.launch_id, process.grace_s))
        launches.append(NodeLaunch(node, command.rank, process))
    return NodeGroup(launches, python=sys.executable)


__all__ = ["AgentRunner", "NodeGroup", "NodeLaunch", "agent_argv", "node_group", "run_agent", "stop_argv"]
