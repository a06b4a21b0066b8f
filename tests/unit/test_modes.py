"""Spawn modes: when a history splits, and how a run is judged against one that does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.judge.history import compare_with_history
from pytest_kimiperf.judge.noise import MIN_HISTORY_BOOTS, align_modes, find_modes
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.reports.sentences import comparison_line


def boots(values: list[float], session: str = "s") -> list[BootSummary]:
    return [BootSummary(median=v, n=20, se_log=0.002, session=session) for v in values]


def _split_rate(rng: np.random.Generator, n: int, slow_share: float, trials: int = 2000) -> float:
    hits = 0
    for _ in range(trials):
        logs = rng.normal(0.0, 0.01, n)
        logs[rng.random(n) < slow_share] += math.log(0.8)
        hits += find_modes(boots(list(np.exp(logs) * 100))) is not None
    return hits / trials


def test_one_normal_mode_is_almost_never_split() -> None:
    rng = np.random.default_rng(11)
    assert _split_rate(rng, 10, 0.0) < 0.01
    assert _split_rate(rng, 20, 0.0) < 0.002


def test_a_history_holding_both_spawn_modes_is_split() -> None:
    rng = np.random.default_rng(12)
    assert _split_rate(rng, 20, 0.3) > 0.98
    assert _split_rate(rng, 10, 0.3) > 0.8  # the rest hold fewer than two slow boots


def test_too_short_a_history_is_never_split() -> None:
    assert find_modes(boots([100, 101, 80, 81, 100, 80][: MIN_HISTORY_BOOTS - 2])) is None


def test_a_boot_in_a_mode_the_history_holds_is_no_regression() -> None:
    history = boots([100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1], "then")
    modes = find_modes(history)
    assert modes is not None and len(modes.low) == 3 and len(modes.high) == 7
    current = boots([80.2, 79.9], "now")
    c = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                             spreads=Spreads(0.01))
    assert c.verdict is not VerdictKind.REGRESSION
    assert "2 modes 25% apart (3 boots at" in comparison_line(c)
    aligned, _ = align_modes(current, modes)
    assert [b.median for b in aligned] == pytest.approx([100.2 * 1.0, 99.9], rel=0.01)


def test_a_shift_inside_the_fast_mode_is_still_caught() -> None:
    history = boots([100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1], "then")
    current = boots([93.0, 92.6], "then")  # same session: the boot level alone
    c = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                             spreads=Spreads(0.01))
    assert c.verdict is VerdictKind.REGRESSION


def test_boots_that_fit_neither_mode_are_a_change_read_least_in_the_builds_favour() -> None:
    history = boots([100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1], "then")
    # Half-way (log scale) between the modes: a fast boot 10% slower, or a slow one 12% faster.
    # Neither mode holds a boot there, so it is a change, read against the better (fast) mode.
    current = boots([89.4, 89.5], "now")
    c = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                             spreads=Spreads(0.01))
    assert c.verdict is VerdictKind.REGRESSION
    assert c.change == pytest.approx(-0.106, abs=0.005)
    line = comparison_line(c)
    assert "2 boot(s) of this run in neither mode (or both), read against the better one (every placing agrees)" in line
    # Not comparable stays not comparable.
    other = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                 spreads=Spreads(0.01), comparable=False)
    assert other.verdict is VerdictKind.NOT_COMPARABLE


def test_boots_just_above_the_slow_mode_are_never_better_since_they_may_be_fast_ones_made_slower() -> None:
    history = boots([100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1], "then")
    # 2.5% above the slow mode: the slow mode's, clearly, and read there +2.5%; but as fast boots
    # they are 18% slower. No direction, and the line says the placing is unclear.
    current = boots([82.0, 82.1, 81.9], "now")
    c = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.02,
                             spreads=Spreads(0.005))
    assert c.verdict is not VerdictKind.IMPROVEMENT


def test_a_boot_belongs_to_a_mode_only_within_its_spread_and_beyond_both_every_placing_agrees() -> None:
    history = boots([100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1], "then")
    modes = find_modes(history)
    assert modes is not None
    # A boot belongs to a mode only within its spread of it: far beyond either, it fits neither.
    assert modes.mode_of(boots([80.5])[0]) == "low" and modes.mode_of(boots([99.0])[0]) == "high"
    assert modes.mode_of(boots([60.0])[0]) is None and modes.mode_of(boots([130.0])[0]) is None
    assert modes.mode_of(boots([89.4])[0]) is None
    # Below the slow mode, every placing reads a regression.
    c = compare_with_history(boots([60.2, 59.9], "now"), history, direction=Direction.HIGHER_IS_BETTER,
                             tolerance=0.03, spreads=Spreads(0.01))
    assert c.verdict is VerdictKind.REGRESSION and "every placing agrees" in comparison_line(c)
    # Above the fast mode, every placing reads an improvement.
    up = compare_with_history(boots([130.2, 129.9], "now"), history, direction=Direction.HIGHER_IS_BETTER,
                              tolerance=0.03, spreads=Spreads(0.01))
    assert up.verdict is VerdictKind.IMPROVEMENT


def test_a_run_landing_in_the_slow_mode_more_often_than_chance_allows_is_a_regression() -> None:
    history = boots([100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1, 99.8, 100.3, 100.4, 99.9,
                     100.6, 99.7, 100.2, 99.5, 100.1, 100.0], "then")  # 3 of 20 slow: 15%
    modes = find_modes(history)
    assert modes is not None and len(modes.low) == 3
    slow = boots([80.1, 79.9, 80.3, 80.0, 79.8], "now")
    c = compare_with_history(slow, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                             spreads=Spreads(0.01))
    # 0.15 ** 5 = 7.6e-5: below the gate's level, though every boot sits on its mode's centre.
    assert c.verdict is VerdictKind.REGRESSION
    line = comparison_line(c)
    assert "REGRESSION" in line and "the run lands in the worse spawn mode more often than chance explains" in line
    assert "5 of 5 boots in the worse mode, which holds 15% of the history (chance 7.6e-05)" in line
    # Two slow boots of two are what the history's share makes likely enough: no direction from it.
    two = compare_with_history(slow[:2], history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                               spreads=Spreads(0.01))
    assert two.verdict is not VerdictKind.REGRESSION and "2 of 2 boots in the worse mode" in comparison_line(two)


def test_for_a_latency_the_worse_mode_is_the_higher_one() -> None:
    # Time to first token: 3 of 20 boots 25% slower (higher).
    history = boots([40, 40.4, 39.6, 40.2, 50, 50.4, 40.1, 49.8, 39.8, 40.0, 39.9, 40.3, 40.2, 39.7,
                     40.5, 39.8, 40.1, 39.9, 40.0, 40.2], "then")
    slow = boots([50.1, 49.9, 50.3, 50.0, 49.8], "now")
    c = compare_with_history(slow, history, direction=Direction.LOWER_IS_BETTER, tolerance=0.03,
                             spreads=Spreads(0.01))
    assert c.verdict is VerdictKind.REGRESSION and "5 of 5 boots in the worse mode" in comparison_line(c)
    fast = compare_with_history(boots([40.1, 39.9, 40.3, 40.0, 39.8], "now"), history,
                                direction=Direction.LOWER_IS_BETTER, tolerance=0.03, spreads=Spreads(0.01))
    assert fast.verdict is not VerdictKind.REGRESSION and "0 of 5 boots in the worse mode" in comparison_line(fast)


def _labelled(values: list[float], session: str) -> list[BootSummary]:
    """One recording's boots: one stamp for all, written in boot order (as make_entry does)."""
    return [BootSummary(median=v, n=20, se_log=0.002, session=session, label="2026-12-01T10:00:00Z") for v in values]


