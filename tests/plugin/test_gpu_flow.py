"""The GPU flow end to end on the simulated GPU (tests/fakes/simgpu): the real hardware check,
sweep, launch, memory-freed wait, NVML telemetry under load, throttle INVALID and report, with
the stub server holding simulated GPU memory the way vLLM's process tree does.

Every case here is a fault a real GPU host shows and a CPU host cannot: orphans of a killed run
holding every GPU, a stranger holding memory, memory slow to come back, NVML pids of another
pid namespace, throttling in a measured window, a PCIe link below its generation, the wrong GPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import gone, stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

MIB_PER_GPU = 90000  # Kimi-K2.5 INT4 at TP=8 holds about this on each 97887 MiB RTX PRO 6000


def rtx8(boots: Path | None = None, *, linger_s: float = 0.0, extra_keys: str = "", mode: str = "normal") -> str:
    """8 simulated RTX PRO 6000 served by the stub: EngineCore and eight workers, 90000 MiB each."""
    return stub_deployment_toml(
        "rtx8", mode=mode, boot_count=boots, gpu_count=8,
        extra_args=("--sim-gpu-mib", str(MIB_PER_GPU), "--sim-gpus", "8", "--sim-linger-s", str(linger_s)),
        extra_keys='gpu_name_contains = "RTX PRO 6000"\nweight_cache = "off"\n' + extra_keys)


HOLD = """
import time
def test_hold(kimiperf_server):
    print("READY", flush=True)
    time.sleep(600)
"""

USES_SERVER = """
def test_uses_server(kimiperf_server):
    assert kimiperf_server.base_url
