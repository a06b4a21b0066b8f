#!/usr/bin/env bash
# What the bare GPU check imports beyond the lent machine's torch and nvidia-ml-py, installed
# into .bare-deps (git-ignored) for the device command to carry: psutil (one cp36-abi3 wheel,
# any CPython 3.6+ on x86_64 Linux), httpx with httpcore, h11, anyio, sniffio, idna, certifi,
# and pytest with pluggy, iniconfig, packaging, pygments (pure Python), plus the backports older Pythons
# need (exceptiongroup, tomli, typing_extensions). Not numpy (a wheel per Python version) and not
# scipy (no step needs it). The folder's size is printed: it must stay under the 64 MiB that
# travel with a device command.
#
#   ci/gpu-bare-deps.sh [PIP_ARGS...]   # e.g. --index-url ...; the versions: ci/gpu-bare-deps.txt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf .bare-deps
"$PY" -m pip install -q --target .bare-deps --no-deps --only-binary=:all: \
  --platform manylinux2014_x86_64 --implementation cp --python-version 3.10 --abi abi3 --abi none \
  -r ci/gpu-bare-deps.txt "$@"
find .bare-deps -name '__pycache__' -prune -exec rm -rf {} +
du -sh .bare-deps
