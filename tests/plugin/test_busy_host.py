"""A busy host through pytest: the measurement is INVALID, names the processes that took the
CPU, gives no verdict, and the run exits 75 so that CI retries on a quiet runner.

Busy on demand, on any host: two busy threads a core for the whole run take far more
than the 5% of the host's CPU the stub deployment allows here, whatever else the host runs.
The host watch's arithmetic is tested on recorded /proc readings (tests/unit/test_hostwatch.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import BUSY, stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_TEST = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=8, output_tokens=32, requests=6, warmup_requests=1)

def test_decode(perf):
    perf.check(perf.measure(SCENARIO), ["decode_tok_s"])
"""


@pytest.fixture
def busy_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Two busy processes of a thread a core each: two busy threads a core in all (one a core got
    only ~18% of a 2-core host beside a server, as the scheduler favours mostly-waiting
    processes), killed after the test."""
    threads = os.cpu_count() or 2
    procs = [subprocess.Popen([sys.executable, "-c", BUSY, str(threads)]) for _ in range(2)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_busy_host_is_invalid_naming_the_busy_processes_gives_no_verdict_and_exits_75(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, busy_processes: list[subprocess.Popen[bytes]]
) -> None:
    stub_project(stub_deployment_toml(host_bounds='{ max_foreign_cpu_share = 0.05, max_steal_share = "none" }'))
    pytester.makepyfile(test_busy=PERF_TEST)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "default,ring-ll",
                                           "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                           "--kimiperf-json", str(report), "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(failed=2)
    assert result.ret == 75, result.stdout.str()[-3000:]  # every failure INVALID (judge/gate.py)
    assert "INVALID measurement: host busy" in result.stdout.str()
    data = json.loads(report.read_text())
    assert [t["profile"] for t in data["tests"]] == ["default", "ring-ll"]
    for test in data["tests"]:
        assert test["invalid"].startswith("host busy") and test["host"]["foreign_cpu_share"] > 0.05, test["invalid"]
        # The processes that took the CPU are named by pid (the terminal wraps lines: read the JSON).
        assert any(f"pid {proc.pid} " in test["invalid"] for proc in busy_processes), test["invalid"]
    # A measurement of a busy host is not a sample of anything: no better or worse between profiles.
    assert not [c for c in data["profile_comparisons"] if c.get("verdict") in ("regression", "improvement")]
