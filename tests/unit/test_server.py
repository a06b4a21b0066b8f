"""ServerProcess pieces that need no server: what happens between the launch and its record."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from pytest_kimiperf.server.process import ServerProcess


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


def test_exit_during_boot_ends_the_wait_with_its_exit_code_not_the_deadline(tmp_path: Path) -> None:
    """A server that dies while loading is noticed at the wait's next poll: the error is its exit
    code and last words, long before the 600 s deadline. How soon, in seconds, is this host's
    scheduling, not a property to pin here (a bound of 2 s failed on a host at load 7.8)."""
    from pytest_kimiperf.errors import ServerError

    server = ServerProcess(
        argv=[sys.executable, "-c",
              "import sys, time; time.sleep(1.0); print('RuntimeError: simulated', flush=True); sys.exit(3)"],
        env={}, log_path=tmp_path / "server.log", state_dir=tmp_path / "state",
        base_url="http://127.0.0.1:9", served_model_name="m", deployment="d", profile="default",
        deadline_s=600,
    )
    server.start()
    with pytest.raises(ServerError, match=r"(?s)exited with code 3 .*RuntimeError: simulated") as caught:
        server.wait_ready()
    assert "not ready within" not in str(caught.value)


def test_a_failed_boot_quotes_the_last_ten_log_lines_and_the_logs_path(tmp_path: Path) -> None:
    from pytest_kimiperf.errors import ServerError

    log = tmp_path / "server.log"
    server = ServerProcess(
        argv=[sys.executable, "-c", "import sys\nfor i in range(1, 31): print(f'engine line {i}', flush=True)\nsys.exit(3)"],
        env={}, log_path=log, state_dir=tmp_path / "state", base_url="http://127.0.0.1:9",
        served_model_name="m", deployment="d", profile="default", deadline_s=600,
    )
    server.start()
    with pytest.raises(ServerError) as failed:
        server.wait_ready()
    head, _, quoted = str(failed.value).partition("\n")
    assert head.startswith("the d server (default) exited with code 3 ") and head.endswith(f"log: {log}"), head
    # The log's last 10 records: the engine's last 9 lines and the launcher's note of its exit.
    *engine, launcher = quoted.splitlines()
    assert engine == [f"engine line {i}" for i in range(22, 31)], quoted
    assert launcher.startswith("kimiperf launcher: the command ended with code 3"), quoted


def test_gpu_memory_held_by_sigkill_survivors_stops_a_gpu_launch(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from pytest_kimiperf.server import zombies as process_sweep
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8, TINY_CPU
    from pytest_kimiperf.errors import ServerError
    from pytest_kimiperf.server.manager import ServerManager

    stuck = process_sweep.ProcessSummary(pid=4242, name="VLLM::Worker_TP3", cmdline=())
    report = process_sweep.SweepReport(survivors=(stuck,), survivor_gpu_memory_mib={4242: 91_000})
    monkeypatch.setattr(process_sweep, "sweep_stale_launches", lambda *a, **kw: report)
    said: list[str] = []

    def manager(deployment: object) -> ServerManager:
        settings = SimpleNamespace(deployment=deployment, grace_s=1.0)
        return ServerManager(settings, log_dir=tmp_path, state_dir=tmp_path,  # type: ignore[arg-type]
                             announce=said.append, on_progress=lambda *a: None)

    with pytest.raises(ServerError, match=r"survived SIGKILL and still hold GPU memory: pid 4242 \(91000 MiB\)"):
        manager(KIMI_K25_INT4_TP8)._sweep()
    assert "kimiperf: zombie sweep: STILL RUNNING after SIGKILL: pid 4242 VLLM::Worker_TP3" in said
    manager(TINY_CPU)._sweep()  # no GPUs needed: reported, not fatal


def test_every_phase_the_log_passes_through_is_shown_however_one_read_holds_them(tmp_path: Path) -> None:
    # One write holds three phases (a late read on a busy host sees them at once): each is still
    # reported, in order, not only the furthest.
    from pytest_kimiperf.errors import ServerError

    lines = ["Initializing a V1 LLM engine", "Starting to load model m...", "Memory profiling takes 1 s"]
    server = ServerProcess(
        argv=[sys.executable, "-c", f"import sys, time; sys.stdout.write({chr(10).join(lines)!r} + '\\n'); "
                                    "sys.stdout.flush(); time.sleep(1.0); sys.exit(3)"],
        env={}, log_path=tmp_path / "server.log", state_dir=tmp_path / "state", base_url="http://127.0.0.1:9",
        served_model_name="m", deployment="d", profile="default", deadline_s=600,
    )
    server.start()
    shown: list[str] = []
    with pytest.raises(ServerError):
        server.wait_ready(lambda progress, elapsed, changed: shown.append(progress.phase) if changed else None)
    assert shown == ["initializing engine", "loading weights", "profiling"]
