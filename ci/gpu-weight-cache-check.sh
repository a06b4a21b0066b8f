#!/usr/bin/env bash
# The weight cache on a real GPU: what the CPU tests can only check with a stand-in daemon.
#
#   ci/gpu-weight-cache-check.sh
#
# On one CUDA GPU, through the plugin's own server manager: the tiny model at TP=1, its
# `vllm preload` daemon started once, then two engine boots with different NCCL profiles
# (default, ring-ll), both with --load-format ipc_cache. Prints each boot's account and the
# second boot's weight phase; fails unless both engines mapped their weights from the daemon
# and nothing of the daemon or engines is left running. About 3-5 minutes on one GPU.
#
# Environment:
#   PYTHON        interpreter with pytest-kimiperf and a CUDA vLLM 0.32 (default: python3)
#   WEIGHT_CACHE_OUT  where the server logs go (default: weight-cache-check)
#   CUDA_VISIBLE_DEVICES  the GPU to use (default: 0)
#   WEIGHT_CACHE_BOOT_DEADLINE_S  each boot's health deadline (default: 900)
#   KIMIPERF_STATE_DIR    the servers' state directory (default: a new one), shared with the
#                         caller's other checks so a server one of them left is swept here
#
# SIGTERM stops the daemons and engines through the manager's teardown before exiting.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${WEIGHT_CACHE_OUT:-weight-cache-check}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
mkdir -p "$OUT"
exec "$PY" - "$OUT" <<'EOF'
import os
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace

import psutil

from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.server.manager import ServerManager

out = Path(sys.argv[1])
deployment = replace(
    TINY_CPU, name="tiny-gpu", description="the tiny model on one CUDA GPU", gpu_count=1,
    command=("{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}",
             "--served-model-name", "{served_model_name}", "--host", "{host}", "--port", "{port}",
             "--tensor-parallel-size", "{tp}", "--max-model-len", "2048", "--dtype", "bfloat16",
             "--gpu-memory-utilization", "0.5"),
    env=MappingProxyType({"HF_HUB_OFFLINE": "1"}),
    health_deadline_s=float(os.environ.get("WEIGHT_CACHE_BOOT_DEADLINE_S", "900")), weight_cache="auto")
settings = SimpleNamespace(deployment=deployment, external=False, port=None, nccl_debug=False,
                           grace_s=30.0, host_wait_s=3600.0, api_key=None, command_plans={})
state = os.environ.get("KIMIPERF_STATE_DIR") or tempfile.mkdtemp(prefix="kimiperf-wc-state-")
manager = ServerManager(settings, log_dir=out, state_dir=Path(state), say=print, on_progress=lambda *a: None)


def on_term(signum, _frame):
    # The manager absorbs a signal during a stop; otherwise leave through the finally below.
    if not manager.on_signal():
        raise SystemExit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
profiles = [NcclProfile("default", "NCCL's own choices", {}),
            NcclProfile("ring-ll", "Ring/LL", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"})]
try:
    for profile in profiles:
        manager.acquire(profile)
        manager.release()
finally:
    manager.close()

plan = manager.weight_cache
accounts = [manager.records[p.name].accounts[0] for p in profiles]
for account in accounts:
    print(account.summary())
    print("  phases:", ", ".join(f"{p.phase} {p.seconds:.0f} s" for p in account.phases))
    print("  environments:", {k: sorted(v) for k, v in account.environments.items()})
problems = []
if plan is None or not plan.enabled:
    problems.append(f"the weight cache was not used: {plan.header_line() if plan else 'no plan'}")
problems += [f"boot of {a.profile} loaded its weights from {a.weights_source}, not the weight cache"
             for a in accounts if a.weights_source != "weight cache"]
left = [p for p in psutil.process_iter(["cmdline"]) if "vllm.entrypoints.cli.main" in " ".join(p.info["cmdline"] or [])]
problems += [f"left running: pid {p.pid}" for p in left]
print(f"second boot ({accounts[1].profile}): weight phase {accounts[1].phase_s('loading weights') or 0:.1f} s "
      f"of {accounts[1].total_s:.0f} s")
if problems:
    print("FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print("OK: both engines mapped their weights from the daemon; nothing left running")
EOF
