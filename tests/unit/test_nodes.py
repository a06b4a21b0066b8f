"""A deployment that spans nodes: its table, each node's command, the node group's boot, death and
teardown (with stand-in processes: a head that serves, worker nodes that sleep or die), the node
agent, the node watch's arithmetic and the fingerprint of every node."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import MappingProxyType

import psutil
import pytest

from pytest_kimiperf import node_agent
from pytest_kimiperf.config.deployment_tables import resolve_deployments
from pytest_kimiperf.config.deployments import TINY_CPU_2NODE
from pytest_kimiperf.config.nodes import Node, check_nodes, launch_argv, node_commands, parse_nodes
from pytest_kimiperf.errors import ConfigError, ServerError
from pytest_kimiperf.judge.baselines import nodes_fingerprint
from pytest_kimiperf.measure.hostwatch import NodeWatch, parse_snapshot
from pytest_kimiperf.server.agent_wire import AGENT_MARK, agent_payload
from pytest_kimiperf.server.cluster import NodeGroup, NodeLaunch, agent_argv, node_group
from pytest_kimiperf.server.process import ServerProcess
from tests.helpers import STUB_SERVER, gone

SSH = ["ssh", "-tt", "{host}", "{command}"]
HEAD = Node("a", "10.0.0.1")
FAR = Node("b", "10.0.0.2", launch=tuple(SSH), env=MappingProxyType({"NCCL_SOCKET_IFNAME": "eth1"}))


def _table(**overrides: object) -> dict[str, object]:
    return {"extends": "tiny-cpu-tp2", "nodes": [{"name": "a", "host": "10.0.0.1"},
                                                 {"name": "b", "host": "10.0.0.2", "launch": SSH}], **overrides}


def test_a_table_with_nodes_resolves_to_the_head_first() -> None:
    dep = resolve_deployments({"two": _table(master_port=29600)}, source="pyproject.toml")["two"]
    assert [n.name for n in dep.nodes] == ["a", "b"] and dep.nodes[1].launch == tuple(SSH)
    assert dep.master_port == 29600


@pytest.mark.parametrize(("overrides", "message"), [
    ({"nodes": [{"name": "a", "host": "h"}]}, "nodes lists 1 node"),
    ({"nodes": [{"name": "a", "host": "h"}, {"name": "a", "host": "g"}]}, "node name(s) a appear more than once"),
    ({"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "g", "launch": ["ssh", "{hots}"]}]},
     "unknown placeholder {hots}; allowed: {host}, {name}, {command}"),
    ({"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "g", "launch": ["sh", "-c", "x {command}"]}]},
     "must be '{command}' alone"),
    ({"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "two words"}]}, "host = 'two words'"),
    ({"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "g", "user": "x"}]}, "unknown key(s) user"),
    ({"nodes": ["a", "b"]}, "nodes = ['a', 'b']; must be a list of tables"),
    ({"tensor_parallel_size": 3}, "2 nodes do not divide the world size 3"),
    ({"master_port": 70000}, "master_port = 70000; must be a TCP port 1-65535"),
    ({"nodes": [{"name": "a", "host": "h"}, {"name": "b", "host": "g", "launch": ["ssh", "{host}"]}]},
     "has no '{command}': ssh joins separate arguments with spaces"),
    ({"nodes": [{"name": "a", "host": "h"},
                {"name": "b", "host": "g", "launch": SSH, "env": {"HF_TOKEN": "hf_x"}}]},
     "node b env sets HF_TOKEN; a node started through a launch template"),
    ({"command": ["{python}", "-m", "vllm", "--tensor-parallel-size", "{tp}", "-dp", "2"]},
     "--data-parallel-size 2 with nodes"),
    ({"command": ["{python}", "-m", "vllm", "-pcp", "x"]}, "--prefill-context-parallel-size 'x' is not an integer"),
    ({"command": ["{python}", "-m", "vllm", "--nnodes", "2"]}, "command sets --nnodes"),
    ({"command": ["{python}", "-m", "vllm", "--distributed-executor-backend", "ray"]},
     "--distributed-executor-backend ray with nodes"),
])
def test_a_bad_node_table_is_a_usage_error_naming_the_value(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_deployments({"two": _table(**overrides)}, source="pyproject.toml")
    assert message in str(info.value) and "[deployments.two]" in str(info.value)


def test_master_port_without_nodes_is_a_usage_error() -> None:
    with pytest.raises(ConfigError, match="master_port = 29600 without nodes"):
        resolve_deployments({"one": {"extends": "tiny-cpu", "master_port": 29600}}, source="p")


def test_a_local_nodes_env_may_hold_a_secret_it_never_leaves_this_machine() -> None:
    check_nodes((Node("a", "h", env=MappingProxyType({"HF_TOKEN": "x"})), FAR), command=["x"],
                tensor_parallel_size=2, master_port=None, where="w")


def test_the_world_counts_prefill_context_parallel_and_a_tensor_size_the_command_sets() -> None:
    with pytest.raises(ConfigError, match=r"2 nodes do not divide the world size 3 \(tensor parallel 3 x"):
        check_nodes((HEAD, FAR), command=["x", "--tensor-parallel-size", "3"], tensor_parallel_size=2,
                    master_port=None, where="w")
    check_nodes((HEAD, FAR), command=["x", "-pcp", "2"], tensor_parallel_size=1, master_port=None, where="w")


def test_pipeline_parallel_counts_in_the_world_size() -> None:
    check_nodes((HEAD, FAR, Node("c", "h3"), Node("d", "h4")), command=["x", "-pp", "2"], tensor_parallel_size=2,
                master_port=None, where="w")
    with pytest.raises(ConfigError, match=r"3 nodes do not divide the world size 4 \(tensor parallel 2 x pipeline"):
        check_nodes((HEAD, FAR, Node("c", "h3")), command=["x", "--pipeline-parallel-size=2"],
                    tensor_parallel_size=2, master_port=None, where="w")


def test_each_node_gets_vllms_own_multi_node_flags_and_only_the_workers_run_headless() -> None:
    head, far = node_commands((HEAD, FAR), ["py", "-m", "vllm", "serve", "m"], master_port=29511,
                              env={"NCCL_ALGO": "Ring"})
    tail = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--master-addr", "10.0.0.1",
            "--master-port", "29511", "--node-rank"]
    assert list(head.argv) == ["py", "-m", "vllm", "serve", "m", *tail, "0"] and head.role == "head"
    assert list(far.argv) == ["py", "-m", "vllm", "serve", "m", *tail, "1", "--headless"] and far.role == "worker"
    assert dict(far.exported) == {"NCCL_ALGO": "Ring", "NCCL_SOCKET_IFNAME": "eth1"}


def test_a_template_node_gets_its_variables_through_env_in_one_quoted_string() -> None:
    _, far = node_commands((HEAD, FAR), ["py", "serve", "my model"], master_port=1, env={"NCCL_PROTO": "LL"})
    argv = launch_argv(far, {"KIMIPERF_LAUNCH_ID": "abc"})
    assert argv[:3] == ["ssh", "-tt", "10.0.0.2"] and len(argv) == 4
    assert argv[3].startswith("env KIMIPERF_LAUNCH_ID=abc NCCL_PROTO=LL NCCL_SOCKET_IFNAME=eth1 py serve 'my model' ")
    srun = Node("b", "n2", launch=("srun", "-w", "{host}"))
    _, far = node_commands((HEAD, srun), ["py"], master_port=1, env={})
    assert launch_argv(far, {"M": "1"})[:6] == ["srun", "-w", "n2", "env", "M=1", "py"]
    local = node_commands((HEAD, Node("c", "127.0.0.1")), ["py"], master_port=1, env={})[1]
    assert launch_argv(local, {"M": "1"})[0] == "py", "a local node's variables travel in its environment"


def test_the_cpu_twin_binds_one_core_a_node() -> None:
    assert [n.env["VLLM_CPU_OMP_THREADS_BIND"] for n in TINY_CPU_2NODE.nodes] == ["0", "1"]
    assert TINY_CPU_2NODE.command[:3] == ("{python}", "-m", "pytest_kimiperf.server.vllm_cli")
    check_nodes(TINY_CPU_2NODE.nodes, command=TINY_CPU_2NODE.command, tensor_parallel_size=2,
                master_port=None, where="built-in")


def test_parse_nodes_keeps_integer_env_values_as_strings() -> None:
    (node,) = parse_nodes([{"name": "n", "host": "h", "env": {"OMP_NUM_THREADS": 8}}], "w")
    assert dict(node.env) == {"OMP_NUM_THREADS": "8"} and node.local


# --------------------------------------------------------------------------- the node group


def _process(tmp_path: Path, name: str, argv: list[str], **kw: object) -> ServerProcess:
    return ServerProcess(argv=argv, env=dict(os.environ), log_path=tmp_path / f"{name}.log",
                         state_dir=tmp_path / "state", base_url=kw.pop("base_url", "http://127.0.0.1:9"),  # type: ignore[arg-type]
                         served_model_name="stub-model", deployment="d", profile="default",
                         deadline_s=60, grace_s=2, **kw)  # type: ignore[arg-type]


def _stub_head(tmp_path: Path) -> ServerProcess:
    from pytest_kimiperf.server.process import pick_free_port

    port = pick_free_port("127.0.0.1")
    return _process(tmp_path, "head", [sys.executable, str(STUB_SERVER), "--model", "stub-model", "--port",
                                       str(port), "--load-seconds", "3"], base_url=f"http://127.0.0.1:{port}")


def test_a_worker_node_that_dies_while_the_head_boots_fails_the_boot_naming_it(tmp_path: Path) -> None:
    worker = _process(tmp_path, "far", [sys.executable, "-c",
                                        "print('ssh: connect to host gpu-b port 22: Connection refused'); exit(255)"])
    group = NodeGroup([NodeLaunch(HEAD, 0, _stub_head(tmp_path)), NodeLaunch(Node("b", "gpu-b"), 1, worker)],
                      python=sys.executable)
    group.start()
    with pytest.raises(ServerError) as info:
        group.wait_ready()
    text = str(info.value)
    assert text.startswith("node b (gpu-b, this machine), worker rank 1 of the d server (default) exited with code "
                           "255 while booting; log: ")
    assert "Connection refused" in text
    assert group.record is None, "every node was stopped"


def test_a_group_serves_names_its_nodes_and_stops_every_node(tmp_path: Path) -> None:
    sleeper = _process(tmp_path, "far", [sys.executable, "-c", "import time; time.sleep(120)"])
    group = NodeGroup([NodeLaunch(HEAD, 0, _stub_head(tmp_path)), NodeLaunch(Node("b", "h"), 1, sleeper)],
                      python=sys.executable)
    group.start()
    try:
        handle = group.wait_ready()
        assert handle.nodes == ("a", "b") and handle.node_pids == (sleeper.server_pid(),)
        group.ensure_alive()
        worker_pid = sleeper.server_pid()
        assert worker_pid is not None
        psutil.Process(worker_pid).kill()
        with pytest.raises(ServerError, match=r"node b \(h, this machine\), worker rank 1 .* exited with code -9 "
                                              "during the session"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                group.ensure_alive()
                time.sleep(0.1)
    finally:
        group.stop()
    assert group.record is None and gone(group.head.popen.pid)  # type: ignore[union-attr]


def test_a_template_node_is_stopped_there_by_the_agent_and_its_survivors_reported(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    answers = iter([[{"pid": 8, "name": "python", "cmdline": ["stuck"]}], []])

    def agent(node: Node, argv: list[str], timeout_s: float) -> str:
        calls.append(argv)
        return json.dumps({"terminated": [{"pid": 7, "name": "VLLM::Worker_TP1", "cmdline": []}], "killed": [],
                           "survivors": next(answers)})

    far = _process(tmp_path, "far", [sys.executable, "-c", "pass"])
    head = _process(tmp_path, "head", [sys.executable, "-c", "import time; time.sleep(60)"])
    group = NodeGroup([NodeLaunch(HEAD, 0, head), NodeLaunch(FAR, 1, far)], python="/venv/bin/python", agent=agent)
    group.start()
    report = group.stop()
    assert report is not None
    assert [p.name for p in report.terminated if p.pid == 7] == ["VLLM::Worker_TP1 on b"]
    assert [p.describe() for p in report.survivors] == ["pid 8 python on b (stuck)"]
    assert group.record is not None, "a node whose processes may still run there keeps its record"
    assert [p.pid for p in report.terminated if p.remote] == [7] and report.survivors[0].remote
    assert group.stop() is not None and group.record is None, "the second stop verified it: forgotten"
    first, second = calls
    assert first[:3] == ["ssh", "-tt", "10.0.0.2"] and first == second
    assert first[3].startswith(f"/venv/bin/python -m pytest_kimiperf.node_agent stop --launch-id {far.launch_id} ")


def test_a_node_that_cannot_start_stops_the_nodes_already_up(tmp_path: Path) -> None:
    head = _process(tmp_path, "head", [sys.executable, "-c", "import time; time.sleep(60)"])
    missing = _process(tmp_path, "far", ["/nonexistent/ssh", "gpu-b"])
    group = NodeGroup([NodeLaunch(HEAD, 0, head), NodeLaunch(Node("b", "gpu-b"), 1, missing)], python="py")
    with pytest.raises(ServerError, match="'/nonexistent/ssh': not found or not executable"):
        group.start()
    assert head.record is None and gone(head.popen.pid)  # type: ignore[union-attr]


def test_a_failed_boot_stops_a_template_node_there_too(tmp_path: Path) -> None:
    stops: list[list[str]] = []

    def agent(node: Node, argv: list[str], timeout_s: float) -> str:
        stops.append(argv)
        return json.dumps({"terminated": [], "killed": [], "survivors": []})

    head = _process(tmp_path, "head", [sys.executable, "-c", "print('RuntimeError: no GPU'); exit(3)"])
    far = _process(tmp_path, "far", [sys.executable, "-c", "import time; time.sleep(60)"])
    group = NodeGroup([NodeLaunch(HEAD, 0, head), NodeLaunch(FAR, 1, far)], python="py", agent=agent)
    group.start()
    with pytest.raises(ServerError, match=r"(?s)the d server \(default\) exited with code 3 .*RuntimeError: no GPU"):
        group.wait_ready()
    assert len(stops) == 1 and far.launch_id in stops[0][3] and group.record is None


def test_a_head_that_died_first_is_the_message_and_names_the_nodes_that_followed(tmp_path: Path) -> None:
    sleeper = _process(tmp_path, "far", [sys.executable, "-c", "import time; time.sleep(120)"])
    group = NodeGroup([NodeLaunch(HEAD, 0, _stub_head(tmp_path)), NodeLaunch(Node("b", "h"), 1, sleeper)],
                      python=sys.executable)
    group.start()
    try:
        group.wait_ready()
        psutil.Process(group.head.server_pid()).kill()  # type: ignore[arg-type]
        group.head.popen.wait(10)  # type: ignore[union-attr]
        psutil.Process(sleeper.server_pid()).kill()  # type: ignore[arg-type]
        sleeper.popen.wait(10)  # type: ignore[union-attr]
        with pytest.raises(ServerError) as info:
            group.ensure_alive(settle_s=0)
    finally:
        group.stop()
    text = str(info.value)
    assert text.startswith("the d server (default) died during the session (exit code -9)"), text
    assert "worker node(s) that exited after the head: b (code -9" in text


def test_node_group_builds_each_nodes_process_from_the_head(tmp_path: Path) -> None:
    head = _process(tmp_path, "server-d-default", ["py"])
    group = node_group(head, (Node("a", "127.0.0.1", env=MappingProxyType({"X": "0"})), FAR), ["py", "serve"],
                       exported={"NCCL_ALGO": "Ring", "HF_TOKEN": "hf_secret"}, master_port=29511)
    head_launch, far = group.launches
    assert head.argv[-2:] == ["--node-rank", "0"] and head.env["X"] == "0"
    assert far.process.log_path == tmp_path / "server-d-default-b.log"
    assert far.process.launch_id != head.launch_id
    assert f"KIMIPERF_LAUNCH_ID={far.process.launch_id}" in far.process.argv[3]
    assert "NCCL_ALGO=Ring" in far.process.argv[3] and far.process.argv[0] == "ssh"
    assert "hf_secret" not in " ".join(far.process.argv), "a secret never travels on a command line"
    with pytest.raises(ServerError, match="the head node b .* must run on this machine"):
        node_group(head, (FAR, HEAD), ["py"], exported={}, master_port=1)


def test_agent_argv_runs_the_agent_inside_the_template() -> None:
    assert agent_argv(HEAD, "py", "facts") == ["py", "-m", "pytest_kimiperf.node_agent", "facts"]
    assert agent_argv(FAR, "py", "facts") == ["ssh", "-tt", "10.0.0.2", "py -m pytest_kimiperf.node_agent facts"]


# --------------------------------------------------------------------------- agent, watch, fingerprint


def test_the_agent_finds_its_launch_by_marker_and_stops_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess

    env = {**os.environ, "KIMIPERF_LAUNCH_ID": "nodeagenttest01"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.3)
        assert child.pid in node_agent.snapshot("nodeagenttest01")["own"]
        assert node_agent.main(["stop", "--launch-id", "nodeagenttest01", "--grace", "2"]) == 0
        data = json.loads(agent_payload(capsys.readouterr().out, where="test"))
        assert [p["pid"] for p in data["terminated"] + data["killed"]] == [child.pid] and not data["survivors"]
        assert child.wait(5) is not None
    finally:
        child.kill()


def _snapshot_json(t: float, busy: float, own: list[int], procs: dict[str, list[float]], boot: str = "other") -> str:
    return json.dumps({"boot_id": boot, "t_s": t, "busy_s": busy, "steal_s": 0.0, "cpu_count": 4,
                       "psi_some_us": {}, "notes": [], "own": own, "processes": procs})


def test_the_node_watch_counts_the_launchs_processes_as_ours_and_the_rest_as_foreign() -> None:
    ends = iter([_snapshot_json(0.0, 100.0, [10], {"10": [1.0, 5.0, 0.0], "20": [1.0, 1.0, 0.0]}),
                 _snapshot_json(10.0, 118.0, [10], {"10": [1.0, 15.0, 0.0], "20": [1.0, 9.0, 0.0]})])
    watch = NodeWatch([(FAR, "id")], run=lambda node, argv: next(ends), python="py", here_boot_id="this")
    watch.start()
    (reading,) = watch.stop()
    # 18 s busy of 40 s capacity, 10 s of it ours: 8 s foreign = 20%, named by node
    assert reading.node == "b" and reading.foreign_cpu_share == pytest.approx(0.2)
    from pytest_kimiperf.config.deployments import HostBounds

    assert reading.disturbances(HostBounds.from_mapping({"max_foreign_cpu_share": 0.1}, source="t"))[0].startswith(
        "on node b, other processes used 20% of the host's CPU")


def test_a_node_on_this_machine_is_left_to_the_local_watch() -> None:
    snap = _snapshot_json(0.0, 1.0, [], {}, boot="this")
    watch = NodeWatch([(FAR, "id")], run=lambda node, argv: snap, python="py", here_boot_id="this")
    watch.start()
    assert watch.stop() == [] and watch.here == ["b"]


def test_a_snapshot_that_is_not_the_agents_json_names_the_node() -> None:
    with pytest.raises(Exception, match="node b: the node agent's snapshot is not its JSON"):
        parse_snapshot("bash: python: command not found", node="b")


def test_every_nodes_hardware_is_in_the_key_sorted_and_one_differing_node_changes_it() -> None:
    h100 = ({"gpu.count": "8", "gpu.name": "NVIDIA H100", "software.vllm": "0.32.0"}, {"host.name": "x"})
    a100 = ({"gpu.count": "8", "gpu.name": "NVIDIA A100", "software.vllm": "0.32.0"}, {"host.name": "y"})
    facts = {"name": "d"}
    same = nodes_fingerprint({"a": h100, "b": h100}, facts)
    assert same.hard["gpu.count"] == "16" and same.hardware_class == "2n-16xH100"
    assert nodes_fingerprint({"b": h100, "a": h100}, facts).key == same.key
    mixed = nodes_fingerprint({"a": h100, "b": a100}, facts)
    assert mixed.key != same.key
    assert nodes_fingerprint({"a": a100, "b": h100}, facts).key == mixed.key, "which node is the head does not matter"
    assert same.soft["node0.name"] in ("a", "b") and "host.name" not in same.hard


# --------------------------------------------------------------------------- the next run's sweep, the weight cache


def _stale_record(launch_id: str, node_stop: tuple[str, ...]) -> object:
    from pytest_kimiperf.server.zombies import LaunchPlace, LaunchRecord

    here = LaunchPlace.here()
    # A launch whose leader and owner are long gone (pid 1's identity never matches a record).
    return LaunchRecord(launch_id=launch_id, pid=999999, pgid=999999, create_time=1.0, cmdline=("ssh",),
                        deployment="d", profile="default", log_path="/dev/null", started_at=time.time(),
                        owner_pid=999999, owner_create_time=1.0, start_ticks=1, host=here.host,
                        boot_id=here.boot_id, pid_ns=here.pid_ns, uid=here.uid, node_stop=node_stop)


def _agent_answer(survivors: list[dict[str, object]]) -> tuple[str, ...]:
    answer = json.dumps({"terminated": [{"pid": 5, "name": "VLLM::Worker_TP1", "cmdline": []}], "killed": [],
                         "survivors": survivors})
    # A banner first, as a remote shell may print: only the marked last line is the answer.
    return (sys.executable, "-c", f"print('Welcome to gpu-b'); print({AGENT_MARK + answer!r})")


def test_the_next_runs_sweep_stops_a_killed_sessions_processes_on_a_template_node(tmp_path: Path) -> None:
    from pytest_kimiperf.server import zombies
    from pytest_kimiperf.server.zombies import sweep_stale_launches

    zombies.record_launch(tmp_path, _stale_record("nodesweep01", _agent_answer([]))).release()  # type: ignore[arg-type]
    report = sweep_stale_launches(tmp_path, grace_s=1.0)
    assert [p.name for p in report.ended] == ["VLLM::Worker_TP1 on the node of launch nodesweep01 (d/default, "
                                              f"pid 999999, started {report.swept[0].split('started ')[1]}"]
    assert not zombies.load_launches(tmp_path).records, "nothing survived: the record is forgotten"


def test_a_node_the_sweep_cannot_reach_keeps_the_record_for_the_next_one(tmp_path: Path) -> None:
    from pytest_kimiperf.server import zombies
    from pytest_kimiperf.server.zombies import sweep_stale_launches

    unreachable = ("sh", "-c", "echo 'ssh: Could not resolve hostname gpu-b' >&2; exit 255")
    zombies.record_launch(tmp_path, _stale_record("nodesweep02", unreachable)).release()  # type: ignore[arg-type]
    report = sweep_stale_launches(tmp_path, grace_s=1.0)
    assert "unverified: exited with code 255: ssh: Could not resolve hostname gpu-b" in report.survivors[0].describe()
    assert [r.launch_id for r in zombies.load_launches(tmp_path).records] == ["nodesweep02"]
    assert zombies.LaunchRecord.from_json(_stale_record("x", ("a", "b")).to_json()).node_stop == ("a", "b")  # type: ignore[attr-defined]
    assert "node_stop" not in _stale_record("y", ()).to_json()  # type: ignore[attr-defined]


def test_a_multi_node_deployment_loads_weights_from_disk_and_says_why() -> None:
    from pytest_kimiperf.server.weight_cache import why_not_used

    reason = why_not_used(setting="auto", gpu_count=8, command=["vllm", "serve", "m"], nodes=2)
    assert reason is not None and reason.startswith("a deployment across 2 nodes: `vllm preload` daemons run on the head")
