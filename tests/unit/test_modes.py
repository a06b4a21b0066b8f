"""Spawn modes: when a history splits, and how a run is judged against one that does."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.judge.history import compare_with_history
from pytest_kimiperf.judge.modes import MIN_HISTORY_BOOTS, align_modes, find_modes
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
