"""A run its CPU quota throttles, through pytest: the measurement is INVALID naming the quota, gives
no verdict, and the run exits 75 (like a busy host: tests/plugin/test_busy_host.py).

Throttled on demand where this host lets a test make a cgroup (root, a writable cpu controller):
a busy process of the client's, moved into a cgroup allowed 1 ms of CPU per 100 ms, is
throttled in every period of the measured window. The reader's arithmetic is tested on recorded
``cpu.stat`` files (tests/unit/test_cgroup_quota.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_TEST = f"""
import os
import subprocess
import sys

from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=8, output_tokens=16, requests=4, warmup_requests=1)
BUSY = {helpers.BUSY!r}


def test_decode(perf):
    # A worker of the client's that the quota holds: in the starved cgroup for the whole test.
    busy = subprocess.Popen([sys.executable, "-c", BUSY, "1"])
    try:
        with open(os.environ["QUOTA_CGROUP_PROCS"], "w") as procs:
            procs.write(str(busy.pid))
        perf.check(perf.measure(SCENARIO), ["decode_tok_s"])
    finally:
        busy.kill()
        busy.wait()
"""


@pytest.fixture
def starved_cgroup() -> Iterator[tuple[Path, str]]:
    made = helpers.quota_cgroup(1_000, 100_000)
    if isinstance(made, str):
        pytest.skip(made)
    try:
        yield made
    finally:
        helpers.remove_cgroup(made[0])


def test_a_run_its_cpu_quota_throttles_is_invalid_naming_the_quota_and_exits_75(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, starved_cgroup: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, name = starved_cgroup
    monkeypatch.setenv("QUOTA_CGROUP_PROCS", str(folder / "cgroup.procs"))
    stub_project(stub_deployment_toml())  # no host bound: the quota alone decides
    pytester.makepyfile(test_quota=PERF_TEST)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-boots", "1", "--kimiperf-max-boots",
                                           "1", "--kimiperf-json", str(report), "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(failed=1)
    assert result.ret == 75, result.stdout.str()[-3000:]
    # The header says the quota in force over the run (the pytest process's own: none here).
    result.stdout.fnmatch_lines(["kimiperf: client: normal priority, *; CPU quota: *"])
    assert "INVALID measurement: CPU quota: " in result.stdout.str()
    (test,) = json.loads(report.read_text())["tests"]
    assert test["invalid"].startswith(f"CPU quota: the CPU quota of 0.01 CPU on cgroup {name} (v"), test["invalid"]
    assert "which holds the client, throttled them in " in test["invalid"]
    assert test["invalid"].endswith("measured 3 times, throttled every time: no verdict from a run its CPU quota "
                                    "held back")
    # A quota's own advice, never a busy host's "retry": on the same runner the quota is the same.
    assert test["invalid_cause"] == "cpu-quota"
    result.stdout.fnmatch_lines(["*exit status 75 (EX_TEMPFAIL); raise the CPU quota (a container's CPU limit) or "
                                 "measure a lighter load: a rerun under the same quota is throttled again"])
