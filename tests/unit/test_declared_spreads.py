"""Declared spreads held at their degrees of freedom (issue 46, item 6).

A declaration is a prior worth ``*_spread_df`` degrees of freedom, pooled with what the history
measures (stats.pooled_variance), and the gate's critical value is Student's t at the
difference's effective df (stats.critical_at). What must hold for every input: declaring more df
never widens an interval on the same data, and infinite df is the exact rule (the declared
variances, normal critical values).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import DEFAULT_LEVEL_SPREAD_DF, Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.history import compare_with_history
from pytest_kimiperf.judge.noise import history_level, level_terms
from pytest_kimiperf.judge.notes import HistoryModes, SpreadSource
from pytest_kimiperf.judge.noise import design_critical, sessions_of_history
from pytest_kimiperf.judge.stats import EQUIVALENCE_CONFIDENCE, GATE_CRITICAL
from pytest_kimiperf.judge.stats import critical_at, pooled_variance
from tests.unit.test_verdict_invariants import PROPERTY, GateCase, boot, gate_cases

dfs = st.sampled_from([1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0, math.inf])


def _widths(case: GateCase, spreads: Spreads) -> tuple[float, float] | None:
    """The log widths of the gate's bounds and of its equivalence interval; None where the
    history is judged per spawn mode (the verdict then picks one of several readings, each
    with its own interval: that choice is test_verdict_invariants' to check)."""
    c = compare_with_history(list(case.current), list(case.history), direction=case.direction,
                             tolerance=case.tolerance, spreads=spreads, segment=False)
    if any(isinstance(n, HistoryModes) for n in c.notes):
        return None
    return (math.log1p(c.bound_high) - math.log1p(c.bound_low), math.log1p(c.ci_high) - math.log1p(c.ci_low))


@PROPERTY
@given(gate_cases(), dfs, dfs, st.sampled_from(["boot_df", "session_df", "host_df", "all"]))
def test_declaring_more_df_never_widens_the_interval_on_the_same_data(case: GateCase, a: float, b: float,
                                                                       which: str) -> None:
    fewer, more = sorted((a, b))
    names = ("boot_df", "session_df", "host_df") if which == "all" else (which,)
    loose = replace(case.spreads, **{n: fewer for n in names})
    sure = replace(case.spreads, **{n: more for n in names})
    widths_loose, widths_sure = _widths(case, loose), _widths(case, sure)
    if widths_loose is None or widths_sure is None:
        return
    (bound_loose, ci_loose), (bound_sure, ci_sure) = widths_loose, widths_sure
    assert bound_sure <= bound_loose * (1 + 1e-9) + 1e-12
    assert ci_sure <= ci_loose * (1 + 1e-9) + 1e-12


@PROPERTY
@given(gate_cases())
def test_infinite_df_is_the_exact_rule(case: GateCase) -> None:
    """Every declaration exact: the variance is the declared one (boots' own error of the median
    added) at each level the sides do not share, and the critical values are normal."""
    spreads = replace(case.spreads, boot_df=math.inf, session_df=math.inf, host_df=math.inf)
    current, history = list(case.current), list(case.history)
    c = compare_with_history(current, history, direction=case.direction, tolerance=case.tolerance,
                             spreads=spreads, segment=False)
    if any(isinstance(n, HistoryModes) for n in c.notes):
        return  # a history judged per spawn mode is aligned first; its figures are another design's
    within = sum(b.se_log ** 2 for b in (*current, *history)) / (len(current) + len(history))
    boot_var = (math.log1p(spreads.boot) ** 2 + within) * (1 / len(current) + 1 / len(history))
    terms = level_terms(current, history, spreads=spreads)
    assert all(t.df == math.inf for t in terms)
    assert all(t.var_log == pytest.approx(math.log1p(dict(spreads.by_level())[t.name]) ** 2 * t.weight) for t in terms)
    se = math.sqrt(boot_var + sum(t.var_log for t in terms))
    assert c.se_log == pytest.approx(se, rel=1e-9)
    d = math.log1p(c.change)
    assert math.log1p(c.bound_high) == pytest.approx(d + GATE_CRITICAL * se, rel=1e-9, abs=1e-12)
    z_eq = float(scipy_stats.norm.ppf(1 - (1 - EQUIVALENCE_CONFIDENCE) / 2))
    assert math.log1p(c.ci_high) == pytest.approx(d + z_eq * se, rel=1e-9, abs=1e-12)


def test_the_pooled_variance_moves_from_the_declaration_toward_what_is_measured() -> None:
    # 3 df declared at 1e-4, 6 df measured at 4e-4 a df: (3e-4 + 24e-4) / 9 = 3e-4 on 9 df
    assert pooled_variance(1e-4, 3.0, 24e-4, 6.0) == (pytest.approx(3e-4), 9.0)
    # measured below the declaration: the declaration is the floor, the df still add up
    assert pooled_variance(1e-4, 3.0, 1e-5, 6.0) == (1e-4, 9.0)
    # exact: the data cannot move it
    assert pooled_variance(1e-4, math.inf, 24e-4, 6.0) == (1e-4, math.inf)


def test_the_critical_value_keeps_the_normal_tail_at_the_df() -> None:
    assert critical_at(GATE_CRITICAL, math.inf) == GATE_CRITICAL
    for df in (3.0, 10.0, 40.0):
        t = critical_at(GATE_CRITICAL, df)
        assert scipy_stats.t.sf(t, df) == pytest.approx(scipy_stats.norm.sf(GATE_CRITICAL))
    assert critical_at(GATE_CRITICAL, 3.0) > critical_at(GATE_CRITICAL, 10.0) > critical_at(GATE_CRITICAL, 40.0)


def test_a_session_spread_twice_the_declaration_is_pulled_up_by_the_history() -> None:
    # Five sessions about 2% apart (SD), the session spread declared 1% at 10 df: the level used
    # lies between the declaration and what the sessions show, on 10 + 4 df.
    offsets = [0.0, 0.025, -0.02, 0.015, -0.03]
    history = [boot(100 * math.exp(o + e), f"s{i}", "h") for i, o in enumerate(offsets) for e in (0.0, 0.002)]
    level = history_level(history, "session", 0.01, boot_var=0.0001, declared_df=DEFAULT_LEVEL_SPREAD_DF)
    exact = history_level(history, "session", 0.01, boot_var=0.0001, declared_df=math.inf)
    measured = history_level(history, "session", 0.01, boot_var=0.0001, declared_df=1.0)
    assert exact.sd_log == pytest.approx(math.log1p(0.01)) and exact.df == math.inf
    assert exact.source.how == SpreadSource.DECLARED
    assert math.log1p(0.01) < level.sd_log < measured.sd_log and level.df == 10 + 4
    assert level.source.how == SpreadSource.MEASURED


def test_a_one_session_history_widens_the_gate_by_the_declarations_df() -> None:
    # One session of history: nothing measures the session level, so its declaration at 10 df
    # is all the comparison knows of it, and the bounds are Student's, not normal.
    history = [boot(100.0 + 0.1 * i, "old", "h") for i in range(5)]
    current = [boot(93.0, "now", "h"), boot(93.2, "now", "h")]
    spreads = Spreads(0.01, 0.01, 0.02)

    def width(s: Spreads) -> float:
        c = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, spreads=s)
        return math.log1p(c.bound_high) - math.log1p(c.bound_low)

    exact = width(replace(spreads, boot_df=math.inf, session_df=math.inf))
    assert width(spreads) > exact
    assert width(replace(spreads, session_df=100.0)) < width(spreads)


def test_the_plan_asks_for_the_history_the_t_rule_needs() -> None:
    # Boot 1%, session 1%, tolerance 3%, a 6% regression, 2 boots a run against 3 sessions x 2
    # boots: 11 sessions with every declaration exact (the normal rule), 79 with the boot
    # declared at 3 df and the session at 10 (two boots of one run measure 1 df of the boot
    # level), 15 with a third boot.
    args = dict(reference_boots=6, sessions=3, tolerance=0.03, goal=0.06)
    assert sessions_of_history(0.01, 0.01, 2, **args) == 11
    assert sessions_of_history(0.01, 0.01, 2, **args, boot_df=3.0, session_df=10.0) == 79
    assert sessions_of_history(0.01, 0.01, 3, **args, boot_df=3.0, session_df=10.0) == 15
    assert design_critical(1e-4, math.inf, [(1e-4, math.inf)]) == GATE_CRITICAL
