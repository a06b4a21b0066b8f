"""Shared helpers of the plugin's own tests."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

# pytester's in-process runs restore sys.modules afterwards: numpy (and scipy, built on it)
# imported for the first time inside one would be imported again by the next, which numpy
# refuses with a warning. The plugin loads them lazily, so the test process loads them first.
import numpy  # noqa: F401
import psutil
import pytest
import scipy.stats  # noqa: F401

STUB_SERVER = Path(__file__).with_name("stub_vllm.py")
STUB_TOLERANCE_METRICS = ("decode_tok_s", "itl_ms", "tpot_ms", "ttft_ms", "e2el_ms", "output_throughput",
                          "request_throughput")


def running_stub(*args: str) -> Iterator[str]:
    """A bare stub server (tests/stub_vllm.py ``args``) that answers /health; yields its URL
    and kills it after (for client tests that need no plugin around the server)."""
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen([sys.executable, str(STUB_SERVER), "--model", "stub-model", "--port", str(port),
                             "--load-seconds", "0", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "stub did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


def stub_deployment_toml(
    name: str = "stub",
    *,
    mode: str = "normal",
    boot_count: Path | None = None,
    health_deadline_s: float = 30,
    load_seconds: float = 0.4,
    floor: float = 1.0,
    target: float = 2.0,
    extra_args: tuple[str, ...] = (),
    host_bounds: str = '{ max_foreign_cpu_share = "none", max_steal_share = "none" }',
    boot_spread: float = 0.06,
) -> str:
    """A ``[tool.kimiperf.deployments.<name>]`` table that boots tests/stub_vllm.py."""
    command = [
        sys.executable, str(STUB_SERVER), "--model", "{served_model_name}",
        "--host", "{host}", "--port", "{port}", "--mode", mode,
        "--load-seconds", str(load_seconds), *extra_args,
    ]
    if boot_count is not None:
        command += ["--boot-count", str(boot_count)]
    return (
        f"[tool.kimiperf.deployments.{name}]\n"
        f"model = \"stub-model\"\n"
        f"served_model_name = \"stub-model\"\n"
        f"command = {json.dumps(command)}\n"
        f"health_deadline_s = {health_deadline_s}\n"
        f"decode_floor_tok_s = {floor}\n"
        f"decode_target_tok_s = {target}\n"
        # These runs test plumbing, not the client: the host's scheduler stalls (one stall of
        # 5 ms in ~50 samples is a p99 past the default bound) must not make them INVALID.
        f"client_bounds = {{ max_loop_latency_p99_ms = 200, max_send_lag_p99_ms = 200 }}\n"
        # The stub shares this host's two cores like tiny-cpu does: two runs of the identical
        # stub differ by ~6% in decode and throughput (seen in test_perf_suite), so the metrics'
        # GPU defaults of 3-5% give false regressions; tiny-cpu's measured 25% does not.
        f"tolerances = {{ {', '.join(f'{m} = 0.25' for m in STUB_TOLERANCE_METRICS)} }}\n"
        # Plumbing runs are not about the host: other tests (xdist workers, the outer pytest)
        # share it. The host-watch tests pass their own bounds.
        f"host_bounds = {host_bounds}\n"
        f"boot_spread = {boot_spread}\n"
    )


@pytest.fixture
def stub_project(pytester: pytest.Pytester):
    """Write a pyproject.toml with stub deployments into the pytester directory."""

    def make(*tables: str, ini: str = "") -> Path:
        text = "\n".join(tables)
        if ini:
            text += "\n[tool.pytest.ini_options]\n" + ini + "\n"
        return pytester.makepyprojecttoml(text)

    return make


# What the plugin (or the servers it starts) reads from the environment: a developer's shell
# or CI job that sets these must not change what the tests see. KIMIPERF_CACHE_DIR stays (the
# built tiny model is shared); KIMIPERF_STATE_DIR is set per test by isolated_state.
_KEEP = frozenset({"KIMIPERF_CACHE_DIR", "KIMIPERF_STATE_DIR"})
_ISOLATED_PREFIXES = ("KIMIPERF_", "NCCL_")
# PYTEST_XDIST_*: when this suite itself runs under -n, a pytester subprocess must not look
# like an xdist worker (pytest-benchmark disables itself there).
_ISOLATED_NAMES = ("GITHUB_STEP_SUMMARY", "VLLM_API_KEY", "CUDA_DEVICE_MAX_CONNECTIONS",
                   "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in _ISOLATED_NAMES or (name.startswith(_ISOLATED_PREFIXES) and name not in _KEEP):
            monkeypatch.delenv(name)


@pytest.fixture
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private launch-record dir so tests never sweep each other's servers."""
    state = tmp_path / "kimiperf-launches"
    monkeypatch.setenv("KIMIPERF_STATE_DIR", str(state))
    return state


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie awaiting its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
