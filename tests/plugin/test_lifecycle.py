"""Server lifecycle faults that a real vLLM cannot show on cue, with the stub server.

Each test here would fail without the handling it names: deadline, fast failure on early
death, death during the session, visible progress, busy port, attach mode, Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import STUB_SERVER, gone, stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

USES_SERVER = """
def test_uses_server(kimiperf_server):
    assert kimiperf_server.base_url
"""


# The first test's stream breaks the stub (crash-stream: the process exits; dead-engine: it
# keeps running with /health at 503); the second needs a working server.
BREAK_IT_THEN_NEED_IT = """
import httpx, pytest

def test_a_breaks_it(kimiperf_server):
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", kimiperf_server.base_url + "/v1/completions",
                          json={"model": "stub-model", "max_tokens": 10, "stream": True}) as r:
            for _ in r.iter_bytes():
                pass

def test_b_needs_it(perf):
    pass
"""


def _stub_pids(boots: Path) -> list[int]:
    if not boots.exists():
        return []
    return [int(line.split()[0]) for line in boots.read_text().splitlines() if line.strip()]


def _assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 5
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if not gone(p)]
        time.sleep(0.1)
    assert not alive, f"server processes left behind: {alive}"


def test_hang_at_boot_is_stopped_at_the_deadline_with_phase_and_log_tail(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="hang", boot_count=boots, health_deadline_s=3))
    pytester.makepyfile(USES_SERVER)
    result = pytester.runpytest_subprocess("--deployment", "stub", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*was not ready within 3s; stuck while initializing engine*it was stopped*",
        "*Initializing a V1 LLM engine*",  # the log tail is in the error
    ])
    _assert_gone(_stub_pids(boots))


def test_crash_during_boot_fails_within_seconds_with_exit_code(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="crash-boot", boot_count=boots, health_deadline_s=600,
                                      load_seconds=1.0))
    pytester.makepyfile(USES_SERVER)
    # Noticed, not waited out: the 600 s deadline lies far past the run's 120 s timeout, which
    # would raise instead of returning this outcome.
    result = pytester.runpytest_subprocess("--deployment", "stub", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*exited with code 3 while loading weights*; log: *server-stub-default.log",
        "*RuntimeError: simulated crash while loading shard 5*",
    ])
    # The log's last 10 lines, once: not again as the error's cause, nor as a report section.
    out = result.stdout.str()
    after = out[out.index("exited with code 3"):].splitlines()
    assert after[9] == "RuntimeError: simulated crash while loading shard 5", after[:12]
    assert after[10].startswith("kimiperf launcher: the command ended") and after[11].startswith("="), after[:12]
    # Before the short summary, which pytest leaves untruncated under CI=true and then repeats.
    body = out.split("short test summary info")[0]
    assert body.count("RuntimeError: simulated crash while loading shard 5") == 1, out


def test_death_mid_session_errors_later_tests_and_next_profile_gets_a_fresh_server(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="crash-stream", boot_count=boots))
    pytester.makepyfile(BREAK_IT_THEN_NEED_IT)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1",
                                           "-p", "no:randomly", timeout=120)
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*died during the session (exit code 7)*", "*simulated engine crash*"])
    assert len(_stub_pids(boots)) == 2, "the second profile did not get its own server"
    _assert_gone(_stub_pids(boots))


def test_server_that_runs_but_stopped_serving_errors_later_tests(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="dead-engine", boot_count=boots))
    pytester.makepyfile(BREAK_IT_THEN_NEED_IT)
    result = pytester.runpytest_subprocess("--deployment", "stub", "-p", "no:randomly", timeout=120)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*stub server (default) still runs but stopped serving: /health answered 503; log: *",
        "*EngineCore encountered a fatal error (simulated)*",
    ])
    _assert_gone(_stub_pids(boots))


def test_slow_load_shows_vllm_progress_lines(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml(load_seconds=2.0))
    pytester.makepyfile(USES_SERVER)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-progress-interval", "0.5",
                                           timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*kimiperf [[]default[]] loading weights *% (*/8)*elapsed*",
        "*kimiperf [[]default[]] ready*",
        "*server (default) ready after*",
    ])


def test_fixed_port_in_use_fails_before_the_boot(pytester: pytest.Pytester, stub_project,
                                                 tmp_path: Path) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile(USES_SERVER)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-port", str(port),
                                               timeout=60)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*port {port} on 127.0.0.1 is already in use*"])
    assert not boots.exists(), "the server was launched although its port was taken"


def test_attach_mode_measures_a_running_server_without_boot_or_teardown(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml())
    port = _free_port()
    external = subprocess.Popen(
        [sys.executable, str(STUB_SERVER), "--model", "stub-model", "--port", str(port),
         "--boot-count", str(boots)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(port)
        pytester.makepyfile("""
            def test_external(kimiperf_server):
                assert kimiperf_server.external
                assert kimiperf_server.log_path is None
        """)
        result = pytester.runpytest_subprocess(
            "--deployment", "stub", "--kimiperf-server-url", f"http://127.0.0.1:{port}", "--nccl-profile", "ring-ll",
            timeout=60,
        )
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["kimiperf: profile ring-ll: only a label for the attached server*"
                                     "not known here)"])
        assert len(_stub_pids(boots)) == 1, "attach mode booted a server of its own"
        assert external.poll() is None, "attach mode stopped a server it did not start"
    finally:
        external.kill()
        external.wait()


def test_attach_mode_errors_later_tests_once_the_server_stops_serving(
    pytester: pytest.Pytester, stub_project
) -> None:
    stub_project(stub_deployment_toml())
    port = _free_port()
    external = subprocess.Popen(
        [sys.executable, str(STUB_SERVER), "--model", "stub-model", "--port", str(port),
         "--mode", "dead-engine"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(port)
        pytester.makepyfile(BREAK_IT_THEN_NEED_IT)
        result = pytester.runpytest_subprocess(
            "--deployment", "stub", "--kimiperf-server-url", f"http://127.0.0.1:{port}", "-p", "no:randomly",
            timeout=60,
        )
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines([f"*--kimiperf-server-url http://127.0.0.1:{port} stopped serving: "
                                     "/health answered 503*"])
    finally:
        external.kill()
        external.wait()


def test_attach_mode_with_two_profiles_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kimiperf-server-url", "http://127.0.0.1:9", "--nccl-profile", "default,ring-ll")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*give at most one --kimiperf-profile as its label*"])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=["ctrl-c", "sigterm", "sighup"])
def test_signal_during_boot_stops_the_server_before_pytest_exits(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, signum: int
) -> None:
    """Ctrl-C, SIGTERM from a cancelled CI job, or SIGHUP from a dropped ssh session, during a
    (hanging) boot: nothing is left."""
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="hang", boot_count=boots, health_deadline_s=600))
    pytester.makepyfile(USES_SERVER)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--deployment", "stub", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    _wait_for(lambda: _stub_pids(boots), 30)
    time.sleep(0.5)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out.decode()
    _assert_gone(_stub_pids(boots))


def test_orphans_of_a_killed_run_are_swept_before_the_next_launch(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    """pytest SIGKILLed mid-session leaves server and workers; the next run ends exactly them."""
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="spawn-children", boot_count=boots))
    pytester.makepyfile("""
        import time
        def test_hold(kimiperf_server):
            print("READY", flush=True)
            time.sleep(600)
    """)
    first = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--deployment", "stub", "-s", "-p", "no:cacheprovider"],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    assert first.stdout is not None
    for line in first.stdout:
        if b"READY" in line:
            break
    server_pid = _stub_pids(boots)[0]
    family = [server_pid] + [c.pid for c in psutil.Process(server_pid).children(recursive=True)]
    assert len(family) == 3
    first.kill()  # SIGKILL: no teardown runs
    first.wait()
    first.stdout.close()
    psutil.Process(server_pid).kill()  # the API server dies too; its workers are orphaned
    # The launcher ends them within seconds (its watchdog pipe closed with pytest); the next
    # run's sweep is the backstop and forgets the stale record either way.
    orphans = family[1:]
    decoy = subprocess.Popen([sys.executable, str(STUB_SERVER), "--model", "decoy", "--port", "1",
                              "--mode", "hang"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pytester.makepyfile(USES_SERVER)
        result = pytester.runpytest_subprocess("--deployment", "stub", timeout=120)
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["*zombie sweep: ended stale launch*"])
        _assert_gone(orphans)
        assert decoy.poll() is None, "the sweep ended a process it did not start"
    finally:
        decoy.kill()
        decoy.wait()
    _assert_gone(_stub_pids(boots))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_http(port: int) -> None:
    import httpx

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    _wait_for(ready, 30)


def _wait_for(check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


HOLD_SERVER = """
import os, time
def test_hold(kimiperf_server):
    print("READY", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def _start_holding(pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None
                   ) -> subprocess.Popen[bytes]:
    """A pytest session that boots the stub and holds it; returns once the server is ready."""
    import os

    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--deployment", "stub", "-s", "-p", "no:cacheprovider",
         "-p", "no:randomly", *args],
        cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if b"READY" in line:
            return proc
    proc.wait()
    raise AssertionError("the holding session ended before its server was ready")


