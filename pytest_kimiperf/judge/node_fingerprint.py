"""The fingerprint of a deployment that spans nodes: every node's hardware, sorted.

Each node reports the facts a one-machine fingerprint holds (its GPUs, CPU, software: the node
agent's ``facts``, or this machine's for a node that runs here). The deployment's hard facts
hold every node's, in the order of their sorted facts, so which host is the head does not
matter, and one node that differs (another GPU, driver class or vLLM) makes the key differ:
a baseline recorded on eight H100 nodes never judges a run with one A100 among them. The
one-machine keys (``gpu.*``, ``cpu.*``, ``software.*``: what the report header and the key's
readable class read) are the first node's in that order, except ``gpu.count``, every node's
together; node names and host names are soft.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from pytest_kimiperf.config.nodes import Node
from pytest_kimiperf.judge.fingerprint import Fingerprint

NodeFacts = tuple[Mapping[str, str], Mapping[str, str]]  # (hard, soft) of one node


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
    hard.update({f"deployment.{name}": value for name, value in deployment_facts.items()})
    return Fingerprint(hard=hard, soft=soft)


def collect_nodes_fingerprint(nodes: Sequence[Node], deployment_facts: Mapping[str, str], *, local: NodeFacts,
                              remote_facts: Callable[[Node], NodeFacts]) -> Fingerprint:
    """Facts of every node: ``local`` (this machine's, probed once) for a node that runs here,
    else ``remote_facts``."""
    per_node = {node.name: local if node.local else remote_facts(node) for node in nodes}
    return nodes_fingerprint(per_node, deployment_facts)


def agent_facts(node: Node) -> NodeFacts:
    """A node's facts from the node agent, run through its launch template."""
    import sys

    from pytest_kimiperf.errors import ServerError
    from pytest_kimiperf.server.cluster import agent_argv, run_agent

    text = run_agent(node, agent_argv(node, sys.executable, "facts"))
    try:
        data = json.loads(text)
        return dict(data["hard"]), dict(data["soft"])
    except (ValueError, KeyError, TypeError):
        raise ServerError(f"node {node.describe()}: the node agent's facts are not its JSON: {text[:300]!r}") from None


__all__ = ["NodeFacts", "agent_facts", "collect_nodes_fingerprint", "nodes_fingerprint"]
