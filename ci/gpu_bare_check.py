"""The bare GPU check's steps: every GPU path of the plugin, run through its own code, on one GPU
and without vLLM (ci/gpu-bare-check.sh runs them, one process a step).

  python ci/gpu_bare_check.py --plan          each step and its time limit, one a line
  python ci/gpu_bare_check.py STEP WORKDIR    run one step; recordings go to WORKDIR/STEP/

Each step prints one line ``check: OK|FAIL|INFO STEP: what was seen`` and writes what it read,
raw, beside it: these are the recordings the plugin's tests are built from. A step never needs
another's output. GPU work runs in children (ci/gpu_bare_load.py), so no CUDA context stays here.
The steps' modules (this one, gpu_bare_preflight.py, gpu_bare_steps.py) share how they run a child
and keep a recording through ci/gpu_bare_recording.py, which imports none of them.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.gpu_bare_recording import CHILD_PATH, LOAD, nvml_sample, record_call, run, save  # noqa: E402
from pytest_kimiperf.server import gpu, gpu_memory, nvidia_smi  # noqa: E402

Step = Callable[[Path], tuple[str, str]]


def _last(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1][:200]


# --------------------------------------------------------------------------- the runtime


def step_runtime(out: Path) -> tuple[str, str]:
    """Kernel, sandbox or not, /proc/stat, PSI and the pid namespace, as the host watch reads them."""
    from pytest_kimiperf.measure.hostwatch import HostWatch
    from pytest_kimiperf.server.pid_namespace import read_pid_view

    for name in ("version", "stat", "self/status", "self/cgroup", "cpuinfo", "meminfo",
                 "pressure/cpu", "pressure/io", "pressure/memory"):
        try:
            save(out, name.replace("/", "_"), Path("/proc", name).read_text())
        except OSError as error:
            save(out, name.replace("/", "_") + ".error", f"{type(error).__name__}: {error}\n")
    try:
        ns = os.readlink("/proc/self/ns/pid") + f" inode {os.stat('/proc/self/ns/pid').st_ino:#x}"
    except OSError as error:
        ns = f"unreadable: {error}"
    watch = HostWatch(own_pids=list)
    watch.start()
    time.sleep(1.0)
    reading = watch.stop()
    view = read_pid_view()
    save(out, "watch.json", reading.to_json())
    facts: dict[str, object] = {"kernel": platform.release(), "pid_ns": ns, "pid_view": view.mode, "pid_note": view.note,
             "dmesg": _last(run(["dmesg"], 5)[1]), "watch": reading.describe_busy(_bounds())}
    status = (out / "self_status").read_text() if (out / "self_status").is_file() else ""
    facts["nspid_line"] = any(text.startswith("NSpid:") for text in status.splitlines())
    save(out, "facts.json", facts)
    # gVisor's kernel log opens with "Starting gVisor..." (its dmesg is synthetic).
    sandbox = "gVisor" if "gVisor" in run(["dmesg"], 5)[1] else "none seen"
    return "INFO", (f"kernel {facts['kernel']}, sandbox {sandbox}, NSpid {facts['nspid_line']}, pid view {view.mode}, "
                    f"PSI {'yes' if reading.psi else 'no'}, watch: {str(facts['watch'])[:160]}")


def _bounds() -> Any:
    from pytest_kimiperf.config.deployments import HostBounds

    return HostBounds()


# --------------------------------------------------------------------------- nvidia-smi


def step_smi(out: Path) -> tuple[str, str]:
    """Each nvidia-smi output the plugin reads, recorded and parsed by the plugin's parsers."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "FAIL", "nvidia-smi not on PATH"
    queries = {
        "banner.txt": [],
        "query_gpu_noheader.csv": [f"--query-gpu={','.join(nvidia_smi.QUERY_GPU_FIELDS)}", "--format=csv,noheader,nounits"],
        "query_gpu_header.csv": [f"--query-gpu={','.join(nvidia_smi.QUERY_GPU_FIELDS)}", "--format=csv"],
        "topo_m.txt": ["topo", "-m"],
        "compute_apps_idle.csv": [f"--query-compute-apps={','.join(nvidia_smi.QUERY_COMPUTE_APPS_FIELDS)}",
                                  "--format=csv"],
        "power_limit.csv": ["--query-gpu=power.limit", "--format=csv,noheader,nounits"],
        "q_power_clocks.txt": ["-q", "-d", "POWER,CLOCK,PERFORMANCE"],
    }
    codes: dict[str, int] = {}
    for name, args in queries.items():
        codes[name], text = run([smi, *args], 20)
        save(out, name, text)
    holder = subprocess.Popen([sys.executable, LOAD, "hold", "--mib", "1024"], stdout=subprocess.PIPE, text=True)
    try:
        ready = holder.stdout.readline() if holder.stdout else ""
        codes["compute_apps_loaded.csv"], loaded = run([smi, *queries["compute_apps_idle.csv"]], 20)
        save(out, "compute_apps_loaded.csv", f"# holder pid {holder.pid}, {ready.strip()}\n{loaded}")
    finally:
        holder.kill()
        holder.wait()
    save(out, "exit_codes.json", codes)
    parsed, problems = {}, []
    readers: dict[str, Callable[[str], object]] = {
        "banner.txt": nvidia_smi.parse_cuda_version,
        "query_gpu_noheader.csv": nvidia_smi.parse_query_gpu_csv,
        "query_gpu_header.csv": nvidia_smi.parse_query_gpu_csv,
        "topo_m.txt": nvidia_smi.parse_topology,
        "compute_apps_idle.csv": nvidia_smi.parse_compute_apps,
        "compute_apps_loaded.csv": lambda text: nvidia_smi.parse_compute_apps(text.split("\n", 1)[1]),
    }
    from pytest_kimiperf.measure.canary import parse_power_limits

    readers["power_limit.csv"] = parse_power_limits
    for name, reader in readers.items():
        try:
            parsed[name] = repr(reader((out / name).read_text()))
        except ValueError as error:
            parsed[name] = f"ValueError: {error}"
            problems.append(name)
    save(out, "parsed.json", parsed)
    hard = [p for p in problems if p != "topo_m.txt"]  # a sandbox without PCI sysfs: expected
    topo = f"topo -m exit {codes['topo_m.txt']}" + (" unparsed" if "topo_m.txt" in problems else " parsed")
    return ("FAIL" if hard else "OK"), f"{len(readers) - len(problems)}/{len(readers)} parsed; {topo}; " + (
        f"failed: {hard}" if hard else f"loaded apps: {parsed['compute_apps_loaded.csv'][:80]}")


