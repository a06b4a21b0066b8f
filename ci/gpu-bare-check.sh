#!/usr/bin/env bash
# Every GPU path of the plugin, run for real through its own code on one GPU, without vLLM and
# without network, in about 330 s: a preflight of the machine (python, torch with its CUDA and
# NCCL, the driver and its CUDA, each GPU's capability, persistence and MIG, the container's GPU
# variables), the runtime, nvidia-smi and NVML as the plugin reads them, the canary, a load
# window (idle, GEMM, HBM copy, GEMV, idle) under the host watch with `nvidia-smi dmon` beside
# it, the GPU-memory sweep, PID namespaces, NCCL's debug files under two profiles, CUDA IPC, the
# real ServerManager with a stand-in server holding GPU memory, and the GPU-relevant unit tests.
# The steps are listed, with their time limits, by `python ci/gpu_bare_check.py --plan`; each is
# independent and prints one line
#
#   check: OK|FAIL|INFO <step>: <what was seen>
#
# Where the preflight finds that torch sees no GPU, it says so in its one FAIL line and the
# steps that need a GPU are not started (one INFO line each). After every step all recordings so
# far are packed into $OUT/recordings.tgz, so a run cut off still returns what it had;
# $OUT/checks.txt holds the check lines. The last line names the steps that passed (or were
# skipped) as a SKIP= list: a rerun with it runs only the rest, within the same 10-minute command.
#
# What the steps import beyond the lent machine's image would travel in .bare-deps, built here by
# ci/gpu-bare-deps.sh (for one CPython minor version, which the preflight checks) and put on
# PYTHONPATH when present. PYTHONPATH comes before site-packages, so only what the image lacks is
# carried: as read on 2026-12-07 (ci/gpu-image-packages.txt) that is nothing, and no .bare-deps is
# built. Where numpy is missing the canary takes the GPU copy only. scipy is needed by no step.
#
#   ci/gpu-bare-check.sh                          # on the device (ci/README.md: the command)
#   SKIP=runtime,smi ci/gpu-bare-check.sh         # leave steps out (comma- or space-separated)
#
# Environment:
#   PYTHON            interpreter (default: python3)
#   OUT               where checks.txt and recordings.tgz go (default: bare-check)
#   SKIP              steps not to run
#   BARE_BUDGET_S     the whole run's time budget in seconds (default: 330); a step whose limit
#                     does not fit in what is left is not started, and says so
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/gpu-step.sh
PY=${PYTHON:-python3}
OUT=${OUT:-bare-check}
BUDGET=${BARE_BUDGET_S:-330}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kimiperf-bare.XXXXXX")
: > "$OUT/checks.txt"

say() {
  echo "$1" | tee -a "$OUT/checks.txt"
}

pack() {
  # Written aside and moved: a run cut off mid-pack still leaves the previous archive whole.
  tar -czf "$OUT/recordings.tgz.part" -C "$WORK" . 2>/dev/null && mv -f "$OUT/recordings.tgz.part" "$OUT/recordings.tgz"
}

if ! plan=$(timeout 30 "$PY" ci/gpu_bare_check.py --plan 2>&1); then
  say "check: FAIL plan: $(echo "$plan" | tail -1)"
  exit 1
fi
while read -r step limit needs; do
  if [[ "$skip" == *" $step "* ]]; then
    say "check: INFO $step: skipped (SKIP)"
    passed+=("$step")
    continue
  fi
  if [ "$needs" = gpu ] && [ -f "$WORK/preflight.blocked" ]; then
    say "check: INFO $step: not run: $(head -1 "$WORK/preflight.blocked")"
    continue
  fi
  left=$((BUDGET - SECONDS))
  if ((left < limit + KILL_GRACE_S)); then
    say "check: INFO $step: not run: ${left} s of the ${BUDGET} s budget left, it may take ${limit} s"
    continue
  fi
  line=$(run_step check "$step" "$limit" "$WORK/$step.log" "$PY" ci/gpu_bare_check.py "$step" "$WORK")
  say "$line"
  case "$line" in
    "check: FAIL "*) status=1 ;;
    *) passed+=("$step") ;;
  esac
  pack
done <<< "$plan"
pack
echo "SKIP=$(IFS=,; echo "${passed[*]:-}")" | tee -a "$OUT/checks.txt"
rm -rf "$WORK"
exit $status
