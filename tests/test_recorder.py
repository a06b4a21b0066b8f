"""The perf fixture's object: verdicts from floors and baselines, extension while inconclusive."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pytest_kimiperf import baselines, scenarios
from pytest_kimiperf.deployments import TINY_CPU
from pytest_kimiperf.fingerprint import Fingerprint
from pytest_kimiperf.gate import BaselineView, strip_profile
from pytest_kimiperf.metric_specs import Direction
from pytest_kimiperf.metrics import RequestRecord, RoundResult, RunResult, merge_rounds
from pytest_kimiperf.recorder import PerfRecorder
from pytest_kimiperf.server import ServerHandle

SCENARIO = scenarios.SingleStream(prompt_tokens=8, output_tokens=65, requests=8, max_rounds=4)
FP = Fingerprint(hard={"gpu.count": "0", "cpu.model": "test", "cpu.cores": "2"}, soft={})


def _run(tok_s: list[float], name: str = SCENARIO.scenario_name) -> RunResult:
    """A run whose requests decode at exactly the given rates (64 gaps each)."""
    records = []
    t = 0
    for rate in tok_s:
        gap_ns = int(1e9 / rate)
        chunks = tuple(t + 10_000_000 + i * gap_ns for i in range(65))
        records.append(RequestRecord(ok=True, error="", prompt_tokens=8, output_tokens=65, t_send_ns=t,
                                     chunk_ns=chunks, t_done_ns=chunks[-1]))
        t = chunks[-1] + 1_000_000
    return RunResult(scenario_name=name, rounds=(RoundResult(records=tuple(records), wall_s=t / 1e9),))


def _recorder(tmp_path: Path, failures: list[str], published: list[Any]) -> PerfRecorder:
    view = BaselineView(tmp_path, "tiny-cpu", FP)
    settings = SimpleNamespace(deployment=TINY_CPU, perf_strict=False)
    server = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="default",
                          log_path=None)

    def fail(message: str) -> None:
        failures.append(message)
        raise AssertionError(message)

    return PerfRecorder(nodeid="t.py::test[default]", test="t.py::test", server=server, settings=settings,
                        profile_env={}, view=view, ensure_alive=lambda: None, publish=published.append, fail=fail)


def _record_baseline(tmp_path: Path, samples: list[float], fingerprint: Fingerprint = FP) -> None:
    entry = baselines.make_entry(test="t.py::test", profile="default", metric="decode_tok_s", unit="tok/s",
                                 direction=Direction.HIGHER_IS_BETTER, samples=samples, git_commit=None,
                                 profile_env={})
    path = baselines.baseline_path(tmp_path, "tiny-cpu", fingerprint.key)
    baselines.update_baseline(path, "tiny-cpu", fingerprint, [entry])


def test_inconclusive_comparison_takes_more_rounds_until_settled(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    _record_baseline(tmp_path, list(700 * rng.lognormal(0, 0.02, 40)))
    noisy = _run(list(700 * rng.lognormal(0, 0.5, 8)))  # too wide to settle within +/-25%
    calm = [_run(list(700 * rng.lognormal(0, 0.02, 8))) for _ in range(3)]
    calls: list[int] = []

    def fake_extend(base_url: str, model: str, scenario: Any, previous: RunResult, **kw: Any) -> RunResult:
        calls.append(len(previous.rounds))
        return merge_rounds(previous, calm[len(calls) - 1])

    def fake_run_scenario(base_url: str, model: str, scenario: Any, **kw: Any) -> RunResult:
        played.append(kw)
        return noisy

    played: list[dict[str, Any]] = []
    monkeypatch.setattr(scenarios, "extend", fake_extend)
    monkeypatch.setattr(scenarios, "run_scenario", fake_run_scenario)
    failures: list[str] = []
    published: list[Any] = []
    recorder = _recorder(tmp_path, failures, published)
    run = recorder.measure(SCENARIO, endpoint="chat", server_metrics=False)
    assert played == [{"api_key": None, "endpoint": "chat", "server_metrics": False, "extra_body": None}]
    extended_with: list[dict[str, Any]] = []
    monkeypatch.setattr(scenarios, "extend", lambda *a, **kw: extended_with.append(kw) or fake_extend(*a, **kw))
    result = recorder.check(run, ["decode_tok_s"])
    assert calls, "an inconclusive comparison was not given more samples"
    # the extra rounds are played the way the test asked for the first ones
    assert {(kw["endpoint"], kw["server_metrics"]) for kw in extended_with} == {("chat", False)}
    assert result.metrics["decode_tok_s"].baseline["verdict"] == "no significant change"
    assert len(result.metrics["decode_tok_s"].samples) == 8 * (1 + len(calls))
    assert any("extended from 1" in m for m in result.messages)
    assert not failures


def test_extension_stops_at_max_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(2)
    _record_baseline(tmp_path, list(700 * rng.lognormal(0, 0.02, 40)))
    wild = [_run(list(700 * rng.lognormal(0, 0.6, 8))) for _ in range(5)]
    calls: list[int] = []

    def fake_extend(base_url: str, model: str, scenario: Any, previous: RunResult, **kw: Any) -> RunResult:
        calls.append(1)
        return merge_rounds(previous, wild[len(calls)])

    monkeypatch.setattr(scenarios, "extend", fake_extend)
    recorder = _recorder(tmp_path, [], [])
    recorder._scenario_of[id(wild[0])] = (SCENARIO, {})
    result = recorder.check(wild[0], ["decode_tok_s"])
    assert len(calls) <= SCENARIO.max_rounds - 1
    assert result.metrics["decode_tok_s"].baseline["verdict"] in ("inconclusive", "no significant change")


def test_a_clear_regression_fails_with_the_one_line_verdict(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    _record_baseline(tmp_path, list(700 * rng.lognormal(0, 0.02, 20)))
    failures: list[str] = []
    recorder = _recorder(tmp_path, failures, [])
    with pytest.raises(AssertionError):
        recorder.check(_run(list(500 * rng.lognormal(0, 0.02, 20))), ["decode_tok_s"])
    assert len(failures) == 1 and "REGRESSION" in failures[0] and "\n" not in failures[0]


def test_below_floor_fails_between_floor_and_target_warns(tmp_path: Path) -> None:
    failures: list[str] = []
    published: list[Any] = []
    recorder = _recorder(tmp_path, failures, published)
    with pytest.raises(AssertionError):
        recorder.check(_run([250.0] * 8), ["decode_tok_s"], floor=True)
    assert "below the floor of 300" in failures[0]
    result = _recorder(tmp_path, failures, published).check(_run([450.0] * 8), ["decode_tok_s"], floor=True)
    assert any("below the target of 600" in w for w in result.warnings)


@pytest.mark.parametrize(("nodeid", "profile", "key"), [
    ("t.py::test_x[ring-ll]", "ring-ll", "t.py::test_x"),
    ("t.py::test_x[ring-ll-8]", "ring-ll", "t.py::test_x[8]"),
    ("t.py::test_x[8-ring-ll]", "ring-ll", "t.py::test_x[8]"),
    ("t.py::test_x[a-default-b]", "default", "t.py::test_x[a-b]"),
])
def test_baseline_key_drops_only_the_profile(nodeid: str, profile: str, key: str) -> None:
    assert strip_profile(nodeid, profile) == key


def test_corrupt_baseline_fails_the_test_with_its_message_not_a_traceback(tmp_path: Path) -> None:
    path = baselines.baseline_path(tmp_path, "tiny-cpu", FP.key)
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    failures: list[str] = []
    with pytest.raises(AssertionError):
        _recorder(tmp_path, failures, []).check(_run([700.0] * 8), ["decode_tok_s"])
    assert len(failures) == 1 and str(path) in failures[0]
    assert path.read_text() == "{ not json", "the corrupt file was touched"


def test_insufficient_samples_pass_with_a_warning(tmp_path: Path) -> None:
    _record_baseline(tmp_path, [700.0, 701.0, 699.0])
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_run([700.0] * 8), ["decode_tok_s"])
    assert not failures
    assert result.metrics["decode_tok_s"].baseline["verdict"] == "insufficient samples"
    assert any("insufficient samples" in w for w in result.warnings)


def test_other_hardwares_baseline_is_shown_as_not_comparable_never_judged(tmp_path: Path) -> None:
    other = Fingerprint(hard={**FP.hard, "cpu.cores": "64"}, soft={})
    _record_baseline(tmp_path, [1400.0 + i for i in range(10)], fingerprint=other)
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_run([700.0 + i for i in range(8)]), ["decode_tok_s"])
    assert not failures, "a baseline from other hardware failed the test"
    metric = result.metrics["decode_tok_s"]
    assert metric.baseline["verdict"] == "not comparable"
    assert metric.baseline["change"] == pytest.approx(-0.5, abs=0.01)
    assert f"recorded on other hardware ({other.key}: cpu.cores: 64 -> 2)" in metric.baseline_message
    assert f"no baseline for this hardware ({FP.key}): run --update-baselines" in metric.baseline_message
    assert any("not comparable" in w for w in result.warnings)


def test_soft_facts_that_differ_only_warn(tmp_path: Path) -> None:
    recorded = Fingerprint(hard=FP.hard, soft={"host.name": "gpu-runner-1", "kernel": "6.8.0"})
    _record_baseline(tmp_path, [700.0 + i for i in range(10)], fingerprint=recorded)
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_run([700.0 + i for i in range(8)]), ["decode_tok_s"])
    assert not failures
    assert result.metrics["decode_tok_s"].baseline["verdict"] == "no significant change"
    assert [w for w in result.warnings if "soft facts" in w] == [
        "the baseline was recorded with other soft facts (they only warn; the hardware and software "
        "that set speed match): host.name: gpu-runner-1 -> <absent>; kernel: 6.8.0 -> <absent>"]


def _with_failures(run: RunResult, n: int) -> RunResult:
    bad = RequestRecord(ok=False, error="HTTP 500", prompt_tokens=8, output_tokens=0, t_send_ns=0,
                        chunk_ns=(), t_done_ns=1)
    rnd = run.rounds[0]
    return RunResult(scenario_name=run.scenario_name,
                     rounds=(RoundResult(records=rnd.records + (bad,) * n, wall_s=rnd.wall_s),))


def test_a_few_failed_requests_warn_and_many_fail_the_test(tmp_path: Path) -> None:
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_with_failures(_run([700.0] * 19), 1), ["decode_tok_s"])
    assert not failures
    assert "1 of 20 measured requests failed and are not counted (1x HTTP 500)" in result.warnings
    with pytest.raises(AssertionError):
        _recorder(tmp_path, failures, []).check(_with_failures(_run([700.0] * 17), 3), ["decode_tok_s"])
    assert failures == ["3 of 20 measured requests failed and are not counted (3x HTTP 500): more than 10% "
                        "failed, the server did not serve this load"]