# --------------------------------------------------------------------------- NVML


def step_nvml(out: Path) -> tuple[str, str]:
    """Every NVML call the plugin makes, raw; probe_gpus over NVML against nvidia-smi alone."""
    from pytest_kimiperf.judge.baselines import host_fingerprint
    from pytest_kimiperf.measure.host_facts import host_facts

    import pynvml

    pynvml.nvmlInit()
    try:
        system: dict[str, object] = {}
        for name in ("nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion", "nvmlDeviceGetCount"):
            record_call(system, name, getattr(pynvml, name))
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            device: dict[str, object] = {}
            for name in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo",
                         "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetMigMode",
                         "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetPowerManagementLimit",
                         "nvmlDeviceGetEnforcedPowerLimit"):
                record_call(device, name, functools.partial(getattr(pynvml, name), h))
            record_call(device, "nvmlDeviceGetTemperature", functools.partial(pynvml.nvmlDeviceGetTemperature, h, 0))
            device["sample"] = nvml_sample(pynvml, index, since_us=int(time.time() * 1e6) - 2_000_000)
            devices.append(device)
    finally:
        pynvml.nvmlShutdown()
    save(out, "nvml_calls.json", {"system": system, "devices": devices})
    with_nvml = gpu.probe_gpus()
    code, text = run([sys.executable, "-c", "import sys, json, dataclasses; sys.modules['pynvml'] = None; "
                      "from pytest_kimiperf.server.gpu import probe_gpus; p = probe_gpus(); "
                      "print(json.dumps({'source': p.source, 'gpus': [dataclasses.asdict(g) for g in p.gpus]}))"],
                     30, env={**os.environ, "PYTHONPATH": CHILD_PATH})
    smi_only: dict[str, Any] = (json.loads(text.strip().splitlines()[-1]) if code == 0 else
                                {"source": "error", "gpus": [], "text": text})
    gpus_smi = tuple(nvidia_smi.GpuInfo(**g) for g in smi_only["gpus"])
    keys = {}
    for label, gpus in (("nvml", with_nvml.gpus), ("smi", gpus_smi)):
        topology, why_not = gpu.host_topology(gpus)
        keys[label] = host_fingerprint(host_facts(gpus=gpus, topology=topology, topology_note=why_not), {})
    save(out, "probe.json", {"nvml": {"source": with_nvml.source, "notes": with_nvml.notes,
                                      "gpus": [repr(g) for g in with_nvml.gpus]}, "smi_only": smi_only,
                             "hard": {k: dict(v.hard) for k, v in keys.items()}})
    differ = sorted(k for k in set(keys["nvml"].hard) | set(keys["smi"].hard)
                    if keys["nvml"].hard.get(k) != keys["smi"].hard.get(k))
    ok = with_nvml.source == "NVML" and smi_only["source"] == "nvidia-smi" and not differ
    return ("OK" if ok else "FAIL"), (f"NVML {with_nvml.source} {len(with_nvml.gpus)} GPU(s), nvidia-smi "
                                      f"{smi_only['source']}; fingerprint keys {'equal' if not differ else 'differ'}"
                                      + (f": {differ}" if differ else f" ({keys['nvml'].key})"))


