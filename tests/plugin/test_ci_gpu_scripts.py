"""Every GPU script in ci/ runs to its end in `make test`, on the simulated GPU (tests/fakes/simgpu)
with stand-ins where a real GPU's software is missing here: a script that has never run is a stub.
What each proves only on a real GPU is said in ci/README.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, STUB_PRELOAD, STUB_SERVER

pytestmark = pytest.mark.usefixtures("isolated_state")


def stand_in_vllm(directory: Path) -> Path:
    """A ``vllm`` executable: ``serve`` runs the stub engine, ``preload`` the stand-in daemons."""
    exe = directory / "vllm"
    directory.mkdir(parents=True, exist_ok=True)
    exe.write_text(
        "#!/bin/sh\n"
        "cmd=$1; shift\n"
        f'if [ "$cmd" = serve ]; then model=$1; shift; exec {sys.executable} {STUB_SERVER} --model "$model" '
        '--load-seconds 0.2 "$@"; fi\n'
        f'exec {sys.executable} {STUB_PRELOAD} "$@"\n')
    exe.chmod(0o755)
    return exe


def test_the_weight_cache_check_runs_to_its_end(simulated_gpus, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "WEIGHT_CACHE_OUT": str(tmp_path / "out"),
           "WEIGHT_CACHE_VLLM": str(stand_in_vllm(tmp_path / "bin")), "WEIGHT_CACHE_BOOT_DEADLINE_S": "60"}
    done = subprocess.run(["bash", "ci/gpu-weight-cache-check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: both engines mapped their weights from the daemon; nothing left running" in done.stdout
    assert "second boot (ring-ll): weight phase" in done.stdout
