"""Installed from a built wheel into a fresh virtualenv, without this checkout, the plugin runs a
user's one-test perf suite in a repository of their own against a server in attach mode."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers import STUB_SERVER, free_port, run_checked

# A user's repository on a shared host, the client's self-check off (TOML's inf; any share of
# requests may lose a figure to shared reads): what is tested is the installed wheel, not the
# host's scheduling, which beside a CPU hog passed a 200 ms loop bound (tests/plugin/test_attach.py).
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
client_bounds = { max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }
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


def test_the_wheel_installs_in_a_fresh_venv_and_gates_a_users_own_repository(tmp_path: Path,
                                                                             wheel_python: str) -> None:
    python = wheel_python
    env_dir = Path(python).parents[1]
    installed = run_checked([python, "-c", "import pathlib, pytest_kimiperf as k; p = pathlib.Path(k.__file__).parent; "
                             "print(p, (p / 'py.typed').is_file())"], cwd=tmp_path).stdout.split()
    assert installed[0].startswith(str(env_dir)) and installed[1] == "True"

    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(USER_PYPROJECT)
    (repo / "tests" / "test_perf.py").write_text(USER_TEST)
    port = free_port()
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
        result = run_checked([python, "-m", "pytest", "--kimiperf-deployment", "my-server", "--kimiperf-server-url",
                              f"http://127.0.0.1:{port}", "-p", "no:cacheprovider", "-rw"], cwd=repo)
    finally:
        server.kill()
        server.wait()
    assert "2 passed" in result.stdout.splitlines()[-1], result.stdout
    assert "MissingBaselineWarning: kimiperf: " in result.stdout
    assert "kimiperf: server attached to http://127.0.0.1" in result.stdout