# --------------------------------------------------------------------------- canary and GPU memory


def step_canary(out: Path) -> tuple[str, str]:
    """The canary as a GPU session takes it (the GPU copy alone where numpy, which the CPU copy
    probe needs, is not here), and what GPU memory this process holds after."""
    import importlib.util

    from pytest_kimiperf.measure.canary import gpu_canary, host_canary

    canary = host_canary(rounds=5, gpus=True) if importlib.util.find_spec("numpy") else gpu_canary(5)
    if canary is None:
        return "FAIL", "the GPU copy canary gave nothing (torch sees no GPU in its child)"
    holders = gpu_memory.gpu_memory_by_pid()
    held = holders.get(os.getpid())
    save(out, "canary.json", {"canary": canary.to_json(), "held_by_session_mib": held})
    # Listed at all is a context left behind, whether or not NVML gives its size.
    ok = "gpu_copy_gbs" in canary.scores and os.getpid() not in holders
    left = gpu_memory.describe_mib(held) if os.getpid() in holders else "0 MiB"
    return ("OK" if ok else "FAIL"), (f"scores {canary.to_json()['scores']}, notes {list(canary.notes)}; "
                                      f"GPU memory left by the session: {left}")


def _holder(mib: int) -> subprocess.Popen[str]:
    # BARE_HOLDER: another command that holds GPU memory and says "ready" (make test's stand-in on
    # the simulated GPU, tests/fakes/simgpu/hold.py); the CUDA allocation of gpu_bare_load.py here.
    command = os.environ.get("BARE_HOLDER", "").split() or [sys.executable, LOAD]
    holder = subprocess.Popen([*command, "hold", "--mib", str(mib)], stdout=subprocess.PIPE, text=True)
    line = holder.stdout.readline() if holder.stdout else ""
    if not line.startswith("ready"):
        holder.kill()
        holder.wait()
        raise RuntimeError(f"the GPU memory holder did not start: {line.strip() or 'no output'}")
    return holder


def step_gpu_memory(out: Path) -> tuple[str, str]:
    """gpu_memory_by_pid sees a holder's memory; wait_gpu_memory_freed after SIGKILL, timed. Where
    NVML's pids name no process here (a container whose driver reports the host's pids), the plugin
    accounts per GPU instead: that is what is checked then, and the line is INFO, not FAIL."""
    before = gpu_memory.gpu_memory_used_mib()
    holder = _holder(2048)
    holders = gpu_memory.gpu_holders()
    seen = holders.by_pid()
    during = gpu_memory.gpu_memory_used_mib()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    # Named without a figure (NVML_VALUE_NOT_AVAILABLE): only the device-level view can tell.
    named = (seen.get(holder.pid) or 0) >= 2048
    started = time.monotonic()
    try:
        if named:
            gpu_memory.wait_gpu_memory_freed([holder.pid], deadline_s=30.0, poll_s=0.1)
        else:  # device-level: every GPU back to its figure before the holder
            gpu_memory.wait_gpu_memory_freed((), deadline_s=30.0, poll_s=0.1, before_mib=before)
        freed = f"freed {time.monotonic() - started:.2f} s after SIGKILL"
    except Exception as error:  # noqa: BLE001
        freed = f"not freed: {error}"
    grew_mib = max((during[i] - before.get(i, 0) for i in during), default=0)
    save(out, "memory.json", {"holder": holder.pid, "seen_mib": seen, "freed": freed, "device_growth_mib": grew_mib,
                              "pid_note": holders.note})
    if named:
        verdict = "OK" if freed.startswith("freed") else "FAIL"
        return verdict, f"holder pid {holder.pid} seen with {seen[holder.pid]} MiB; {freed}"
    if holder.pid in seen and seen[holder.pid] is None and grew_mib >= 2048 and freed.startswith("freed"):
        return "INFO", (f"NVML names holder pid {holder.pid} without a figure for its memory: device-level "
                        f"accounting saw +{grew_mib} MiB while the holder ran; {freed}")
    if holders.unnamed and grew_mib >= 2048 and freed.startswith("freed"):
        return "INFO", (f"NVML names no process here ({(holders.note or '')[:160]}): device-level accounting saw "
                        f"+{grew_mib} MiB while the holder ran; {freed}")
    return "FAIL", f"holder pid {holder.pid} seen with {seen.get(holder.pid)} MiB, device +{grew_mib} MiB; {freed}"


