"""One budget for every sign a run states, whatever the number of comparisons it makes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.gate import RUN_ALPHA, decide_family, family_critical, holm, sign_p
from pytest_kimiperf.judge.stats import VerdictKind, compare_boots


def test_the_critical_value_grows_with_the_family_and_holds_the_runs_budget() -> None:
    # Either sign spends the budget (a REGRESSION, an IMPROVEMENT, a change with its size
    # unresolved): each side of each comparison gets alpha / 2m.
    assert family_critical(1) == pytest.approx(scipy_stats.norm.isf(0.005))
    assert family_critical(24) == pytest.approx(scipy_stats.norm.isf(0.01 / 48))
    assert family_critical(12) < family_critical(24) < family_critical(100)
    # m comparisons, either way at alpha/2m each: the run's chance of any sign, independent, below alpha.
    for m in (1, 12, 24, 200):
        assert 1 - (1 - 2 * scipy_stats.norm.sf(family_critical(m))) ** m <= RUN_ALPHA + 1e-12
    with pytest.raises(ValueError, match="at least one"):
        family_critical(0)


def test_holm_steps_down_and_stops_at_the_first_kept() -> None:
    # alpha 0.05, m 4: thresholds 0.0125, 0.0167, 0.025, 0.05.
    assert holm([0.01, 0.04, 0.015, 0.2], 0.05) == [True, False, True, False]
    assert holm([0.013, 0.001], 0.05) == [True, True]
    assert holm([0.02, 0.02, 0.02], 0.05) == [False, False, False]
    assert holm([math.nan, 0.001], 0.05) == [False, True]


def test_holm_keeps_the_runs_false_alarm_rate_at_its_level_whatever_the_families_size() -> None:
    rng = np.random.default_rng(46)
    for m in (2, 24, 100):
        alarms = sum(any(holm(list(rng.uniform(size=m)), 0.05)) for _ in range(4000))
        assert alarms / 4000 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 4000)


def boots(*medians: float, session: str) -> list[BootSummary]:
    return [BootSummary(median=m, n=20, se_log=0.002, session=session) for m in medians]


def test_a_family_keeps_a_clear_regression_and_drops_a_marginal_one() -> None:
    reference = boots(100.0, 100.5, 99.5, 100.2, 99.8, session="then")
    clear = compare_boots(boots(80.0, 80.4, session="now"), reference, direction=Direction.HIGHER_IS_BETTER,
                          tolerance=0.03, prior_spread=0.01, critical=2.0)
    # 2.4 standard errors at a 2% spread: a regression at 2.0, not among 24 comparisons at 1%.
    marginal = compare_boots(boots(96.0, 96.1, session="now"), reference, direction=Direction.HIGHER_IS_BETTER,
                             tolerance=0.03, prior_spread=0.02, critical=2.0)
    assert clear.verdict is marginal.verdict is VerdictKind.REGRESSION
    assert sign_p(clear) < sign_p(marginal)
    quiet = [compare_boots(boots(100.1, 99.9, session="now"), reference, direction=Direction.HIGHER_IS_BETTER,
                           tolerance=0.03, prior_spread=0.01) for _ in range(22)]
    decided = decide_family([clear, marginal, *quiet])
    assert decided[0].verdict is VerdictKind.REGRESSION
    # The marginal one keeps no sign at all: its estimate is beyond the tolerance, so "inconclusive".
    assert decided[1].verdict is VerdictKind.INCONCLUSIVE
    assert [c.verdict for c in decided[2:]] == [c.verdict for c in quiet]


def test_a_family_takes_the_sign_from_a_change_with_its_size_unresolved_it_does_not_keep() -> None:
    reference = boots(100.0, 100.5, 99.5, 100.2, 99.8, session="then")
    # -2.1%: the bounds at 2.0 standard errors exclude zero, the 90% interval crosses the 3% tolerance.
    small = compare_boots(boots(97.8, 97.9, session="now"), reference, direction=Direction.HIGHER_IS_BETTER,
                          tolerance=0.03, prior_spread=0.01, critical=2.0)
    assert small.verdict is VerdictKind.CHANGED_SIZE_UNRESOLVED
    quiet = [compare_boots(boots(100.1, 99.9, session="now"), reference, direction=Direction.HIGHER_IS_BETTER,
                           tolerance=0.03, prior_spread=0.01) for _ in range(200)]
    assert decide_family([small, *quiet])[0].verdict is VerdictKind.NO_DETECTABLE_CHANGE
    assert decide_family([small], 0.05)[0].verdict is VerdictKind.CHANGED_SIZE_UNRESOLVED


def test_the_gate_applies_the_runs_family_critical_value() -> None:
    from pytest_kimiperf.config.deployments import Spreads
    from pytest_kimiperf.judge.gate import GateRules
    from pytest_kimiperf.judge.history import compare_with_history

    rules = GateRules({"decode_tok_s": 0.03}, 0.0, 0.0, Spreads(0.02), family=24)
    assert rules.critical == pytest.approx(family_critical(24)) and GateRules({}, 0.0, 0.0, Spreads(0.02)).critical is None
    reference = boots(100.0, 100.5, 99.5, 100.2, 99.8, session="then")
    current = boots(96.0, 96.1, session="now")
    alone = compare_with_history(current, reference, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                 spreads=Spreads(0.02), critical=2.0)
    run = compare_with_history(current, reference, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                               spreads=Spreads(0.02), critical=rules.critical)
    assert alone.verdict is VerdictKind.REGRESSION and run.verdict is not VerdictKind.REGRESSION
    assert run.confidence == pytest.approx(1 - 0.01 / 48)


def test_each_kind_of_load_has_its_primary_metric_and_a_test_without_it_takes_its_first() -> None:
    from pytest_kimiperf.config.metric_specs import METRICS, PRIMARY_METRICS, primary_metric

    assert all(metric in METRICS for metric in PRIMARY_METRICS.values())
    assert primary_metric("single-stream", ["itl_ms", "decode_tok_s", "p99_itl_ms"]) == "decode_tok_s"
    assert primary_metric("concurrency", ["ttft_ms", "e2el_ms"]) == "ttft_ms"
    with pytest.raises(ValueError, match="no primary metric"):
        primary_metric("single-stream", [])


def test_each_boot_on_demand_is_one_more_look_the_runs_budget_is_split_over() -> None:
    from pytest_kimiperf.config.deployments import Spreads
    from pytest_kimiperf.judge.gate import GateRules

    planned = GateRules({}, 0.0, 0.0, Spreads(0.02), boots=2, max_boots=2, family=24)
    on_demand = GateRules({}, 0.0, 0.0, Spreads(0.02), boots=1, max_boots=3, family=24)
    assert planned.looks == 1 and on_demand.looks == 3
    assert planned.critical == pytest.approx(family_critical(24))
    assert on_demand.critical == pytest.approx(family_critical(72))


def test_the_family_is_the_stored_entries_of_the_tests_and_profiles_the_run_collected() -> None:
    from pytest_kimiperf.judge.gate import family_size

    entries = [("t.py::a", "default", "decode_tok_s"), ("t.py::a", "default", "itl_ms"),
               ("t.py::a", "ring-ll", "decode_tok_s"), ("t.py::b", "default", "ttft_ms")]
    assert family_size(entries, {("t.py::a", "default"), ("t.py::a", "ring-ll")}) == 3
    assert family_size(entries, {("t.py::b", "default"), ("t.py::c", "default")}) == 1
    # A run that collected nothing stored compares nothing: no family, the gate's default.
    assert family_size(entries, {("t.py::c", "default")}) is None and family_size([], {("t.py::a", "default")}) is None


def test_the_plan_asks_for_the_boots_the_runs_own_critical_value_needs() -> None:
    from pytest_kimiperf.judge.noise import boots_needed, critical_of, plan
    from pytest_kimiperf.judge.stats import GATE_CRITICAL

    cur = [BootSummary(median=m, n=20, se_log=0.002, session="now") for m in (97.0, 98.5)]
    ref = [BootSummary(median=100.0 + (i % 3 - 1), n=20, se_log=0.002, session="old") for i in range(20)]
    plans = {}
    for critical in (None, family_critical(200)):
        c = compare_boots(cur, ref, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, prior_spread=0.02,
                          critical=critical)
        assert critical_of(c) == pytest.approx(GATE_CRITICAL if critical is None else critical)
        p = plan(c)
        assert p is not None and p.boots is not None
        assert p.boots == boots_needed(0.06, math.expm1(c.spread_sd_log), tolerance=0.03,
                                       reference_boots=c.boots_reference, critical=critical_of(c))
        plans[critical is None] = p.boots
    # A run of 200 comparisons convicts at a stricter level: its plan asks for more boots.
    assert plans[False] > plans[True]