"""


def _stub_pids(boots: Path) -> list[int]:
    return [int(line.split()[0]) for line in boots.read_text().splitlines() if line.strip()] if boots.exists() else []


def _kill_run_leaving_workers(pytester: pytest.Pytester, boots: Path) -> list[int]:
    """Boot the deployment in a pytest run, then SIGKILL that run's pytest, launcher, API server and
    EngineCore (an OOM kill, a cancelled CI job and a `kill -9` by hand at once); returns the
    workers left holding the GPUs."""
    pytester.makepyfile(test_hold=HOLD)
    first = subprocess.Popen([sys.executable, "-m", "pytest", "--kimiperf-deployment", "rtx8", "-s",
                              "-p", "no:cacheprovider", "test_hold.py"],
                             cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert first.stdout is not None
    for line in first.stdout:
        if b"READY" in line:
            break
    api = psutil.Process(_stub_pids(boots)[0])
    launcher = api.parent()
    assert launcher is not None and "launcher" in " ".join(launcher.cmdline())
    engine = [p for p in api.children() if "EngineCore" in " ".join(p.cmdline())]
    workers = [p.pid for p in api.children(recursive=True) if "Worker_TP" in " ".join(p.cmdline())]
    assert len(engine) == 1 and len(workers) == 8
    for process in (launcher, api, *engine):  # the launcher first: its watchdog would end the rest
        process.kill()
    first.kill()
    first.wait()
    first.stdout.close()
    (pytester.path / "test_hold.py").unlink()
    return workers


def test_orphans_of_a_killed_run_holding_every_gpu_are_swept_and_the_next_run_boots(
    pytester: pytest.Pytester, stub_project, simulated_gpus, tmp_path: Path
) -> None:
    """The seed's scenario: a killed run's workers hold 90000 MiB on each of the 8 GPUs. The next
    run ends exactly them by their launch marker, waits for the memory, boots and passes; before
    the sweep came first, every perf test failed on free memory and the orphans stayed."""
    boots = tmp_path / "boots"
    stub_project(rtx8(boots))
    workers = _kill_run_leaving_workers(pytester, boots)
    assert all(not gone(pid) for pid in workers)
    assert simulated_gpus.used_mib() == dict.fromkeys(range(8), MIB_PER_GPU)
    pytester.makepyfile(USES_SERVER)
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "rtx8", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*zombie sweep: ended stale launch * (rtx8/default, pid *",
        "*zombie sweep: ended pid * VLLM::Worker_TP0, which held 90000 MiB of GPU memory",
        "*kimiperf: servers and files*",
        "before the first boot the sweep ended 8 processes of 1 stale launch of a killed run (launch * (rtx8/default,"
        " pid *); 720000 MiB of GPU memory came back on 8 GPUs",
    ])
    assert "MiB free" not in result.stdout.str()
    assert all(gone(pid) for pid in workers)
    simulated_gpus.wait_released()


def test_a_stranger_holding_gpu_memory_is_never_signalled_and_stops_the_run_before_any_boot(
    pytester: pytest.Pytester, stub_project, simulated_gpus
) -> None:
    """Memory held by a process of no kimiperf launch (another user's job): the sweep leaves it,
    and every perf test errors before any boot naming its pid, name and MiB on each GPU short."""
    stub_project(rtx8())
    stranger = simulated_gpus.stranger({0: 30000, 5: 60000})
    pytester.makepyfile(USES_SERVER)
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "rtx8", "--kimiperf-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                           timeout=120)
    result.assert_outcomes(errors=2)
    name = psutil.Process(stranger.pid).name()
    result.stdout.fnmatch_lines([
        f"*GPU 0 (NVIDIA RTX PRO 6000 Blackwell Server Edition) has 67887 of 97887 MiB free, vLLM asks 88099: "
        f"held by pid {stranger.pid} {name} (30000 MiB); GPU 5 (*) has 37887 of 97887 MiB free, vLLM asks 88099: "
        f"held by pid {stranger.pid} {name} (60000 MiB)*never signalled*",
    ])
    assert "starting rtx8 server" not in result.stdout.str()
    assert not list(pytester.path.rglob("server-*.log"))
    assert stranger.poll() is None, "the run signalled a process it did not start"


@pytest.mark.parametrize(("linger_s", "wait_s"), [(1.5, 30), (3600, 2)], ids=["comes-back", "never-comes-back"])
def test_memory_slow_to_come_back_after_a_stop_is_waited_for_then_named_per_gpu(
    pytester: pytest.Pytester, stub_project, simulated_gpus, linger_s: float, wait_s: float
) -> None:
    """After the first profile's server stops, its GPU memory lingers (the driver still tearing its
    contexts down). The next boot waits for it up to gpu_memory_wait_s; past that, it fails naming
    the MiB unexplained on each GPU."""
    stub_project(rtx8(linger_s=linger_s, extra_keys=f"gpu_memory_wait_s = {wait_s}\n"))
    pytester.makepyfile(USES_SERVER)
    started = time.monotonic()
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "rtx8", "--kimiperf-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                           timeout=120)
    if linger_s < wait_s:
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["*kimiperf: GPU memory back to its figure before the first boot after *s"])
        return
    result.assert_outcomes(passed=1, errors=1)
    assert time.monotonic() - started >= wait_s
    result.stdout.fnmatch_lines([
        f"*GPU memory still held {wait_s} s after stopping the server: "
        "GPU 0: 90000 MiB used, 0 MiB before the first boot, ours 0 MiB: 90000 MiB unexplained, *"
        "GPU 7: 90000 MiB used, 0 MiB before the first boot, ours 0 MiB: 90000 MiB unexplained*",
    ])


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


PERF_TEST = """
from pytest_kimiperf import SingleStream

def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=3))
    perf.check(run, ["decode_tok_s"])
