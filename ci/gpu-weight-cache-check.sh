#!/usr/bin/env bash
# The weight cache on a real GPU: what the CPU tests can only check with a stand-in daemon.
#
#   ci/gpu-weight-cache-check.sh
#
# On one CUDA GPU, through the plugin's own server manager (ci/gpu_weight_cache_check.py): the
# tiny model at TP=1, its `vllm preload` daemon started once, then two engine boots with
# different NCCL profiles (default, ring-ll), both with --load-format ipc_cache. Prints each
# boot's account and the second boot's weight phase; fails unless both engines mapped their
# weights from the daemon and nothing of the daemon or engines is left running. About 3-5
# minutes on one GPU. `make test` runs it to its end on the simulated GPU with a stand-in vllm
# (tests/unit/test_ci_gpu_scripts.py).
#
# Environment:
#   PYTHON        interpreter with pytest-kimiperf and a CUDA vLLM 0.32 (default: python3)
#   WEIGHT_CACHE_OUT  where the server logs go (default: weight-cache-check)
#   CUDA_VISIBLE_DEVICES  the GPU to use (default: 0)
#   WEIGHT_CACHE_BOOT_DEADLINE_S  each boot's health deadline (default: 900)
#   WEIGHT_CACHE_VLLM  the vllm command (default: {python} -m vllm.entrypoints.cli.main)
#   KIMIPERF_STATE_DIR    the servers' state directory (default: a new one), shared with the
#                         caller's other checks so a server one of them left is swept here
#
# SIGTERM stops the daemons and engines through the manager's teardown before exiting.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${WEIGHT_CACHE_OUT:-weight-cache-check}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
exec "$PY" ci/gpu_weight_cache_check.py "$OUT"
