"""ci/gpu-first-run.sh's checks end their servers when their time limit's SIGTERM arrives.

timeout(1) sends SIGTERM at a check's limit; Python's default action ends the process at once,
without its finally blocks, while the server, in a session of its own, runs on holding its GPUs.
The checks' manager (ci/gpu_first_run.py manager_for) turns SIGTERM into an exit through the
teardown: tried here on the stub server, which needs no GPU.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT, STUB_SERVER, gone

SESSION = f"""
import sys, time
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, {str(ROOT)!r})
from ci.gpu_first_run import manager_for
from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES

stub = replace(TINY_CPU, name="stub", model="stub-model", served_model_name="stub-model", weight_cache="off",
               health_deadline_s=30.0, command=(sys.executable, {str(STUB_SERVER)!r}, "--model", "{{served_model_name}}",
               "--host", "{{host}}", "--port", "{{port}}", "--load-seconds", "0"))
out = Path(sys.argv[1])
manager = manager_for(stub, out, out, nccl_debug=False)
try:
    print(manager.acquire(BUILTIN_PROFILES["default"]).pid, flush=True)
    time.sleep(600)
finally:
    manager.close()
"""


def test_a_check_cut_off_by_its_limit_stops_its_server(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", SESSION, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                          cwd=ROOT) as check:
        assert check.stdout is not None
        server = int(check.stdout.readline())
        assert not gone(server)
        check.send_signal(signal.SIGTERM)  # what timeout(1) sends at the limit
        assert check.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while not gone(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(server), f"the server (pid {server}) outlived its check"
