#!/usr/bin/env bash
# The GPU runner's environment: the pinned engine (ci/gpu-constraints.txt) in a virtualenv kept
# outside the workspace (checkout's clean wipes the workspace), created once per change of the
# constraints or pyproject.toml (their hash names it); the plugin itself is reinstalled from
# this checkout on every run, without touching the engine. Then the installed vLLM is checked
# against the log lines and flags the plugin was written for (ci/vllm_contract.py): a
# mismatch fails here, not an hour into a gate. In a GitHub job it sets PYTHON for the later
# steps (ci/perf-gate.sh reads it).
#
# The virtualenv is built where it stays: a venv's console scripts carry its absolute path in
# their shebang, so one built elsewhere and moved has scripts that point at a folder that is
# gone. A marker written after the last install step says it is complete; a folder without it
# (an install that was interrupted or failed) is removed and built again.
#
#   ci/gpu-venv.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
KEY=$(cat ci/gpu-constraints.txt pyproject.toml | sha256sum | cut -c1-16)
VENV=${1:-${RUNNER_TOOL_CACHE:-$HOME/.cache}/kimiperf-venv-$KEY}
DONE="$VENV/.kimiperf-venv-complete"
PY=${PYTHON:-python3}
if [ ! -f "$DONE" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q '.[gpu,plots,dev]' -c ci/gpu-constraints.txt
  touch "$DONE"
fi
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall . -c ci/gpu-constraints.txt
"$VENV/bin/python" -m pip check
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
print("gpu-venv: vllm", md.version("vllm"), "torch", md.version("torch"), "pytest-kimiperf",
      md.version("pytest-kimiperf"))
PY
"$VENV/bin/python" ci/vllm_contract.py
if [ -n "${GITHUB_ENV:-}" ]; then
  echo "PYTHON=$VENV/bin/python" >> "$GITHUB_ENV"
fi
