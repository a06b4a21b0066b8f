"""ServerProcess pieces that need no server: what happens between the launch and its record."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from pytest_kimiperf.server import ServerProcess


def test_launch_whose_record_cannot_be_written_is_stopped_not_leaked(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state folder should be")
    server = ServerProcess(
        argv=[sys.executable, "-c", "import time; time.sleep(120)"],
        env={},
        log_path=tmp_path / "server.log",
        state_dir=blocker,
        base_url="http://127.0.0.1:9",
        served_model_name="m",
        deployment="d",
        profile="default",
        deadline_s=10,
    )
    with pytest.raises(OSError):
        server.start()
    assert server.popen is not None
    assert server.popen.returncode is not None, "the launched process was left running"
    assert not psutil.pid_exists(server.popen.pid)
    assert server.record is None
