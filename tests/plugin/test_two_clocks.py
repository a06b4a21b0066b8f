"""Every answer on two clocks, through pytest on the stub server: the engine's own figures (its
/metrics histograms) say whether a change the client saw was the engine's.

The stub's engine stamps each token on its own schedule; --api-delay-ms slows its API layer alone
(the client sees it, the engine does not), --engine-tok-per-s the engine itself. Each change is a
halving, far past the client's boot-to-boot noise on any host, so which way each clock moved is
the stub's, not the host's."""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import STUB_SERVER, stub_deployment_toml

DECODE = """
from pytest_kimiperf import SingleStream

def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=8, warmup_requests=1))
    perf.check(run, ["decode_tok_s"])
"""


def _run(pytester: pytest.Pytester, tmp_path: Path, extra_args: tuple[str, ...], profiles: str,
         hook_profiles: str = "{}", *more: str) -> tuple[pytest.RunResult, dict]:
    pytester.makefile(".toml", pyproject=stub_deployment_toml(
        extra_args=("--engine-metrics", "--tok-per-s", "100", *extra_args)))
    pytester.makeconftest(f"""
        def pytest_kimiperf_add_profiles(config):
            return {hook_profiles}
    """)
    pytester.makepyfile(test_clocks=DECODE)
    report = tmp_path / "report.json"
    # 3 boots a side: Welch's degrees of freedom reach past the 2 that place nothing (engine_clock.py).
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-profile", profiles,
                                           "--kimiperf-boots", "3", "--kimiperf-json", str(report), *more,
                                           timeout=300)
    return result, json.loads(report.read_text())


def _answer(result: pytest.RunResult, start: str) -> str:
    lines = result.stdout.lines
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    assert first is not None, repr(lines[-40:])
    text = lines[first]
    for line in lines[first + 1:]:  # the answer's wrapped continuation lines
        if not line.startswith("    "):
            break
        text += " " + line.strip()
    return text


def _comparison(data: dict, profile: str) -> dict:
    found = [c for c in data["profile_comparisons"] if c["profile"] == profile and c["metric"] == "decode"]
    assert found, json.dumps(data["profile_comparisons"])[:3000]
    return found[-1]


