"""Attaching to a running server: the served model from /v1/models, and restarts between boots.

``restart_server`` runs against injected command, health and readiness fakes here (every way a
restart can go wrong, in milliseconds); tests/real_engine/test_attach_cpu.py restarts a real tiny-cpu
server, and tests/plugin/test_attach.py a stub one through the plugin.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server.attach import restart_server, served_model

FAKES = Path(__file__).resolve().parents[1] / "fakes"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _run(returncode: int = 0, stderr: str = "") -> object:
    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        kwargs["stdout"].write(stderr)  # type: ignore[attr-defined]  # the command's output goes to a file
        return subprocess.CompletedProcess(argv, returncode)
    return run


def _restart(*, health: object, ready: object, run: object = None, deadline_s: float = 10.0,
             clock: Clock | None = None) -> object:
    clock = clock or Clock()
    return restart_server(["systemctl", "restart", "vllm"], base_url="http://127.0.0.1:9", model="m", headers={},
                          deadline_s=deadline_s, run=run or _run(), health=health, ready=ready,  # type: ignore[arg-type]
                          clock=clock, sleep=clock.sleep)


def test_a_restart_waits_for_the_server_to_go_down_and_serve_again() -> None:
    answers: Iterator[str | None] = iter([None, None, "/health not answering", None])  # up, up, down, up
    ready: Iterator[str | None] = iter(["/v1/models answered 503", "/v1/models answered 503", None])
    restart = _restart(health=lambda *a: next(answers, None), ready=lambda *a: next(ready))
    assert restart.ready_s >= restart.command_s >= 0  # type: ignore[attr-defined]


def test_a_command_that_leaves_the_old_server_answering_is_no_restart() -> None:
    # kubectl rollout restart returns at once; a rolling update never stops answering.
    with pytest.raises(ServerError, match=r"restart_command systemctl restart vllm returned, but "
                       r"http://127.0.0.1:9 never stopped answering /health within 10 s: the same server process "
                       r"would be measured as another boot"):
        _restart(health=lambda *a: None, ready=lambda *a: None)


@pytest.mark.parametrize("run, message", [
    (_run(returncode=5, stderr="Failed to restart vllm.service: Unit vllm.service not found."),
     r"restart_command systemctl restart vllm exited 5: Failed to restart vllm.service: Unit vllm.service not found."),
])
def test_a_failing_command_says_what_it_said(run: object, message: str) -> None:
    with pytest.raises(ServerError, match=message):
        _restart(health=lambda *a: "down", ready=lambda *a: None, run=run)


def test_a_command_that_is_not_installed_or_hangs_is_named() -> None:
    def missing(argv: list[str], **kwargs: object) -> object:
        raise FileNotFoundError(argv[0])

    def hangs(argv: list[str], **kwargs: object) -> object:
        raise subprocess.TimeoutExpired(argv, float(kwargs["timeout"]))  # type: ignore[arg-type]

    with pytest.raises(ServerError, match=r"'systemctl' was not found"):
        _restart(health=lambda *a: "down", ready=lambda *a: None, run=missing)
    with pytest.raises(ServerError, match=r"did not return within health_deadline_s = 10 s"):
        _restart(health=lambda *a: "down", ready=lambda *a: None, run=hangs)


def test_a_server_that_does_not_come_back_within_the_deadline_says_why() -> None:
    with pytest.raises(ServerError, match=r"did not serve 'm' again within health_deadline_s = 10 s after "
                       r"restart_command systemctl restart vllm: /v1/models answered 503"):
        _restart(health=lambda *a: "down", ready=lambda *a: "/v1/models answered 503")


# -- the served model ---------------------------------------------------------------------------


@contextlib.contextmanager
def _serve_models(ids: list[str]) -> Iterator[str]:
    """A server whose /v1/models lists ``ids``; yields its URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("ids, expected", [
    (["my-model"], "my-model"),
    (["a", "b"], "--kimiperf-server-url .* serves 'a', 'b'; deployment mine names none: set served_model_name in its table"),
    ([], "lists no model at /v1/models, and deployment mine names none"),
])
def test_a_deployment_without_a_model_takes_the_one_the_server_lists(ids: list[str], expected: str) -> None:
    with _serve_models(ids) as url:
        if len(ids) == 1:
            assert served_model(url, {}, deployment="mine") == expected
        else:
            with pytest.raises(ServerError, match=expected):
                served_model(url, {}, deployment="mine")


def test_the_restart_script_restarts_a_real_process(tmp_path: Path) -> None:
    # What the e2e and plugin tests use as restart_command: stop, wait until gone, start again.
    pidfile, log = tmp_path / "pid", tmp_path / "log"
    argv = [sys.executable, str(FAKES / "restart_server.py"), "--pidfile", str(pidfile), "--log", str(log), "--",
            sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(60)"]
    def serving(count: int) -> int:
        # Each server prints once it runs: wait for it before the next restart stops it (on a
        # loaded 2-core host the interpreter can take seconds to start).
        deadline = time.monotonic() + 20
        while log.read_text().count("serving") < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return log.read_text().count("serving")

    subprocess.run(argv, check=True, timeout=30)
    first = int(pidfile.read_text())
    assert serving(1) == 1
    subprocess.run(argv, check=True, timeout=30)
    second = int(pidfile.read_text())
    assert first != second
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    assert psutil.Process(second).is_running()
    # Appended, not overwritten: both servers' lines are in the log.
    assert serving(2) == 2
    psutil.Process(second).kill()


def test_a_restart_script_that_leaves_the_new_server_in_the_background_returns_at_once(tmp_path: Path) -> None:
    # `vllm serve ... &`: the background server keeps the script's stdout; a pipe there would
    # hold subprocess.run until that server exits (the deadline, then "did not return").
    script = tmp_path / "restart.sh"
    # The background server outlives the deadline many times over: held by a pipe, the call
    # would raise "did not return within health_deadline_s" instead of returning.
    background = tmp_path / "background.pid"
    script.write_text(f"#!/bin/sh\necho restarting\nsleep 600 &\necho $! > {background}\n")
    script.chmod(0o755)
    down = iter(["down"])
    try:
        restart = restart_server([str(script)], base_url="http://127.0.0.1:9", model="m", headers={},
                                 deadline_s=20.0, health=lambda *a: next(down, None), ready=lambda *a: None)
        assert psutil.Process(int(background.read_text())).is_running()  # returned while it still runs
        assert restart.command_s <= restart.ready_s
    finally:
        psutil.Process(int(background.read_text())).kill()
