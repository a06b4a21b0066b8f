#!/usr/bin/env bash
# What the plugin needs on a lent GPU machine beyond its image, installed into .bare-deps
# (git-ignored) for the device command to carry (ci/gpu-bare-check.sh and ci/gpu-lent.sh put it
# on PYTHONPATH). Only what the image lacks: PYTHONPATH comes before site-packages, so a carried
# copy would shadow the image's own. ci/gpu-bare-deps.txt lists it and ci/gpu-image-packages.txt
# the image's distributions; a requirement naming one of those stops this script, and an empty
# list (the case as read on 2026-12-07: the image holds every dependency) builds nothing and
# leaves no .bare-deps, so nothing is carried.
#
# Built for one CPython minor version (BARE_PYTHON_VERSION, default 3.12, the lent machines'),
# written into .bare-deps/BUILT_FOR: the bare check's preflight fails, naming both, on another.
#
#   ci/gpu-bare-deps.sh [PIP_ARGS...]   # e.g. --index-url ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERSION=${BARE_PYTHON_VERSION:-3.12}
TAG=cp${VERSION/./}
rm -rf .bare-deps
# pip's names, normalized (PEP 503): lower case, runs of -_. as one -.
normalized() { tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g'; }
wanted=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' ci/gpu-bare-deps.txt)
if [ -z "$wanted" ]; then
  echo "gpu-bare-deps: nothing to carry: ci/gpu-bare-deps.txt names nothing the image lacks (no .bare-deps)"
  exit 0
fi
names=$(echo "$wanted" | sed -E 's/[[:space:]]*[<>=!~;[].*//' | normalized | sort -u)
image=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' ci/gpu-image-packages.txt | normalized | sort -u)
shadowing=$(comm -12 <(echo "$names") <(echo "$image") | tr '\n' ' ')
if [ -n "$shadowing" ]; then
  echo "gpu-bare-deps: the image already has ${shadowing% }: a carried copy would shadow it (ci/gpu-image-packages.txt)" >&2
  exit 1
fi
"$PY" -m pip install -q --target .bare-deps --no-deps --no-compile --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp --python-version "$VERSION" --abi "$TAG" --abi abi3 --abi none \
  -r ci/gpu-bare-deps.txt "$@"
find .bare-deps -name '__pycache__' -prune -exec rm -rf {} +
echo "$TAG" > .bare-deps/BUILT_FOR
du -sh .bare-deps
