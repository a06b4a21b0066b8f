"""The life of a real server's processes: orphans found by their launch marker, a Ctrl-C during
a real boot, a second signal during a real teardown. Three boots of tiny-cpu (one of them TP=2,
one cut short).

vLLM renames EngineCore and its workers with setproctitle (utils/system_utils.py:194), which without
SPT_NOENV writes over /proc/PID/environ (py-setproctitle src/spt_status.c:204-230); the plugin
starts every server with SPT_NOENV=1 (server/process.py). The mechanisms (the launcher ending what
a SIGKILLed API server left, the sweep, the escalation to SIGKILL) have their deterministic tests on
the stub (tests/plugin/test_lifecycle.py, tests/unit/test_zombies.py); these show them on vLLM's
own process tree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import STUB_SERVER, stub_deployment_toml
from tests.real_engine.conftest import vllm_processes

KILL_EVERYTHING = """
import json, os, signal, time, psutil

def test_kill_launcher_server_and_pytest_at_once(kimiperf_server):
    server = psutil.Process(kimiperf_server.pid)
    launcher = server.parent()
    engine = [p for p in server.children(recursive=True) if p.name().startswith("VLLM::")]
    with open(os.environ["ORPHANS_FILE"], "w") as fh:
        json.dump({"marker": server.environ().get("KIMIPERF_LAUNCH_ID"),
                   "engine": [[p.pid, p.name(), p.environ().get("KIMIPERF_LAUNCH_ID"),
                               p.environ().get("SPT_NOENV")] for p in engine]}, fh)
    launcher.kill()   # nobody is left to end the engine: not the launcher,
    server.kill()     # not the API server,
    os.kill(os.getpid(), signal.SIGKILL)   # not pytest
"""


def test_a_tp2_engine_orphaned_by_a_kill_of_every_launch_process_is_found_by_its_marker_and_swept_exactly(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_servers_before_and_after: None,
) -> None:
    orphans_file = tmp_path / "orphans.json"
    monkeypatch.setenv("ORPHANS_FILE", str(orphans_file))
    pytester.makepyfile(test_kill=KILL_EVERYTHING)
    killed = pytester.runpytest_subprocess("--deployment", "tiny-cpu-tp2", "-p", "no:cacheprovider", timeout=900)
    assert killed.ret == -signal.SIGKILL
    seen = json.loads(orphans_file.read_text())
    engine = seen["engine"]
    decoy = subprocess.Popen([sys.executable, str(STUB_SERVER), "--model", "decoy", "--port", "1",
                              "--mode", "hang"], stdout=subprocess.DEVNULL)
    try:
        names = sorted(name for _, name, _, _ in engine)
        assert names[0] == "VLLM::EngineCore" and sum(n.startswith("VLLM::Worker") for n in names) == 2, engine
        # Renamed, and their environment still carries the launch's marker.
        assert {(marker, noenv) for _, _, marker, noenv in engine} == {(seen["marker"], "1")}, engine
        time.sleep(2)
        assert all(psutil.pid_exists(pid) for pid, *_ in engine), "the engine did not outlive its launch"

        stub_project(stub_deployment_toml())
        (pytester.path / "test_kill.py").unlink()
        pytester.makepyfile(test_next="def test_next(kimiperf_server):\n    pass\n")
        nxt = pytester.runpytest_subprocess("--deployment", "stub", "-p", "no:cacheprovider", timeout=300)
        nxt.assert_outcomes(passed=1)
        nxt.stdout.fnmatch_lines(["*zombie sweep: ended stale launch*"])
        deadline = time.monotonic() + 10
        while any(psutil.pid_exists(pid) for pid, *_ in engine) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid, *_ in engine if psutil.pid_exists(pid)]
        assert decoy.poll() is None, "the sweep ended a process it did not start"
    finally:
        decoy.kill()
        decoy.wait()
        for pid, *_ in engine:  # never leave a real engine on a shared machine
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_ctrl_c_during_a_real_boot_stops_every_server_process(
    pytester: pytest.Pytester, isolated_state: Path, no_servers_before_and_after
) -> None:
    pytester.makepyfile(test_boot="def test_boot(kimiperf_server):\n    pass\n")
    engines_before = {p.pid for p in vllm_processes()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--deployment", "tiny-cpu", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy(),
    )
    # Wait until the engine core exists: the boot is well under way.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if any(p.name() == "VLLM::EngineCore" and p.pid not in engines_before for p in vllm_processes()):
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the server never got to its engine core")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()[-3000:]


def test_a_second_signal_during_a_real_teardown_sigkills_the_launch_and_leaves_nothing(
    pytester: pytest.Pytester, isolated_state: Path, no_servers_before_and_after
) -> None:
    """GitHub Actions' cancel on the real engine: SIGINT stops the session, and SIGTERM arrives
    while vLLM is shutting down. The stop escalates to SIGKILL and nothing is left."""
    pytester.makepyfile(test_hold="""
import time
def test_hold(kimiperf_server):
    print("READY", flush=True)
    time.sleep(600)
""")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--deployment", "tiny-cpu", "-s", "-p", "no:cacheprovider",
         "--kimiperf-grace", "60"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy(),
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for raw in proc.stdout:
        lines.append(raw.decode(errors="replace"))
        if "READY" in lines[-1]:
            break
    else:
        pytest.fail("the server never became ready:\n" + "".join(lines[-40:]))
    proc.send_signal(signal.SIGINT)
    for raw in proc.stdout:
        lines.append(raw.decode(errors="replace"))
        if "kimiperf: stopping the tiny-cpu server" in lines[-1]:
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read().decode(errors="replace")
    proc.wait(timeout=60)
    proc.stdout.close()
    out = "".join(lines) + rest
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert ("a second signal during teardown: every process of the tiny-cpu server (default) got SIGKILL "
            "without waiting out the grace") in out
    assert "survived SIGKILL" not in out
