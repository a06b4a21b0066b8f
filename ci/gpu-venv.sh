#!/usr/bin/env bash
# The GPU runner's environment: the pinned engine (ci/gpu-constraints.txt) in a virtualenv kept
# outside the workspace (checkout's clean wipes the workspace), created once per change of the
# constraints or pyproject.toml (their hash names it); the plugin itself is reinstalled from
# this checkout on every run, without touching the engine. In a GitHub job it sets PYTHON for
# the later steps (ci/perf-gate.sh reads it).
#
#   ci/gpu-venv.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
KEY=$(cat ci/gpu-constraints.txt pyproject.toml | sha256sum | cut -c1-16)
VENV=${1:-${RUNNER_TOOL_CACHE:-$HOME/.cache}/kimiperf-venv-$KEY}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV.tmp"
  "$VENV.tmp/bin/python" -m pip install -q --upgrade pip
  "$VENV.tmp/bin/python" -m pip install -q '.[gpu,plots,dev]' -c ci/gpu-constraints.txt
  mv "$VENV.tmp" "$VENV"
fi
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall . -c ci/gpu-constraints.txt
"$VENV/bin/python" -m pip check
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
print("gpu-venv: vllm", md.version("vllm"), "torch", md.version("torch"), "pytest-kimiperf",
      md.version("pytest-kimiperf"))
PY
if [ -n "${GITHUB_ENV:-}" ]; then
  echo "PYTHON=$VENV/bin/python" >> "$GITHUB_ENV"
fi
