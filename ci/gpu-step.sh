# The step runner of ci/gpu-bare-check.sh and ci/gpu-lent.sh (sourced by both): a step is one
# command cut at its time limit, whose output says in one line how it went. Sourced from the
# checkout's top, it puts the checkout on PYTHONPATH, then what the lent machine's image lacks
# (.bare-deps, built by ci/gpu-bare-deps.sh) after it, so that it shadows none of the image's.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .bare-deps ]; then
  export PYTHONPATH="$PYTHONPATH:$PWD/.bare-deps"
fi
KILL_GRACE_S=5
# The steps SKIP names (comma- or space-separated), the steps that passed, the exit status.
skip=" ${SKIP:+${SKIP//,/ }} "
passed=()
status=0

# run_step PREFIX NAME LIMIT_S LOG COMMAND...: run COMMAND with its output in LOG, SIGTERM at
# LIMIT_S and SIGKILL KILL_GRACE_S later, and print the step's line: the first line of LOG that
# begins with "PREFIX: ", else a FAIL line saying the step was cut off (then CUT_OFF_NOTE) or how
# it exited.
run_step() {
  local prefix=$1 name=$2 limit=$3 log=$4
  shift 4
  timeout -k "$KILL_GRACE_S" "$limit" "$@" > "$log" 2>&1
  local rc=$? line
  line=$(grep -m1 "^$prefix: " "$log")
  if [ -n "$line" ]; then
    echo "$line"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "$prefix: FAIL $name: cut off after ${limit} s${CUT_OFF_NOTE:-}"
  else
    echo "$prefix: FAIL $name: exited with $rc: $(tail -1 "$log" | cut -c1-300)"
  fi
}