# --------------------------------------------------------------------------- pid namespaces


def step_pid_ns(out: Path) -> tuple[str, str]:
    """Through unshare --pid --fork, with and without --mount-proc: the view and the sweep's GPU check."""
    if shutil.which("unshare") is None:
        return "INFO", "no unshare(1) here"
    seen, failed = [], False
    for extra in ([], ["--mount-proc"]):
        code, text = run(["unshare", "--pid", "--fork", *extra, sys.executable, __file__, "pid-ns-probe", str(out)],
                         40, env={**os.environ, "PYTHONPATH": CHILD_PATH})
        save(out, f"unshare{''.join(extra) or '_plain'}.txt", f"exit {code}\n{text}")
        seen.append(f"{' '.join(extra) or 'plain'}: " + (_last(text) if code == 0 else f"exit {code} {_last(text)}"))
        # unshare(1) refusing (no CAP_SYS_ADMIN, a sandbox without PID namespaces) is a fact of
        # the runtime; the probe failing inside a namespace it got is a failure.
        failed = failed or (code != 0 and not text.lstrip().startswith("unshare:"))
    return ("FAIL" if failed else "INFO"), "; ".join(seen)


def pid_ns_probe() -> None:
    """Inside the namespace: a holder, the pid view NVML's pids give, and whether the holder is named."""
    from pytest_kimiperf.server.pid_namespace import read_pid_view

    holder = _holder(512)
    try:
        held = gpu_memory.gpu_memory_by_pid()
        view = read_pid_view()
        print(json.dumps({"mode": view.mode, "holder": holder.pid, "named": holder.pid in held, "held": held,
                          "note": (view.note or "")[:120]}), flush=True)
    finally:
        holder.kill()
        holder.wait()


def steps() -> dict[str, tuple[Step, int, bool]]:
    """Every step with its time limit in seconds and whether it needs torch to see a GPU, in the
    order the shell runs them: what tells most first. The limits add up to 330 s, so a rerun of
    what failed fits the same 10-minute command (tests/unit/test_bare_check.py checks)."""
    from ci import gpu_bare_steps as more
    from ci.gpu_bare_preflight import step_preflight

    return {
        "preflight": (step_preflight, 20, False), "runtime": (step_runtime, 10, False), "smi": (step_smi, 30, False),
        "nvml": (step_nvml, 25, False), "load-window": (more.step_load_window, 50, True),
        "canary": (step_canary, 25, True), "gpu-memory": (step_gpu_memory, 25, True),
        "server": (more.step_server, 55, True), "nccl": (more.step_nccl, 25, True), "ipc": (more.step_ipc, 15, True),
        "pid-ns": (step_pid_ns, 20, True), "unit-tests": (more.step_unit_tests, more.UNIT_TESTS_LIMIT_S, False),
    }


def main(argv: Sequence[str]) -> int:
    """--plan, one step, or the pid-namespace probe (run inside unshare)."""
    STEPS = steps()
    if argv[:1] == ["--plan"]:
        print("\n".join(f"{name} {limit} {'gpu' if gpu_only else 'any'}" for name, (_, limit, gpu_only) in STEPS.items()))
        return 0
    if argv[:1] == ["pid-ns-probe"]:
        pid_ns_probe()
        return 0
    name, workdir = argv[0], Path(argv[1])
    if name not in STEPS:
        print(f"check: FAIL {name}: no such step; steps: {', '.join(STEPS)}", flush=True)
        return 2
    try:
        verdict, text = STEPS[name][0](workdir / name)
    except Exception as error:  # noqa: BLE001  (one step's failure is its line, never the run's)
        traceback.print_exc()  # into the step's log, which the recordings carry
        verdict, text = "FAIL", f"{type(error).__name__}: {error}"[:300]
    print(f"check: {verdict} {name}: {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
