"""Boots on demand (judge/profiles.py): the spending functions, their exact boundaries, and
the rule that stops or books, with the properties every session's booking must keep."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.profiles import IN_SESSION_ALPHA, InSessionRules, compare_in_session
from pytest_kimiperf.judge.notes import BootsForWithin
from pytest_kimiperf.judge.profiles import LookStep, next_step, profiles_to_book, session_plan
from pytest_kimiperf.judge.profiles import OBRIEN_FLEMING, POCOCK, SequentialPlan, boundaries, spent
from pytest_kimiperf.judge.stats import VerdictLeaning, VerdictKind, band_log, leaning
from pytest_kimiperf.reports.sentences import note_text
from tests.helpers import BENCHMARKS
from tests.unit.test_verdict_invariants import EXAMPLES, FRESH

HIGHER = Direction.HIGHER_IS_BETTER
KIMI = InSessionRules(boot_spread=0.01, boot_spread_df=3.0)
# As many examples as the verdict invariants, the same every run (test_verdict_invariants.EXAMPLES).
PROPERTY = settings(max_examples=EXAMPLES, derandomize=not FRESH, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def boots(*figures: float) -> list[BootSummary]:
    return [BootSummary(median=f, n=20, se_log=0.003) for f in figures]


# -- the spending functions and their boundaries ----------------------------------------------

def test_obrien_fleming_boundaries_are_the_published_ones() -> None:
    # Five equally spaced looks, one-sided 2.5%, Lan-DeMets O'Brien-Fleming spending: the
    # upper bounds gsDesign prints for gsDesign(k=5, test.type=1, sfu=sfLDOF).
    got = boundaries(0.025, (0.2, 0.4, 0.6, 0.8, 1.0), OBRIEN_FLEMING)
    assert got == pytest.approx((4.8769, 3.3569, 2.6803, 2.2898, 2.0310), abs=1e-3)


@pytest.mark.parametrize("shape", [OBRIEN_FLEMING, POCOCK])
def test_each_look_is_crossed_first_exactly_as_often_as_the_budget_it_spends(shape: str) -> None:
    # An independent check of the recursion: Brownian paths under the null, seeded.
    fractions = (2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0)
    critical = np.array(boundaries(0.05, fractions, shape))
    rng = np.random.default_rng(46)
    steps = np.diff((0.0, *fractions))
    score = np.cumsum(rng.normal(0.0, np.sqrt(steps), size=(200_000, len(fractions))), axis=1)
    crossed = score / np.sqrt(fractions) >= critical
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    budget = np.diff((0.0, *(spent(0.05, t, shape) for t in fractions)))
    for look, share in enumerate(budget):
        assert np.mean(first == look) == pytest.approx(share, abs=4 * math.sqrt(share / 200_000) + 1e-4)
    assert np.mean(first >= 0) == pytest.approx(0.05, abs=0.002)


def test_a_single_look_spends_the_whole_budget_at_the_fixed_sample_level() -> None:
    assert SequentialPlan(2, 2).level(0.05, 2, POCOCK) == pytest.approx(0.05)
    assert SequentialPlan(3, 3).level(IN_SESSION_ALPHA, 3, OBRIEN_FLEMING) == pytest.approx(IN_SESSION_ALPHA)


@given(st.integers(1, 4), st.integers(0, 6), st.sampled_from([OBRIEN_FLEMING, POCOCK]),
       st.sampled_from([0.005, 0.05]))
@PROPERTY
def test_a_looks_level_is_never_above_the_budget_spent_by_then(start: int, extra: int, shape: str, alpha: float) -> None:
    plan = SequentialPlan(start, start + extra)
    for k in range(start, start + extra + 1):
        assert plan.level(alpha, k, shape) <= spent(alpha, k / plan.cap, shape) * (1 + 1e-6)


def test_bad_input_names_the_value_and_what_is_allowed() -> None:
    with pytest.raises(ValueError, match=r"start=3, cap=2: use 1 <= start <= cap"):
        SequentialPlan(3, 2)
    with pytest.raises(ValueError, match=r"spending shape 'linear'; allowed: obrien-fleming, pocock"):
        SequentialPlan(2, 6, equivalence_shape="linear")
    with pytest.raises(ValueError, match=r"fraction=1.5"):
        spent(0.05, 1.5, POCOCK)
    with pytest.raises(ValueError, match=r"alpha=0.7"):
        spent(0.7, 0.5, POCOCK)
    with pytest.raises(ValueError, match=r"increasing"):
        boundaries(0.05, (0.5, 0.5), POCOCK)


# -- the rule a session follows ------------------------------------------------------------

def _planned(plan: SequentialPlan) -> InSessionRules:
    return replace(KIMI, plan=plan)


def test_a_profile_within_tolerance_stops_at_the_first_look_that_shows_it() -> None:
    plan = SequentialPlan(2, 6)
    c = compare_in_session(boots(100.2, 100.1), boots(100.0, 100.1), direction=HIGHER, tolerance=0.03,
                           rules=_planned(plan))
    assert c.verdict is VerdictKind.WITHIN_TOLERANCE
    assert next_step(c, plan).step is LookStep.STOP


def test_an_undecided_look_books_one_more_boot_a_side_until_the_cap() -> None:
    plan = SequentialPlan(2, 3)
    cur, ref = boots(101.2, 101.7), boots(100.0, 100.5)
    c = compare_in_session(cur, ref, direction=HIGHER, tolerance=0.03, rules=_planned(plan))
    assert c.verdict is VerdictKind.NO_DETECTABLE_CHANGE
    assert not c.notes  # an early look: the session books, no advice yet
    assert (next_step(c, plan).step, next_step(c, plan).boots) == (LookStep.BOOK, 2)
    c3 = compare_in_session(cur + boots(103.0), ref + boots(99.0), direction=HIGHER, tolerance=0.03,
                            rules=_planned(plan))
    # Its 90% interval excludes zero, its bounds at the sign's level do not: no sign, and no more boots.
    assert c3.verdict is VerdictKind.NO_DETECTABLE_CHANGE and c3.ci_low > 0 > c3.bound_low
    assert (next_step(c3, plan).step, next_step(c3, plan).why) == (LookStep.STOP, "cap")


def test_a_fixed_budget_of_two_says_how_many_more_boots_would_decide() -> None:
    # Two boots a side 1.2% apart at the declared 1% boot spread are not yet shown within +/-3%
    # at the 5% TOST; 6 a side (4 more) would, with 90% power, were the change 1.2%.
    c = compare_in_session(boots(101.2, 101.2), boots(100.0, 100.0), direction=HIGHER, tolerance=0.03,
                           rules=_planned(SequentialPlan(2, 2)))
    assert c.verdict is VerdictKind.NO_DETECTABLE_CHANGE
    note = next(n for n in c.notes if isinstance(n, BootsForWithin))
    assert note == BootsForWithin(6, 2, 8)
    assert note_text(note) == ("4 more boots a side (6 in all, --kimiperf-boots 6) would show it within the tolerance, "
                         "with 90% power")
    # Too near the band's edge for any number of boots the planner looks at.
    edge = compare_in_session(boots(102.6, 102.6), boots(100.0, 100.0), direction=HIGHER, tolerance=0.03, rules=KIMI)
    assert BootsForWithin(None, 2, 8) in edge.notes


def test_booking_on_demand_judges_the_first_look_more_strictly_than_a_fixed_budget() -> None:
    # Two boots a side 5% apart: a fixed budget of 2 convicts at IN_SESSION_ALPHA; a session that
    # may book up to 6 spends almost none of its budget at its first look, and books instead.
    cur, ref = boots(92.0, 92.2), boots(100.0, 100.1)
    fixed = compare_in_session(cur, ref, direction=HIGHER, tolerance=0.03, rules=_planned(SequentialPlan(2, 2)))
    first = compare_in_session(cur, ref, direction=HIGHER, tolerance=0.03, rules=_planned(SequentialPlan(2, 6)))
    assert fixed.verdict is VerdictKind.REGRESSION
    assert first.verdict is not VerdictKind.REGRESSION
    assert next_step(first, SequentialPlan(2, 6)).step is LookStep.BOOK


# -- properties ------------------------------------------------------------------------------

@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[BootSummary], list[BootSummary], SequentialPlan, float]:
    start = draw(st.integers(1, 3))
    cap = draw(st.integers(start, 7))
    shift = draw(st.floats(-0.15, 0.15))
    spread = draw(st.floats(0.0, 0.05))

    def side(level: float) -> list[BootSummary]:
        return boots(*(100.0 * math.exp(level + draw(st.floats(-spread, spread))) for _ in range(cap)))

    return side(shift), side(0.0), SequentialPlan(start, cap), draw(st.floats(0.01, 0.1))


@PROPERTY
@given(sessions())
def test_a_session_stops_no_later_than_its_cap(case: tuple[list[BootSummary], list[BootSummary], SequentialPlan, float]) -> None:
    cur, ref, plan, tolerance = case
    rules = _planned(plan)
    k = plan.start  # a session's rounds, booked as the session books them
    while profiles_to_book({"cur": cur[:k], "ref": ref[:k]}, "ref", direction=HIGHER, tolerance=tolerance, rules=rules):
        k += 1
    decision = next_step(compare_in_session(cur[:k], ref[:k], direction=HIGHER, tolerance=tolerance, rules=rules), plan)
    assert plan.start <= decision.boots == k <= plan.cap
    assert decision.step is LookStep.STOP
    assert decision.why == "decided" or decision.boots == plan.cap


@PROPERTY
@given(sessions(), st.integers(0, 6))
def test_booking_on_demand_never_flips_a_direction_and_only_makes_a_claim_harder(
        case: tuple[list[BootSummary], list[BootSummary], SequentialPlan, float], extra: int) -> None:
    # The same boots judged as one look of a plan that may book more, against a fixed budget of
    # them: any claim the plan makes the fixed budget makes too, and no direction changes sign.
    cur, ref, plan, tolerance = case
    k = plan.cap
    fixed = compare_in_session(cur, ref, direction=HIGHER, tolerance=tolerance, rules=KIMI)
    for larger in (SequentialPlan(plan.start, k + extra), SequentialPlan(1, k + extra)):
        booked = compare_in_session(cur, ref, direction=HIGHER, tolerance=tolerance, rules=_planned(larger))
        assert leaning(booked.verdict) in (VerdictLeaning.NEITHER, leaning(fixed.verdict))
        if booked.verdict in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT, VerdictKind.WITHIN_TOLERANCE):
            assert fixed.verdict is booked.verdict


def test_the_rates_hold_across_looks_in_a_seeded_simulation() -> None:
    # The benchmark's cells (benchmarks/seed_answer.py), small: at the band's edge "within" in at
    # most 5% of sessions; with no change, a direction in none of them; the seed's case within.
    spec = importlib.util.spec_from_file_location("bench_seed_answer", BENCHMARKS / "seed_answer.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    run_cell = bench.run_cell
    plan = SequentialPlan(2, 6)
    band = band_log(0.03)
    edge = run_cell("edge", -band, plan, trials=250, seed=7)
    assert edge.within <= 0.05
    still = run_cell("A/A", 0.0, plan, trials=250, seed=8)
    assert still.direction <= 0.01
    seed = run_cell("seed", math.log1p(0.006), plan, trials=250, seed=9)
    assert seed.within >= 0.90 and seed.direction == 0.0
    assert seed.mean_boots < 6


def test_a_round_books_the_undecided_profiles_and_the_reference_once_every_profile_measured_it() -> None:
    rules = _planned(SequentialPlan(2, 4))
    decided, undecided = boots(100.1, 100.0), boots(101.2, 101.7)
    ref = boots(100.0, 100.1)
    kwargs = dict(direction=HIGHER, tolerance=0.03, rules=rules)
    assert profiles_to_book({"default": ref, "ring-ll": decided, "tree": undecided}, "default", **kwargs) == (
        "default", "tree")
    assert profiles_to_book({"default": ref, "ring-ll": decided}, "default", **kwargs) == ()
    assert profiles_to_book({"default": ref, "ring-ll": []}, "default", **kwargs) == ()
    assert profiles_to_book({"default": ref, "tree": undecided}, "default", direction=HIGHER, tolerance=0.03,
                            rules=KIMI) == ()  # no plan: nothing on demand


def test_only_a_comparison_of_profiles_books_on_demand() -> None:
    assert session_plan(profiles=2, boots=2, max_boots=6, control=False) == SequentialPlan(2, 6)
    assert session_plan(profiles=1, boots=2, max_boots=6, control=False) is None
    assert session_plan(profiles=2, boots=2, max_boots=6, control=True) is None  # the gate's rule
