"""The launch marker in a real engine's children: a `kill -9` of launcher, API server and pytest
together leaves vLLM's EngineCore and its worker orphaned, and the next run's sweep must still prove it ours.

vLLM renames EngineCore and its workers with setproctitle (utils/system_utils.py:194), which without
SPT_NOENV writes over /proc/PID/environ (py-setproctitle src/spt_status.c:204-230); the plugin
starts every server with SPT_NOENV=1 (server/process.py). One real boot of tiny-cpu.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import stub_deployment_toml

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


def test_an_engine_orphaned_by_a_kill_of_every_launch_process_is_still_found_by_its_marker(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    orphans_file = tmp_path / "orphans.json"
    monkeypatch.setenv("ORPHANS_FILE", str(orphans_file))
    pytester.makepyfile(test_kill=KILL_EVERYTHING)
    killed = pytester.runpytest_subprocess("--deployment", "tiny-cpu", "-p", "no:cacheprovider", timeout=900)
    assert killed.ret == -signal.SIGKILL
    seen = json.loads(orphans_file.read_text())
    engine = seen["engine"]
    try:
        names = [name for _, name, _, _ in engine]
        assert names[0] == "VLLM::EngineCore" and all(n.startswith("VLLM::") for n in names), engine
        # Renamed, and its environment still carries the launch's marker.
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
    finally:
        for pid, *_ in engine:  # never leave a real engine on a shared machine
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
