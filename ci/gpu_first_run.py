"""The checks of ci/gpu-first-run.sh, one process each (the shell gives each its own time limit):

  python ci/gpu_first_run.py facts OUT                 NVML fingerprint and MIG, counters, pid namespace
  python ci/gpu_first_run.py sweep-gpu-memory OUT      a process holding GPU memory, seen and freed
  python ci/gpu_first_run.py boot OUT DEADLINE_S       one vLLM boot of the tiny model with --kimiperf-nccl-debug
  python ci/gpu_first_run.py nodes OUT DEADLINE_S      the node agent, and a boot across two loopback nodes

Each prints ``first-run: <check>: OK|FAIL|INFO <what was seen>`` lines and exits 1 if one failed.
Every server is started with OUT/state as its state directory, so a server a check left behind
(its process killed past its limit) is swept by the next check's first boot. SIGTERM (the shell's
time limit) becomes an exit through ``finally``, so the server is stopped, not orphaned.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
failed = False


def line(check: str, verdict: str, text: str) -> None:
    """One check's line; a FAIL makes the process exit 1."""
    global failed
    failed |= verdict == "FAIL"
    print(f"first-run: {check}: {verdict} {text}", flush=True)


# The engine: CUDA vLLM by default; `make test` runs this script to its end on the simulated GPU
# with a stand-in `vllm` (tests/plugin/test_ci_gpu_scripts.py), and a stand-in holder of GPU memory.
VLLM = tuple(os.environ.get("FIRST_RUN_VLLM", "").split()) or ("{python}", "-m", "vllm.entrypoints.cli.main")
HOLDER = tuple(os.environ.get("FIRST_RUN_HOLDER", "").split()) or (sys.executable, str(ROOT / "ci" / "gpu_bare_load.py"),
                                                                    "hold", "--mib", "1024")


def tiny_gpu(deadline_s: float, **changes: Any) -> Any:
    """The tiny model on CUDA GPUs, booted through vLLM with the given boot deadline."""
    from pytest_kimiperf.config.deployments import TINY_CPU

    return replace(
        TINY_CPU, name="tiny-gpu", description="the tiny model on CUDA GPUs",
        command=(*VLLM, "serve", "{model}",
                 "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}",
                 "--tensor-parallel-size", "{tp}", "--max-model-len", "2048", "--dtype", "bfloat16",
                 "--gpu-memory-utilization", "0.5"),
        env=MappingProxyType({"HF_HUB_OFFLINE": "1"}), health_deadline_s=deadline_s, weight_cache="off", **changes)


def manager_for(deployment: Any, out: Path, logs: Path, *, nccl_debug: bool) -> Any:
    """A ServerManager on OUT/state, and SIGTERM turned into an exit that runs its teardown."""
    from pytest_kimiperf.config.options import script_settings
    from pytest_kimiperf.server.manager import ServerManager

    settings = replace(script_settings("tiny-cpu", rootpath=ROOT, source="ci/gpu-first-run.sh", grace="20",
                                       host_wait="30"), deployment=deployment, nccl_debug=nccl_debug)
    manager = ServerManager(settings, log_dir=logs, state_dir=out / "state", announce=lambda _: None,
                            on_progress=lambda *a: None)

    def on_term(signum: int, _frame: object) -> None:
        # As the plugin does (session.py): the manager absorbs a signal during a stop; otherwise
        # leave through the finally blocks, which stop the server.
        if not manager.on_signal():
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    return manager


