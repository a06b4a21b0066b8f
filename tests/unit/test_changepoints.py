"""Steps in a boot history: found where the level moved and stayed, not where noise, a session or a spawn mode moved it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.history import (
    DEFAULT_HISTORIES, MIN_SEGMENT, STEP_ALPHA, find_steps, history_alpha, history_noise, last_segment,
    segment_spreads,
)
from pytest_kimiperf.judge.history import compare_with_history
from pytest_kimiperf.judge.notes import HistorySteps
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.reports.outputs import comparison_json
from pytest_kimiperf.reports.sentences import comparison_line, note_text

SPREADS = Spreads(0.01, 0.01, 0.02)


def history(rng: np.random.Generator, sessions: int, per_session: int, *, step: float = 0.0, at: int | None = None,
            session_sd: float = 0.01, boot_sd: float = 0.01, slow_share: float = 0.0) -> list[BootSummary]:
    """``sessions`` sessions of ``per_session`` boots, oldest first; from session ``at`` on the
    level is ``step`` (a fraction) off."""
    out = []
    for s in range(sessions):
        offset = rng.normal(0.0, session_sd) + (math.log1p(step) if at is not None and s >= at else 0.0)
        for _ in range(per_session):
            k = len(out)
            slow = math.log(0.8) if rng.random() < slow_share else 0.0
            out.append(BootSummary(median=100.0 * math.exp(offset + rng.normal(0.0, boot_sd) + slow), n=20,
                                   se_log=0.003, label=f"2026-11-{k + 1:02d}T10:00:00+00:00", session=f"s{s}",
                                   host="h", commit=f"c{k:03d}"))
    return out


def step_rate(rng: np.random.Generator, trials: int, *args: int, histories: int = DEFAULT_HISTORIES,
              **kwargs: float) -> float:
    return sum(bool(find_steps(history(rng, *args, **kwargs), spreads=SPREADS, histories=histories))
               for _ in range(trials)) / trials


def test_a_step_is_found_between_the_sessions_where_it_happened() -> None:
    h = history(np.random.default_rng(1), 10, 1, step=-0.06, at=5)
    steps = find_steps(h, spreads=SPREADS)
    assert len(steps) == 1
    step = steps[0]
    assert (step.boots_before, step.boots_after) == (5, 5)
    assert step.change == pytest.approx(-0.06, abs=0.02)
    assert (step.before, step.before_commit) == (h[4].label, "c004")
    assert (step.after, step.after_commit) == (h[5].label, "c005")
    assert last_segment(h, steps) == h[5:]
    assert note_text(HistorySteps(tuple(steps), 5)).startswith("the history stepped -")
    assert "2026-11-05 10:00 (c004) and 2026-11-06 10:00 (c005)" in note_text(step)


def test_two_steps_are_both_found_and_the_last_segment_follows_the_second() -> None:
    # One history searched alone (its own budget): among a run's 24, the first split's check
    # against the residual spread, which still holds the second step, is too wide to pass.
    h = history(np.random.default_rng(2), 12, 1, step=0.08, at=4)
    later = [dataclasses.replace(b, median=b.median * 0.85) if i >= 8 else b for i, b in enumerate(h)]
    assert find_steps(later, spreads=SPREADS) == []
    steps = find_steps(later, spreads=SPREADS, histories=1)
    assert [(s.boots_before, s.boots_after) for s in steps] == [(4, 4), (4, 4)]
    assert steps[0].change > 0 > steps[1].change
    assert last_segment(later, steps) == later[8:]


def runs_with_a_step(rng: np.random.Generator, runs: int, histories: int) -> float:
    """The share of A/A runs (no history stepped) that report a step in any of their
    DEFAULT_HISTORIES histories (the shipped suite's shapes in turn), each history searched at the
    level ``histories`` leaves it."""
    shapes = ((10, 1), (20, 1), (10, 2), (5, 2))
    hits = 0
    for _ in range(runs):
        hits += any(find_steps(history(rng, *shapes[i % len(shapes)]), spreads=SPREADS, histories=histories)
                    for i in range(DEFAULT_HISTORIES))
    return hits / runs


def test_a_run_of_unstepped_histories_reports_a_step_at_most_at_the_stated_level() -> None:
    # STEP_ALPHA is the run's budget over its 24 histories (Bonferroni), not each history's:
    # searched at 1% each, the same runs report a false step far more often than 1%.
    assert history_alpha(DEFAULT_HISTORIES) == pytest.approx(STEP_ALPHA / 24)
    assert runs_with_a_step(np.random.default_rng(3), 150, DEFAULT_HISTORIES) <= STEP_ALPHA
    assert runs_with_a_step(np.random.default_rng(3), 150, 1) > 2 * STEP_ALPHA


@pytest.mark.parametrize("histories, alpha", [(0, 0.01), (24, 0.0), (24, 1.0)])
def test_a_run_budget_needs_a_history_and_a_probability(histories: int, alpha: float) -> None:
    with pytest.raises(ValueError):
        history_alpha(histories, alpha)


def test_a_step_of_twice_the_tolerance_is_found_in_a_nightly_history() -> None:
    # The price of the run's corrected level (1% over 24 histories): a -6% step half-way is
    # found in 77% of 10 x 1 histories and 74% of 10 x 2 (93% and 95% searched at 1% each),
    # and in every 20 x 1.
    assert step_rate(np.random.default_rng(4), 300, 10, 1, step=-0.06, at=5) >= 0.7
    assert step_rate(np.random.default_rng(4), 300, 10, 1, step=-0.06, at=5, histories=1) >= 0.9
    assert step_rate(np.random.default_rng(4), 300, 10, 2, step=-0.06, at=5) >= 0.7
    assert step_rate(np.random.default_rng(4), 300, 20, 1, step=-0.06, at=10) >= 0.95


def test_one_session_cannot_show_a_step_and_three_sessions_need_two_each_side() -> None:
    # A step needs MIN_SEGMENT sessions each side: a single session's offset is its session
    # effect, indistinguishable from a new level.
    assert MIN_SEGMENT == 2
    rng = np.random.default_rng(5)
    one = [dataclasses.replace(b, session="one") for b in history(rng, 6, 1, step=-0.2, at=3)]
    assert find_steps(one, spreads=SPREADS) == []
    assert find_steps(history(rng, 3, 2, step=-0.2, at=2), spreads=SPREADS) == []
    assert len(find_steps(history(rng, 4, 2, step=-0.2, at=2), spreads=SPREADS)) == 1


def test_a_session_spread_larger_than_declared_is_measured_not_called_steps() -> None:
    # Sessions alternate 4% apart while 1% is declared: the residual spread confirms no step.
    rng = np.random.default_rng(6)
    h = history(rng, 10, 1, session_sd=0.0)
    wobbly = [dataclasses.replace(b, median=b.median * (1.04 if i % 2 else 1.0)) for i, b in enumerate(h)]
    assert find_steps(wobbly, spreads=SPREADS) == []
    assert history_noise(wobbly, SPREADS).session > math.log1p(0.015)


def test_spawn_modes_interleaved_in_time_are_not_steps() -> None:
    rng = np.random.default_rng(7)
    assert step_rate(rng, 400, 20, 1, slow_share=0.3) <= 0.02


def test_two_clusters_one_after_the_other_are_a_step_not_modes() -> None:
    h = history(np.random.default_rng(8), 20, 1, step=-0.2, at=10)
    steps = find_steps(h, spreads=SPREADS)
    assert len(steps) == 1 and steps[0].boots_after == 10


def test_unknown_sessions_count_each_boot_as_its_own() -> None:
    h = [dataclasses.replace(b, session="") for b in history(np.random.default_rng(9), 10, 1, step=-0.1, at=5)]
    assert len(find_steps(h, spreads=SPREADS)) == 1


def test_too_short_a_history_has_no_steps() -> None:
    assert find_steps(history(np.random.default_rng(10), 3, 1, step=-0.5, at=1), spreads=SPREADS) == []
    assert find_steps([], spreads=SPREADS) == []


def test_a_run_is_judged_against_the_segment_since_the_last_step() -> None:
    # The history stepped down 8% half-way; the current build sits at the new level. As one
    # pool (6 boots: too few for spawn modes) the run reads 4% slower than the history's centre.
    rng = np.random.default_rng(11)
    h = history(rng, 6, 1, step=-0.08, at=3, session_sd=0.003, boot_sd=0.003)
    current = [BootSummary(median=92.0 * f, n=20, se_log=0.003, session="now", host="h") for f in (0.999, 1.001)]
    pooled = compare_with_history(current, h, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                  spreads=SPREADS, segment=False)
    judged = compare_with_history(current, h, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, spreads=SPREADS)
    assert pooled.change < -0.03
    assert pooled.verdict in (VerdictKind.REGRESSION, VerdictKind.INCONCLUSIVE)
    assert judged.boots_reference == 3
    assert abs(judged.change) < 0.01
    assert judged.verdict in (VerdictKind.WITHIN_TOLERANCE, VerdictKind.NO_DETECTABLE_CHANGE)
    [note] = [n for n in judged.notes if isinstance(n, HistorySteps)]
    assert note.judged_boots == 3
    assert "since the last step" in comparison_line(judged) or any(
        "since the last step" in note_text(n) for n in judged.notes)
    [step] = comparison_json(judged)["steps"]  # type: ignore[misc]
    assert step["boots_before"] == 3 and step["after_commit"] == "c003"
    assert comparison_json(pooled)["steps"] == []


def test_a_regression_back_to_the_old_level_is_seen_after_a_step_up() -> None:
    # 20 nightly boots, the last 10 8% faster (a faster driver): read as two spawn modes, a
    # build that falls back 8% lands on the old "mode" and is no change; judged against the
    # segment since the step, it is the regression it is.
    rng = np.random.default_rng(12)
    h = history(rng, 20, 1, step=0.08, at=10, session_sd=0.003, boot_sd=0.005)
    current = [BootSummary(median=100.0 * f, n=20, se_log=0.003, session="now", host="h") for f in (0.995, 1.0, 1.005)]
    as_modes = compare_with_history(current, h, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                    spreads=SPREADS, segment=False)
    judged = compare_with_history(current, h, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, spreads=SPREADS)
    assert as_modes.verdict is not VerdictKind.REGRESSION
    assert judged.verdict is VerdictKind.REGRESSION
    assert judged.change == pytest.approx(-0.074, abs=0.01)


def test_a_history_of_several_hosts_is_judged_whole() -> None:
    # The host level explains a difference between hosts (the canary a large one): steps are one
    # machine's. The corpus replay read hosts 3x apart as steps before this rule.
    h = history(np.random.default_rng(13), 10, 1, step=-0.2, at=5)
    two = [dataclasses.replace(b, host="a" if i < 5 else "b") for i, b in enumerate(h)]
    assert len(find_steps(h, spreads=SPREADS)) == 1
    assert find_steps(two, spreads=SPREADS) == []


def test_the_last_segment_is_judged_with_the_session_spread_the_whole_history_shows() -> None:
    # Sessions stray 4% around each level (1% declared): the 5 boots since the step alone would
    # say little of it; the comparison keeps what the 12 sessions showed.
    rng = np.random.default_rng(14)
    h = history(rng, 12, 1, step=-0.3, at=6, session_sd=0.04, boot_sd=0.002)
    steps = find_steps(h, spreads=SPREADS)
    assert len(steps) == 1
    assert segment_spreads(h, steps, SPREADS).session > 0.025
    assert segment_spreads(h, steps, SPREADS).host == SPREADS.host
