#!/usr/bin/env bash
# The plugin's tests that run the real client against a real or stub server, run N times beside
# a CPU hog on every core: a test whose outcome a loaded host can change fails here, not first on
# a newcomer's CI (issue 64). Prints each failure (test id and its first error line) as it comes,
# then the count; exits 1 on any failure.
#
#   scripts/stress_suite.sh [N] [FILE...]
#
# N: runs (default 20). FILE...: the test files (default: every file under tests/unit and
# tests/plugin that starts a stub, paced or TLS server; tests/real_engine boots vLLM and is left
# out unless named). PY: the interpreter (default $VENV/bin/python, VENV=.venv, as the Makefile);
# PYTEST_ARGS: more pytest arguments (e.g. "-n 4 --dist worksteal", as `make test`);
# HOGS: busy processes (default one per core); LOGS: where each run's output is kept.
set -uo pipefail

cd "$(dirname "$0")/.."
runs=20
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    runs=$1
    shift
fi
PY=${PY:-${VENV:-.venv}/bin/python}
HOGS=${HOGS:-$(nproc)}
LOGS=${LOGS:-$(mktemp -d -t kimiperf-stress.XXXXXX)}
mkdir -p "$LOGS"
read -r -a extra <<<"${PYTEST_ARGS:-}"

if [[ $# -gt 0 ]]; then
    files=("$@")
else
    # What starts a server the client measures: tests/helpers.py's stub and paced servers, the
    # TLS gateway in front of one, and the stub_project fixture that boots the stub deployment.
    mapfile -t files < <(grep -lE 'stub_project|stub_deployment_toml|running_stub|STUB_SERVER|PACED_SERVER|paced_server|TLS_GATEWAY' \
        -r tests/unit tests/plugin --include='test_*.py' | sort)
fi
if [[ ${#files[@]} -eq 0 ]]; then
    echo "stress_suite: no test files" >&2
    exit 2
fi

hogs=()
stop_hogs() {
    for pid in "${hogs[@]}"; do
        kill "$pid" 2>/dev/null
    done
    wait "${hogs[@]}" 2>/dev/null
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM
for _ in $(seq "$HOGS"); do
    "$PY" -c 'while True: pass' &
    hogs+=($!)
done

echo "stress_suite: $runs runs of ${#files[@]} files beside $HOGS CPU hogs on $(nproc) cores; logs in $LOGS"
failures=0
failed_runs=0
start=$SECONDS
for run in $(seq "$runs"); do
    log=$LOGS/run-$run.log
    began=$SECONDS
    # -rfE: one short line per failure and error, "FAILED id - first line of the error", wide
    # enough to keep the line. Only the last summary counts: a pytester test prints its inner
    # run's summary into the output of a failure.
    COLUMNS=400 "$PY" -m pytest -p no:cacheprovider -q -rfE "${extra[@]}" "${files[@]}" >"$log" 2>&1
    status=$?
    failed=$(awk '/short test summary info/ {n = NR} {line[NR] = $0} END {for (i = n + 1; n && i <= NR; i++) print line[i]}' "$log" \
        | grep -E '^(FAILED|ERROR) ')
    found=$(grep -c . <<<"$failed")
    summary=$(grep -E '(passed|failed|errors?|skipped|no tests ran).* in [0-9.]+s' "$log" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
    echo "run $run/$runs: exit $status, $((SECONDS - began)) s: ${summary:-no summary line}"
    [[ -n $failed ]] && sed 's/^/    /' <<<"$failed"
    if [[ $status -ne 0 ]]; then
        failed_runs=$((failed_runs + 1))
        failures=$((failures + (found > 0 ? found : 1)))
        [[ $found -eq 0 ]] && tail -5 "$log" | sed 's/^/    /'
    fi
done
echo "stress_suite: $failures failures in $failed_runs of $runs runs, $((SECONDS - start)) s, beside $HOGS CPU hogs"
[[ $failures -eq 0 ]]