def _family(pid: int) -> list[int]:
    return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]


def test_a_second_signal_during_teardown_escalates_to_sigkill_instead_of_abandoning_the_stop(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    """GitHub Actions' cancel: SIGINT, then SIGTERM while the server (slow to stop: it ignores
    SIGTERM) is in its 60 s grace. The stop is cut short with SIGKILL, never abandoned."""
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="ignore-sigterm", boot_count=boots))
    pytester.makepyfile(HOLD_SERVER)
    proc = _start_holding(pytester, "--kimiperf-grace", "60", env={"RELEASE_FILE": str(tmp_path / "never")})
    assert proc.stdout is not None
    server = _stub_pids(boots)[0]
    proc.send_signal(signal.SIGINT)
    for line in proc.stdout:
        if b"kimiperf: stopping the stub server" in line:
            break
    time.sleep(0.3)
    assert not gone(server), "the stub stopped on SIGTERM; this test needs one that ignores it"
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read().decode()
    proc.wait(timeout=30)
    proc.stdout.close()
    # The line below is said only where the second signal cut the grace short; a grace waited
    # out ends in the grace's own words.
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, rest
    assert ("a second signal during teardown: every process of the stub server (default) got SIGKILL "
            "without waiting out the grace") in rest
    _assert_gone([server])