def facts(out: Path) -> None:
    """NVML's fingerprint and MIG, the violation counters over 5 s idle, the pid namespace."""
    from pytest_kimiperf.measure.hostwatch import merge_gpu_samples, sample_gpu
    from pytest_kimiperf.server.gpu import probe_gpus
    from pytest_kimiperf.server.pid_namespace import read_pid_view

    probe = probe_gpus(timeout_s=10.0)
    if not probe.gpus:
        line("nvml", "FAIL", f"no GPU: {probe.absence_reason()}")
        return
    gpu0 = probe.gpus[0]
    line("nvml", "OK" if probe.source == "NVML" else "FAIL",
         f"{len(probe.gpus)}x {gpu0.name} ({gpu0.memory_total_mib} MiB), driver {gpu0.driver_version}, "
         f"CUDA {gpu0.cuda_version}, PCIe gen {gpu0.pcie_gen} x{gpu0.pcie_width}, source {probe.source}, "
         f"MIG {sorted({str(g.mig_mode) for g in probe.gpus})}")
    whole = [g for g in probe.gpus if not g.in_mig_mode]
    if not whole:
        line("nvml", "FAIL", "every GPU is in MIG mode: no whole GPU to boot on")
        return
    (out / "whole-gpus").write_text(str(len(whole)))
    import pynvml

    pynvml.nvmlInit()
    try:
        started_us = int(time.time() * 1e6)
        first = sample_gpu(pynvml, whole[0].index)
        time.sleep(5)
        window = merge_gpu_samples([first, sample_gpu(pynvml, whole[0].index, since_us=started_us)], own_pids=())
    finally:
        pynvml.nvmlShutdown()
    counters = {"power_violation_ms": window.power_violation_ms, "thermal_violation_ms": window.thermal_violation_ms,
                "energy_j": window.energy_j, "sm_clock_samples_median_mhz": window.sm_clock_under_load_mhz}
    line("counters", "OK" if None not in counters.values() else "INFO",
         f"GPU {whole[0].index} over 5 s idle: {counters}; totals since driver load: "
         f"power {first.power_violation_ms} ms, thermal {first.thermal_violation_ms} ms, {first.energy_j} J")
    view = read_pid_view()
    line("pid-namespace", "FAIL" if view.mode == "unmappable" else "OK", f"{view.mode}; {view.note or 'host namespace'}")


def sweep_gpu_memory(out: Path) -> None:
    """What the zombie sweep rests on, without vLLM: a process holding GPU memory is named, and
    its memory is free after SIGKILL (ci/gpu_bare_load.py holds it)."""
    import subprocess

    from pytest_kimiperf.server.gpu_memory import describe_mib, gpu_memory_by_pid, wait_gpu_memory_freed

    holder = subprocess.Popen(list(HOLDER), stdout=subprocess.PIPE, text=True)
    try:
        ready = holder.stdout.readline() if holder.stdout else ""
        held = gpu_memory_by_pid() if ready.startswith("ready") else {}
    finally:
        holder.kill()
        holder.wait()
    started = time.monotonic()
    wait_gpu_memory_freed([holder.pid], deadline_s=30.0, poll_s=0.2)
    # Named is what the sweep rests on; NVML may name it without a figure (describe_mib says so).
    line("sweep-gpu-memory", "OK" if holder.pid in held and held[holder.pid] != 0 else "FAIL",
         f"pid {holder.pid} seen holding {describe_mib(held[holder.pid]) if holder.pid in held else 'nothing'} "
         f"({ready.strip() or 'holder did not start'}); "
         f"free {time.monotonic() - started:.1f} s after SIGKILL")


def boot(out: Path, deadline_s: float) -> None:
    """One boot at TP = min(2, GPUs) under tree-ll with --kimiperf-nccl-debug; each check after a failed
    boot still says what it can (the NCCL files of a failed boot are read all the same)."""
    import psutil

    from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
    from pytest_kimiperf.errors import KimiperfError
    from pytest_kimiperf.reports.nccl import check_server_log
    from pytest_kimiperf.server.gpu_memory import gpu_memory_by_pid
    from pytest_kimiperf.server.zombies import LAUNCH_ID_ENV

    if not (out / "whole-gpus").is_file():
        line("boot", "FAIL", "not run: no whole GPU (see the nvml line)")
        return
    tp = min(2, int((out / "whole-gpus").read_text()))
    manager = manager_for(tiny_gpu(deadline_s, gpu_count=tp, tensor_parallel_size=tp), out, out, nccl_debug=True)
    profile = BUILTIN_PROFILES["tree-ll"]
    try:
        handle = manager.acquire(profile)
        server = psutil.Process(handle.pid) if handle.pid is not None else None
        family = [p for p in server.children(recursive=True) if p.name().startswith("VLLM::")] if server else []
        marked = {p.name(): p.environ().get(LAUNCH_ID_ENV) is not None for p in family}
        line("boot", "OK", f"TP={tp} ready after {handle.boot_s or 0:.0f} s; "
             f"{manager.records[profile.name].accounts[0].summary()}")
        line("spt-noenv", "OK" if family and all(marked.values()) else "FAIL", f"launch marker in {marked}")
        held = gpu_memory_by_pid()
        ours = {p.pid for p in [*([server] if server else []), *family]} & set(held)
        line("sweep-gpu-memory-vllm", "OK" if ours else "FAIL",
             f"NVML sees {len(held)} process(es) holding memory, {len(ours)} of them this boot's")
        manager.release()
    except KimiperfError as error:
        line("boot", "FAIL", f"TP={tp}: {str(error)[:400]}")
        line("spt-noenv", "FAIL", "not checked: the boot failed")
    finally:
        manager.close()
    rec = manager.records.get(profile.name)
    check = check_server_log(profile.name, profile.env, rec.log_path if rec else None, cpu_engine=False)
    statuses = {v.variable: v.message for v in check.variables}
    nccl_ok = tp > 1 and all(v.status == "applied" for v in check.variables) and any("was used" in n for n in check.notes)
    line("nccl-debug", "OK" if nccl_ok else ("INFO" if tp == 1 else "FAIL"),
         f"TP={tp}: {statuses}; notes: {list(check.notes)}; error: {check.error}"
         + ("; at TP=1 vLLM runs no NCCL collective, so NCCL may write nothing" if tp == 1 else ""))


