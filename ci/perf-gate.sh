#!/usr/bin/env bash
# The perf gate, usable from any CI system.
#
#   ci/perf-gate.sh [extra pytest args...]
#
# Environment:
#   PERF_GATE_PROFILES   profiles to compare (default: default,ring-ll)
#   PERF_GATE_OUT        where reports, plots and server logs go (default: perf-results)
#   PERF_GATE_MAX_BOOTS  most boots per profile, boots on demand included (default: the
#                        deployment's max_boots); the workflow's job timeout is sized from it
#   KIMIPERF_DEPLOYMENT  the plugin's own variable: deployment (default: the suite's, kimi-k25-int4-tp8)
#   (PERF_GATE_* are this script's; the names KIMIPERF_PROFILES, KIMIPERF_OUT and
#   KIMIPERF_MAX_BOOTS they had are still read, with a line saying to rename them.)
#   PYTHON              interpreter with pytest-kimiperf installed (default: python3)
#
# Exit codes are pytest's, and one of the plugin's:
#   0 every perf test passed (no regression, floors met)
#   1 a perf test failed (regression, below floor, no baseline for this hardware, server died)
#     or errored (the deployment's GPUs are missing: each perf test errors, naming them, before
#     any boot)
#   2 interrupted (Ctrl-C, or SIGTERM from a cancelled job: the servers were stopped)
#   3 internal error
#   4 usage error (bad option, profile or policy)
#   5 no perf test was collected
#  75 every failure was an INVALID measurement (a busy host, a client-bound load): nothing was
#     learned about the build. This script reruns the gate once on its own; a second 75 is
#     returned for the CI system to retry on a quieter runner.
#  76 every failure was UNRESOLVED: a change beyond the tolerance on the one boot of an attached
#     server (--kimiperf-server-url) that the run cannot restart; give the deployment a restart_command.
set -uo pipefail
cd "$(dirname "$0")/.."
for old in KIMIPERF_PROFILES KIMIPERF_OUT KIMIPERF_MAX_BOOTS; do
  if [ -n "${!old:-}" ]; then
    echo "perf-gate: $old is deprecated (the plugin never read it): set PERF_GATE_${old#KIMIPERF_} instead" >&2
  fi
done
OUT=${PERF_GATE_OUT:-${KIMIPERF_OUT:-perf-results}}
PROFILES=${PERF_GATE_PROFILES:-${KIMIPERF_PROFILES:-default,ring-ll}}
MAX_BOOTS=${PERF_GATE_MAX_BOOTS:-${KIMIPERF_MAX_BOOTS:-}}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# A gate without a baseline to judge against must not pass: record one first (the
# workflow's "record baselines" job), review it, commit it.
args=(perf_tests --kimiperf-profile "$PROFILES" --kimiperf-gate
      --kimiperf-json "$OUT/report.json" --kimiperf-markdown "$OUT/summary.md" --kimiperf-plots "$OUT/plots"
      --junitxml "$OUT/junit.xml" --basetemp "$OUT/tmp" -p no:cacheprovider)
if [ -n "$MAX_BOOTS" ]; then
  args+=(--kimiperf-max-boots "$MAX_BOOTS")
fi
"$PY" -m pytest "${args[@]}" "$@"
status=$?
if [ "$status" -eq 75 ]; then
  # The first attempt's JUnit XML stays beside the second's for the record.
  mv "$OUT/junit.xml" "$OUT/junit-attempt1.xml" 2>/dev/null
  echo "perf-gate: every failure was an INVALID measurement (exit 75): rerunning the gate once"
  "$PY" -m pytest "${args[@]}" "$@"
  status=$?
fi
# Server logs live under the basetemp; keep them next to the reports for the artifact upload.
find "$OUT/tmp" -name 'server-*.log' -exec cp {} "$OUT/" \; 2>/dev/null
exit $status