def test_server_stops_within_seconds_when_pytest_is_sigkilled(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    """pytest dies without teardown (SIGKILL, the OOM killer, pytest-timeout's os._exit): the
    launcher sees its watchdog pipe close and stops the server and its children."""
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(mode="spawn-children", boot_count=boots))
    pytester.makepyfile(HOLD_SERVER)
    proc = _start_holding(pytester, "--kimiperf-grace", "2", env={"RELEASE_FILE": str(tmp_path / "never")})
    family = _family(_stub_pids(boots)[0])
    assert len(family) == 3
    proc.kill()
    killed = time.monotonic()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()
    alive = family
    while alive and time.monotonic() - killed < 10:
        alive = [p for p in alive if not gone(p)]
        time.sleep(0.02)
    took = time.monotonic() - killed
    assert not alive, f"still running {took:.1f}s after pytest was SIGKILLed: {alive}"
    print(f"server and children gone {took:.2f}s after pytest's SIGKILL")


def test_a_second_session_waits_for_the_first_naming_it_then_boots(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    """Two sessions on one host never boot side by side: the second says who holds the host,
    fails once its bounded wait runs out, and boots as soon as the first is done."""
    boots = tmp_path / "boots"
    release = tmp_path / "release"
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile(HOLD_SERVER)
    first = _start_holding(pytester, env={"RELEASE_FILE": str(release)})
    assert first.stdout is not None
    try:
        impatient = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-host-wait", "1",
                                                  "-p", "no:randomly", timeout=60)
        assert impatient.parseoutcomes().get("errors") == 1
        impatient.stdout.fnmatch_lines([
            f"*waiting for another pytest session on this host to finish with its servers: pid {first.pid} "
            "(*pytest --deployment stub*), holding the host for *",
            f"*another pytest session on this host is using it for its servers: pid {first.pid}*",
        ])
        assert len(_stub_pids(boots)) == 1, "the second session booted beside the first"
        patient = subprocess.Popen(
            [sys.executable, "-m", "pytest", "--deployment", "stub", "-s", "-p", "no:cacheprovider",
             "-p", "no:randomly", "--kimiperf-host-wait", "60"],
            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "RELEASE_FILE": str(release)},
        )
        assert patient.stdout is not None
        seen = b""
        for line in patient.stdout:  # its start-up takes seconds: release only once it waits
            seen += line
            if b"waiting for another pytest session" in line:
                break
        assert first.poll() is None and len(_stub_pids(boots)) == 1
        release.touch()
        out = seen + patient.stdout.read()
        patient.wait(timeout=60)
        patient.stdout.close()
        assert patient.returncode == 0, out.decode()
        assert b"waiting for another pytest session" in out and b"the host is free after" in out, out.decode()
    finally:
        release.touch()
        first.wait(timeout=60)
        first.stdout.close()
    _assert_gone(_stub_pids(boots))
