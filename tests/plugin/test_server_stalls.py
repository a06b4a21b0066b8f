"""A server that stalls or writes in bursts, measured through pytest: what it did is measured and
judged like any slower server, never an INVALID (issue 70); what the run did not measure is
counted, with its reason, on every screen, ``-q`` included.

The paced server (tests/fakes/paced_server.py) writes every 10th stream whole in one send
(``--burst-every 10``), or writes every stream's first chunk on time and the rest in one send
100 ms after the last one's due time (``--stall-every 1``). Its stalls are far beyond anything a
host adds: 16 tokens at 2.5 ms are 37.5 ms of decode, and the stall makes them 137.5 ms (-73%).
The client's self-check and the window's bound are off, as in every plumbing test: which
requests a loaded host's holds cost is the host's, and these tests assert what the run reports
of them (its JSON's counts), never a count the host decides. Which stamps a hold spoils, read by
read, is tested on virtual time in tests/unit/test_coverage.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import measured_count
from tests.paced_truth import paced_server

DECODE = """
from pytest_kimiperf import SingleStream

def test_decode(perf):
    perf.check(perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=30)), ["decode_tok_s"])
"""

PYPROJECT = """
[tool.kimiperf.deployments.remote]
server_hardware = "paced server here"
tolerances = { decode_tok_s = 0.25 }
host_bounds = { max_foreign_cpu_share = "none", max_steal_share = "none" }
client_bounds = { max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }
"""

PACE = ("--ttft-ms", "20", "--itl-ms", "2.5")


def _run(pytester: pytest.Pytester, url: str, report: Path, *args: str) -> tuple[pytest.RunResult, dict]:
    result = pytester.runpytest_subprocess(
        "--deployment", "remote", "--kimiperf-server-url", url, "--kimiperf-json", str(report),
        "-p", "no:cacheprovider", *args, timeout=300)
    return result, json.loads(report.read_text())


def test_streams_written_whole_are_the_server_s_counted_and_said(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(test_bursts=DECODE)
    with paced_server("--burst-every", "10", *PACE) as url:
        result, data = _run(pytester, url, tmp_path / "report.json")
    (test,) = data["tests"]
    measured = measured_count(test["run"], "decode_tok_s")
    withheld = test["run"]["measured"]["figures"]["decode_tok_s"]["withheld"]
    # Every 10th stream the server starts is whole in one read (the warm-up's counted): 3 of 30,
    # each the server's, unless a hold of the client touched its read (then the client's).
    assert withheld.get("one-read", 0) + withheld.get("client-held", 0) >= 3, withheld
    assert set(withheld) <= {"one-read", "client-held"}
    assert len(test["metrics"]["decode_tok_s"]["samples"]) == measured
    assert test["invalid"] is None and test["invalid_cause"] is None
    result.assert_outcomes(passed=1)
    said = " ".join(" ".join(result.stdout.lines).split())
    assert f"decode, decode measured of sent: default {measured}/30 ({30 - measured} not measured: " in said
    if withheld.get("one-read"):
        assert f"{withheld['one-read']} the server wrote whole in one read" in said


def test_a_server_that_stalls_after_the_first_token_is_a_regression_said_as_a_stall(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyprojecttoml(PYPROJECT)
    pytester.makepyfile(test_stalls=DECODE)
    with paced_server(*PACE) as url:
        recorded, _ = _run(pytester, url, tmp_path / "record.json", "--kimiperf-update-baselines")
    assert recorded.ret == 0, recorded.stdout.str()
    with paced_server("--stall-every", "1", "--stall-ms", "100", *PACE) as url:
        result, data = _run(pytester, url, tmp_path / "gate.json", "--kimiperf-gate")
        quiet, quiet_data = _run(pytester, url, tmp_path / "quiet.json", "--kimiperf-gate", "-q")
    (test,) = data["tests"]
    # Measured, not INVALID: the stall is the server's, and it is what the gate exists to catch.
    assert test["invalid"] is None and test["invalid_cause"] is None
    assert result.ret in (1, 76), result.stdout.str()  # REGRESSION, or UNRESOLVED on one attached boot
    stream = test["run"]["measured"]["stream"]
    measured = measured_count(test["run"], "decode_tok_s")
    # Each stream whose stall's two stamps held shows it (a hold of the client over the burst's
    # read leaves decode, whose first and last stamps hold, but not the gap: the host's share).
    assert 0 < stream["stalled_requests"] <= measured
    assert all(100.0 <= ms < 200.0 for ms in stream["stall_ms"]), stream["stall_ms"]
    assert test["metrics"]["decode_tok_s"]["summary"]["median"] < 0.5 * 400.0
    said = " ".join(" ".join(result.stdout.lines).split())
    assert "exit status 75" not in said and "nothing learned about the build" not in said
    assert (f"the server stalled about {round(sorted(stream['stall_ms'])[(len(stream['stall_ms']) - 1) // 2])}"
            in said or "the server stalled about 1" in said), said
    assert f"mid-stream in {stream['stalled_requests']} of 30 requests" in said, said
    # -q: the verdict, and what the run did not measure in one line where it missed any.
    assert quiet.ret in (1, 76) and quiet_data["tests"][0]["invalid"] is None
    quiet_said = " ".join(" ".join(quiet.stdout.lines).split())
    unmeasured = 30 - measured_count(quiet_data["tests"][0]["run"], "decode_tok_s")
    assert ("kimiperf: not measured: " in quiet_said) == (unmeasured > 0), quiet_said