FAST_SLOW = [100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1]  # boots 5, 6 and 8 slow


def test_joint_placement_takes_the_mode_every_clear_metric_agrees_on_and_none_where_two_disagree() -> None:
    from pytest_kimiperf.judge.noise import BETTER, BETWEEN, WORSE, joint_modes

    assert joint_modes([(WORSE, BETWEEN, BETTER, BETWEEN), (WORSE, BETTER, BETTER, BETWEEN)]) == (
        WORSE, BETTER, BETTER, BETWEEN)
    assert joint_modes([(WORSE,), (BETTER,)]) == (BETWEEN,)


def test_a_boot_one_metric_puts_between_the_modes_is_placed_by_the_metric_the_change_left_alone() -> None:
    from pytest_kimiperf.judge.history import joint_placements

    decode_history = _labelled(FAST_SLOW, "then")
    other_history = _labelled([v / 2 for v in FAST_SLOW], "then")  # the same boots slow, half the figure
    decode_now = boots([89.4, 89.5], "then")  # a fast boot 10.6% slower reads half-way between the modes
    other_now = boots([50.1, 49.9], "then")  # left alone: clearly in the fast mode

    def judge(placements=None):  # type: ignore[no-untyped-def]
        return [compare_with_history(now, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                     spreads=Spreads(0.01), placements=None if placements is None else placements[i])
                for i, (now, history) in enumerate(((decode_now, decode_history), (other_now, other_history)))]

    alone = judge()
    # On its own, decode fits neither mode: a change, read against the better mode.
    assert alone[0].verdict is VerdictKind.REGRESSION
    again = joint_placements(alone)
    assert again == {0: ("better", "better")}  # only decode is judged again, in the fast mode
    joint = judge({0: again[0], 1: None})
    assert joint[0].verdict is VerdictKind.REGRESSION and joint[0].change == pytest.approx(-0.106, abs=0.005)
    assert "each boot judged against the mode the test's metrics place it in together" in comparison_line(joint[0])
    assert joint[1].verdict is alone[1].verdict


def test_metrics_that_place_a_boot_in_different_modes_read_it_least_favourably_and_unlike_splits_stay_apart() -> None:
    from pytest_kimiperf.judge.history import joint_placements

    decode_history = _labelled(FAST_SLOW, "then")
    other_history = _labelled([v / 2 for v in FAST_SLOW], "then")
    # A change the size of the gap: decode clearly in the slow mode, the other metric clearly fast.
    decode_now, other_now = boots([80.1, 79.9], "then"), boots([50.1, 49.9], "then")
    alone = [compare_with_history(now, h, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, spreads=Spreads(0.01))
             for now, h in ((decode_now, decode_history), (other_now, other_history))]
    assert alone[0].verdict is not VerdictKind.REGRESSION  # alone, the fold hides it
    again = joint_placements(alone)
    assert again == {0: ("", ""), 1: ("", "")}
    decode = compare_with_history(decode_now, decode_history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                  spreads=Spreads(0.01), placements=again[0])
    # The metrics disagree on the boot's mode: unclear, so read least in the build's favour.
    assert decode.verdict is VerdictKind.REGRESSION and decode.change == pytest.approx(-0.2, abs=0.01)
    # A history whose other boots are slow in the other metric is another phenomenon: not grouped.
    shuffled = _labelled([v / 2 for v in [80, 80.5, 99, 100.5, 100, 101, 100.2, 79.8, 99.6, 100.1]], "then")
    other = compare_with_history(other_now, shuffled, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                 spreads=Spreads(0.01))
    assert joint_placements([alone[0], other]) == {}
