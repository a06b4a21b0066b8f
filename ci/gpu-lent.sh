#!/usr/bin/env bash
# The one prepared command for a lent GPU machine (one H100 or H200; Python 3.12 with torch and
# the image's packages, the plugin not installed, no vLLM, no network; 10 minutes a command,
# 64 MiB carried): the plugin end to end on tiny-gpu-torch first (a real CUDA orphan left by a
# SIGKILLed run and swept by the next, two profiles x two boots with NVML telemetry under real
# load, the JSON and Markdown reports and the plots), then the bare GPU check in what is left, all
# within LENT_BUDGET_S (330 s: ci/README.md has the plan, a warm SKIP= rerun included). One line a
# step, with its seconds:
#
#   lent: OK|FAIL|INFO <step> (<s> s): <what was seen>
#
# A step that would not fit in what is left of the budget is not started, and says so; one cut at
# its limit says so; each step's own output is kept. What comes back (at most 8 files): $OUT/lent.txt
# (the lines), report.json, report.md, plots.tgz, logs.tgz (every step's output, the server logs,
# pytest's), bare/checks.txt and bare/recordings.tgz. The exit code is 1 when a step failed.
#
# The last line is the rerun's: SKIP= the steps that passed, BARE_SKIP= the bare check's steps that
# passed (where the bare check as a whole did not). orphan, e2e and report are one unit there,
# skipped only together: report judges the orphan's sweep and e2e's output of the same run.
# preflight (the mode every step reads) and cleanup always run.
#
# Without a GPU (here, CI) DRY_RUN=1 runs every step on the CPU: lent-cpu (tiny-torch-cpu) stands
# in for tiny-gpu-torch and what needs NVML or CUDA says it was skipped. Without DRY_RUN, a
# machine whose torch sees no GPU is a FAIL, and the rest runs on the CPU all the same.
#
#   OUT=$OUT ci/gpu-lent.sh                # on the device: nothing carried (ci/README.md, the plan)
#   DRY_RUN=1 PYTEST_ADDOPTS="-p no:kimiperf" PYTHON=.venv/bin/python ci/gpu-lent.sh   # here, on the CPU,
#                                          # with the plugin's entry point blocked as on the device
#
# Step time estimates on the GPU machine: ci/README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
. ci/gpu-step.sh
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-lent}
BUDGET=${LENT_BUDGET_S:-330}
# Kept after the bare check for packing what comes back.
PACK_S=10
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kimiperf-lent.XXXXXX")
export PYTHONUNBUFFERED=1
: > "$OUT/lent.txt"

say() {
  echo "$1" | tee -a "$OUT/lent.txt"
}

# step NAME LIMIT_S [ARGS...]: ci/gpu_lent.py NAME, cut at LIMIT_S, its line with its seconds.
step() {
  local name=$1 limit=$2
  shift 2
  if [[ "$skip" == *" $name "* ]] && [ "$name" != preflight ] && [ "$name" != cleanup ]; then
    say "lent: INFO $name (0 s): skipped (SKIP)"
    passed+=("$name")
    return
  fi
  local left=$((BUDGET - SECONDS))
  if ((left < limit + KILL_GRACE_S)); then
    say "lent: INFO $name (0 s): not run: ${left} s of the ${BUDGET} s budget left, it may take ${limit} s"
    status=1
    return
  fi
  local started=$SECONDS line
  line=$(CUT_OFF_NOTE="; its output so far: $name.log in logs.tgz" \
    run_step lent "$name" "$limit" "$WORK/$name.log" "$PY" ci/gpu_lent.py "$name" "$WORK" "$OUT" "$@")
  local took=$((SECONDS - started))
  say "${line/ $name: / $name ($took s): }"
  case "$line" in
    "lent: FAIL "*) status=1 ;;
    # The bare check passes for a rerun only where every one of its steps ran and passed (OK).
    "lent: INFO bare-check"*) ;;
    *) passed+=("$name") ;;
  esac
}

# What matters most first: the plugin end to end on the GPU and the orphan it must sweep.
step preflight 30
step orphan 60
step e2e 150
step report 20
# Whatever is left of the budget: nothing this run started may outlive it, nor hold the GPU the
# bare check measures next.
budget=$BUDGET
BUDGET=$((SECONDS + 30 + KILL_GRACE_S + 10))
step cleanup 30
BUDGET=$budget
# The bare check in what is left; it skips (naming them) its steps that do not fit.
bare_s=$((BUDGET - SECONDS - PACK_S))
if ((bare_s < 30)) && [[ "$skip" != *" bare-check "* ]]; then
  say "lent: INFO bare-check (0 s): not run: $((BUDGET - SECONDS)) s of the ${BUDGET} s budget left, ${PACK_S} s of it kept for packing"
  status=1
else
  step bare-check "$bare_s" $((bare_s - 15))  # its own budget inside the limit: it ends its steps first
fi

# Pack what comes back: the plots, and every step's output with the server logs in one archive.
started=$SECONDS
if [ -d "$WORK/plots" ]; then
  tar -czf "$OUT/plots.tgz" -C "$WORK" plots
fi
(cd "$WORK" && { find . -maxdepth 1 -type f \( -name '*.log' -o -name '*.txt' -o -name '*.json' \)
  find . -path './pytest-*' -name 'server-*.log'; }) | tar -czf "$OUT/logs.tgz" -C "$WORK" -T -
say "lent: INFO pack ($((SECONDS - started)) s): $(cd "$OUT" && find . -type f ! -name lent.txt | sort | tr '\n' ' ')"
say "lent: $([ $status -eq 0 ] && echo OK || echo FAIL) all ($SECONDS s of the ${BUDGET} s budget)"
# The rerun's list: orphan, e2e and report only together (report judges the other two's run);
# preflight and cleanup run every time.
rerun=()
unit=0
for name in "${passed[@]}"; do
  case "$name" in orphan | e2e | report) unit=$((unit + 1)) ;; esac
done
for name in "${passed[@]}"; do
  case "$name" in
    preflight | cleanup) ;;
    orphan | e2e | report) ((unit == 3)) && rerun+=("$name") ;;
    *) rerun+=("$name") ;;
  esac
done
bare_rerun=""
if [[ " ${rerun[*]:-} " != *" bare-check "* ]] && [ -s "$WORK/bare-skip" ]; then
  bare_rerun=" BARE_SKIP=$(cat "$WORK/bare-skip")"
fi
say "SKIP=$(IFS=,; echo "${rerun[*]:-}")$bare_rerun"
# Leftovers of a failed step must not outlive the command: the sweep's own launch records.
rm -rf "$WORK"
exit $status
