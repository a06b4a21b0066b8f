#!/usr/bin/env bash
# What the plugin needs on a lent GPU machine beyond its image, installed into .bare-deps
# (git-ignored) for the device command to carry (ci/gpu-bare-check.sh and ci/gpu-lent.sh put it
# on PYTHONPATH). The image (Python 3.12, torch, numpy, scipy, httpx, pytest, pytest-xdist,
# filelock, psutil, nvidia-ml-py) lacks pytest-benchmark (with py-cpuinfo2) and prometheus_client
# from pyproject's dependencies; those are pure Python, so the folder is under 2 MB. Only what
# the image lacks: PYTHONPATH comes before site-packages, so a carried copy would shadow the
# image's own. matplotlib is not carried: with its stack it installs to 107 MB (matplotlib 35,
# fontTools 36, pillow 22), over the 64 MiB that travel with a device command; where the image
# has no matplotlib, ci/gpu-lent.sh writes no plots and says so.
#
# Built for one CPython minor version (BARE_PYTHON_VERSION, default 3.12, the lent machines'),
# written into .bare-deps/BUILT_FOR: the bare check's preflight fails, naming both, on another.
#
#   ci/gpu-bare-deps.sh [PIP_ARGS...]   # e.g. --index-url ...; the versions: ci/gpu-bare-deps.txt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${BARE_PYTHON_VERSION:-3.12}
TAG=cp${VERSION/./}
rm -rf .bare-deps
"$PY" -m pip install -q --target .bare-deps --no-deps --no-compile --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp --python-version "$VERSION" --abi "$TAG" --abi abi3 --abi none \
  -r ci/gpu-bare-deps.txt "$@"
find .bare-deps -name '__pycache__' -prune -exec rm -rf {} +
echo "$TAG" > .bare-deps/BUILT_FOR
du -sh .bare-deps
