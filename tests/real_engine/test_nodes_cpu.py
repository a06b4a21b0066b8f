"""A deployment that spans two nodes, on the real CPU engine: vLLM's --nnodes 2 over loopback.

Node 0 (the head) runs here; node 1 is started through a launch template that behaves as ssh
does: a clean environment and the whole command as one string for a shell. So one boot covers
what a remote node needs: the variables that must reach it travel in ``env K=V``, the node agent
gives its fingerprint facts, host-watch snapshots and teardown through the same template, and a
node that dies fails the next test with its name and log tail.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest


# The ssh stand-in: no environment from this process (env -i), the command one string (bash -c).
NODES_PROJECT = """
[tool.kimiperf.deployments.two-nodes]
extends = "tiny-cpu-2node"
host_bounds = {{ max_foreign_cpu_share = "none", max_steal_share = "none" }}
client_bounds = {{ max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }}
nodes = [
  {{name = "head", host = "127.0.0.1", env = {{VLLM_CPU_OMP_THREADS_BIND = "0"}}}},
  {{name = "far", host = "127.0.0.1", env = {{VLLM_CPU_OMP_THREADS_BIND = "1"}}, launch = ["env", "-i", "HOME={home}", "PATH={path}", "bash", "-c", "{{command}}"]}},
]
"""

NODES_TESTS = """
import os, signal
import psutil
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=32, requests=8, warmup_requests=1)

def _cmd(p):
    try:
        return p.cmdline()
    except psutil.Error:
        return []

def node_processes(rank):
    return [p for p in psutil.process_iter() if "--node-rank" in (c := _cmd(p))
            and c[c.index("--node-rank") + 1] == rank and "pytest_kimiperf.server.vllm_cli" in c]

def test_each_node_runs_its_own_command(kimiperf_server):
    assert kimiperf_server.nodes == ("head", "far")
    head = psutil.Process(kimiperf_server.pid).cmdline()
    assert head[head.index("--nnodes") + 1] == "2" and "--headless" not in head, head
    (far,) = node_processes("1")
    argv = far.cmdline()
    assert "--headless" in argv and argv[argv.index("--master-addr") + 1] == "127.0.0.1", argv
    # Through the template's clean environment, only what was exported reached the node.
    env = far.environ()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["HF_HUB_OFFLINE"] == "1", env
    assert env.get("KIMIPERF_LAUNCH_ID") and "PYTEST_CURRENT_TEST" not in env, env
    # The far node's worker is not in the head's process tree: only the marker finds it.
    tree = {p.pid for p in psutil.Process(kimiperf_server.pid).children(recursive=True)}
    assert far.pid not in tree

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"])

def test_zz_a_node_dies(kimiperf_server):
    (far,) = node_processes("1")
    far.send_signal(signal.SIGKILL)
    far.wait(10)

def test_zzz_measured_after_the_node_died(perf):
    perf.measure(SCENARIO)
"""


def _node_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"].startswith("VLLM::") or "pytest_kimiperf.server.vllm_cli" in cmd:
            found.append(proc)
    return found


def test_a_two_node_deployment_boots_measures_and_leaves_no_process_on_either_node(
    pytester: pytest.Pytester, no_servers_before_and_after: None, tmp_path: Path  # noqa: F811
) -> None:
    before = {p.pid for p in _node_processes()}
    pytester.makefile(".toml", pyproject=NODES_PROJECT.format(
        home=os.environ["HOME"], path=os.path.dirname(sys.executable) + ":/usr/bin:/bin"))
    pytester.makepyfile(test_nodes=NODES_TESTS)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        "--deployment", "two-nodes", "--kimiperf-json", str(report), "-p", "no:randomly", "-p", "no:cacheprovider",
        timeout=900,
    )
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "kimiperf: starting two-nodes server for profile default on *; 2 nodes: head (127.0.0.1, this machine) "
        "head, far (127.0.0.1, via env) worker rank 1; log: *-far.log",
        # The node's death is named, with its log tail.
        "*node far (127.0.0.1, via env), worker rank 1 of the two-nodes server (default) exited with code -9 during the session; log: *-far.log",
    ])
    data = json.loads(report.read_text())
    fingerprint = data["fingerprint"]
    assert fingerprint["key"].startswith("2n-cpu-"), fingerprint["key"]
    assert fingerprint["hard"]["nodes.count"] == "2" and "node1.cpu.model" in fingerprint["hard"]
    decode = next(t for t in data["tests"] if t["nodeid"].endswith("test_single_stream_decode[default]"))
    # The far node was watched through the agent: a reading of it is in the verdict's messages.
    # The far node was read through the agent and found to be this machine (its boot id): the
    # local watch, which knows every pid of the measurement, covers it.
    assert any("node far: this machine, read above" in m for m in decode["messages"]), decode["messages"]
    left = [(p.pid, p.info["name"]) for p in _node_processes() if p.pid not in before]
    assert not left, f"processes left on a node: {left}"
