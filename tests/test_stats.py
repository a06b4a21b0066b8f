"""The regression gate: verdicts on hand-built samples, direction handling, wording, floors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_kimiperf.metric_specs import Direction
from pytest_kimiperf.stats import (
    Comparison,
    FloorStatus,
    VerdictKind,
    compare,
    floor_check,
    needs_more_samples,
    single_threshold_regression,
)

HIGHER = Direction.HIGHER_IS_BETTER
LOWER = Direction.LOWER_IS_BETTER

# Ten requests at about 100 tok/s with +/-0.5% spread: tight enough that a 8% move is obvious.
REFERENCE = [100.0, 100.4, 99.6, 100.2, 99.8, 100.1, 99.9, 100.3, 99.7, 100.0]


def scaled(factor: float) -> list[float]:
    return [s * factor for s in REFERENCE]


@pytest.mark.parametrize(
    "current, direction, verdict",
    [
        (scaled(0.92), HIGHER, VerdictKind.REGRESSION),  # tok/s down 8%
        (scaled(1.08), HIGHER, VerdictKind.IMPROVEMENT),
        (scaled(1.08), LOWER, VerdictKind.REGRESSION),  # latency up 8%
        (scaled(0.92), LOWER, VerdictKind.IMPROVEMENT),
        (REFERENCE, HIGHER, VerdictKind.NO_SIGNIFICANT_CHANGE),
        (REFERENCE, LOWER, VerdictKind.NO_SIGNIFICANT_CHANGE),
        # Significant (p tiny) but 2% is inside the 3% tolerance: not a regression.
        (scaled(0.98), HIGHER, VerdictKind.NO_SIGNIFICANT_CHANGE),
        # +/-12% noise around an unchanged median: the CI spans far more than +/-3%.
        ([88.0, 112.0, 95.0, 105.0, 100.0, 90.0, 110.0, 97.0, 103.0, 100.0], HIGHER, VerdictKind.INCONCLUSIVE),
    ],
)
def test_hand_built_verdicts(current: list[float], direction: Direction, verdict: VerdictKind) -> None:
    c = compare(current, REFERENCE, direction=direction, tolerance=0.03)
    assert c.verdict is verdict
    assert c.failed is (verdict is VerdictKind.REGRESSION)
    assert c.ci_low <= c.change <= c.ci_high


def test_change_is_the_raw_signed_median_ratio() -> None:
    for direction in (HIGHER, LOWER):
        c = compare(scaled(0.92), REFERENCE, direction=direction, tolerance=0.03)
        assert c.change == pytest.approx(-0.08)
        assert c.median_current == pytest.approx(92.0)
        assert c.median_reference == pytest.approx(100.0)
    assert compare(scaled(0.92), REFERENCE, direction=HIGHER, tolerance=0.03).gain == pytest.approx(-0.08)
    assert compare(scaled(0.92), REFERENCE, direction=LOWER, tolerance=0.03).gain == pytest.approx(0.08)


def test_p_values_point_the_right_way() -> None:
    tok_s = compare(scaled(0.92), REFERENCE, direction=HIGHER, tolerance=0.03)
    latency = compare(scaled(0.92), REFERENCE, direction=LOWER, tolerance=0.03)
    assert tok_s.p_worse < 0.001 and tok_s.p_better > 0.99
    assert latency.p_better < 0.001 and latency.p_worse > 0.99
    assert tok_s.p_value == tok_s.p_worse and latency.p_value == latency.p_better


def test_beyond_tolerance_without_significance_is_inconclusive() -> None:
    reference = [100.0, 80.0, 120.0, 90.0, 110.0]
    current = [s * 0.95 for s in reference]  # median down 5%, but the spread is 40%
    c = compare(current, reference, direction=HIGHER, tolerance=0.03)
    assert c.verdict is VerdictKind.INCONCLUSIVE
    assert c.p_worse > 0.01
    assert "beyond 3% but p=" in c.message() and "is not below 0.01" in c.message()
    assert needs_more_samples(c)


def test_non_finite_samples_are_dropped_then_counted() -> None:
    current = scaled(0.92)[:4] + [math.nan, math.inf, math.nan]
    c = compare(current, REFERENCE, direction=HIGHER, tolerance=0.03)
    assert (c.n_current, c.n_reference) == (4, 10)
    assert c.verdict is VerdictKind.INSUFFICIENT_SAMPLES
    assert not c.failed
    assert c.message() == (
        "insufficient samples (4 current, 10 reference; need at least 5 valid samples on each side)"
    )
    assert compare(current, REFERENCE, direction=HIGHER, tolerance=0.03, min_samples=4).verdict is (
        VerdictKind.REGRESSION
    )


def test_insufficient_reference_too() -> None:
    c = compare(REFERENCE, REFERENCE[:3], direction=LOWER, tolerance=0.05)
    assert c.verdict is VerdictKind.INSUFFICIENT_SAMPLES
    json.dumps(c.to_dict(), allow_nan=False)


def test_not_comparable_reports_but_never_fails() -> None:
    c = compare(scaled(0.92), REFERENCE, direction=HIGHER, tolerance=0.03, comparable=False,
                metric="decode", unit="tok/s")
    assert c.verdict is VerdictKind.NOT_COMPARABLE
    assert not c.failed
    assert c.change == pytest.approx(-0.08) and c.p_worse < 0.001
    assert c.message().startswith("decode tok/s: not comparable to the baseline (-8.0%, CI ")
    assert c.message().endswith("; reported only)")


def test_same_seed_same_interval_and_it_narrows_with_confidence() -> None:
    rng = np.random.default_rng(7)
    current, reference = rng.lognormal(0, 0.05, 30), rng.lognormal(0, 0.05, 30)
    a = compare(current, reference, direction=HIGHER, tolerance=0.03, seed=3)
    b = compare(current, reference, direction=HIGHER, tolerance=0.03, seed=3)
    narrow = compare(current, reference, direction=HIGHER, tolerance=0.03, seed=3, confidence=0.5)
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert a.ci_low < narrow.ci_low <= narrow.ci_high < a.ci_high


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"tolerance": 3}, "tolerance=3: use a fraction between 0 and 1"),
        ({"tolerance": 0.03, "alpha": 0.0}, "alpha=0.0"),
        ({"tolerance": 0.03, "n_boot": 10}, "n_boot=10"),
        ({"tolerance": 0.03, "min_samples": 1}, "min_samples=1"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, float], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        compare(REFERENCE, REFERENCE, direction=HIGHER, **kwargs)  # type: ignore[arg-type]


def test_bad_samples_are_named() -> None:
    with pytest.raises(ValueError, match=r"current samples include negative value -1\.0"):
        compare([-1.0, *REFERENCE], REFERENCE, direction=HIGHER, tolerance=0.03)
    with pytest.raises(ValueError, match="reference samples must be a flat sequence"):
        compare(REFERENCE, [REFERENCE, REFERENCE], direction=HIGHER, tolerance=0.03)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="reference median of ttft_ms is 0"):
        compare(REFERENCE, [0.0] * 5, direction=LOWER, tolerance=0.03, metric="ttft_ms")


def make(verdict: VerdictKind, change: float, ci: tuple[float, float], p_worse: float, p_better: float,
         *, metric: str = "decode", unit: str = "tok/s", direction: Direction = HIGHER,
         reference_half: float = 0.01) -> Comparison:
    return Comparison(
        metric=metric, unit=unit, direction=direction, tolerance=0.03, alpha=0.01, confidence=0.95,
        min_samples=5, n_current=10, n_reference=10, median_current=100 * (1 + change),
        median_reference=100.0, change=change, ci_low=ci[0], ci_high=ci[1], p_worse=p_worse,
        p_better=p_better, reference_ci_half_width=reference_half, verdict=verdict,
    )


@pytest.mark.parametrize(
    "comparison, expected",
    [
        (make(VerdictKind.NO_SIGNIFICANT_CHANGE, -0.004, (-0.011, 0.003), 0.3, 0.7),
         "decode tok/s: no significant change (-0.4%, CI -1.1%..+0.3%, within +/-3%)"),
        (make(VerdictKind.REGRESSION, -0.079, (-0.098, -0.060), 0.0004, 0.9996),
         "decode tok/s: REGRESSION -7.9% (CI -9.8%..-6.0%, p=0.0004, tolerance 3%)"),
        (make(VerdictKind.REGRESSION, 0.061, (0.04, 0.09), 0.00001, 1.0, metric="ttft", unit="ms",
              direction=LOWER),
         "ttft ms: REGRESSION +6.1% (CI +4.0%..+9.0%, p<0.0001, tolerance 3%)"),
        (make(VerdictKind.IMPROVEMENT, 0.052, (0.035, 0.07), 0.99, 0.0021),
         "decode tok/s: improvement +5.2% (CI +3.5%..+7.0%, p=0.0021, tolerance 3%)"),
        (make(VerdictKind.INCONCLUSIVE, 0.012, (-0.020, 0.044), 0.79, 0.21, metric="", unit=""),
         "inconclusive (+1.2%, CI -2.0%..+4.4% reaches past +/-3%; p=0.21)"),
        (make(VerdictKind.INCONCLUSIVE, -0.002, (-0.045, 0.041), 0.45, 0.55),
         "decode tok/s: inconclusive (-0.2%, CI -4.5%..+4.1% is wider than +/-3%; p=0.45)"),
        (make(VerdictKind.INCONCLUSIVE, 0.01, (-0.01, 0.052), 0.8, 0.2, reference_half=0.021),
         "decode tok/s: inconclusive (+1.0%, CI -1.0%..+5.2% reaches past +/-3%; p=0.2; the baseline "
         "alone is uncertain by +/-2.1% (10 samples): re-record it with --update-baselines on a quiet host)"),
    ],
)
def test_message_wording(comparison: Comparison, expected: str) -> None:
    assert comparison.message() == expected


@pytest.mark.parametrize(
    "comparison, expected",
    [
        # Median already 4.5% worse, only significance missing: more samples can settle it.
        (make(VerdictKind.INCONCLUSIVE, -0.045, (-0.09, 0.001), 0.02, 0.98), True),
        # +1% with a reference good to +/-1%: the CI can still shrink inside +/-3%.
        (make(VerdictKind.INCONCLUSIVE, 0.01, (-0.03, 0.05), 0.8, 0.2, reference_half=0.01), True),
        # +2.5% known to +/-0.5% from many current samples, against a reference only good to
        # +/-1.4%: no number of current samples gets the CI inside +/-3%.
        (make(VerdictKind.INCONCLUSIVE, 0.025, (0.01, 0.04), 0.9, 0.1, reference_half=0.014), False),
        # The same +2.5% from a few samples (CI +/-3.5%): the truth may well be near 0.
        (make(VerdictKind.INCONCLUSIVE, 0.025, (-0.01, 0.06), 0.9, 0.1, reference_half=0.014), True),
        # A reference only good to +/-3.5% can never show "within +/-3%".
        (make(VerdictKind.INCONCLUSIVE, 0.0, (-0.05, 0.05), 0.5, 0.5, reference_half=0.035), False),
        (make(VerdictKind.REGRESSION, -0.079, (-0.098, -0.06), 0.0004, 0.9996), False),
        (make(VerdictKind.NO_SIGNIFICANT_CHANGE, 0.0, (-0.01, 0.01), 0.5, 0.5), False),
    ],
)
def test_needs_more_samples(comparison: Comparison, expected: bool) -> None:
    assert needs_more_samples(comparison) is expected


def test_more_samples_do_resolve_what_needs_more_samples_says() -> None:
    rng = np.random.default_rng(0)
    reference = 100 * rng.lognormal(0, 0.04, 80)
    current = 100 * rng.lognormal(0, 0.04, 300)
    first = compare(current[:5], reference, direction=HIGHER, tolerance=0.03)
    assert first.verdict is VerdictKind.INCONCLUSIVE and needs_more_samples(first)
    assert compare(current, reference, direction=HIGHER, tolerance=0.03).verdict is (
        VerdictKind.NO_SIGNIFICANT_CHANGE
    )


def test_to_dict_is_json_ready() -> None:
    c = compare(scaled(0.92), REFERENCE, direction=HIGHER, tolerance=0.03, metric="decode", unit="tok/s")
    data = json.loads(json.dumps(c.to_dict(), allow_nan=False))
    assert data["verdict"] == "regression" and data["direction"] == "higher_is_better"
    assert data["message"] == c.message() and data["p_value"] == c.p_worse


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
    assert result.message() == message


def test_floor_check_without_floor_or_target() -> None:
    assert floor_check(45.0, None, 50, "tok/s", "decode").message() == (
        "decode 45 tok/s is below the target of 50 tok/s"
    )
    assert floor_check(45.0, 40, None, "tok/s", "decode").status is FloorStatus.OK
    assert floor_check(12345.6, None, None, "tok/s", "decode").message() == (
        "decode 12346 tok/s (no floor or target set)"
    )


def test_floor_check_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="decode floor 60 tok/s is above its target 50 tok/s"):
        floor_check(45.0, 60, 50, "tok/s", "decode")
    with pytest.raises(ValueError, match="decode median nan is not a finite number"):
        floor_check(math.nan, 40, 50, "tok/s", "decode")
    with pytest.raises(ValueError, match="decode target -1"):
        floor_check(45.0, None, -1, "tok/s", "decode")


def test_single_threshold_rule_follows_direction() -> None:
    down_4 = scaled(0.96)
    assert single_threshold_regression(down_4, REFERENCE, HIGHER, 0.03)
    assert not single_threshold_regression(down_4, REFERENCE, LOWER, 0.03)
    assert single_threshold_regression(scaled(1.04), REFERENCE, LOWER, 0.03)
    assert not single_threshold_regression(scaled(0.98), REFERENCE, HIGHER, 0.03)
    with pytest.raises(ValueError, match="needs samples on both sides"):
        single_threshold_regression([math.nan], REFERENCE, HIGHER, 0.03)