def nodes(out: Path, deadline_s: float) -> None:
    """The node agent's facts through a launch template; with 2+ whole GPUs, a two-node boot."""
    import httpx
    import psutil

    from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
    from pytest_kimiperf.config.nodes import Node
    from pytest_kimiperf.measure.host_facts import agent_facts

    whole = int((out / "whole-gpus").read_text()) if (out / "whole-gpus").is_file() else 0
    stand_in = ("env", "-i", f"HOME={os.environ.get('HOME', '/tmp')}", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
                "bash", "-c", "{command}")
    hard, _ = agent_facts(Node("far", "127.0.0.1", launch=stand_in))
    ok = int(hard.get("gpu.count", "0")) >= 1
    line("nodes", "OK" if ok else "FAIL", f"node agent facts through a template: gpu.count {hard.get('gpu.count')}, "
         f"gpu.name {hard.get('gpu.name')}, interconnect {hard.get('gpu.interconnect')}")
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",") if d.strip()][:2]
    if whole < 2 or len(visible) < 2:
        line("nodes", "INFO", f"{whole} whole GPU(s): the two-node boot needs one GPU a node (NCCL refuses two "
             "ranks on one device)")
        return
    node_list = tuple(Node(f"n{i}", "127.0.0.1", env=MappingProxyType({"CUDA_VISIBLE_DEVICES": d}))
                      for i, d in enumerate(visible))
    deployment = tiny_gpu(deadline_s, name="tiny-gpu-2node", gpu_count=1, tensor_parallel_size=2, nodes=node_list)
    manager = manager_for(deployment, out, out / "nodes", nccl_debug=False)
    pids: list[int] = []
    tokens = None
    try:
        handle = manager.acquire(BUILTIN_PROFILES["default"])
        reply = httpx.post(f"{handle.base_url}/v1/completions", timeout=60,
                           json={"model": handle.model, "prompt": "hello", "max_tokens": 16}).json()
        tokens = reply.get("usage", {}).get("completion_tokens")
        roots = [psutil.Process(p) for p in (handle.pid, *handle.node_pids) if p is not None]
        pids = [p.pid for root in roots for p in (root, *root.children(recursive=True))]
        manager.release()
    finally:
        manager.close()
    left = [p for p in pids if psutil.pid_exists(p)]
    line("nodes", "OK" if tokens == 16 and not left else "FAIL",
         f"TP=2 across 2 loopback nodes: {tokens} tokens served, left running: {left}")


def main(argv: list[str]) -> int:
    """Run one check (see the module docstring)."""
    check, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if check == "facts":
        facts(out)
    elif check == "sweep-gpu-memory":
        sweep_gpu_memory(out)
    elif check == "boot":
        boot(out, float(argv[2]))
    elif check == "nodes":
        nodes(out, float(argv[2]))
    else:
        raise SystemExit(f"unknown check {check!r}: use facts, sweep-gpu-memory, boot or nodes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