"""


@pytest.mark.skipif(not _unshare_works(), reason="this host refuses a pid namespace (unshare --pid --mount-proc)")
def test_nvml_pids_of_another_pid_namespace_fall_back_to_device_accounting_said_once(
    pytester: pytest.Pytester, stub_project, simulated_gpus
) -> None:
    """The run in a pid namespace of its own (a container) whose driver names processes by the
    host's pids: none is a process here. The memory is accounted per GPU, one line says so, and
    the run goes on, measured."""
    simulated_gpus.update(pid_mode="foreign")
    stub_project(rtx8())
    pytester.makepyfile(PERF_TEST)
    result = pytester.run("unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "pytest",
                          "--kimiperf-deployment", "rtx8", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
    said = [line for line in result.outlines if "accounted per GPU, not per process" in line]
    assert len(said) == 1, result.stdout.str()
    assert "none of NVML's pids" in said[0]


@pytest.mark.parametrize(("gpu", "changes", "named"), [
    (3, {"reasons_under_load": ("hw_thermal_slowdown",)}, "GPU 3 clocks held back by temperature for * ms of the *"),
    (5, {"reasons_always": ("hw_power_brake_slowdown",)}, "GPU 5 clocks held back by hw_power_brake_slowdown*"),
], ids=["thermal", "power-brake"])
def test_a_throttle_in_the_measured_window_makes_the_measurement_invalid_naming_reason_and_gpu(
    pytester: pytest.Pytester, stub_project, simulated_gpus, gpu: int, changes: dict[str, object], named: str
) -> None:
    simulated_gpus.update_gpu(gpu, **changes)
    stub_project(rtx8())
    pytester.makepyfile(PERF_TEST)
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "rtx8", timeout=120)
    result.assert_outcomes(failed=1)
    assert result.ret == 75, result.stdout.str()
    result.stdout.fnmatch_lines([f"*INVALID*{named}"])


def test_a_pcie_link_below_its_generation_under_load_is_reported(
    pytester: pytest.Pytester, stub_project, simulated_gpus
) -> None:
    """GPU 2's link trained to Gen4 x8 under load (a riser, a slot of fewer lanes): another
    machine than the one the baseline knows, said with the result."""
    simulated_gpus.update_gpu(2, pcie_load_gen=4, pcie_load_width=8)
    stub_project(rtx8())
    pytester.makepyfile(PERF_TEST)
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "rtx8", "-v", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*GPU 2's PCIe link ran at Gen4 x8 (Gen5 x16 possible)*"])
    assert "GPU 0's PCIe link" not in result.stdout.str()


@pytest.mark.parametrize(("deployment_keys", "env", "expected"), [
    ('gpu_name_contains = "H100"\n', {}, "*needs 8x NVIDIA GPU whose name contains 'H100'; found 8x NVIDIA RTX PRO 6000"
     " Blackwell Server Edition (97887 MiB), of which 0 qualify*extends = \"rtx8\" gpu_name_contains*"),
    ("", {"CUDA_VISIBLE_DEVICES": "0,1,2"}, "*needs 8x NVIDIA GPU whose name contains 'RTX PRO 6000'; found 3x NVIDIA "
     "RTX PRO 6000 Blackwell Server Edition (97887 MiB) (CUDA_VISIBLE_DEVICES='0,1,2' leaves the server 3 of the "
     "host's 8)*"),
    ("gpu_count = 16\n", {}, "*needs 16x NVIDIA GPU whose name contains 'RTX PRO 6000'; found 8x NVIDIA RTX PRO 6000"
     " Blackwell Server Edition (97887 MiB)*"),
], ids=["wrong-name", "too-few-visible", "too-few"])
def test_the_wrong_gpus_error_every_perf_test_before_any_boot(
    pytester: pytest.Pytester, stub_project, simulated_gpus, monkeypatch: pytest.MonkeyPatch,
    deployment_keys: str, env: dict[str, str], expected: str
) -> None:
    """The wrong GPU name or count, or CUDA_VISIBLE_DEVICES leaving too few: each selected perf test
    errors at setup with the one message, before any boot; the run's other tests still run."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stub_project(stub_deployment_toml("rtx8", gpu_count=8, extra_args=("--sim-gpu-mib", "1000"),
                                      extra_keys='gpu_name_contains = "RTX PRO 6000"\nweight_cache = "off"\n')
                 .replace("gpu_count = 8\n", "gpu_count = 8\n" + deployment_keys if "gpu_count" not in deployment_keys
                          else deployment_keys)
                 .replace('gpu_name_contains = "RTX PRO 6000"\n', "" if "gpu_name" in deployment_keys else
                          'gpu_name_contains = "RTX PRO 6000"\n'))
    pytester.makepyfile(USES_SERVER + "\ndef test_unit():\n    pass\n")
    result = pytester.runpytest_subprocess("--kimiperf-deployment", "rtx8", "--kimiperf-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                           timeout=120)
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([expected])
    assert "starting rtx8 server" not in result.stdout.str()
    assert not list(pytester.path.rglob("server-*.log"))


@pytest.fixture(autouse=True)
def _no_simulated_process_left(simulated_gpus):
    """A failed case must not leave this case's stub processes behind (found by the simulated
    host they were started on, never another case's)."""
    yield
    for process in psutil.process_iter():
        try:
            if process.environ().get("SIMGPU_STATE") == str(simulated_gpus.directory) and process.pid != os.getpid():
                process.kill()
        except psutil.Error:
            continue
