"""Every answer on two clocks, through pytest on the stub server: the engine's own figures (its
/metrics histograms) say whether a change the client saw was the engine's.

The stub's engine stamps each token on its own schedule; --api-delay-ms slows its API layer alone
(the client sees it, the engine does not), --engine-tok-per-s the engine itself. Each change is a
halving, far past the client's boot-to-boot noise on any host, so which way each clock moved is
the stub's, not the host's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import stub_deployment_toml

DECODE = """
from pytest_kimiperf import SingleStream

def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=8, warmup_requests=1))
    perf.check(run, ["decode_tok_s"])
"""


def _run(pytester: pytest.Pytester, tmp_path: Path, extra_args: tuple[str, ...], profiles: str,
         hook_profiles: str = "{}") -> tuple[pytest.RunResult, dict]:
    pytester.makefile(".toml", pyproject=stub_deployment_toml(
        extra_args=("--engine-metrics", "--tok-per-s", "100", *extra_args)))
    pytester.makeconftest(f"""
        def pytest_kimiperf_add_profiles(config):
            return {hook_profiles}
    """)
    pytester.makepyfile(test_clocks=DECODE)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-profile", profiles,
                                           "--kimiperf-boots", "2", "--kimiperf-json", str(report), timeout=300)
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
    assert "; engine decode +0.0% (+0.0..+0.0%, 90%): the time went outside the engine (API server, network or " \
           "client)" in answer, answer
    assert _comparison(data, "slow-api")["verdict"] == "regression"
    views = [t["run"]["server_metrics"][0] for t in data["tests"]]
    assert {round(v["engine_decode_tok_s"]) for v in views} == {100}  # the engine kept its pace on both


def test_in_an_nccl_only_comparison_the_same_case_is_not_the_profiles(pytester: pytest.Pytester, tmp_path: Path) -> None:
    # ring-ll differs from default only in NCCL_ALGO and NCCL_PROTO; its API layer is slowed beside
    # it, as a host's or a client's change that coincides with the profile would be.
    result, data = _run(pytester, tmp_path, ("--slow-if-env", "NCCL_PROTO=LL", "--api-delay-ms", "10"),
                        "default,ring-ll")
    answer = _answer(result, "ring-ll vs default, decode tok/s (decode): ")
    assert "UNRESOLVED: the client's clock moved, the engine's did not" in answer, answer
    assert "ring-ll differs from default only in what reaches the engine's workers, so this change is not the " \
           "profile's" in answer, answer
    assert " worse (" not in answer


def test_an_engine_slowed_itself_moves_both_clocks_and_the_verdict_is_a_regression(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    result, data = _run(pytester, tmp_path, (), "default,slow-engine",
                        '{"slow-engine": {"args": ["--engine-tok-per-s", "50"]}}')
    answer = _answer(result, "slow-engine vs default, decode tok/s (decode): ")
    assert _comparison(data, "slow-engine")["verdict"] == "regression", answer
    assert "; engine decode -50.0% (-50.0..-50.0%, 90%): the engine changed" in answer, answer
