"""A server that writes every 10th stream in one send, measured through pytest: the run says how
many requests it measured of how many and why not the rest, and never passes quietly on fewer.

The paced server (tests/fakes/paced_server.py --burst-every 10) writes those streams whole, so
their decode figure measures nothing: withheld as "burst", every time, whatever the host does.
How many more a loaded host's stalls cost is the host's; these tests assert what the run reports
of them (its JSON's counts, its summary's line), never a count the host decides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimiperf.measure.invalid_causes import InvalidCause, advice
from tests.paced_truth import paced_server

DECODE = """
from pytest_kimiperf import SingleStream

def test_decode(perf):
    perf.check(perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=60)), ["decode_tok_s"])
"""


def _pyproject(max_unmeasured: float) -> str:
    # The accounting is this test's subject, not the client's self-check: its loop and CPU bounds
    # are off, and only the unmeasured share is set.
    return ("[tool.kimiperf.deployments.remote]\n"
            "tolerances = { decode_tok_s = 0.25 }\n"
            "host_bounds = { max_foreign_cpu_share = \"none\", max_steal_share = \"none\" }\n"
            "client_bounds = { max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, "
            f"max_send_lag_p99_ms = inf, max_unmeasured_fraction = {max_unmeasured} }}\n")


def _run(pytester: pytest.Pytester, tmp_path: Path, max_unmeasured: float) -> tuple[pytest.RunResult, dict]:
    pytester.makepyprojecttoml(_pyproject(max_unmeasured))
    pytester.makepyfile(test_bursts=DECODE)
    report = tmp_path / "report.json"
    with paced_server("--burst-every", "10", "--ttft-ms", "20", "--itl-ms", "2.5") as url:
        result = pytester.runpytest_subprocess(
            "--deployment", "remote", "--kimiperf-server-url", url, "--kimiperf-server-hardware", "paced server here",
            "--kimiperf-json", str(report), "-p", "no:cacheprovider", timeout=300)
    return result, json.loads(report.read_text())


def test_a_server_that_writes_every_tenth_stream_at_once_is_counted_and_said(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, data = _run(pytester, tmp_path, 1.0)  # the switch off: every loss kept, and shown
    (test,) = data["tests"]
    decode = test["run"]["measured"]["figures"]["decode_tok_s"]
    assert decode["sent"] == 60 and decode["measured"] + sum(decode["withheld"].values()) == 60
    assert decode["withheld"].get("burst", 0) >= 6  # the six streams written whole, at least
    assert len(test["metrics"]["decode_tok_s"]["samples"]) == decode["measured"]
    result.assert_outcomes(passed=1)
    lost = 60 - decode["measured"]
    lines = result.stdout.lines
    title = next(i for i, text in enumerate(lines) if "kimiperf: requests not measured, per boot" in text)
    line = " ".join(text.strip() for text in lines[title + 1:title + 4])
    assert line.startswith(f"decode, decode measured of sent: default {decode['measured']}/60 ({lost} not measured: "), line
    assert "that came in bursts" in line


def test_past_its_bound_the_window_is_measured_again_then_invalid_with_the_advice_of_its_cause(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, data = _run(pytester, tmp_path, 0.05)  # 6 of 60 is past 5%, in every attempt
    (test,) = data["tests"]
    held = test["run"]["measured"]["held_by"]
    cause = InvalidCause.SERVER_BURSTS if held == "server" else InvalidCause.CLIENT_HELD
    assert test["invalid_cause"] == cause.value, test["run"]["measured"]
    assert "unmeasured: more than 5% of the window's requests lost a figure to shared reads: decode_tok_s lost for " \
        in test["invalid"]
    assert result.ret == 75
    result.stdout.fnmatch_lines([f"*exit status 75 (EX_TEMPFAIL); {advice(cause)}*"])
    # Measured three times before the verdict, each earlier attempt saying why.
    (again,) = [m for m in test["messages"] if m.startswith("attempt 1 measured again: unmeasured: ")]
    assert "; attempt 2 measured again: unmeasured: " in again and "attempt 3" not in again
