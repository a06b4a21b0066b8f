"""ci/gpu-lent.sh's orphan maker: boots the deployment, writes who its processes are to
$LENT_FAMILY, and waits to be killed with its launcher and API server (ci/gpu_lent.py orphan)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil

from pytest_kimiperf.server.process import ServerHandle


def test_hold_the_server(kimiperf_server: ServerHandle) -> None:
    """Say the server's processes, then wait for SIGKILL."""
    assert kimiperf_server.pid is not None
    server = psutil.Process(kimiperf_server.pid)
    family = {"pytest": os.getpid(), "launcher": server.ppid(), "server": server.pid,
              "engine": [child.pid for child in server.children()]}
    Path(os.environ["LENT_FAMILY"]).write_text(json.dumps(family))
    time.sleep(600)
