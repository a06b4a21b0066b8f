"""Installed from a built wheel into a fresh virtualenv, without this checkout, the plugin runs a
user's one-test perf suite in a repository of their own against a server in attach mode."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx

from tests.helpers import ROOT, STUB_SERVER

USER_PYPROJECT = """
[tool.pytest.ini_options]
addopts = "--strict-markers"
filterwarnings = ["error::pytest_kimiperf.InconclusiveWarning"]

[tool.kimiperf.deployments.my-server]
model = "my-model"
served_model_name = "my-model"
command = ["vllm", "serve", "{model}", "--port", "{port}"]
decode_floor_tok_s = 1
decode_target_tok_s = 2
client_bounds = { max_loop_latency_p99_ms = 200, max_send_lag_p99_ms = 200 }
host_bounds = { max_foreign_cpu_share = "none", max_steal_share = "none" }
"""

USER_TEST = """
from pytest_kimiperf import PerfRecorder, SingleStream

DECODE = SingleStream(prompt_tokens=8, output_tokens=16, requests=5, warmup_requests=1)


def test_unit():
    assert True


def test_decode(perf: PerfRecorder) -> None:
    run = perf.measure(DECODE)
    perf.check(run, ["decode_tok_s", "ttft_ms"], floor=True)
"""


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert result.returncode == 0, f"{argv}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_wheel_installs_in_a_fresh_venv_and_gates_a_users_own_repository(tmp_path: Path) -> None:
    # Built from a copy of what the wheel holds, so the checkout gains no build/ or egg-info.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "pytest_kimiperf", source / "pytest_kimiperf",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
          str(tmp_path / "dist"), str(source)], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("pytest_kimiperf-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)
    installed = _run([python, "-c", "import pathlib, pytest_kimiperf as k; p = pathlib.Path(k.__file__).parent; "
                      "print(p, (p / 'py.typed').is_file())"], cwd=tmp_path).stdout.split()
    assert installed[0].startswith(str(env_dir)) and installed[1] == "True"

    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(USER_PYPROJECT)
    (repo / "tests" / "test_perf.py").write_text(USER_TEST)
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(STUB_SERVER), "--model", "my-model", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the stub server did not come up"
            time.sleep(0.2)
        result = _run([python, "-m", "pytest", "--kimiperf-deployment", "my-server", "--kimiperf-server-url",
                       f"http://127.0.0.1:{port}", "-p", "no:cacheprovider", "-rw"], cwd=repo)
    finally:
        server.kill()
        server.wait()
    assert "2 passed" in result.stdout.splitlines()[-1], result.stdout
    assert "MissingBaselineWarning: kimiperf: " in result.stdout
    assert "kimiperf: server attached to http://127.0.0.1" in result.stdout
