"""The hardware and software a measurement was taken on, and whether two of them are comparable.

The facts come from the probes in measure/host_facts.py; this module only composes and compares
them. A fingerprint has two halves.  *Hard* facts change the speed a benchmark can reach: the GPU model,
count, memory, driver major, CUDA, PCIe link and NVLink-or-not, on a CPU host the CPU model, the
cores this process may use and the vector ISA; the vLLM, torch and NCCL versions; the deployment
(model, revision, quantization, TP).  A baseline only compares with a run whose hard facts are
equal, and the ``key`` is a hash of them.  *Soft* facts (host name, full driver build, kernel,
Python) are reported when they differ but do not block a comparison.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from pytest_kimiperf.config.names import UNKNOWN
from pytest_kimiperf.config.nodes import Node, NodeFacts
from pytest_kimiperf.errors import BaselineError, ConfigError

if TYPE_CHECKING:
    from pytest_kimiperf.config.deployments import Deployment

_KEY_HASH_HEX = 12
_KEY_CLASS_MAX = 64 - _KEY_HASH_HEX - 1  # keeps keys within names.check_safe_name's 64 characters


def _frozen(mapping: Mapping[str, str], *, what: str) -> Mapping[str, str]:
    for name, value in mapping.items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ConfigError(
                f"fingerprint {what} entries must map non-empty str to str, got {name!r}: {value!r}"
            )
    return MappingProxyType(dict(sorted(mapping.items())))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.") or UNKNOWN


@dataclass(frozen=True)
class Fingerprint:
    """Hard facts decide comparability (and the key); soft facts only warn when they differ."""

    hard: Mapping[str, str]
    soft: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "hard", _frozen(self.hard, what="hard"))
        object.__setattr__(self, "soft", _frozen(self.soft, what="soft"))

    @property
    def hardware_class(self) -> str:
        """A readable name for the hardware, e.g. ``8xRTX-PRO-6000-Blackwell-Server-Edition``."""
        count = self.hard.get("gpu.count", "0")
        nodes = f"{self.hard['nodes.count']}n-" if "nodes.count" in self.hard else ""
        if ATTACHED_HARDWARE in self.hard:
            text = f"attached-{_slug(self.hard[ATTACHED_HARDWARE])}"
        elif count != "0":
            name = self.hard.get("gpu.name", UNKNOWN).removeprefix("NVIDIA ")
            text = f"{count}x{_slug(name)}"
        else:
            cores = self.hard.get("cpu.cores", "?")
            text = f"cpu-{_slug(self.hard.get('cpu.model', UNKNOWN))}-{cores}c"
        return (nodes + text)[:_KEY_CLASS_MAX].rstrip("-.")

    @property
    def key(self) -> str:
        """A short stable id of the hard facts, safe in file names: ``<class>-<12 hex>``."""
        digest = hashlib.sha256(json.dumps(dict(self.hard), sort_keys=True).encode()).hexdigest()
        return f"{self.hardware_class}-{digest[:_KEY_HASH_HEX]}"

    def diff(self, other: Fingerprint) -> tuple[list[str], list[str]]:
        """List what changed from ``self`` to ``other`` as ``name: old -> new`` (hard, soft)."""

        def changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
            return [
                f"{name}: {old.get(name, '<absent>')} -> {new.get(name, '<absent>')}"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]

        return changes(self.hard, other.hard), changes(self.soft, other.soft)

    def to_json(self) -> dict[str, object]:
        """The fingerprint as stored in a baseline file: ``{"key", "hard", "soft"}``."""
        return {"key": self.key, "hard": dict(self.hard), "soft": dict(self.soft)}

    @classmethod
    def from_json(cls, data: object, *, source: str = "fingerprint") -> Fingerprint:
        """Rebuild a fingerprint from ``to_json`` data; BaselineError naming ``source`` if malformed.

        A stored key that does not match the stored hard facts means the facts were edited by
        hand: comparing against them would be comparing against a machine that never existed.
        """
        if not isinstance(data, Mapping):
            raise BaselineError(f"{source}: fingerprint must be a JSON object, got {type(data).__name__}")
        hard, soft = data.get("hard"), data.get("soft")
        for name, part in (("hard", hard), ("soft", soft)):
            if not isinstance(part, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in part.items()
            ):
                raise BaselineError(
                    f"{source}: fingerprint '{name}' must be an object mapping names to strings, got {part!r}"
                )
        assert isinstance(hard, Mapping) and isinstance(soft, Mapping)
        fingerprint = cls(hard=hard, soft=soft)
        if "key" in data and data["key"] != fingerprint.key:
            raise BaselineError(
                f"{source}: fingerprint key {data['key']!r} does not match its hard facts, which hash to "
                f"{fingerprint.key!r}: the hard facts were edited by hand"
            )
        return fingerprint


def _section(hard: Mapping[str, str], prefix: str) -> str:
    items = [(name.removeprefix(prefix), value) for name, value in hard.items() if name.startswith(prefix)]
    return ", ".join(f"{name}={value}" for name, value in items) or "none"


ATTACHED_HARDWARE = "server.hardware"

# The hard facts that name software versions. A baseline recorded on the same hardware under
# other versions is still judged by default (an upgrade is what a gate is for), with the
# differing versions named beside the verdict; every other hard fact must match.
VERSION_KEYS: tuple[str, ...] = ("software.vllm", "software.torch", "software.nccl", "server.vllm")


def version_changes(old: Fingerprint, new: Fingerprint) -> list[str] | None:
    """The version facts that differ from ``old`` to ``new`` (``name: old -> new``), or None
    when anything else that is hard differs too (then the two are not comparable at all)."""
    hard = old.diff(new)[0]
    if any(change.split(":", 1)[0] not in VERSION_KEYS for change in hard):
        return None
    return hard
NOT_STATED = "not stated (--kimiperf-server-hardware)"


def stated_apart(old: Fingerprint, new: Fingerprint) -> str | None:
    """The attached server's hardware as stated when ``old`` was recorded, where that is all that
    keeps ``old`` from ``new`` besides software versions (which are judged across): the same
    server, stated otherwise or not at all. None where anything else hard differs."""
    hard = old.diff(new)[0]
    keys = {change.split(":", 1)[0] for change in hard}
    recorded = old.hard.get(ATTACHED_HARDWARE)
    if ATTACHED_HARDWARE not in keys or not keys <= {ATTACHED_HARDWARE, *VERSION_KEYS} or recorded in (None, NOT_STATED):
        return None
    return recorded


def attached_fingerprint(local: Fingerprint, server: Mapping[str, str], *, stated_hardware: str | None) -> Fingerprint:
    """The fingerprint of a measurement of an attached server (``--kimiperf-server-url``).

    This host's probes describe the *client*: they move to soft facts (``client.*``). The hard
    facts are what the server tells (vLLM version, models) and the hardware the user states,
    since nothing here can see the server's GPUs; unstated, it reads as such, so such a run
    never compares with (or, see settings, records) a baseline of known hardware.
    """
    hard = {name: value for name, value in local.hard.items() if name.startswith("deployment.")}
    hard.update(server)
    hard[ATTACHED_HARDWARE] = stated_hardware or NOT_STATED
    soft = {f"client.{name}": value for name, value in {**local.hard, **local.soft}.items()
            if not name.startswith("deployment.")}
    return Fingerprint(hard=hard, soft=soft)


def describe(fp: Fingerprint) -> list[str]:
    """Lines for the pytest report header: key, hardware, software, deployment."""
    hard = fp.hard
    if ATTACHED_HARDWARE in hard:
        return [
            f"kimiperf fingerprint: {fp.key}",
            f"  hardware: attached server: {hard[ATTACHED_HARDWARE]}"
            + ("" if hard[ATTACHED_HARDWARE] == NOT_STATED else " (as stated)"),
            f"  server: vLLM {hard.get('server.vllm', UNKNOWN)}, models {hard.get('server.models', UNKNOWN)}, "
            f"max_model_len {hard.get('server.max_model_len', UNKNOWN)}",
            f"  deployment: {_section(hard, 'deployment.')}",
            f"  client host (not compared): {fp.soft.get('client.host.name', UNKNOWN)}",
        ]
    if hard.get("gpu.count", "0") != "0":
        hardware = (
            f"{hard['gpu.count']}x {hard.get('gpu.name', UNKNOWN)} ({hard.get('gpu.memory_mib', '?')} MiB), "
            f"driver {fp.soft.get('gpu.driver', hard.get('gpu.driver_major', '?'))}, "
            f"CUDA {hard.get('gpu.cuda', '?')}, PCIe {hard.get('gpu.pcie', '?')}, "
            f"interconnect {hard.get('gpu.interconnect', '?')} ({hard.get('gpu.links', '?')})"
        )
    else:
        hardware = (
            f"CPU {hard.get('cpu.model', UNKNOWN)}, {hard.get('cpu.cores', '?')} cores, "
            f"ISA {hard.get('cpu.isa', 'none')}"
        )

    def section(prefix: str) -> str:
        items = [
            (name.removeprefix(prefix), value) for name, value in hard.items() if name.startswith(prefix)
        ]
        return ", ".join(f"{name}={value}" for name, value in items) or "none"

    return [
        f"kimiperf fingerprint: {fp.key}",
        f"  hardware: {hardware}",
        f"  software: {section('software.')}",
        f"  deployment: {section('deployment.')}",
        f"  host: {fp.soft.get('host.name', UNKNOWN)}, kernel {fp.soft.get('os.kernel', UNKNOWN)}, "
        f"python {fp.soft.get('python', UNKNOWN)}",
    ]


def host_fingerprint(facts: NodeFacts, deployment_facts: Mapping[str, str]) -> Fingerprint:
    """One machine's facts (measure/host_facts.py) and the deployment's, as a Fingerprint."""
    hard, soft = facts
    return Fingerprint(hard={**hard, **_deployment_hard(deployment_facts)}, soft=soft)


def _deployment_hard(deployment_facts: Mapping[str, str]) -> dict[str, str]:
    for name, value in deployment_facts.items():
        if not isinstance(name, str) or not name or not isinstance(value, str) or not value:
            raise ConfigError(
                f"deployment fact {name!r} = {value!r} (from the deployment definition): "
                "names and values must be non-empty strings"
            )
    return {f"deployment.{name}": value for name, value in deployment_facts.items()}


def deployment_facts(deployment: Deployment, *, built_revision: str | None = None) -> dict[str, str]:
    """The deployment's hard facts: model, revision, quantization, TP. A model the plugin builds
    (``kimiperf:``) has no revision of its own: ``built_revision`` names its build."""
    revision = deployment.revision or (built_revision if deployment.model.startswith("kimiperf:") else None)
    return {
        "name": deployment.name,
        # An attach-only deployment names no model: the server's /v1/models (server.models) does.
        "model": deployment.model or "from-/v1/models",
        "revision": revision or "unpinned",
        "quantization": deployment.quantization or "none",
        "tensor_parallel_size": str(deployment.tensor_parallel_size),
    }


# -- a deployment that spans nodes ---------------------------------------------------------------
# Each node reports the facts a one-machine fingerprint holds (its GPUs, CPU, software: the node
# agent's ``facts``, or this machine's for a node that runs here). The deployment's hard facts
# hold every node's, in the order of their sorted facts, so which host is the head does not
# matter, and one node that differs (another GPU, driver class or vLLM) makes the key differ:
# a baseline recorded on eight H100 nodes never judges a run with one A100 among them. The
# one-machine keys (``gpu.*``, ``cpu.*``, ``software.*``: what the report header and the key's
# readable class read) are the first node's in that order, except ``gpu.count``, every node's
# together; node names and host names are soft.


def nodes_fingerprint(per_node: Mapping[str, NodeFacts], deployment_facts: Mapping[str, str]) -> Fingerprint:
    """One fingerprint from each node's (hard, soft) facts, keyed by node name."""
    ordered = sorted(per_node.items(), key=lambda item: json.dumps(dict(item[1][0]), sort_keys=True))
    hard: dict[str, str] = {"nodes.count": str(len(ordered))}
    soft: dict[str, str] = {}
    for k, (name, (node_hard, node_soft)) in enumerate(ordered):
        hard.update({f"node{k}.{fact}": value for fact, value in node_hard.items()})
        soft.update({f"node{k}.{fact}": value for fact, value in node_soft.items()})
        soft[f"node{k}.name"] = name
    # The one-machine keys (what describe() and the readable class read) are the first node's;
    # the GPU count is every node's; the host names are every node's.
    first_hard, first_soft = ordered[0][1]
    hard.update(first_hard)
    hard["gpu.count"] = str(sum(int(h.get("gpu.count", "0")) for _, (h, _) in ordered))
    soft.update(first_soft)
    soft["host.name"] = ",".join(dict.fromkeys(s.get("host.name", "?") for _, (_, s) in ordered))
    hard.update(_deployment_hard(deployment_facts))
    return Fingerprint(hard=hard, soft=soft)


def collect_nodes_fingerprint(nodes: Sequence[Node], deployment_facts: Mapping[str, str], *, local: NodeFacts,
                              remote_facts: Callable[[Node], NodeFacts]) -> Fingerprint:
    """Facts of every node: ``local`` (this machine's, probed once) for a node that runs here,
    else ``remote_facts`` (the node agent's, measure/host_facts.agent_facts)."""
    per_node = {node.name: local if node.local else remote_facts(node) for node in nodes}
    return nodes_fingerprint(per_node, deployment_facts)


__all__ = [
    "ATTACHED_HARDWARE",
    "VERSION_KEYS",
    "version_changes",
    "attached_fingerprint",
    "Fingerprint",
    "collect_nodes_fingerprint",
    "deployment_facts",
    "describe",
    "host_fingerprint",
    "nodes_fingerprint",
]
