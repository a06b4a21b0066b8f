#!/usr/bin/env bash
# First contact with a GPU host: what the CPU machines cannot show, in one run of under 10
# minutes, on any lent NVIDIA machine (one GPU is enough; two or more also exercise NCCL across
# ranks). One line per check, "first-run: <check>: OK|FAIL|INFO <what was seen>"; exit 1 if a
# check failed. Issue 23's predictions, each checked where it can be:
#
#   vllm-contract   the installed vLLM writes the log lines and takes the flags we use (item 7)
#   nvml            the fingerprint as NVML reads it: GPUs, driver, CUDA, MIG mode (item 11)
#   counters        NVML's cumulative violation counters and energy over 5 s (item 5)
#   pid-namespace   whether NVML's pids are ours here, mapped, or unmappable (item 6)
#   boot            one vLLM boot of the tiny model at TP = min(2, GPUs) with --nccl-debug and
#                   the tree-ll profile (NCCL_ALGO=allreduce:Tree): boot account and progress
#                   (items 1, 9), NCCL's per-process debug files and its enabled matrix (item 4),
#                   SPT_NOENV keeping the launch marker in EngineCore and workers (item 10), and
#                   the sweep seeing the engine's GPU memory (item 6)
#   weight-cache    ci/gpu-weight-cache-check.sh on the unquantized tiny model (item 2)
#   nodes           issue 25: the node agent's facts through a launch template (an ssh stand-in:
#                   env -i, bash -c) carry NVML's GPUs; with 2+ whole GPUs, one boot of the tiny
#                   model at TP=2 across two loopback "nodes" (--nnodes 2, one GPU a node, NCCL
#                   between them) serves 16 tokens and is stopped with nothing left
#
#   ci/gpu-first-run.sh            # with PYTHON pointing at the GPU venv (ci/gpu-venv.sh)
#
# Environment:
#   PYTHON        interpreter with pytest-kimiperf and a CUDA vLLM 0.32 (default: python3)
#   KIMIPERF_OUT  where logs and NCCL debug files go (default: first-run)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${KIMIPERF_OUT:-first-run}
mkdir -p "$OUT"
rm -f "$OUT/whole-gpus"
status=0

if ! timeout 60 "$PY" -m pytest_kimiperf.server.vllm_contract > "$OUT/vllm-contract.txt" 2>&1; then
  status=1
fi
echo "first-run: vllm-contract: $(tail -1 "$OUT/vllm-contract.txt")"

timeout 270 "$PY" - "$OUT" <<'EOF' || status=1
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import psutil

out = Path(sys.argv[1])
failed = False


def line(check: str, verdict: str, text: str) -> None:
    global failed
    failed |= verdict == "FAIL"
    print(f"first-run: {check}: {verdict} {text}", flush=True)


from pytest_kimiperf.server.gpu import probe_gpus
from pytest_kimiperf.server.pid_namespace import read_pid_view

probe = probe_gpus(timeout_s=10.0)
if not probe.gpus:
    line("nvml", "FAIL", f"no GPU: {probe.absence_reason()}")
    sys.exit(1)
gpu0 = probe.gpus[0]
line("nvml", "OK" if probe.source == "NVML" else "FAIL",
     f"{len(probe.gpus)}x {gpu0.name} ({gpu0.memory_total_mib} MiB), driver {gpu0.driver_version}, "
     f"CUDA {gpu0.cuda_version}, PCIe gen {gpu0.pcie_gen} x{gpu0.pcie_width}, source {probe.source}, "
     f"MIG {sorted({str(g.mig_mode) for g in probe.gpus})}")
whole = [g for g in probe.gpus if not g.in_mig_mode]
if not whole:
    line("nvml", "FAIL", "every GPU is in MIG mode: no whole GPU to boot on")
    sys.exit(1)
(out / "whole-gpus").write_text(str(len(whole)))  # the weight-cache check runs only where there is one

import pynvml
from pytest_kimiperf.measure.host_readings import merge_gpu_samples, sample_gpu

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

from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
from pytest_kimiperf.reports.nccl_check import check_server_log
from pytest_kimiperf.server.gpu import gpu_memory_by_pid
from pytest_kimiperf.server.manager import ServerManager
from pytest_kimiperf.server.sweep import LAUNCH_ID_ENV

tp = min(2, len(whole))
deployment = replace(
    TINY_CPU, name="tiny-gpu", description="the tiny model on CUDA GPUs", gpu_count=tp, tensor_parallel_size=tp,
    command=("{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}",
             "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}",
             "--tensor-parallel-size", "{tp}", "--max-model-len", "2048", "--dtype", "bfloat16",
             "--gpu-memory-utilization", "0.5"),
    env=MappingProxyType({"HF_HUB_OFFLINE": "1"}), health_deadline_s=300.0, weight_cache="off")
settings = SimpleNamespace(deployment=deployment, external=False, port=None, nccl_debug=True, grace_s=30.0,
                           host_wait_s=60.0, api_key=None, command_plans={})
manager = ServerManager(settings, log_dir=out, state_dir=Path(tempfile.mkdtemp(prefix="kimiperf-first-run-")),
                        say=lambda _: None, on_progress=lambda *a: None)