def test_an_api_layer_slowed_alone_reads_as_time_outside_the_engine(pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, data = _run(pytester, tmp_path, (), "default,slow-api",
                        '{"slow-api": {"args": ["--api-delay-ms", "10"]}}')
    answer = _answer(result, "slow-api vs default, decode tok/s (decode): ")
    # The client's clock stays the verdict's: a slower API server is a slower build.
    assert ": worse (tolerance 25%" in answer, answer
    assert "; client +" in answer and " ms a token, engine +0.0 (+0.0..+0.0, 90%): outside the engine (API server, " \
           "network or client)" in answer, answer
    assert _comparison(data, "slow-api")["verdict"] == "regression"
    views = [t["run"]["server_metrics"][0] for t in data["tests"]]
    assert {round(v["engine_decode_tok_s"]) for v in views} == {100}  # the engine kept its pace on both


NCCL_ONLY_SLOWED = ("--slow-if-env", "NCCL_PROTO=LL", "--api-delay-ms", "10")


def test_in_an_nccl_only_comparison_the_same_case_is_not_the_profiles_in_every_output(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    # ring-ll differs from default only in NCCL_ALGO and NCCL_PROTO; its API layer is slowed beside
    # it, as a host's or a client's change that coincides with the profile would be.
    markdown, junit = tmp_path / "report.md", tmp_path / "junit.xml"
    result, data = _run(pytester, tmp_path, NCCL_ONLY_SLOWED, "default,ring-ll", "{}",
                        "--kimiperf-markdown", str(markdown), f"--junitxml={junit}")
    answer = _answer(result, "ring-ll vs default, decode tok/s (decode): ")
    withdrawn = ("sign withdrawn: this profile differs from default only in what reaches the engine's workers, and "
                 "the engine's clock did not move with the client's, so the change is not the profile's")
    # One verdict, decided in judge/: the terminal, the JSON, the Markdown, JUnit and the exit status.
    assert ": inconclusive (tolerance 25%" in answer and withdrawn in answer, answer
    assert " worse (" not in answer
    comparison = _comparison(data, "ring-ll")
    assert comparison["verdict"] == "inconclusive" and withdrawn in comparison["note"], comparison
    assert withdrawn in " ".join(markdown.read_text().split())
    assert "| worse" not in markdown.read_text()
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert properties["kimiperf_verdict test_clocks.py::test_decode|decode_tok_s|ring-ll vs default"] == "inconclusive"
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()


def test_an_engine_slowed_itself_moves_both_clocks_and_the_verdict_is_a_regression(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, data = _run(pytester, tmp_path, (), "default,slow-engine",
                        '{"slow-engine": {"args": ["--engine-tok-per-s", "50"]}}')
    answer = _answer(result, "slow-engine vs default, decode tok/s (decode): ")
    assert _comparison(data, "slow-engine")["verdict"] == "regression", answer
    assert "; client +" in answer and ", engine +10.0 (+10.0..+10.0, 90%): the engine's" in answer, answer


# --- the gate: this run's boots against the history's, on both clocks -------------------------
#
# The engine's figures are set per boot (the stub's --engine-stamps: each boot's time per token and
# queue+prefill, recorded for every request whatever the host did), so which way the engine's clock
# moved is the test's, never the host's; the client reads the stub's real pace. Each change is a
# halving (10 against 20 ms a token), far past a 2-core host's boot-to-boot noise.

RECORDED = [{"tpot_ms": 9.9, "ttft_ms": 49.0}, {"tpot_ms": 10.0, "ttft_ms": 50.0}, {"tpot_ms": 10.1, "ttft_ms": 51.0}]


def _gate_project(pytester: pytest.Pytester) -> Path:
    stamps = pytester.path / "engine_stamps.json"
    pytester.makefile(".toml", pyproject=stub_deployment_toml(
        extra_args=("--engine-metrics", "--tok-per-s", "100", "--engine-stamps", str(stamps))))
    pytester.makepyfile(test_clocks=DECODE)
    return stamps


def _boots_of(stamps: Path, boots: list[dict]) -> None:
    """The next run's boots: their set engine figures and pace (the count of boots starts again)."""
    stamps.write_text(json.dumps(boots))
    Path(f"{stamps}.booted").unlink(missing_ok=True)


def _record_then_gate(pytester: pytest.Pytester, tmp_path: Path, gate_boots: list[dict], *,
                      strip_engine: bool = False) -> tuple[pytest.RunResult, dict]:
    stamps = _gate_project(pytester)
    _boots_of(stamps, RECORDED)
    args = ("--deployment", "stub", "--kimiperf-boots", "3", "-p", "no:cacheprovider")
    recorded = pytester.runpytest_subprocess(*args, "--kimiperf-update-baselines", timeout=300)
    assert recorded.ret == pytest.ExitCode.OK, recorded.stdout.str()
    [path] = (pytester.path / "baselines" / "stub").glob("*.json")
    baseline = json.loads(path.read_text())
    boots = baseline["entries"]["test_clocks.py::test_decode|default|decode_tok_s"]["boots"]
    # Every recorded boot keeps its two clocks: the engine's set figures beside the client's means.
    assert [b["engine"]["engine_tpot_ms"] for b in boots] == [9.9, 10.0, 10.1]
    assert all(b["engine"]["requests"] == 8 and b["engine"]["tokens"] == 8 * 15 for b in boots)
    assert all(b["engine"]["client_tpot_ms"] is not None for b in boots)
    if strip_engine:  # a file written before the engine's figures were kept
        for entry in baseline["entries"].values():
            for boot in entry["boots"] + entry.get("anchor", []):
                boot.pop("engine", None)
        path.write_text(json.dumps(baseline, indent=2, sort_keys=True) + "\n")
    _boots_of(stamps, gate_boots)
    report = tmp_path / "gate.json"
    result = pytester.runpytest_subprocess(*args, "--kimiperf-gate", "--kimiperf-json", str(report), timeout=300)
    return result, json.loads(report.read_text())


def _without_stream_remark(answer: str) -> str:
    """The answer without what the stream showed of the server (reports/answers.py
    stream_remark): on a loaded host the stub writes two late tokens back to back, and the
    answer rightly says it wrote chunks together; which streams it did is the host's."""
    return re.sub(r" \((the server stalled|it wrote|its chunks carried)[^()]*(\([^()]*\)[^()]*)*\)$", "", answer)


def _last_baseline(data: dict) -> dict:
    last = max((t for t in data["tests"] if t["profile"] == "default"), key=lambda t: t["boot"])
    return last["metrics"]["decode_tok_s"]["baseline"]


def test_the_gate_says_an_api_layer_slowed_alone_spent_its_time_outside_the_engine(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    slowed_api = [{**boot, "api_delay_ms": 10.0} for boot in RECORDED]  # the engine's figures as recorded
    result, data = _record_then_gate(pytester, tmp_path, slowed_api)
    answer = _answer(result, "default vs its baseline, decode tok/s (decode): ")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, answer  # the client's clock is the verdict's
    assert ": REGRESSION (" in answer, answer
    assert "; client +" in answer and " ms a token, engine " in answer, answer
    assert _without_stream_remark(answer).endswith(": outside the engine (API server, network or client)"), answer
    baseline = _last_baseline(data)
    assert baseline["verdict"] == "regression"
    assert "outside the engine (API server, network or client)" in baseline["note"]


def test_the_gate_says_an_engine_slowed_itself_is_the_engines(pytester: pytest.Pytester, tmp_path: Path) -> None:
    slowed_engine = [{"tpot_ms": t, "ttft_ms": p, "engine_tok_per_s": 50.0}
                     for t, p in ((19.9, 49.0), (20.0, 50.0), (20.1, 51.0))]
    result, data = _record_then_gate(pytester, tmp_path, slowed_engine)
    answer = _answer(result, "default vs its baseline, decode tok/s (decode): ")
    assert ": REGRESSION (" in answer, answer
    assert ", engine +10.0 (" in answer and _without_stream_remark(answer).endswith(": the engine's"), answer
    assert "the engine's" in _last_baseline(data)["note"]


def test_a_baseline_without_engine_figures_is_judged_on_the_clients_clock_and_says_so_once(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, data = _record_then_gate(pytester, tmp_path, RECORDED, strip_engine=True)
    said = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, said
    line = ("against the baseline: judged on the client's clock alone: the baseline's boots keep no engine "
            "figures (recorded before they were stored)")
    assert " ".join(said.split()).count(line) == 1, said
    assert "outside the engine" not in said and "the engine's" not in said
    assert _last_baseline(data)["verdict"] != "regression"


def test_under_control_the_candidates_regression_reads_the_same_everywhere_and_fails_the_run(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    # The candidate's API layer slowed, its control's not: a build that slows the API server is a
    # slower build. The candidate and its control share their environment, so the engine-only rule
    # cannot withdraw the sign, and every output reads the one REGRESSION.
    control = [sys.executable, str(STUB_SERVER), "--model", "{served_model_name}", "--host", "{host}", "--port",
               "{port}", "--load-seconds", "0.4", "--engine-metrics", "--tok-per-s", "100"]
    pytester.makefile(".toml", pyproject=stub_deployment_toml(
        extra_args=("--engine-metrics", "--tok-per-s", "100", "--api-delay-ms", "10"))
        + f"control_command = {json.dumps(control)}\n")
    pytester.makepyfile(test_clocks=DECODE)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-control", "--kimiperf-boots", "3",
                                           "--kimiperf-json", str(report), f"--junitxml={junit}",
                                           "-p", "no:cacheprovider", timeout=300)
    data = json.loads(report.read_text())
    [decode] = [c for c in data["profile_comparisons"] if c["metric"] == "decode"]
    assert decode["verdict"] == "regression" and "outside the engine" in decode["note"], decode
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert properties["kimiperf_verdict test_clocks.py::test_decode|decode_tok_s|default vs default@control"] \
        == "regression"
    answer = _answer(result, "default vs default@control, decode tok/s (decode): ")
    assert ": worse (" in answer and ": outside the engine (API server, network or client)" in answer, answer
    assert result.ret == pytest.ExitCode.TESTS_FAILED
