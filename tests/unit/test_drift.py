"""A drift that adds up fails against the anchor, however slowly it comes; quiet nights do not."""

from __future__ import annotations

import math

import pytest

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.drift import drift_since_anchor

SPREADS = Spreads(0.01, 0.01)
WOBBLE = (0.004, -0.006, 0.002, -0.001, 0.005, -0.004, 0.0, 0.003, -0.002, -0.003)  # a quiet night's session


def night(level: float, name: str) -> list[BootSummary]:
    return [BootSummary(median=100.0 * math.exp(level + d), n=20, se_log=0.003, session=name, host="h")
            for d in (-0.004, 0.004)]


ANCHOR = night(0.0, "anchor-1") + night(0.002, "anchor-2")


def series(per_night: float, count: int) -> list[list[BootSummary]]:
    return [night(math.log1p(per_night) * t + WOBBLE[t % len(WOBBLE)], f"n{t}") for t in range(1, count + 1)]


def first_failure(per_night: float, count: int, direction: Direction = Direction.HIGHER_IS_BETTER) -> int | None:
    nights = series(per_night, count)
    if direction is Direction.LOWER_IS_BETTER:
        nights = [[BootSummary(1.0 / b.median, b.n, b.se_log, session=b.session, host=b.host) for b in n]
                  for n in nights]
    anchor = ANCHOR if direction is Direction.HIGHER_IS_BETTER else [
        BootSummary(1.0 / b.median, b.n, b.se_log, session=b.session, host=b.host) for b in ANCHOR]
    for t in range(1, count + 1):
        if drift_since_anchor(anchor, nights[:t], direction=direction, tolerance=0.03, spreads=SPREADS).failed:
            return t
    return None


@pytest.mark.parametrize("per_night", [-0.0005, -0.001, -0.0025])
def test_a_drift_that_adds_up_to_the_tolerance_fails_before_twice_the_tolerance(per_night: float) -> None:
    twice = math.log(0.94) / math.log1p(per_night)  # nights until the drift totals -6%
    first = first_failure(per_night, int(twice) + 5)
    assert first is not None and first < twice
    # ... and not before the drift is of the tolerance's order: a quiet wobble is no drift.
    assert math.expm1(math.log1p(per_night) * first) < -0.015


def test_quiet_nights_never_fail_and_a_drift_of_a_latency_fails_alike() -> None:
    assert first_failure(0.0, 150) is None
    assert first_failure(-0.0025, 30) == first_failure(-0.0025, 30, Direction.LOWER_IS_BETTER)


def test_the_anchor_alone_says_nothing() -> None:
    d = drift_since_anchor(ANCHOR, [], direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, spreads=SPREADS)
    assert not d.failed and math.isnan(d.change) and d.nights == 0


def test_the_cumulative_change_is_the_lines_and_its_bound_lies_in_the_builds_favour() -> None:
    d = drift_since_anchor(ANCHOR, series(-0.001, 60), direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                           spreads=SPREADS)
    assert d.nights == 60 and d.change == pytest.approx(-0.06, abs=0.01) and d.bound > d.change and d.failed