profile = BUILTIN_PROFILES["tree-ll"]
try:
    handle = manager.acquire(profile)
    assert handle.pid is not None, "the server's handle names no pid"
    server = psutil.Process(handle.pid)
    family = [p for p in server.children(recursive=True) if p.name().startswith("VLLM::")]
    marked = {p.name(): p.environ().get(LAUNCH_ID_ENV) is not None for p in family}
    line("boot", "OK", f"TP={tp} ready after {handle.boot_s or 0:.0f} s; {manager.records[profile.name].accounts[0].summary()}")
    line("spt-noenv", "OK" if family and all(marked.values()) else "FAIL", f"launch marker in {marked}")
    held = gpu_memory_by_pid()
    ours = {p.pid for p in [server, *family]} & set(held)
    line("sweep-gpu-memory", "OK" if ours else "FAIL",
         f"NVML sees {len(held)} process(es) holding memory, {len(ours)} of them this boot's: "
         f"{ {pid: held[pid] for pid in sorted(ours)} } MiB")
    manager.release()
finally:
    manager.close()
rec = manager.records[profile.name]
check = check_server_log(profile.name, profile.env, rec.log_path, cpu_engine=False)
statuses = {v.variable: v.message for v in check.variables}
nccl_ok = tp > 1 and all(v.status == "applied" for v in check.variables) and any("was used" in n for n in check.notes)
line("nccl-debug", "OK" if nccl_ok else ("INFO" if tp == 1 else "FAIL"),
     f"TP={tp}: {statuses}; notes: {list(check.notes)}"
     + ("; at TP=1 vLLM runs no NCCL collective, so NCCL may write nothing" if tp == 1 else ""))
sys.exit(1 if failed else 0)
EOF

if [ ! -s "$OUT/whole-gpus" ]; then
  echo "first-run: weight-cache: FAIL not run: no whole GPU (see the nvml line)"
  exit 1
fi
if KIMIPERF_OUT="$OUT/weight-cache" CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHON="$PY" \
    timeout 270 ci/gpu-weight-cache-check.sh > "$OUT/weight-cache.txt" 2>&1; then
  echo "first-run: weight-cache: $(tail -1 "$OUT/weight-cache.txt")"
else
  status=1
  echo "first-run: weight-cache: FAIL $(tail -4 "$OUT/weight-cache.txt" | tr '\n' ' ' | cut -c1-400)"
fi
timeout 240 "$PY" - "$OUT" "$(cat "$OUT/whole-gpus")" <<'EOF' || status=1
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import httpx
import psutil

from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
from pytest_kimiperf.config.nodes import Node
from pytest_kimiperf.judge.node_fingerprint import agent_facts
from pytest_kimiperf.server.manager import ServerManager

out, whole = Path(sys.argv[1]), int(sys.argv[2])
stand_in = ("env", "-i", f"HOME={os.environ.get('HOME', '/tmp')}", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
            "bash", "-c", "{command}")
hard, _ = agent_facts(Node("far", "127.0.0.1", launch=stand_in))
ok = int(hard.get("gpu.count", "0")) >= 1
print(f"first-run: nodes: {'OK' if ok else 'FAIL'} node agent facts through a template: gpu.count "
      f"{hard.get('gpu.count')}, gpu.name {hard.get('gpu.name')}", flush=True)
if whole < 2 or len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",") if d.strip()]) < 2:
    print("first-run: nodes: INFO one whole GPU: the two-node boot needs one GPU a node (NCCL refuses two "
          "ranks on one device)")
    sys.exit(0 if ok else 1)
# One GPU a node, from the runner's own restriction where it sets one.
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",") if d.strip()][:2]
nodes = tuple(Node(f"n{i}", "127.0.0.1", env=MappingProxyType({"CUDA_VISIBLE_DEVICES": d}))
              for i, d in enumerate(visible))
deployment = replace(
    TINY_CPU, name="tiny-gpu-2node", description="the tiny model across two loopback GPU nodes", gpu_count=1,
    tensor_parallel_size=2, nodes=nodes,
    command=("{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}",
             "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}",
             "--tensor-parallel-size", "{tp}", "--max-model-len", "2048", "--dtype", "bfloat16",
             "--gpu-memory-utilization", "0.5"),
    env=MappingProxyType({"HF_HUB_OFFLINE": "1"}), health_deadline_s=200.0, weight_cache="off")
settings = SimpleNamespace(deployment=deployment, external=False, port=None, nccl_debug=False, grace_s=30.0,
                           host_wait_s=60.0, api_key=None, command_plans={})
manager = ServerManager(settings, log_dir=out / "nodes", state_dir=Path(tempfile.mkdtemp(prefix="kimiperf-nodes-")),
                        say=lambda _: None, on_progress=lambda *a: None)
try:
    handle = manager.acquire(BUILTIN_PROFILES["default"])
    reply = httpx.post(f"{handle.base_url}/v1/completions", timeout=60,
                       json={"model": handle.model, "prompt": "hello", "max_tokens": 16}).json()
    tokens = reply.get("usage", {}).get("completion_tokens")
    roots = [psutil.Process(p) for p in (handle.pid, *handle.node_pids) if p is not None]
    pids = [p.pid for root in roots for p in (root, *root.children(recursive=True))]  # workers included
    manager.release()
finally:
    manager.close()
left = [p for p in pids if p is not None and psutil.pid_exists(p)]
ok = tokens == 16 and not left and handle.nodes == ("n0", "n1")
print(f"first-run: nodes: {'OK' if ok else 'FAIL'} TP=2 across 2 loopback nodes ready after {handle.boot_s or 0:.0f} s, "
      f"{tokens} tokens served, left running: {left}; logs: {out / 'nodes'}")
sys.exit(0 if ok else 1)
EOF
exit $status
