"""A deployment that spans nodes: which nodes, how each is started, and each node's command.

The plugin drives vLLM's own multiprocessing executor across nodes (vllm/engine/arg_utils.py
``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``; entrypoints/cli/serve.py
``run_headless``), which gives every node ``world_size // nnodes`` ranks; data parallelism across
nodes is another launch (one API server per rank) it does not drive. What a user writes and what
is refused is on docs/how-to/scaling.md.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pytest_kimiperf.config.names import check_placeholders, check_safe_name
from pytest_kimiperf.errors import ConfigError

# One machine's fingerprint facts, (hard, soft): measure/host_facts.py reads them, a node agent
# sends them, judge/baselines.py composes them.
NodeFacts = tuple[Mapping[str, str], Mapping[str, str]]

LAUNCH_PLACEHOLDERS = ("host", "name", "command")
# What vLLM's multi-node flags are called; the plugin sets them per node, a command may not.
NODE_FLAGS = ("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless")
_EXECUTOR_FLAG = "--distributed-executor-backend"
_TP_FLAGS = ("--tensor-parallel-size", "-tp")
_PP_FLAGS = ("--pipeline-parallel-size", "-pp")
_PCP_FLAGS = ("--prefill-context-parallel-size", "-pcp")
_DP_FLAGS = ("--data-parallel-size", "-dp")
# Never on a command line that `ps` shows (a launch template's), nor in a report.
SECRET_NAMES = frozenset({"VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})


@dataclass(frozen=True)
class Node:
    """One machine of a deployment: its name, the address other nodes reach it at, how its
    command is started there, and its own environment (over the deployment's)."""

    name: str
    host: str
    launch: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def local(self) -> bool:
        """Whether the node's command runs on this machine (no launch template)."""
        return not self.launch

    def describe(self) -> str:
        """``node1 (10.0.0.2, via ssh)`` or ``node1 (127.0.0.1, this machine)``."""
        how = "this machine" if self.local else f"via {self.launch[0]}"
        return f"{self.name} ({self.host}, {how})"


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: the argument list to start, and the environment it runs with."""

    node: Node
    rank: int
    argv: tuple[str, ...]
    # Variables the command sets itself (``env K=V`` after a launch template); for a local node
    # the caller passes them through the process environment instead.
    exported: Mapping[str, str]

    @property
    def role(self) -> str:
        """``head`` (rank 0: API server and engine core) or ``worker`` (``--headless``)."""
        return "head" if self.rank == 0 else "worker"


def parse_nodes(value: Any, where: str) -> tuple[Node, ...]:
    """The ``nodes`` key of a deployment table: a list of ``{name, host, launch?, env?}`` tables."""
    if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
        raise ConfigError(f"{where}: nodes = {value!r}; must be a list of tables "
                          "such as {{name = 'node0', host = '10.0.0.1', launch = ['ssh', '-tt', '{{host}}', '{{command}}']}}")
    nodes = []
    for index, item in enumerate(value):
        here = f"{where} nodes[{index}]"
        unknown = set(item) - {"name", "host", "launch", "env"}
        if unknown:
            raise ConfigError(f"{here}: unknown key(s) {', '.join(sorted(unknown))}; allowed: env, host, launch, name")
        name, host = item.get("name"), item.get("host")
        check_safe_name("node", name, source=here)
        if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
            raise ConfigError(f"{here}: host = {host!r}; must be the address the other nodes reach "
                              "this node at (a host name or IP, no spaces)")
        launch = item.get("launch", [])
        if not isinstance(launch, list) or not all(isinstance(p, str) and p for p in launch):
            raise ConfigError(f"{here}: launch = {launch!r}; must be a list of non-empty strings "
                              "(an argument-list prefix such as ['ssh', '-tt', '{host}', '{command}']), or [] "
                              "for this machine")
        env = item.get("env", {})
        if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool) for k, v in env.items()):
            raise ConfigError(f"{here}: env = {env!r}; must be a table of NAME = string")
        nodes.append(Node(name=name, host=host, launch=tuple(launch),
                          env=MappingProxyType({k: str(v) for k, v in env.items()})))
    return tuple(nodes)


def check_nodes(nodes: Sequence[Node], *, command: Sequence[str], tensor_parallel_size: int,
                master_port: int | None, where: str) -> None:
    """ConfigError, naming the table and what is allowed, unless ``nodes`` can run ``command``."""
    if not nodes:
        if master_port is not None:
            raise ConfigError(f"{where}: master_port = {master_port} without nodes; it is the head "
                              "node's torch.distributed port, set only with nodes")
        return
    if len(nodes) < 2:
        raise ConfigError(f"{where}: nodes lists {len(nodes)} node; a deployment on one machine leaves "
                          "nodes out, a multi-node one lists every node, the head first")
    names = [n.name for n in nodes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: node name(s) {', '.join(twice)} appear more than once; each node needs its own")
    for node in nodes:
        _check_launch(node, where)
    if master_port is not None and not 1 <= master_port <= 65535:
        raise ConfigError(f"{where}: master_port = {master_port}; must be a TCP port 1-65535")
    present = [flag for flag in command if flag.split("=", 1)[0] in NODE_FLAGS]
    if present:
        raise ConfigError(f"{where}: command sets {', '.join(present)}; with nodes the plugin sets "
                          "--nnodes, --node-rank, --master-addr, --master-port and --headless per node itself")
    backend = flag_value(command, (_EXECUTOR_FLAG,))
    if backend not in (None, "mp"):
        raise ConfigError(
            f"{where}: {_EXECUTOR_FLAG} {backend} with nodes; a deployment that spans nodes runs vLLM's "
            "multiprocessing executor across them ('mp', or leave the flag out). Ray starts its workers "
            "through a cluster the plugin does not own, so it cannot watch, sweep or stop them "
            "(docs/how-to/scaling.md): attach to such a server with --kimiperf-server-url instead")
    sizes = {name: _int_flag(command, flags, where) for name, flags in
             (("pipeline parallel", _PP_FLAGS), ("prefill context parallel", _PCP_FLAGS), ("data parallel", _DP_FLAGS))}
    if sizes["data parallel"] > 1:
        raise ConfigError(f"{where}: --data-parallel-size {sizes['data parallel']} with nodes; the plugin drives "
                          "tensor, pipeline and prefill-context parallelism across nodes (one engine, one API "
                          "server on the head), not data-parallel ranks, which vLLM launches differently")
    tensor_parallel_size = _tensor_parallel(command, tensor_parallel_size)
    world = tensor_parallel_size * sizes["pipeline parallel"] * sizes["prefill context parallel"]
    if world % len(nodes):
        raise ConfigError(
            f"{where}: {len(nodes)} nodes do not divide the world size {world} (tensor parallel "
            f"{tensor_parallel_size} x pipeline parallel {sizes['pipeline parallel']} x prefill context parallel "
            f"{sizes['prefill context parallel']}); vLLM gives every node world_size / nnodes ranks")


def layout_gpu_count(command: Sequence[str], *, tensor_parallel_size: int, nodes: int, where: str) -> int:
    """The GPUs one machine of a deployment holds by its parallel layout: tensor x pipeline x
    prefill-context x data parallel ranks (from the command's flags, ``{tp}`` or none being
    ``tensor_parallel_size``), over its ``nodes`` (0 or 1: one machine)."""
    world = _tensor_parallel(command, tensor_parallel_size)
    for flags in (_PP_FLAGS, _PCP_FLAGS, _DP_FLAGS):
        world *= _int_flag(command, flags, where)
    return max(1, world // max(1, nodes))


def _tensor_parallel(command: Sequence[str], tensor_parallel_size: int) -> int:
    """A profile's own size where one replaced ``{tp}``, else the deployment's."""
    text = flag_value(command, _TP_FLAGS)
    return int(text) if text is not None and text.isdigit() else tensor_parallel_size


def _int_flag(command: Sequence[str], flags: Sequence[str], where: str) -> int:
    value = flag_value(command, flags)
    try:
        return int(value) if value is not None else 1
    except ValueError:
        raise ConfigError(f"{where}: {flags[0]} {value!r} is not an integer") from None


def _check_launch(node: Node, where: str) -> None:
    check_placeholders(node.launch, LAUNCH_PLACEHOLDERS, what=f"node {node.name} launch part", where=where)
    if sum("{command}" in part for part in node.launch) > 1:
        raise ConfigError(f"{where}: node {node.name} launch uses {{command}} more than once")
    if any("{command}" in part and part != "{command}" for part in node.launch):
        raise ConfigError(f"{where}: node {node.name} launch part must be '{{command}}' alone, "
                          "the whole command as one quoted string (e.g. for ssh)")
    if node.launch and node.launch[0].rsplit("/", 1)[-1] == "ssh" and "{command}" not in node.launch:
        raise ConfigError(f"{where}: node {node.name} launch {list(node.launch)} has no '{{command}}': ssh joins "
                          "separate arguments with spaces for the remote shell, unquoted (a value such as "
                          "VLLM_CPU_OMP_THREADS_BIND=0|1 would become a pipe); end it with '{command}'")
    secrets = sorted(SECRET_NAMES & set(node.env))
    if node.launch and secrets:
        raise ConfigError(f"{where}: node {node.name} env sets {', '.join(secrets)}; a node started through a "
                          "launch template gets its variables on a command line that `ps` shows on both "
                          "machines: set secrets in that node's own environment instead")


def flag_value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last ``--flag value`` or ``--flag=value`` among ``names`` in ``argv``."""
    found = None
    for i, part in enumerate(argv):
        key, eq, value = part.partition("=")
        if key in names:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def node_commands(nodes: Sequence[Node], engine_argv: Sequence[str], *, master_port: int,
                  env: Mapping[str, str]) -> list[NodeCommand]:
    """Each node's command, the head first: vLLM's own flags for rank, peers and head address.
    ``env``: the variables every node must see, to which each node adds its own."""
    head = nodes[0]
    argv = list(engine_argv)
    if flag_value(argv, (_EXECUTOR_FLAG,)) is None:
        argv += [_EXECUTOR_FLAG, "mp"]
    shared = ["--nnodes", str(len(nodes)), "--master-addr", head.host, "--master-port", str(master_port)]
    commands = []
    for rank, node in enumerate(nodes):
        own = [*argv, *shared, "--node-rank", str(rank), *(["--headless"] if rank else [])]
        exported = {**env, **node.env}
        commands.append(NodeCommand(node=node, rank=rank, argv=tuple(own), exported=MappingProxyType(exported)))
    return commands


def in_template(node: Node, inner: Sequence[str]) -> list[str]:
    """``inner`` as ``node`` starts it: itself on this machine, else inside the node's launch
    template (as one shell-quoted string for ``{command}``, else appended as arguments)."""
    if node.local:
        return list(inner)
    values = {"host": node.host, "name": node.name, "command": shlex.join(inner)}
    prefix = [part.format(**values) for part in node.launch]
    return prefix if "{command}" in node.launch else [*prefix, *inner]


def launch_argv(command: NodeCommand, marker: Mapping[str, str]) -> list[str]:
    """What this machine starts for ``command``: the argv itself for a local node (its variables
    travel in the process environment), else the node's launch template around ``env K=V ...
    argv``."""
    if command.node.local:
        return list(command.argv)
    exported = {**command.exported, **marker}
    return in_template(command.node, ["env", *(f"{k}={v}" for k, v in sorted(exported.items())), *command.argv])
