"""The rules plugin.py forwards to: boot order of the collected tests, whether a run asked for
perf settings, the kimiperf marker's arguments and the missing-baseline failure."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_kimiperf.config.deployment_tables import marker_tolerances
from pytest_kimiperf.config.options import perf_run_requested
from pytest_kimiperf.config.settings import RawOption
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge.stats import BootSlot, group_by_slot, schedule
from pytest_kimiperf.judge.gate import PerfOutcome, decide_test
from pytest_kimiperf.reports.sentences import note_text
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, MetricResult, TestResult


@dataclass(frozen=True)
class Profile:
    name: str


@dataclass
class Item:
    name: str
    slot: BootSlot | None


def test_each_slots_tests_run_together_in_the_schedules_order_the_rest_stays_put() -> None:
    a, b = Profile("a"), Profile("b")
    order = schedule([a, b], 2)  # a b b-boot2 a-boot2
    assert [s.id for s in order] == ["a", "b", "b-boot2", "a-boot2"]
    slot = {s.id: s for s in order}
    items = [Item("x1", slot["a-boot2"]), Item("plain", None), Item("y1", slot["b"]),
             Item("x2", slot["a"]), Item("y2", slot["b-boot2"]), Item("x3", slot["a"])]
    group_by_slot(items, lambda item: item.slot, order)
    assert [i.name for i in items] == ["x2", "plain", "x3", "y1", "y2", "x1"]


def test_only_a_kimiperf_setting_counts_as_asking_for_a_perf_run() -> None:
    default = {"deployment": RawOption("tiny-cpu", "default")}
    assert not perf_run_requested(default)
    assert not perf_run_requested({**default, "api_key": RawOption("k", "environment variable VLLM_API_KEY")})
    assert perf_run_requested({**default, "boots": RawOption("3", "environment variable KIMIPERF_BOOTS")})
    assert perf_run_requested({**default, "boots": RawOption("3", "command line --kimiperf-boots")})
    assert perf_run_requested({**default, "boots": RawOption("3", "ini option kimiperf_boots")})


def test_the_marker_takes_only_known_tolerances() -> None:
    where = "@pytest.mark.kimiperf on t.py::test_x"
    assert marker_tolerances((), {}, where) == {}
    assert marker_tolerances((), {"tolerances": {"decode_tok_s": 0.05}}, where) == {"decode_tok_s": 0.05}
    with pytest.raises(ConfigError, match=r"t.py::test_x: takes only tolerances=\{metric: fraction\}, got 0.1, tol"):
        marker_tolerances((0.1,), {"tol": 1}, where)
    with pytest.raises(ConfigError, match="unknown metric 'decode'; known: "):
        marker_tolerances((), {"tolerances": {"decode": 0.05}}, where)


def _result(line: BaselineLine | None) -> TestResult:
    metric = MetricResult(metric="decode_tok_s", unit="tok/s", direction="higher", tolerance=0.05,
                          samples=[1.0], baseline_line=line)
    return TestResult(test="t.py::test_x", nodeid="t.py::test_x[default]", profile="default",
                      deployment="tiny-cpu", scenario="single", metrics={"decode_tok_s": metric})


def test_a_missing_baseline_fails_only_when_asked_and_the_failure_is_kept() -> None:
    missing = BaselineLine(BaselineState.MISSING, "decode tok/s", fingerprint="fingerprint abc")
    warned = _result(missing)
    assert decide_test(warned, missing_baseline_fails=False) is PerfOutcome.PASSED and warned.failures == []
    judged = _result(BaselineLine(BaselineState.JUDGED, "decode tok/s"))
    assert decide_test(judged, missing_baseline_fails=True) is PerfOutcome.PASSED and judged.failures == []
    result = _result(missing)
    assert decide_test(result, missing_baseline_fails=True) is PerfOutcome.FAILED
    [failure] = result.failures
    assert note_text(failure) == (
        "missing baseline (--kimiperf-missing-baseline=fail): decode tok/s: no baseline for this "
        "hardware (fingerprint abc): run --kimiperf-update-baselines (it records this run's figures as the new "
        "baseline: review the diff)")
