"""The error budget of boots booked on demand: spending functions and their boundaries.

A profile comparison starts with ``start`` boots a side and may book one more boot of each side
at a time, up to ``cap`` (``--kimiperf-max-boots``). Looking at the data after every round and
stopping at the first verdict would spend the comparison's error budget once per look: a test at
5% looked at five times claims "within" at the band's edge in far more than 5% of sessions. Each
look therefore spends only part of it, by an alpha-spending function of the information so far
(Lan & DeMets, Biometrika 1983): with ``k`` boots a side of at most ``cap`` the information
fraction is ``k / cap`` (the variance of the difference falls as ``1/k``), and by look ``k`` the
rule has spent at most ``alpha(k / cap)`` of its budget, whatever the looks it took before.

* The direction (REGRESSION / IMPROVEMENT, :data:`~pytest_kimiperf.judge.in_session.IN_SESSION_ALPHA`
  one-sided at the tolerance's edge) spends O'Brien-Fleming-type: almost nothing early, so a
  direction claimed at 2 boots a side needs overwhelming evidence, and the last look's level is
  close to the fixed-sample one.
* "Within +/-tol" (the TOST at 5%) spends Pocock-type: evenly, so a profile that is within
  tolerance says so at the first look that can show it, which is the point of booking on demand.

Each one-sided test's critical values are the exact group-sequential boundaries for its
spending (the recursive numerical integration of Armitage, McPherson & Rowe 1969, as
Jennison & Turnbull 2000, ch. 19): ``P(cross at look j and not before) = alpha(t_j) -
alpha(t_{j-1})`` for a Brownian motion under the null. A look's boundary is turned into the
nominal one-sided level it stands for, and the comparison's Student-t test is run at that level
(the "significance level" approach, Jennison & Turnbull 2000, section 3.5). Stopping for another
reason (the other claim) only lowers the chance of a later crossing, so each rate stays at most
its budget. Pure functions: values in, values out; judge/sequential.py decides with them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

OBRIEN_FLEMING = "obrien-fleming"
POCOCK = "pocock"
SPENDING_SHAPES = (OBRIEN_FLEMING, POCOCK)
# Points per look of the integration grid: the boundaries agree with gsDesign's published ones
# to 1e-3 (tests/unit/test_sequential.py), far below what a boot's spread can tell.
GRID_POINTS = 401
# The grid's reach below zero, in standard deviations of the score: what lies beyond is < 1e-15.
GRID_REACH_SD = 8.0


def spent(alpha: float, fraction: float, shape: str) -> float:
    """The error budget a one-sided test at ``alpha`` has spent by information ``fraction``
    (0 < fraction <= 1; all of it at 1): Lan-DeMets O'Brien-Fleming-type or Pocock-type."""
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha={alpha!r}: use a one-sided level above 0 and below 0.5")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction!r}: the information fraction lies above 0 and at most 1")
    if shape == OBRIEN_FLEMING:
        return float(2.0 * scipy_stats.norm.sf(scipy_stats.norm.isf(alpha / 2.0) / math.sqrt(fraction)))
    if shape == POCOCK:
        return alpha * math.log1p((math.e - 1.0) * fraction)
    raise ValueError(f"spending shape {shape!r}; allowed: {', '.join(SPENDING_SHAPES)}")


@functools.lru_cache(maxsize=256)
def boundaries(alpha: float, fractions: tuple[float, ...], shape: str) -> tuple[float, ...]:
    """The upper critical values (standard normal scale) of a one-sided group-sequential test
    at ``alpha`` with looks at the increasing information ``fractions``: under the null, the
    chance of first crossing at look j is exactly what the spending function adds at j."""
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:])):
        raise ValueError(f"fractions={fractions!r}: give increasing information fractions")
    budget = [spent(alpha, t, shape) for t in fractions]
    increments = [budget[0], *(b - a for a, b in zip(budget, budget[1:]))]
    critical = [float(scipy_stats.norm.isf(increments[0]))]
    # The score S_j = Z_j * sqrt(t_j) is a Brownian motion in t; ``density`` holds the
    # sub-density of S at the last look on ``grid``, over the paths that have not crossed yet.
    sd = math.sqrt(fractions[0])
    grid = np.linspace(-GRID_REACH_SD * sd, critical[0] * sd, GRID_POINTS)
    density = scipy_stats.norm.pdf(grid, scale=sd)
    for j in range(1, len(fractions)):
        step = math.sqrt(fractions[j] - fractions[j - 1])
        weights = _trapezoid_weights(grid) * density

        def crossing(z: float, t: float = fractions[j]) -> float:
            # brentq below calls it within this pass, while the loop's names still hold this pass's values
            return float(np.sum(weights * scipy_stats.norm.sf((z * math.sqrt(t) - grid) / step)))  # noqa: B023

        if crossing(12.0) >= increments[j]:  # nothing left to spend: a boundary nobody crosses
            critical.append(math.inf)
            break
        critical.append(float(optimize.brentq(lambda z: crossing(z) - increments[j], -12.0, 12.0, xtol=1e-10)))  # noqa: B023
        reach = math.sqrt(fractions[j])
        new_grid = np.linspace(-GRID_REACH_SD * reach, critical[-1] * reach, GRID_POINTS)
        density = scipy_stats.norm.pdf((new_grid[:, None] - grid[None, :]) / step) @ weights / step
        grid = new_grid
    critical += [math.inf] * (len(fractions) - len(critical))
    return tuple(critical)


def _trapezoid_weights(grid: np.ndarray) -> np.ndarray:
    h = np.diff(grid)
    w = np.zeros_like(grid)
    w[:-1] += h / 2.0
    w[1:] += h / 2.0
    return w


@dataclass(frozen=True)
class SequentialPlan:
    """Boots on demand for a profile comparison: ``start`` boots a side first, then one more a
    side at a time up to ``cap``; each look's levels from the spending functions."""

    start: int
    cap: int
    direction_shape: str = OBRIEN_FLEMING
    equivalence_shape: str = POCOCK

    def __post_init__(self) -> None:
        if self.start < 1 or self.cap < self.start:
            raise ValueError(f"start={self.start!r}, cap={self.cap!r}: use 1 <= start <= cap boots a side")
        for shape in (self.direction_shape, self.equivalence_shape):
            if shape not in SPENDING_SHAPES:
                raise ValueError(f"spending shape {shape!r}; allowed: {', '.join(SPENDING_SHAPES)}")

    def looks(self, boots: int) -> tuple[int, ...]:
        """The looks taken by the time each side has ``boots`` boots: one a round from ``start``
        (fewer boots than planned, after a failed boot: that one look)."""
        if boots < 1:
            raise ValueError(f"boots={boots!r}: a look needs at least 1 boot a side")
        return tuple(range(min(self.start, boots), boots + 1))

    def level(self, alpha: float, boots: int, shape: str) -> float:
        """The nominal one-sided level of a test at ``alpha`` at the look with ``boots`` boots a
        side. A plan that books nothing (``start == cap``) keeps ``alpha`` whole."""
        cap = max(self.cap, boots)
        fractions = tuple(k / cap for k in self.looks(boots))
        return float(scipy_stats.norm.sf(boundaries(alpha, fractions, shape)[-1]))

    def final(self, boots: int) -> bool:
        """Whether the look with ``boots`` boots a side is the last one (the cap is reached)."""
        return boots >= self.cap
