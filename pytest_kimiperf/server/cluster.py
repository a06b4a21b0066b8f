"""The processes of a deployment that spans nodes: one launch per node, booted, watched and
stopped as one server.

Each node's command (config/nodes.py) runs as its own ``ServerProcess`` (launcher, log, launch
record, marker), so the sweep and teardown find every node's processes. The head (rank 0) becomes
ready; a worker node has no endpoint and is alive while its launch runs. A node that exits fails
the boot (or the next test) with its name and log tail: vLLM's head does not notice an idle
worker's death until its next collective (measured on the CPU twin). A node behind a launch
template (ssh, srun) is, here, only the template's process; the node agent (``python -m
pytest_kimiperf.node_agent stop``) stops its processes there.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import reduce
from pathlib import Path

from pytest_kimiperf.config.nodes import SECRET_NAMES, Node, in_template, launch_argv, node_commands
from pytest_kimiperf.errors import KimiperfError, ServerError
from pytest_kimiperf.server import zombies as process_sweep
from pytest_kimiperf.server.agent_wire import agent_payload
from pytest_kimiperf.server.launcher import ENDED
from pytest_kimiperf.server.process import (
    LAUNCH_ID_ENV,
    SPT_NOENV,
    ProgressCallback,
    ServerHandle,
    ServerProcess,
    tail_lines,
)
from pytest_kimiperf.server.progress import BootProgress

_AGENT_TIMEOUT_S = 60.0
# How long worker nodes get to finish exiting once the head stopped serving (their launcher gives
# what a node left 2 s: launcher.ORPHAN_GRACE_S).
_WORKER_EXIT_WAIT_S = 5.0
# argv (the node's launch template filled with its host), timeout -> what the agent printed
AgentRunner = Callable[[Node, list[str], float], str]


def agent_argv(node: Node, python: str, *args: str) -> list[str]:
    """The node agent's command line, inside ``node``'s launch template (as its server's is)."""
    return in_template(node, [python, "-m", "pytest_kimiperf.node_agent", *args])


def run_agent(node: Node, argv: list[str], timeout_s: float = _AGENT_TIMEOUT_S) -> str:
    """Run the node agent and return its answer's JSON; ServerError naming the node if it failed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"node {node.describe()}: the node agent did not run ({exc}); command: "
                          f"{' '.join(argv)}") from None
    if done.returncode != 0:
        raise ServerError(f"node {node.describe()}: the node agent exited with code {done.returncode}: "
                          f"{(done.stderr or done.stdout).strip()[-800:]}; command: {' '.join(argv)}")
    try:
        return agent_payload(done.stdout, where=f"node {node.describe()}")
    except KimiperfError as exc:
        raise ServerError(str(exc)) from None


def stop_argv(node: Node, python: str, launch_id: str, grace_s: float) -> list[str]:
    """The node agent's stop of one launch on ``node``, inside its launch template."""
    return agent_argv(node, python, "stop", "--launch-id", launch_id, "--grace", f"{grace_s:g}")


def _ended_at(log_path: Path | None) -> float | None:
    """When the launcher saw the node's command end (its last ``launcher.ENDED`` line), if it says."""
    if log_path is None:
        return None
    for line in reversed(tail_lines(log_path, 20).splitlines()):
        if line.startswith(ENDED) and " at " in line:
            try:
                return float(line.rsplit(" at ", 1)[1])
            except ValueError:
                return None
    return None


@dataclass
class NodeLaunch:
    """One node of the group: its spec, rank and the process this machine started for it."""

    node: Node
    rank: int
    process: ServerProcess

    def describe(self) -> str:
        """``node node1 (127.0.0.1, this machine), worker rank 1``."""
        return f"node {self.node.describe()}, {'head' if self.rank == 0 else 'worker'} rank {self.rank}"

    def exit_code(self) -> int | None:
        """The node's exit status on this machine (its launcher's), None while it runs."""
        popen = self.process.popen
        return popen.poll() if popen is not None else None


class NodeGroup:
    """Every node of one boot: the head and its worker nodes, managed as one server."""

    def __init__(self, launches: Sequence[NodeLaunch], *, python: str, agent: AgentRunner = run_agent) -> None:
        assert launches and launches[0].rank == 0, "the head first"
        self.launches = list(launches)
        self.head = launches[0].process
        self.python = python
        self._agent = agent
        # Nodes whose processes there may not all have ended (a failed or unverified agent
        # stop): their local record is kept so close() and the next run's sweep try again.
        self._unverified: set[str] = set()

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
                started.append(launch)
                launch.process.start()
        except BaseException:
            self._stop_all(started)
            raise

    def wait_ready(self, on_progress: ProgressCallback | None = None) -> ServerHandle:
        """Wait for the head to serve; a worker node that exits meanwhile fails the boot, and any
        exception stops every node first, as a one-machine server's wait does."""
        def progress(state: BootProgress, elapsed: float, changed: bool) -> None:
            if self.launches[0].exit_code() is None:
                self._raise_for_dead_workers("while booting")
            if on_progress is not None:
                on_progress(state, elapsed, changed)

        try:
            try:
                handle = self.head.wait_ready(progress)
            except ServerError as head_error:
                raise self._cause(head_error, "while booting") from None
            self._raise_for_dead_workers("while booting")
        except BaseException:
            self.stop()
            raise
        others = tuple(pid for n in self.launches[1:] if n.node.local and (pid := n.process.server_pid()))
        remote = tuple((n.node, n.process.launch_id) for n in self.launches[1:] if not n.node.local)
        return replace(handle, node_pids=others, nodes=tuple(n.node.name for n in self.launches), remote_nodes=remote)

    def _dead_workers(self) -> list[tuple[NodeLaunch, int]]:
        return [(n, code) for n in self.launches[1:] if (code := n.exit_code()) is not None]

    def _worker_error(self, launch: NodeLaunch, code: int, when: str) -> ServerError:
        log = launch.process.log_path
        return ServerError(f"{launch.describe()} of the {self.deployment} server ({self.profile}) exited with code "
                           f"{code} {when}; log: {log}\n{tail_lines(log)}")

    def _raise_for_dead_workers(self, when: str) -> None:
        dead = self._dead_workers()
        if dead:
            raise self._worker_error(*dead[0], when)

    def _cause(self, head_error: ServerError, when: str, settle_s: float = 0.0) -> ServerError:
        """The error to report when the head failed: a worker node that died before it (by the
        launchers' ENDED lines) is the cause; else the head's own error, naming the nodes that
        died too. ``settle_s``: how long worker nodes get to finish exiting first."""
        deadline = time.monotonic() + settle_s
        dead = self._dead_workers()
        while not dead and time.monotonic() < deadline:
            time.sleep(0.2)
            dead = self._dead_workers()
        if not dead:
            return head_error
        head_ended = _ended_at(self.head.log_path) if self.launches[0].exit_code() is not None else None
        first, code = min(dead, key=lambda item: _ended_at(item[0].process.log_path) or float("inf"))
        first_ended = _ended_at(first.process.log_path)
        if head_ended is None or (first_ended is not None and first_ended <= head_ended):
            return ServerError(f"{self._worker_error(first, code, when)}\nthe head then failed too: "
                               f"{str(head_error).splitlines()[0]}")
        also = ", ".join(f"{n.node.name} (code {c}; log: {n.process.log_path})" for n, c in dead)
        return ServerError(f"{head_error}\nworker node(s) that exited after the head: {also}")

    def ensure_alive(self, *, settle_s: float = _WORKER_EXIT_WAIT_S) -> None:
        """ServerError naming the node (with its log tail) unless every node runs and the head serves.

        A head that stopped serving is often the consequence of a worker node's death (its engine
        died at the next collective), so the workers get ``settle_s`` to finish exiting and the
        node that ended first is the message.
        """
        if self.launches[0].exit_code() is None:
            self._raise_for_dead_workers("during the session")
        try:
            self.head.ensure_alive()
        except ServerError as head_error:
            raise self._cause(head_error, "during the session", settle_s) from None

    def stop(self) -> process_sweep.TerminationReport | None:
        """Stop the head first (vLLM shuts its engine down), then every worker node."""
        return self._stop_all(self.launches)

    def _stop_all(self, launches: Sequence[NodeLaunch]) -> process_sweep.TerminationReport | None:
        """Stop each of ``launches``, every one even if another's stop raises (the first error
        is raised after the rest were stopped)."""
        reports: list[process_sweep.TerminationReport] = []
        error: BaseException | None = None
        for launch in launches:
            try:
                report = self._stop_one(launch)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after every node
                error = error or exc
                continue
            if report is not None:
                reports.append(report)
        if error is not None:
            raise error
        return reduce(process_sweep.TerminationReport.combined, reports) if reports else None

    def _stop_one(self, launch: NodeLaunch) -> process_sweep.TerminationReport | None:
        """One node's stop. Behind a template, the agent stops the launch there first (while the
        template's process still holds the node's session); the local record is kept unless
        that stop is verified, so close() and the next run's sweep try again."""
        if launch.node.local:
            return launch.process.stop()
        if launch.process.record is None and launch.node.name not in self._unverified:
            return None  # never started, or already stopped and verified
        control = launch.process.control
        grace = 0.0 if control.kill_now else launch.process.grace_s
        argv = stop_argv(launch.node, self.python, launch.process.launch_id, grace)
        timeout = grace + process_sweep.KILL_WAIT_S + _AGENT_TIMEOUT_S
        control.stopping = True
        try:
            there = process_sweep.remote_stop(argv, where=launch.node.name,
                                              run=lambda argv: self._agent(launch.node, list(argv), timeout))
        finally:
            control.stopping = False
        if there.survivors:
            self._unverified.add(launch.node.name)
            return there.combined(launch.process.stop(keep_record=True) or process_sweep.TerminationReport())
        self._unverified.discard(launch.node.name)
        return there.combined(launch.process.stop() or process_sweep.TerminationReport())

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
    which becomes node 0), each worker node a process of its own with its log beside the head's.

    ``exported``: what every node must see (the deployment's and the profile's variables: a
    profile's NCCL settings reach every rank).
    """
    # A template's command line is visible in `ps` on both machines: secrets never travel on it.
    # A remote node that needs one (HF_TOKEN to fetch weights) reads it from its own environment.
    exported = {k: v for k, v in exported.items() if k not in SECRET_NAMES}
    commands = node_commands(nodes, engine_argv, master_port=master_port, env=exported)
    if not nodes[0].local:
        raise ServerError(f"the head node {nodes[0].describe()} must run on this machine (launch = []): "
                          "its API server is measured and its processes watched from here")
    head.argv = list(commands[0].argv)
    shared_env = {k: v for k, v in head.env.items() if k != LAUNCH_ID_ENV}  # before the head's own
    head.env.update(nodes[0].env)
    launches = [NodeLaunch(nodes[0], 0, head)]
    for command in commands[1:]:
        node = command.node
        log = head.log_path.with_name(f"{head.log_path.stem}-{node.name}{head.log_path.suffix}")
        process = ServerProcess(
            argv=[], env=dict(shared_env), log_path=log,
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
