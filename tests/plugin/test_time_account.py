"""The summary ends with where the session's time went, and the JSON report carries the same.

A stub session, alone and under xdist: the block is printed, its parts and the unaccounted rest
add up to its total, the boots and windows it counts are the session's, and the JSON's
``time_account`` holds the same figures. No figure of this host's speed is asserted: only the
account's structure and its sums.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_FILE = """
from pytest_kimiperf.measure.workload import SingleStream

def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=3, warmup_requests=1))
    perf.check(run, ["decode_tok_s"])

def test_functional():
    pass
"""

_ROW = re.compile(r"^  (\S.*?)\s{2,}(\d+(?:\.\d)?)\s+(\d+%)$")


def _run(pytester: pytest.Pytester, stub_project, tmp_path: Path, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    stub_project(stub_deployment_toml(), ini='kimiperf_deployment = "stub"')
    pytester.makepyfile(test_perf=PERF_FILE)
    out = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1",
                                           "--kimiperf-max-boots", "1", "--kimiperf-json", str(out), *args,
                                           timeout=180)
    return result, json.loads(out.read_text())["time_account"]


def _block(lines: list[str]) -> dict[str, float]:
    """The block's top-level rows (parts, the rest and the total), by name, as printed."""
    start = next(i for i, line in enumerate(lines) if "kimiperf: where the time went" in line)
    rows: dict[str, float] = {}
    for line in lines[start + 2:]:
        if line.startswith("  plan"):
            break
        if (m := _ROW.match(line)) is not None:  # a part's row has a share, a boot's or a test's none
            rows[re.sub(r" \(\d+ \w+\)$", "", m.group(1))] = float(m.group(2))
    return rows


def _check(result: pytest.RunResult, account: dict[str, Any], *, boots: int, windows: int) -> None:
    result.assert_outcomes(passed=3)
    parts = {p["part"]: p for p in account["parts"]}
    # The parts and the rest are the wall clock, to the rounding of the JSON's figures.
    assert sum(p["seconds"] for p in account["parts"]) + account["unaccounted_s"] == pytest.approx(
        account["wall_clock_s"], abs=0.01 * len(parts))
    assert parts["boots"]["count"] == boots == account["boots"]
    assert [r["row"] for r in parts["boots"]["rows"]] == [
        "boot 1 of default (first of the deployment)", "boot 1 of ring-ll"]
    for row in parts["boots"]["rows"]:
        assert sum(row["details"].values()) == pytest.approx(row["seconds"], abs=0.01 * len(row["details"]))
        assert set(row["details"]) - {"outside the server's log"}  # the phases of its log, laid from its launch
    # Each boot's stretch holds its time to ready (launch to serving) and the manager's steps.
    assert parts["boots"]["seconds"] >= account["ready_s"] - 0.01
    assert parts["measuring"]["count"] == windows
    assert [(r["row"], r["count"]) for r in parts["measuring"]["rows"]] == [("test_perf.py::test_decode", windows)]
    assert parts["server stops"]["count"] == boots
    assert parts["perf tests' set-up, checks and teardown"]["count"] == 2
    assert account["planned"]["boots"] == 2 and account["planned"]["ready_s_per_boot"] is None
    # The terminal prints the same account: every part, the rest and the total, adding up.
    printed = _block(result.stdout.lines)
    assert printed.pop("total: the pytest process, from its start to session finish") == pytest.approx(account["wall_clock_s"], abs=0.1)
    assert printed.pop("other / unaccounted") == pytest.approx(account["unaccounted_s"], abs=0.1)
    assert printed == pytest.approx({name: p["seconds"] for name, p in parts.items()}, abs=0.1)
    result.stdout.fnmatch_lines(["*= kimiperf: where the time went =*",
                                 "  part * s  share",
                                 "  plan (--kimiperf-plan): 2 boots; time to ready unknown: *"])


def test_the_summary_ends_with_where_the_time_went(pytester: pytest.Pytester, stub_project, tmp_path: Path) -> None:
    result, account = _run(pytester, stub_project, tmp_path)
    _check(result, account, boots=2, windows=2)
    assert [p["part"] for p in account["parts"]][:2] == ["session start", "boots"]
    assert account["parts"][-1]["part"] == "session end"
    assert next(p for p in account["parts"] if p["part"] == "other tests")["count"] == 1


def test_under_xdist_the_workers_boots_and_windows_are_accounted(pytester: pytest.Pytester, stub_project,
                                                                  tmp_path: Path) -> None:
    result, account = _run(pytester, stub_project, tmp_path, "-n", "2")
    _check(result, account, boots=2, windows=2)
