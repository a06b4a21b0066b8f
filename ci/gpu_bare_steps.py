"""The bare GPU check's longer steps (ci/gpu_bare_check.py lists them all): the load window, the
real ServerManager on the GPU, NCCL under two profiles, CUDA IPC and the GPU-relevant unit tests.

  python ci/gpu_bare_steps.py server-session STATE LOGS   a session that boots and is then killed
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.gpu_bare_recording import CHILD_PATH, LOAD, nvml_sample, run, save  # noqa: E402
from pytest_kimiperf.server import gpu, gpu_memory  # noqa: E402

STUB = str(ROOT / "tests" / "fakes" / "stub_vllm.py")
PHASE_S = 6.0  # five phases: 30 s of the step's 50


# --------------------------------------------------------------------------- the load window


def _watch_pair(load_pid: int, indices: tuple[int, ...], pynvml: Any) -> tuple[Any, Any]:
    """Two watches over one window: the load counted as ours, and as a foreign process."""
    from pytest_kimiperf.measure.hostwatch import HostWatch

    ours = HostWatch(own_pids=lambda: [load_pid], gpu_indices=indices, nvml=pynvml)
    foreign = HostWatch(own_pids=list, gpu_indices=indices, nvml=pynvml)
    ours.start()
    foreign.start()
    return ours, foreign


def _judged(pair: tuple[Any, Any]) -> dict[str, object]:
    from pytest_kimiperf.config.deployments import HostBounds

    ours, foreign = (watch.stop() for watch in pair)
    return {"ours": ours.to_json(), "foreign": foreign.to_json(),
            "ours_disturbances": ours.disturbances(HostBounds()), "ours_own_throttling": ours.own_throttling(),
            "foreign_disturbances": foreign.disturbances(HostBounds())}


def step_load_window(out: Path) -> tuple[str, str]:
    """Idle, GEMM, HBM copy, GEMV, idle, watched phase by phase and whole, with dmon beside it."""
    import pynvml

    indices = gpu.visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), 1)
    if not indices:
        return "FAIL", f"no GPU visible under CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
    pynvml.nvmlInit()  # before any child: a host where NVML cannot start fails here, leaving nothing running
    out.mkdir(parents=True, exist_ok=True)
    smi = shutil.which("nvidia-smi")
    dmon_log = (out / "dmon.txt").open("w")
    dmon = (subprocess.Popen([smi, "dmon", "-s", "pucv", "-d", "1", "-o", "T", "-i", str(indices[0])],
                             stdout=dmon_log, stderr=subprocess.STDOUT) if smi else None)
    child = subprocess.Popen([sys.executable, LOAD, "window", "--phase-s", str(PHASE_S)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    phases: list[dict[str, Any]] = []
    samples: list[dict[str, object]] = []
    readings: dict[str, object] = {}
    others: list[str] = []
    try:
        whole = _watch_pair(child.pid, indices, pynvml)
        pair, since_us = whole, int(time.time() * 1e6)
        assert child.stdout is not None
        for text in child.stdout:
            try:
                event = json.loads(text)
            except ValueError:
                others.append(text.rstrip())
                continue
            phases.append(event)
            if event["event"] == "start":
                since_us = int(time.time() * 1e6)
                samples.append({"phase": event["phase"], "at": "start", **nvml_sample(pynvml, indices[0])})
                pair = _watch_pair(child.pid, indices, pynvml)
            else:
                readings[event["phase"]] = _judged(pair)
                samples.append({"phase": event["phase"], "at": "end", **nvml_sample(pynvml, indices[0], since_us)})
        child.wait(timeout=10)
        readings["whole"] = _judged(whole)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        pynvml.nvmlShutdown()
        if dmon is not None:
            dmon.terminate()
            dmon.wait(timeout=5)
        dmon_log.close()
    save(out, "window_fake_nvml.json", {"gpus": {str(indices[0]): samples}, "phases": phases, "child": others})
    save(out, "readings.json", readings)
    gemm = readings.get("gemm_bf16")
    if not isinstance(gemm, dict):
        return "FAIL", f"the load child gave no GEMM phase (exit {child.returncode}): {(others or ['no output'])[-1]}"
    (reading,) = gemm["ours"]["gpus"]
    rate = next((e.get("rate", 0.0) for e in phases if e["phase"] == "gemm_bf16" and e["event"] == "end"), 0.0)
    watts = reading["energy_j"] / gemm["ours"]["wall_s"] if reading["energy_j"] is not None else None
    # The watch must tell the load apart: named as a foreign GPU process when it is not ours,
    # never when it is (NVML's pid, which in a container may be the host's: pid_namespace.py).
    from pytest_kimiperf.server.pid_namespace import UNMAPPABLE, read_pid_view

    named = {side: {pid for gpu in gemm[side]["gpus"] for pid, _ in gpu["foreign_processes"]} for side in ("ours", "foreign")}
    view = read_pid_view(nvml_pids=named["foreign"])
    load = {child.pid} | view.host_pids([child.pid])
    told_apart = bool(named["foreign"] & load) and not named["ours"] & load
    link = [reading.get(key) for key in ("pcie_gen", "pcie_width", "pcie_max_gen", "pcie_max_width")]
    # Where NVML's pids name no process here, the watch cannot tell the load apart by pid and
    # bounds other GPU processes by device-level growth instead (hostwatch.py): a fact, not a fault.
    verdict = "OK" if told_apart else ("INFO" if view.mode == UNMAPPABLE or view.unnamed(named["foreign"]) else "FAIL")
    return verdict, (
        f"GEMM {rate / 1e12:.0f} TFLOP/s, {watts or 0:.0f} W average, power-capped {reading['power_violation_ms']} "
        f"ms, reasons {reading['throttle_reasons']}, PCIe gen/width/max {link}; load pid {child.pid} named as "
        f"foreign: {bool(named['foreign'] & load)}, as ours: {bool(named['ours'] & load)}; as ours "
        f"{len(gemm['ours_disturbances'])} disturbance(s), as foreign {len(gemm['foreign_disturbances'])}")


# --------------------------------------------------------------------------- the server manager


def _stub_gpu_deployment() -> Any:
    from pytest_kimiperf.config.deployments import TINY_CPU

    return replace(
        TINY_CPU, name="stub-gpu", description="the stub server with a process holding GPU memory",
        model="stub-model", served_model_name="stub-model", gpu_count=1, tensor_parallel_size=1,
        command=(sys.executable, LOAD, "serve", "--mib", "1024", "--", sys.executable, STUB, "--model",
                 "{served_model_name}", "--host", "{host}", "--port", "{port}", "--load-seconds", "0"),
        env=MappingProxyType({}), health_deadline_s=60.0, weight_cache="off")


def _manager(logs: Path, state: Path, announce: Any) -> Any:
    from pytest_kimiperf.config.options import script_settings
    from pytest_kimiperf.server.manager import ServerManager

    settings = replace(script_settings("tiny-cpu", rootpath=ROOT, source="ci/gpu-bare-check.sh", grace="10",
                                       host_wait="30"), deployment=_stub_gpu_deployment())
    return ServerManager(settings, log_dir=logs, state_dir=state, announce=announce, on_progress=lambda *a: None)


def _family(pid: int | None) -> list[int]:
    import psutil

    if pid is None:
        return []
    root = psutil.Process(pid)
    return [root.pid, *(p.pid for p in root.children(recursive=True))]


def step_server(out: Path) -> tuple[str, str]:
    """Boot, mark, measure, stop and free; then a killed session and the next one's sweep."""
    import httpx

    from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
    from pytest_kimiperf.measure.hostwatch import HostWatch
    from pytest_kimiperf.server.zombies import LAUNCH_ID_ENV

    said: list[str] = []
    default = BUILTIN_PROFILES["default"]
    before = gpu_memory.gpu_memory_used_mib()
    manager = _manager(out / "logs", out / "state", said.append)
    try:
        handle = manager.acquire(default)
        family = _family(handle.pid)
        import psutil

        marked = sum(1 for pid in family if psutil.Process(pid).environ().get(LAUNCH_ID_ENV))
        holders = gpu_memory.gpu_holders()
        held = {pid: mib for pid, mib in holders.by_pid().items() if pid in family}
        device_mib = sum(max(0, mib - before.get(i, 0)) for i, mib in gpu_memory.gpu_memory_used_mib().items())
        watch = HostWatch(own_pids=lambda: family)
        watch.start()
        # The stub answers every completion as a stream of SSE chunks, as vLLM does with "stream".
        reply = httpx.post(f"{handle.base_url}/v1/completions", timeout=30,
                           json={"model": handle.model, "prompt": "hi", "max_tokens": 8, "stream": True}).text
        chunks = sum(1 for text in reply.splitlines() if text.startswith("data: {"))
        measured = watch.stop()
        manager.release()
        # Where NVML's pids name no process here the plugin accounts per GPU: so does this wait.
        gpu_memory.wait_gpu_memory_freed(held, deadline_s=20.0, poll_s=0.2, before_mib=None if held else before)
    finally:
        manager.close()
    memory = f"GPU memory {held} MiB" if held else f"GPU memory +{device_mib} MiB on the device (no pid named)"
    first = (f"{len(family)} process(es), {marked} marked, {memory}, "
             f"{chunks} stream chunks, {measured.describe_busy(_bounds())[:60]}; freed")
    # A session SIGKILLed: its launcher's watchdog pipe closes and the launcher stops the server.
    watched = _killed_session(out, kill_launcher=False)
    started = time.monotonic()
    while any(_alive(pid) for pid in watched) and time.monotonic() - started < 20:
        time.sleep(0.2)
    watchdog = f"watchdog: {'all gone' if not any(_alive(p) for p in watched) else 'LEFT RUNNING'} " \
               f"{time.monotonic() - started:.1f} s after the session's SIGKILL"
    # The launcher killed first as well (a job killed as a whole): the next session's sweep must
    # find the server and the GPU memory its holder keeps.
    orphans = _killed_session(out, kill_launcher=True)
    swept: list[str] = []
    follower = _manager(out / "logs2", out / "state2", swept.append)
    try:
        follower.acquire(default)
        follower.release()
    finally:
        follower.close()
    save(out, "said.json", {"first": said, "second_session": swept, "orphans": orphans, "watchdog": watchdog})
    named = [line for line in swept if "MiB of GPU memory" in line]
    lifecycle = marked == len(family) and bool(named) and "all gone" in watchdog
    said_of_it = f"{first}; {watchdog}; killed session's sweep: {named or swept[-3:]}"
    if held:
        return ("OK" if lifecycle else "FAIL"), said_of_it
    if holders.unnamed and device_mib > 0 and lifecycle:
        return "INFO", f"NVML names no process here, so GPU memory is accounted per GPU, as the plugin does: {said_of_it}"
    return "FAIL", said_of_it


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _killed_session(out: Path, *, kill_launcher: bool) -> list[int]:
    """Start a session that boots the stub GPU server (state in OUT/state2), SIGKILL it (and its
    server's launcher first, where asked); the server's processes as the session saw them."""
    import psutil

    session = subprocess.Popen([sys.executable, __file__, "server-session", str(out / "state2"), str(out / "logs2")],
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": CHILD_PATH})
    assert session.stdout is not None
    family = json.loads(session.stdout.readline() or "{}").get("family", [])
    if kill_launcher and family:
        candidates = [psutil.Process(family[0]), *(p for p in [psutil.Process(family[0]).parent()] if p)]
        for process in candidates:
            if "pytest_kimiperf.server.launcher" in " ".join(process.cmdline()):
                process.send_signal(signal.SIGKILL)
    session.send_signal(signal.SIGKILL)
    session.wait()
    session.stdout.close()
    return family


def _bounds() -> Any:
    from pytest_kimiperf.config.deployments import HostBounds

    return HostBounds()


def server_session(state: Path, logs: Path) -> None:
    """A session that boots the stub GPU server, says its processes, and waits to be killed."""
    from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES

    manager = _manager(logs, state, lambda line: None)
    handle = manager.acquire(BUILTIN_PROFILES["default"])
    print(json.dumps({"family": _family(handle.pid)}), flush=True)
    while True:
        time.sleep(3600)


# --------------------------------------------------------------------------- NCCL, IPC, unit tests


def step_nccl(out: Path) -> tuple[str, str]:
    """A one-rank all-reduce under tree-ll's and ring-ll's environment with --kimiperf-nccl-debug's files."""
    from pytest_kimiperf.config.nccl.debug_log import nccl_debug_env
    from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
    from pytest_kimiperf.reports.nccl import check_server_log

    out.mkdir(parents=True, exist_ok=True)
    seen, failed = [], False
    for name in ("tree-ll", "ring-ll"):
        profile = BUILTIN_PROFILES[name]
        log = out / f"{name}.log"
        code, text = run([sys.executable, LOAD, "nccl"], 20, env={**os.environ, **profile.env, **nccl_debug_env(log)})
        log.write_text(f"exit {code}\n{text}")
        check = check_server_log(name, profile.env, log, cpu_engine=False)
        save(out, f"{name}.check.json", check.to_json())
        statuses = {v.variable: v.status for v in check.variables}
        failed |= code != 0 or check.error is not None
        seen.append(f"{name}: exit {code}, {statuses}, {len(list(out.glob(f'{name}.nccl.*')))} debug file(s)")
    return ("FAIL" if failed else "OK"), "; ".join(seen)


def step_ipc(out: Path) -> tuple[str, str]:
    """A CUDA tensor read by a second process through CUDA IPC."""
    code, text = run([sys.executable, LOAD, "ipc"], 20)
    save(out, "ipc.txt", f"exit {code}\n{text}")
    try:
        result = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "FAIL", f"exit {code}: {text.strip()[-200:] or 'no output'}"
    ok = code == 0 and result["parent_sum"] == result["child_sum"] and result["child_exit"] == 0
    return ("OK" if ok else "FAIL"), f"parent sum {result['parent_sum']:.0f}, child sum {result['child_sum']:.0f}"


# The plugin named, not found: the lent machine has the repository on PYTHONPATH and no installed
# package, so no pytest11 entry point; where one exists its name (kimiperf) is blocked first, since
# pluggy refuses one module under two names (ci/lent_tests/pyproject.toml does the same).
REGISTER_PLUGIN = ("-p", "no:kimiperf", "-p", "pytest_kimiperf.plugin")
GPU_TESTS = ("tests/unit/test_gpu.py", "tests/unit/test_gpu_counters.py", "tests/unit/test_hostwatch.py",
             "tests/unit/test_pid_namespace.py", "tests/unit/test_canary.py", "tests/unit/test_nvidia_smi.py")
# The step's limit (gpu_bare_check.steps) and pytest's inside it: the inner one ends first, with
# room to write the verdict, so a slow run is reported as one and its output kept (11 s on a
# 2-core host; the shell's limit would cut the step off without either).
UNIT_TESTS_LIMIT_S = 30
UNIT_TESTS_TIMEOUT_S = UNIT_TESTS_LIMIT_S - 6


def step_unit_tests(out: Path) -> tuple[str, str]:
    """The GPU-relevant unit tests, here where NVML loads (the CPU hosts skip what needs it)."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "pytest.txt"
    # Into the file as it runs: whatever cuts the run short, what it printed is there.
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-u", "-m", "pytest", *GPU_TESTS, "-q", "-p", "no:cacheprovider", "-rs",
                                 *REGISTER_PLUGIN],
                                stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": CHILD_PATH})
        try:
            code = proc.wait(timeout=UNIT_TESTS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return "FAIL", (f"cut off after {UNIT_TESTS_TIMEOUT_S} s; what it printed is in unit-tests/pytest.txt: "
                            f"{_last(log.read_text())}")
    return ("OK" if code == 0 else "FAIL"), f"exit {code}: {_last(log.read_text())}"


def _last(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1][:200]


if __name__ == "__main__" and sys.argv[1:2] == ["server-session"]:
    server_session(Path(sys.argv[2]), Path(sys.argv[3]))
