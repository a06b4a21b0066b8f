"""The verdict: boots are the samples, the tolerance is inside the test, every claim says what it rests on."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import (
    VerdictLeaning,
    VerdictKind,
    compare_boots,
    estimate_spread,
)
from pytest_kimiperf.judge.stats import BootSummary, summarize_boot
from pytest_kimiperf.judge.notes import FloorStatus, floor_check
from pytest_kimiperf.judge.notes import SpreadSource
from pytest_kimiperf.judge.noise import boots_needed, plan, wants_another_boot
from pytest_kimiperf.reports.outputs import comparison_json
from pytest_kimiperf.reports.sentences import comparison_line, floor_line, note_text

HIGHER = Direction.HIGHER_IS_BETTER
LOWER = Direction.LOWER_IS_BETTER


# Ten requests at about 100 tok/s with +/-0.5% spread (for the single-threshold comparison rule).
REFERENCE = [100.0, 100.4, 99.6, 100.2, 99.8, 100.1, 99.9, 100.3, 99.7, 100.0]


def scaled(factor: float) -> list[float]:
    return [s * factor for s in REFERENCE]


def boots(*medians: float, n: int = 20, se: float = 0.005) -> list[BootSummary]:
    return [BootSummary(median=m, n=n, se_log=se, label=f"boot {i + 1}") for i, m in enumerate(medians)]


def history(center: float = 100.0, spread: float = 0.01, count: int = 10, seed: int = 1) -> list[BootSummary]:
    rng = np.random.default_rng(seed)
    return boots(*(center * math.exp(x) for x in rng.normal(0, spread, count)))


def test_a_boot_is_summarized_by_its_median_and_the_error_of_that_median() -> None:
    rng = np.random.default_rng(0)
    samples = rng.lognormal(math.log(80), 0.04, 400)
    summary = summarize_boot([*samples, math.nan], label="ring-ll boot 1")
    assert summary.n == 400 and summary.label == "ring-ll boot 1"
    assert summary.median == pytest.approx(80, rel=0.01)
    # sqrt(pi/2) * 4% / sqrt(400) = 0.25%: the median's own error, not the requests' spread
    assert summary.se_log == pytest.approx(0.0025, rel=0.15)


def test_one_boots_luck_is_not_a_regression_however_many_requests_it_had() -> None:
    # Boot 3 of cpu_noise.py (now noise_study.py) (517 tok/s) against boot 1 (779): the old request-level test said
    # REGRESSION -33.6% (p < 0.0001). With the measured 18% boot spread it is no verdict.
    c = compare_boots(boots(517, n=400, se=0.002), boots(779, n=400, se=0.002), direction=HIGHER,
                      tolerance=0.25, prior_spread=0.18)
    assert c.verdict is VerdictKind.INCONCLUSIVE and not c.failed
    assert "1 boot (400 samples) vs 1 reference boot; boot spread 18% (declared 18%)" in comparison_line(c)


def test_two_boots_beyond_the_tolerance_bound_are_a_regression_that_says_what_it_rests_on() -> None:
    c = compare_boots(boots(93.0, 93.5), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01,
                      metric="decode", unit="tok/s")
    assert c.verdict is VerdictKind.REGRESSION and c.failed
    assert c.boots_current == 2 and c.boots_reference == 10 and c.n_current == 40
    assert c.change < -0.03 and c.bound_high < 0
    msg = comparison_line(c)
    assert msg.startswith("decode tok/s: REGRESSION -7.0% (beyond the 3% tolerance, and its 99.94% bound -3.6% excludes zero")
    assert "2 boots (40 samples) vs 10 reference boots; boot spread 1.1% (declared 1%; 2 + 10 boots measured 0.64%)" in msg


def test_a_change_inside_the_tolerance_is_never_a_regression_even_when_significant() -> None:
    # -2% with a tiny spread: clearly real, but inside the 3% tolerance.
    c = compare_boots(boots(98.0, 98.0, 98.0, se=0.001), history(spread=0.001), direction=HIGHER,
                      tolerance=0.03, prior_spread=0.001)
    assert c.verdict is VerdictKind.WITHIN_TOLERANCE


def test_latency_direction_is_respected() -> None:
    worse = compare_boots(boots(110, 111), history(), direction=LOWER, tolerance=0.03, prior_spread=0.01)
    better = compare_boots(boots(90, 91), history(), direction=LOWER, tolerance=0.03, prior_spread=0.01)
    assert worse.verdict is VerdictKind.REGRESSION and worse.gain < 0
    assert better.verdict is VerdictKind.IMPROVEMENT and better.gain > 0


def test_within_needs_the_whole_interval_inside_else_no_detectable_change_with_the_mdc() -> None:
    within = compare_boots(boots(100.2, 99.9), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    assert within.verdict is VerdictKind.WITHIN_TOLERANCE
    assert -0.03 <= within.ci_low and within.ci_high <= 0.03
    wide = compare_boots(boots(99.0), history(spread=0.03, count=3), direction=HIGHER, tolerance=0.03,
                         prior_spread=0.03)
    assert wide.verdict is VerdictKind.NO_DETECTABLE_CHANGE
    assert wide.mdc > 0.03
    assert f"this design detects changes of {wide.mdc * 100:.2g}% or more" in comparison_line(wide)


def test_each_region_of_point_interval_and_tolerance_has_the_name_of_what_it_shows() -> None:
    # The case: -24.7%, 90% CI -42.2..-1.9% against a 25% tolerance. The interval
    # excludes zero, but a sign is a claim: it needs the bounds a direction needs (the run's
    # budget) clear of zero, and these hold it. So no detectable change, the interval beside it.
    quiet = compare_boots(boots(75.3, 75.3), boots(100.0, 100.0), direction=HIGHER, tolerance=0.25,
                          prior_spread=0.14, metric="output throughput", unit="tok/s")
    assert quiet.ci_high < 0 and quiet.bound_low < 0 < quiet.bound_high
    assert quiet.verdict is VerdictKind.NO_DETECTABLE_CHANGE and quiet.claim is VerdictLeaning.NEITHER
    assert not quiet.failed and not quiet.unresolved_beyond_tolerance
    assert comparison_line(quiet).startswith(
        f"output throughput tok/s: no detectable change (-24.7%, 90% CI {quiet.ci_low * 100:+.1f}%.."
        f"{quiet.ci_high * 100:+.1f}%; a sign needs its 99.94% bounds {quiet.bound_low * 100:+.1f}%.."
        f"{quiet.bound_high * 100:+.1f}% clear of zero; this design detects changes of 66% or more; 2 boots")
    # The same change at a 2% spread: the bounds exclude zero, so it changed, and which way is
    # said; the interval crosses the tolerance, so not how far.
    changed = compare_boots(boots(75.3, 75.3), boots(100.0, 100.0), direction=HIGHER, tolerance=0.25,
                            prior_spread=0.02, metric="output throughput", unit="tok/s")
    assert changed.bound_high < 0 and changed.ci_low < -0.25 < changed.change
    assert changed.verdict is VerdictKind.CHANGED_SIZE_UNRESOLVED and changed.claim is VerdictLeaning.WORSE
    assert not changed.failed and not changed.unresolved_beyond_tolerance
    assert comparison_line(changed).startswith(
        "output throughput tok/s: changed, size unresolved (-24.7%: its 99.94% bounds -34.3%..-13.7% exclude zero, "
        "and its 90% CI -27.7%..-21.5% crosses the 25% tolerance; 2 boots")
    # Bounds that hold zero with the point beyond the tolerance: inconclusive (both "no change"
    # and "beyond" fit the data).
    loud = compare_boots(boots(70.0), boots(100.0), direction=HIGHER, tolerance=0.25, prior_spread=0.3)
    assert loud.bound_low < 0 < loud.bound_high and loud.verdict is VerdictKind.INCONCLUSIVE
    assert loud.unresolved_beyond_tolerance and loud.claim is VerdictLeaning.NEITHER
    assert "inconclusive (-30.0% is beyond the 25% tolerance, but a sign needs its 99.94% bounds" in comparison_line(loud)
    assert "% clear of zero; 1 boot" in comparison_line(loud)
    # One boot wholly beyond the tolerance: changed, but one boot can screen, never convict
    # (against four reference boots: their 3 measured df with the declaration's 3 put the bound
    # beyond zero; one boot a side, at 3 df, is not even that: t_3 at 99.94% is 12.3 SEs).
    screened = compare_boots(boots(50.0), boots(100.0, 100.2, 99.8, 100.1), direction=HIGHER, tolerance=0.25,
                             prior_spread=0.05)
    assert screened.ci_high < -0.25 and screened.verdict is VerdictKind.CHANGED_SIZE_UNRESOLVED
    assert screened.unresolved_beyond_tolerance and not screened.failed
    assert "exclude zero, and its 90% CI -55.1%..-44.4% lies beyond the 25% tolerance" in comparison_line(screened)
    assert comparison_line(screened).endswith("a verdict needs 2 boots: one boot can screen, never convict)")


def test_the_declared_spread_is_a_floor_the_boots_can_raise_but_never_lower() -> None:
    few = estimate_spread(boots(100), boots(100, 100.1), prior_sd_log=0.05)
    assert few.sd_log == pytest.approx(0.05, rel=0.01) and few.source.how == SpreadSource.FLOOR
    assert few.df == 4 and note_text(few.source) == "declared 5.1%; 1 + 2 boots measured 0.071%"
    many = estimate_spread(boots(100), boots(*[100, 100.1] * 20), prior_sd_log=0.05)
    assert many.sd_log == pytest.approx(0.05, rel=0.01) and many.source.how == SpreadSource.FLOOR
    wide = estimate_spread(boots(100), boots(*[100, 120] * 3), prior_sd_log=0.05)
    # pooled with the declaration at its 3 df: (3 * floor + the 5 df's sum of squares) / 8
    floor = 0.05 ** 2 + 0.005 ** 2
    sum_sq = 6 * (math.log(120) - math.log(100)) ** 2 / 4
    assert wide.sd_log == pytest.approx(math.sqrt((3 * floor + sum_sq) / 8))
    assert wide.sd_log > 0.08 and wide.df == 3 + 5 and note_text(wide.source) == "measured over 1 + 6 boots"
    alone = estimate_spread(boots(100), boots(100), prior_sd_log=0.05)
    assert alone.source.how == SpreadSource.DECLARED and alone.df == 3


def test_the_spread_is_never_below_the_boots_own_error_of_the_median() -> None:
    spread = estimate_spread(boots(100, 100, se=0.02), boots(*[100] * 6, se=0.02), prior_sd_log=0.0)
    assert spread.sd_log == pytest.approx(0.02)


def test_boots_with_too_few_requests_do_not_count() -> None:
    c = compare_boots(boots(90, n=2), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    assert c.verdict is VerdictKind.INSUFFICIENT_SAMPLES
    assert "insufficient samples (0 current and 10 reference boots" in comparison_line(c)


def test_not_comparable_is_computed_and_never_fails() -> None:
    c = compare_boots(boots(50, 50), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01,
                      comparable=False)
    assert c.verdict is VerdictKind.NOT_COMPARABLE and not c.failed and c.change < -0.4


def test_a_first_boot_that_looks_worse_asks_for_another_and_a_good_one_does_not() -> None:
    bad = compare_boots(boots(95), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    good = compare_boots(boots(99.5), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    better = compare_boots(boots(105), history(), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    assert wants_another_boot(bad)
    assert not wants_another_boot(good)
    assert not wants_another_boot(better)  # only the worse side screens


def test_the_planner_answers_the_814_vs_819_question() -> None:
    # 81.4 vs 81.9 tok/s is 0.6%; at a boot spread of 0.8% two profiles need ~31 boots each.
    n = boots_needed(81.9 / 81.4 - 1, 0.008)
    assert 25 <= n <= 35
    assert boots_needed(0.06, 0.01, tolerance=0.03, reference_boots=10) == 2
    assert boots_needed(0.04, 0.05, tolerance=0.03, reference_boots=2) is None
    c = compare_boots(boots(99.0), history(spread=0.03, count=3), direction=HIGHER, tolerance=0.03,
                      prior_spread=0.03)
    assert "you need" in note_text(plan(c)) or "too few" in note_text(plan(c))


@pytest.mark.parametrize("kwargs, expected", [
    ({"tolerance": 0.0}, "tolerance=0.0"),
    ({"tolerance": 1.5}, "tolerance=1.5"),
    ({"prior_spread": -0.1}, "prior_spread=-0.1"),
])
def test_bad_settings_are_named(kwargs: dict[str, float], expected: str) -> None:
    args = {"direction": HIGHER, "tolerance": 0.03, "prior_spread": 0.01, **kwargs}
    with pytest.raises(ValueError, match=expected):
        compare_boots(boots(100), boots(100), **args)


def test_planner_rejects_bad_input_naming_it() -> None:
    with pytest.raises(ValueError, match="change=0"):
        boots_needed(0, 0.01)
    with pytest.raises(ValueError, match="tolerance=0.05"):
        boots_needed(0.03, 0.01, tolerance=0.05)


def test_bad_samples_are_named() -> None:
    with pytest.raises(ValueError, match="negative value"):
        summarize_boot([1.0, -2.0])


def test_to_dict_is_json_ready() -> None:
    c = compare_boots(boots(100), boots(100), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    data = json.loads(json.dumps(c.to_dict(), allow_nan=False))
    assert data["verdict"] == c.verdict.value and comparison_json(c)["message"] == comparison_line(c)
    assert data["boots_current"] == 1 and "spread_source" in data


@pytest.mark.parametrize(
    "median, status, message",
    [
        (38.2, FloorStatus.BELOW_FLOOR, "decode 38.2 tok/s is below the floor of 40 tok/s"),
        (45.0, FloorStatus.BELOW_TARGET,
         "decode 45 tok/s is above the floor of 40 tok/s but below the target of 50 tok/s"),
        (50.0, FloorStatus.OK, "decode 50 tok/s meets the target of 50 tok/s"),
    ],
)
def test_floor_check(median: float, status: FloorStatus, message: str) -> None:
    result = floor_check(median, 40, 50, "tok/s", "decode")
    assert result.status is status
    assert result.failed is (status is FloorStatus.BELOW_FLOOR)
    assert result.warned is (status is FloorStatus.BELOW_TARGET)
    assert floor_line(result) == message


def test_floor_check_without_floor_or_target() -> None:
    assert floor_line(floor_check(45.0, None, 50, "tok/s", "decode")) == (
        "decode 45 tok/s is below the target of 50 tok/s"
    )
    assert floor_check(45.0, 40, None, "tok/s", "decode").status is FloorStatus.OK
    assert floor_line(floor_check(12345.6, None, None, "tok/s", "decode")) == (
        "decode 12346 tok/s (no floor or target set)"
    )


def test_floor_check_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="decode floor 60 tok/s is above its target 50 tok/s"):
        floor_check(45.0, 60, 50, "tok/s", "decode")
    with pytest.raises(ValueError, match="decode median nan is not a finite number"):
        floor_check(math.nan, 40, 50, "tok/s", "decode")
    with pytest.raises(ValueError, match="decode target -1"):
        floor_check(45.0, None, -1, "tok/s", "decode")


def test_the_planner_command_answers_in_one_line_and_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_kimiperf.__main__ import boots_answer as answer

    out, status = answer(["--from", "81.4", "--to", "81.9", "--spread", "0.8%"])
    assert status == 0
    assert out.startswith("to tell 81.4 vs 81.9 (0.61%) at a boot spread of 0.8% you need ")
    assert "boots per profile" in out
    out, status = answer(["--change", "4%", "--spread", "5%", "--tolerance", "3%", "--reference-boots", "2"])
    assert status == 1
    assert "no number of boots will do" in out
    with pytest.raises(SystemExit):
        answer(["--change", "abc", "--spread", "1%"])
    assert "'abc' is not a fraction" in capsys.readouterr().err


def test_insufficient_samples_says_how_many_this_boot_had() -> None:
    c = compare_boots([summarize_boot([90.0, math.nan, math.nan, 91.0])], history(), direction=HIGHER,
                      tolerance=0.03, prior_spread=0.01)
    assert c.verdict is VerdictKind.INSUFFICIENT_SAMPLES
    assert comparison_line(c).endswith("at least 3 each); this boot has 2 valid samples: failed requests are not samples")


def test_a_comparison_states_the_level_of_the_bounds_the_gate_uses_even_without_samples() -> None:
    from scipy.stats import norm

    from pytest_kimiperf.judge.stats import GATE_CRITICAL

    empty = compare_boots([], boots(100.0), direction=HIGHER, tolerance=0.03, prior_spread=0.01)
    assert empty.verdict is VerdictKind.INSUFFICIENT_SAMPLES
    assert empty.confidence == pytest.approx(float(norm.cdf(GATE_CRITICAL)), rel=1e-12)
