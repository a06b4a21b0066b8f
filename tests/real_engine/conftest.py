"""Real-engine tests: each boots real vLLM servers on the CPU engine (tiny-cpu), a minute each.

They show what only a real engine can (it boots, its children carry the launch marker and die
with pytest, the request and token counts, the export, the restart of an attached server, two
nodes, the compile cache) and assert that plumbing, never a verdict that rests on this host's
noise: what the real engine says about the statistics is measured in
benchmarks/real_engine_verdicts.py. Every test here is marked ``real_engine`` (deselect with
``-m "not real_engine"``) and runs with a private launch-record directory, so its sweeps never
touch another test's servers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent

# tiny-cpu as a plumbing run sees it: the host watch and the client's self-check read how busy
# and how fast this host is, which makes a measurement INVALID on a busy host (a capability
# with its own deterministic test, tests/plugin/test_busy_host.py). Here they are off, so a
# busy host slows these tests and never fails them. TOML's inf: no figure exceeds the bound.
PLUMBING_DEPLOYMENT = """
[tool.kimiperf.deployments.{name}]
extends = "{base}"
host_bounds = {{ max_foreign_cpu_share = "none", max_steal_share = "none" }}
client_bounds = {{ max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }}
"""


def plumbing_deployment(name: str = "tiny", base: str = "tiny-cpu", extra: str = "") -> str:
    """A pyproject table for deployment ``name``: ``base`` with the host watch and the client's
    self-check off, and ``extra`` lines of the table after them."""
    return PLUMBING_DEPLOYMENT.format(name=name, base=base) + extra


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: the mark is in place before `-m` deselects by it.
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.real_engine)


@pytest.fixture(autouse=True)
def _private_launch_records(isolated_state: Path) -> Path:
    return isolated_state


def vllm_processes() -> list[psutil.Process]:
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
        # An argument that is the module vllm.entrypoints...: not a `python -c` script that
        # merely mentions it, as the plugin's read of vLLM's serve parser is (config/serve_args.py),
        # which any pytest run on this host may start while a test here runs.
        cmdline = proc.info["cmdline"] or []
        if (proc.info["name"] or "").startswith("VLLM::") or any(a.startswith("vllm.entrypoints") for a in cmdline):
            found.append(proc)
    return found


@pytest.fixture
def no_servers_before_and_after() -> Iterator[None]:
    """Fails the test if it leaves a vLLM process behind that was not there before it."""
    before = {p.pid for p in vllm_processes()}
    yield
    deadline = time.monotonic() + 10

    def new() -> list[psutil.Process]:
        return [p for p in vllm_processes() if p.pid not in before]

    while new() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.name()) for p in new()]
    assert not left, f"server processes left behind: {left}"
