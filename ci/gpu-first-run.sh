#!/usr/bin/env bash
# First contact with a GPU host: what the CPU machines cannot show, in one run of under 10
# minutes, on any lent NVIDIA machine with the GPU engine (ci/gpu-venv.sh); one GPU is enough, two
# or more also exercise NCCL across ranks and two nodes. One line per check,
# "first-run: <check>: OK|FAIL|INFO <what was seen>"; exit 1 if a check failed. The checks
# (ci/gpu_first_run.py runs each in its own process):
#
#   vllm-contract     the installed vLLM writes the log lines and takes the flags we use
#   facts             nvml (the fingerprint as NVML reads it: GPUs, driver, CUDA, MIG mode),
#                     counters (violation counters and energy over 5 s), pid-namespace
#   sweep-gpu-memory  a process holding GPU memory is named, and freed after SIGKILL (no vLLM)
#   boot              one vLLM boot of the tiny model at TP = min(2, GPUs) with --kimiperf-nccl-debug and
#                     tree-ll: boot account, spt-noenv (the launch marker in EngineCore and
#                     workers), the sweep seeing the engine's memory, nccl-debug (NCCL's
#                     per-process debug files, read even after a failed boot)
#   weight-cache      ci/gpu-weight-cache-check.sh on the unquantized tiny model
#   nodes             the node agent's facts through a launch template; with 2+ whole GPUs one
#                     boot at TP=2 across two loopback nodes, stopped with nothing left
#
# Each check has a time limit of at least its boot deadline plus teardown; at the limit it gets
# SIGTERM, which stops its server through the plugin's teardown, and SIGKILL 30 s later. All
# servers share one state directory, so whatever a killed check left is swept by the next boot.
# A check whose limit no longer fits the budget is not started, and says so; the last line is a
# SKIP= list of the checks that passed, for a rerun of the rest.
#
#   ci/gpu-first-run.sh            # with PYTHON pointing at the GPU venv (ci/gpu-venv.sh)
#
# Environment:
#   PYTHON             interpreter with pytest-kimiperf and a CUDA vLLM 0.32 (default: python3)
#   FIRST_RUN_OUT       where logs and NCCL debug files go (default: first-run)
#   SKIP               checks not to run (comma- or space-separated)
#   FIRST_RUN_BUDGET_S the whole run's budget in seconds (default: 570, inside a 10-minute command)
#   BOOT_DEADLINE_S    each boot's health deadline (default: 150; the tiny model boots in 1-2 min)
#   FIRST_RUN_QUICK_LIMIT_S  the limit of each check that boots nothing (default: 45; vLLM's
#                      import takes 10-30 s on an idle host)
#   FIRST_RUN_VLLM     the vllm command (default: {python} -m vllm.entrypoints.cli.main), and
#   FIRST_RUN_HOLDER   the command that holds GPU memory and prints "ready" (default:
#                      ci/gpu_bare_load.py hold): `make test` runs this script to its end on the
#                      simulated GPU with stand-ins for both (tests/plugin/test_ci_gpu_scripts.py)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${FIRST_RUN_OUT:-first-run}
BUDGET=${FIRST_RUN_BUDGET_S:-570}
DEADLINE=${BOOT_DEADLINE_S:-150}
QUICK=${FIRST_RUN_QUICK_LIMIT_S:-45}
KILL_GRACE_S=30
# Teardown after a boot's deadline: SIGTERM, the manager's 20 s grace, the GPU-memory wait.
TEARDOWN_S=60
mkdir -p "$OUT"
# The facts check writes how many whole GPUs there are; a rerun that skips it keeps the last count.
[[ " ${SKIP:+${SKIP//,/ }} " == *" facts "* ]] || rm -f "$OUT/whole-gpus"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
skip=" ${SKIP:+${SKIP//,/ }} "
passed=()
status=0

check() {  # check NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 rc left
  shift 2
  if [[ "$skip" == *" $name "* ]]; then
    echo "first-run: $name: INFO skipped (SKIP)"
    passed+=("$name")
    return
  fi
  left=$((BUDGET - SECONDS))
  if ((left < limit + KILL_GRACE_S)); then
    echo "first-run: $name: INFO not run: ${left} s of the ${BUDGET} s budget left, it may take $((limit + KILL_GRACE_S)) s"
    return
  fi
  timeout -k "$KILL_GRACE_S" "$limit" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  grep '^first-run: ' "$OUT/$name.txt"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "first-run: $name: FAIL cut off after $limit s (log: $OUT/$name.txt)"
  elif [ "$rc" -ne 0 ] && ! grep -q "^first-run: " "$OUT/$name.txt"; then
    echo "first-run: $name: FAIL exited with $rc: $(tail -1 "$OUT/$name.txt" | cut -c1-300)"
  fi
  if [ "$rc" -eq 0 ]; then passed+=("$name"); else status=1; fi
}

contract() {
  "$PY" ci/vllm_contract.py > "$OUT/vllm-contract.log" 2>&1
  local rc=$?
  echo "first-run: vllm-contract: $(tail -1 "$OUT/vllm-contract.log")"
  return $rc
}

weight_cache() {
  if [ ! -s "$OUT/whole-gpus" ]; then
    echo "first-run: weight-cache: FAIL not run: no whole GPU (see the nvml line)"
    return 1
  fi
  WEIGHT_CACHE_OUT="$OUT/weight-cache" KIMIPERF_STATE_DIR="$OUT/state" WEIGHT_CACHE_BOOT_DEADLINE_S="$DEADLINE" \
    WEIGHT_CACHE_VLLM="${FIRST_RUN_VLLM:-}" \
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} PYTHON="$PY" ci/gpu-weight-cache-check.sh > "$OUT/weight-cache.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "first-run: weight-cache: $(tail -1 "$OUT/weight-cache.log")"
  else
    echo "first-run: weight-cache: FAIL $(tail -4 "$OUT/weight-cache.log" | tr '\n' ' ' | cut -c1-400)"
  fi
  return $rc
}

export -f contract weight_cache
export PY OUT DEADLINE
check vllm-contract "$QUICK" bash -c contract
check facts "$QUICK" "$PY" ci/gpu_first_run.py facts "$OUT"
check sweep-gpu-memory "$QUICK" "$PY" ci/gpu_first_run.py sweep-gpu-memory "$OUT"
check boot $((DEADLINE + TEARDOWN_S)) "$PY" ci/gpu_first_run.py boot "$OUT" "$DEADLINE"
# The daemon and two engine boots, each under the deadline.
check weight-cache $((3 * DEADLINE + TEARDOWN_S)) bash -c weight_cache
check nodes $((DEADLINE + TEARDOWN_S)) "$PY" ci/gpu_first_run.py nodes "$OUT" "$DEADLINE"
echo "SKIP=$(IFS=,; echo "${passed[*]:-}")"
exit $status
