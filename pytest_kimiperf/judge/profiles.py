"""Profiles of one session compared with each other, boot against boot, at session end.

In order: error spending for boots booked on demand (:func:`spent`, :func:`boundaries`), two
profiles of one session compared (:func:`compare_in_session`), the session's comparisons against
the reference profile or a control (:func:`profile_comparisons`, ``--kimiperf-control``), and
after each round, stop or book one more boot a side (:func:`next_step`).

The method and why: docs/explanation/methods.md,
"Profiles of one session: error spending, two profiles, boots on demand".
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import numpy as np
from scipy import optimize, special
from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.engine_clock import engine_boot_of, engine_only, on_two_clocks
from pytest_kimiperf.judge.notes import BootsForWithin, BootsToDecide, DeclaredModes, Note, SpreadSeen, SpreadSource
from pytest_kimiperf.judge.noise import smallest_change
from pytest_kimiperf.judge.stats import (
    DETECTION_POWER, EQUIVALENCE_CONFIDENCE, GATE_CRITICAL, MIN_BOOTS_DIRECTIONAL, RUN_ALPHA, BootSummary, Comparison,
    VerdictKind, _insufficient_note, band_log, compare_boots, family_critical, satterthwaite_df, t_quantile,
)
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult

OBRIEN_FLEMING = "obrien-fleming"
POCOCK = "pocock"
_SPENDING_SHAPES = (OBRIEN_FLEMING, POCOCK)
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
    raise ValueError(f"spending shape {shape!r}; allowed: {', '.join(_SPENDING_SHAPES)}")


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
            if shape not in _SPENDING_SHAPES:
                raise ValueError(f"spending shape {shape!r}; allowed: {', '.join(_SPENDING_SHAPES)}")

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


# One-sided, per metric and direction, at the tolerance's edge: the test is calibrated there, and
# an inert profile sits far inside the band (25% on the CPU engine, 3% on GPUs, against boot
# spreads of 10% and 1%), so its false directions come almost only from mode assignments the
# declared modes make likely, whose weight this bounds. A profile comparison judges 12 metrics
# and an inert profile must get a direction in at most 1% of sessions (benchmarks/profile_power.py:
# the replay of every host of the noise corpus and the spawn-mode cells).
IN_SESSION_ALPHA = 0.005
# "Within +/-tol" is a TOST at 5%: both one-sided 95% bounds (the 90% interval, the gate's
# stats.EQUIVALENCE_CONFIDENCE) inside the band, as bioequivalence claims it. A claim gets the
# conventional level; where 2 boots a side cannot reach it, the answer is more boots.
EQUIVALENCE_LEVEL = 1.0 - (1.0 - EQUIVALENCE_CONFIDENCE) / 2.0
_EQUIVALENCE_ALPHA = 1.0 - EQUIVALENCE_LEVEL
# The two-sided interval every row shows, "within" rows included: the gate's. Under boots on
# demand a "within" row's interval is the repeated confidence interval at that look (Jennison &
# Turnbull 2000, ch. 9): wider than the look's fixed 90%, and covering at 90% over every look.
WITHIN_INTERVAL = EQUIVALENCE_CONFIDENCE
INTERVAL_LEGEND = f"{EQUIVALENCE_CONFIDENCE * 100:g}% CI"
# A mode assignment whose posterior weight is below this is ignored by the "within" claim.
_MODE_WEIGHT_IGNORED = 0.01
# The planner looks this far for the boots that would decide a comparison.
MAX_PLANNED_BOOTS = 8
# Boots a side beyond which the mode assignments are not enumerated one by one (2**k each).
_MAX_ENUMERATED_BOOTS = 12
# The verdicts that answer a profile comparison's question: a direction, or "within".
_DECIDED = (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT, VerdictKind.WITHIN_TOLERANCE)


@dataclass(frozen=True)
class SpawnModes:
    """A deployment's spawn modes: a share ``slow_share`` of boots land in a mode ``drop`` worse
    (0.5: half as fast; on a latency, twice as slow). ``drop`` 0 declares no modes."""

    drop: float = 0.0
    slow_share: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.drop) and 0.0 <= self.drop < 1.0):
            raise ValueError(f"spawn mode drop {self.drop!r}: use a fraction >= 0 and below 1 (0.5 = half as fast)")
        if not (math.isfinite(self.slow_share) and 0.0 <= self.slow_share < 1.0):
            raise ValueError(f"spawn mode slow_share {self.slow_share!r}: use a fraction >= 0 and below 1")

    @property
    def gap_log(self) -> float:
        """The gap between the modes on the log scale (0 when none are declared)."""
        return -math.log1p(-self.drop) if self.declared else 0.0

    @property
    def declared(self) -> bool:
        """Whether the deployment declares modes at all."""
        return self.drop > 0.0 and self.slow_share > 0.0


@dataclass(frozen=True)
class InSessionRules:
    """What a profile comparison is judged by, from the deployment."""

    boot_spread: float = 0.01
    boot_spread_df: float = 3.0
    modes: SpawnModes = SpawnModes()
    alpha: float = IN_SESSION_ALPHA
    plan: SequentialPlan | None = None  # boots on demand; None: one look
    # The comparisons the session's sign budget (stats.RUN_ALPHA) is shared by. None: this one alone.
    family: int | None = None
    # (metric, boot spread) where the deployment declares a metric its own (``boot_spreads``).
    boot_by_metric: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.family is not None and self.family < 1:
            raise ValueError(f"family={self.family!r}: a session's profile comparisons number 1 or more")

    @classmethod
    def of(cls, deployment: Deployment, plan: SequentialPlan | None = None) -> InSessionRules:
        """The rules a deployment declares (``plan``: the session books boots on demand)."""
        return cls(deployment.boot_spread, deployment.boot_spread_df,
                   SpawnModes(deployment.spawn_mode_drop, deployment.spawn_mode_share), plan=plan,
                   boot_by_metric=tuple(sorted(deployment.boot_spreads.items())))

    def for_metric(self, metric: str) -> InSessionRules:
        """The rules a comparison of ``metric`` is judged by: its own declared boot spread where
        the deployment gives one."""
        spread = dict(self.boot_by_metric).get(metric)
        return self if spread is None else replace(self, boot_spread=spread, boot_by_metric=())

    @property
    def sign_alpha(self) -> float:
        """The one-sided level of each side of a comparison's sign: the session's budget split
        over its comparisons and their two sides (stats.family_critical's split)."""
        return RUN_ALPHA / (2.0 * (self.family or 1))

    def levels(self, boots: int) -> tuple[float, float]:
        """The one-sided levels of the direction and of each side of the TOST at the look with
        ``boots`` boots a side: the whole ``alpha`` and 5% without a plan, the spent share with one."""
        if self.plan is None or boots < 1:
            return self.alpha, _EQUIVALENCE_ALPHA
        return (self.plan.level(self.alpha, boots, self.plan.direction_shape),
                self.plan.level(_EQUIVALENCE_ALPHA, boots, self.plan.equivalence_shape))

    @property
    def sign_level(self) -> float:
        """The one-sided level of a sign at any look: :attr:`sign_alpha` split over the looks the
        plan may take (Bonferroni: the booking stops on the primary metric alone, so the other
        metrics' looks are not the ones a spending function plans for)."""
        if self.plan is None:
            return self.sign_alpha
        return self.sign_alpha / len(self.plan.looks(self.plan.cap))


def _side_offsets(gains: Sequence[float], sd: float, modes: SpawnModes) -> list[tuple[float, float]]:
    """The side's mean mode offset (on the gain scale: a slow boot is ``-gap``) and its posterior
    weight, for every assignment of the side's boots to the modes."""
    if not modes.declared:
        return [(0.0, 1.0)]
    k = len(gains)
    gap = modes.gap_log
    mean = sum(gains) / k
    residuals = [g - mean for g in gains]
    log_weights: dict[float, list[float]] = {}
    if k > _MAX_ENUMERATED_BOOTS:
        # The worst case instead: every boot of the side in either mode, with equal weight.
        return [(0.0, 0.5), (-gap, 0.5)]
    for mask in itertools.product((0, 1), repeat=k):
        slow = sum(mask)
        share = slow / k
        # The residuals the modes leave inside the side, as the within-mode spread sees them.
        misfit = sum((r + gap * (m - share)) ** 2 for r, m in zip(residuals, mask))
        log_w = (slow * math.log(modes.slow_share) + (k - slow) * math.log1p(-modes.slow_share)
                 - misfit / (2.0 * sd * sd))
        log_weights.setdefault(round(-gap * share, 12), []).append(log_w)
    top = max(w for ws in log_weights.values() for w in ws)
    weights = {off: sum(math.exp(w - top) for w in ws) for off, ws in log_weights.items()}
    total = sum(weights.values())
    return [(off, w / total) for off, w in sorted(weights.items())]


def _t_sf(x: float, df: float) -> float:
    """Student's t survival function, as ``scipy.stats.t.sf(x, df)`` gives it to the last bit,
    from the ufunc under it: a scalar call of ``t.sf`` costs ~75 us of argument checks, and a
    comparison of a few boots a side weighs every assignment of its boots to the spawn modes."""
    return float(special.stdtr(df, -x))


@dataclass(frozen=True)
class _Fit:
    """The difference of the sides' mean gains and its two standard errors: pooled (the boots of
    both sides with the declared spread, for "within" and the interval) and separate (each
    side's own spread where it exceeds the declared one, for a direction)."""

    d: float
    sd: float  # pooled SD of a boot's log-median, never below the declared
    df: float
    se: float
    se_dir: float
    df_dir: float
    pairs: tuple[tuple[float, float], ...]  # (offset of current - offset of reference, weight)


def _fit(cur: Sequence[float], ref: Sequence[float], rules: InSessionRules) -> _Fit:
    declared_var = math.log1p(rules.boot_spread) ** 2
    sides = [(len(side), sum((x - sum(side) / len(side)) ** 2 for x in side)) for side in (cur, ref)]
    df_measured = sum(k - 1 for k, _ in sides)
    pooled = (rules.boot_spread_df * declared_var + sum(ss for _, ss in sides)) / (rules.boot_spread_df + df_measured)
    var = max(pooled, declared_var)
    df = rules.boot_spread_df + df_measured
    se = math.sqrt(var * (1.0 / len(cur) + 1.0 / len(ref)))
    # A direction takes each side's own spread where it exceeds the declared one (with the side's
    # own few degrees of freedom): one side whose boots agree by chance must not vouch for the other.
    parts = []
    for k, ss in sides:
        own = ss / (k - 1) if k > 1 else 0.0
        parts.append((own / k, k - 1.0) if own > declared_var else (declared_var / k, rules.boot_spread_df))
    se_dir = math.sqrt(sum(v for v, _ in parts))
    df_dir = satterthwaite_df(parts)
    d = sum(cur) / len(cur) - sum(ref) / len(ref)
    sd = math.sqrt(var)
    cur_off, ref_off = _side_offsets(cur, sd, rules.modes), _side_offsets(ref, sd, rules.modes)
    pairs = tuple((oc - orf, wc * wr) for oc, wc in cur_off for orf, wr in ref_off)
    return _Fit(d=d, sd=sd, df=df, se=se, se_dir=se_dir, df_dir=df_dir, pairs=pairs)


def _p_better(fit: _Fit, band: float) -> float:
    """P(a difference this large | the true gain at the band's upper edge), the modes weighed."""
    return sum(w * _t_sf((fit.d - band - off) / fit.se_dir, fit.df_dir) for off, w in fit.pairs)


def _p_worse(fit: _Fit, band: float) -> float:
    """P(a difference this low | the true gain at the band's lower edge), the modes weighed."""
    return sum(w * _t_sf((off - band - fit.d) / fit.se_dir, fit.df_dir) for off, w in fit.pairs)


def _sign_bound(fit: _Fit, level: float, *, upper: bool) -> float:
    """The lower (``upper``: upper) bound of the difference at one-sided ``level``, the modes
    weighed as a direction's p-value weighs them, on the pooled spread: the true gain at which a
    difference as far out as this one has chance ``level``. It lies beyond zero exactly where
    "no change" is rejected at ``level``."""
    se, df = fit.se, fit.df
    t = -t_quantile(level, df)  # the lower tail's quantile keeps a tiny level exact
    centres = [fit.d - off for off, _ in fit.pairs]
    low, high = min(centres), max(centres)
    if not math.isfinite(t) or high - low <= 1e-12 * max(1.0, abs(high)):
        return high + t * se if upper else low - t * se

    def tail(x: float) -> float:
        # P(a difference this far out | true gain x): rising in x for the lower bound, falling for the upper.
        return sum(w * _t_sf(((x - c) if upper else (c - x)) / se, df)
                   for c, (_, w) in zip(centres, fit.pairs)) - level

    # Each centre's own bound brackets the mixture's; where rounding leaves an end on the other
    # side, that end is the bound to the last bit.
    a, b = (low + t * se, high + t * se) if upper else (low - t * se, high - t * se)
    fa, fb = tail(a), tail(b)
    if fa == 0.0 or fb == 0.0 or (fa > 0.0) == (fb > 0.0):
        return a if abs(fa) <= abs(fb) else b
    return float(optimize.brentq(tail, a, b, xtol=1e-12))


def _expm1(x: float) -> float:
    """exp(x) - 1, infinite beyond what a float holds (a sign's bound at a tiny level on 1 df)."""
    return math.expm1(x) if x < 700.0 else math.inf


def compare_in_session(
    current: Sequence[BootSummary],
    reference: Sequence[BootSummary],
    *,
    direction: Direction,
    tolerance: float,
    rules: InSessionRules,
    metric: str = "",
    unit: str = "",
) -> Comparison:
    """Decide whether the ``current`` profile's boots differ from the ``reference`` profile's,
    both measured in this session (methods.md, "Two profiles in one session")."""
    direction = Direction(direction)
    if not (math.isfinite(tolerance) and 0.0 < tolerance < 1.0):
        raise ValueError(f"tolerance={tolerance!r}: use a fraction between 0 and 1 (0.03 means 3%)")
    cur_b = [b for b in current if b.usable]
    ref_b = [b for b in reference if b.usable]
    sign = 1.0 if direction is Direction.HIGHER_IS_BETTER else -1.0
    nan = math.nan
    alpha, equivalence_alpha = rules.levels(min(len(cur_b), len(ref_b)))
    common: dict[str, Any] = dict(metric=metric, unit=unit, direction=direction, tolerance=float(tolerance),
                  boots_current=len(cur_b), boots_reference=len(ref_b),
                  n_current=sum(b.n for b in cur_b), n_reference=sum(b.n for b in ref_b),
                  confidence=1.0 - rules.sign_level)
    if not cur_b or not ref_b:
        return Comparison(**common, median_current=nan, median_reference=nan, change=nan, bound_low=nan,
                          bound_high=nan, ci_low=nan, ci_high=nan, spread_sd_log=nan, spread_df=nan,
                          spread_source=None, se_log=nan, mdc=nan, verdict=VerdictKind.INSUFFICIENT_SAMPLES,
                          notes=_insufficient_note(current, reference))
    cur = [sign * math.log(b.median) for b in cur_b]
    ref = [sign * math.log(b.median) for b in ref_b]
    fit = _fit(cur, ref, rules)
    band = band_log(tolerance)
    p_better, p_worse = _p_better(fit, band), _p_worse(fit, band)
    t_eq = t_quantile(1.0 - equivalence_alpha, fit.df)
    t_ci = t_quantile(1.0 - (1.0 - EQUIVALENCE_CONFIDENCE) / 2.0, fit.df)
    enough = min(len(cur), len(ref)) >= MIN_BOOTS_DIRECTIONAL
    apart_better = min(cur) > max(ref)
    apart_worse = max(cur) < min(ref)
    # Every likely mode assignment must agree that the change is inside the band.
    likely = [off for off, w in fit.pairs if w >= _MODE_WEIGHT_IGNORED]
    inside = all(abs(fit.d - off) + t_eq * fit.se <= band for off in likely)
    # The intervals hold every likely mode assignment's (the modes are part of what is unknown).
    def interval(t: float) -> tuple[float, float]:
        return min(fit.d - off for off in likely) - t * fit.se, max(fit.d - off for off in likely) + t * fit.se

    clo, chi = interval(t_ci)
    # A sign only where the bounds at the session's sign level exclude zero, on the pooled spread
    # (a direction's own test, each side's own spread at its few df, comes on top: at 1 df a
    # family's level is out of reach).
    sign_level = rules.sign_level
    slo, shi = _sign_bound(fit, sign_level, upper=False), _sign_bound(fit, sign_level, upper=True)
    if enough and p_worse <= alpha and apart_worse and shi < 0.0:
        verdict = VerdictKind.REGRESSION
    elif enough and p_better <= alpha and apart_better and slo > 0.0:
        verdict = VerdictKind.IMPROVEMENT
    elif inside:
        verdict = VerdictKind.WITHIN_TOLERANCE
    elif slo > 0.0 or shi < 0.0:
        verdict = VerdictKind.CHANGED_SIZE_UNRESOLVED
    elif abs(fit.d) > band:
        verdict = VerdictKind.INCONCLUSIVE
    else:
        verdict = VerdictKind.NO_DETECTABLE_CHANGE
    if verdict is VerdictKind.WITHIN_TOLERANCE:
        clo, chi = interval(t_eq)
    # Reported on the metric's own scale (change > 0: the current side's figure is higher); the
    # bounds are the sign's.
    lo, hi = slo, shi
    if sign < 0:
        lo, hi, clo, chi = -hi, -lo, -chi, -clo
    change = math.expm1(sign * fit.d)
    notes: list[Note] = [DeclaredModes(rules.modes.drop, rules.modes.slow_share)] if rules.modes.declared else []
    have = min(len(cur), len(ref))
    if rules.plan is not None and not rules.plan.final(have) and verdict not in _DECIDED:
        pass  # an early look of boots on demand: the session books the next boot a side
    elif verdict in (VerdictKind.CHANGED_SIZE_UNRESOLVED, VerdictKind.INCONCLUSIVE) and abs(fit.d) > band:
        needed = _boots_to_decide(fit.d, fit.sd, band, rules)
        notes.append(BootsToDecide(needed, MAX_PLANNED_BOOTS, have_them=needed is not None and needed <= have))
    elif verdict not in _DECIDED:
        notes.append(BootsForWithin(_boots_for_within(fit.d, fit.sd, band, rules), have, MAX_PLANNED_BOOTS))
    source = (SpreadSource(SpreadSource.DECLARED, declared=rules.boot_spread, whole=True)
              if fit.sd <= math.log1p(rules.boot_spread) + 1e-12
              else SpreadSource(SpreadSource.SIDES, measured=math.expm1(fit.sd), whole=True))
    return Comparison(
        spreads_seen=_boot_seen(cur, ref, [*cur_b, *ref_b], rules),
        **common, median_current=math.exp(sum(math.log(b.median) for b in cur_b) / len(cur_b)),
        median_reference=math.exp(sum(math.log(b.median) for b in ref_b) / len(ref_b)),
        change=change, bound_low=_expm1(lo), bound_high=_expm1(hi), ci_low=math.expm1(clo),
        ci_high=math.expm1(chi), spread_sd_log=fit.sd, spread_df=fit.df, spread_source=source, se_log=fit.se,
        mdc=_mdc(fit, band, rules), verdict=verdict, notes=tuple(notes),
        equivalence_confidence=WITHIN_INTERVAL if verdict is VerdictKind.WITHIN_TOLERANCE else EQUIVALENCE_CONFIDENCE)


def _boot_seen(cur: Sequence[float], ref: Sequence[float], boots: Sequence[BootSummary],
               rules: InSessionRules) -> tuple[SpreadSeen, ...]:
    """What the two sides' boots measure of the boot level against the declared boot spread;
    nothing where the deployment declares spawn modes (the sides' spread holds them too) or no
    side has two boots."""
    df = sum(len(side) - 1 for side in (cur, ref))
    if rules.modes.declared or df <= 0:
        return ()
    sum_sq = sum(sum((x - sum(side) / len(side)) ** 2 for x in side) for side in (cur, ref))
    errors = [b.se_log ** 2 for b in boots if math.isfinite(b.se_log)]
    lower = sum(errors) / len(errors) if errors else 0.0
    units = sum(len(side) for side in (cur, ref) if len(side) > 1)
    return (SpreadSeen("boot", sum_sq, df, math.log1p(rules.boot_spread) ** 2 + lower, rules.boot_spread, units,
                       lower_var=lower),)


def _boots_to_decide(d: float, sd: float, band: float, rules: InSessionRules) -> int | None:
    """The boots a side at which a difference ``d`` (log, gain scale) would get its direction,
    were every boot to fall as these did (each side in one mode, spread ``sd``); None when no
    number up to :data:`MAX_PLANNED_BOOTS` would."""
    for k in range(MIN_BOOTS_DIRECTIONAL, MAX_PLANNED_BOOTS + 1):
        side = [0.0] * k
        offsets = _side_offsets(side, sd, rules.modes)
        pairs = tuple((oc - orf, wc * wr) for oc, wc in offsets for orf, wr in offsets)
        se = sd * math.sqrt(2.0 / k)
        df = rules.boot_spread_df + 2 * (k - 1)
        fit = _Fit(d=abs(d), sd=sd, df=df, se=se, se_dir=se, df_dir=df, pairs=pairs)
        if _p_better(fit, band) <= rules.alpha:
            return k
    return None


def _boots_for_within(d: float, sd: float, band: float, rules: InSessionRules) -> int | None:
    """The boots a side, booked up front, at which a true difference ``d`` (log) shows "within"
    the ``band`` with :data:`DETECTION_POWER`; None when no number up to
    :data:`MAX_PLANNED_BOOTS` does. The modes are left out: they can only ask for more."""
    z_power = float(scipy_stats.norm.ppf(DETECTION_POWER))
    for k in range(MIN_BOOTS_DIRECTIONAL, MAX_PLANNED_BOOTS + 1):
        se = sd * math.sqrt(2.0 / k)
        if abs(d) + (t_quantile(EQUIVALENCE_LEVEL, rules.boot_spread_df + 2 * (k - 1)) + z_power) * se <= band:
            return k
    return None


def smallest_drop(boots: int, tolerance: float, rules: InSessionRules) -> float:
    """The smallest regression (0.3 is 30% slower) that ``boots`` boots a side convict beyond
    ``tolerance`` with 90% power, the modes left out."""
    if boots < 1:
        raise ValueError(f"boots={boots!r}: use a count of at least 1")
    reach = _reach(band_log(tolerance), math.log1p(rules.boot_spread) * math.sqrt(2.0 / boots),
                   rules.boot_spread_df + 2 * (boots - 1), rules)
    return -math.expm1(-reach)


def _reach(band: float, se: float, df: float, rules: InSessionRules) -> float:
    """How far (log) a true difference must lie for a direction with 90% power, modes left out."""
    return band + (t_quantile(1.0 - rules.alpha, df) + t_quantile(0.90, df)) * se


def _mdc(fit: _Fit, band: float, rules: InSessionRules) -> float:
    """The smallest change (a positive fraction) this design calls a direction with 90% power,
    modes left out (they can only make it larger)."""
    return math.expm1(_reach(band, fit.se, fit.df, rules))


def compare_with_control(current: Sequence[BootSummary], control: Sequence[BootSummary], *, direction: Direction,
                         tolerance: float, rules: InSessionRules, metric: str = "", unit: str = "") -> Comparison:
    """The candidate's boots against its control's (--kimiperf-control), interleaved in one
    session: the gate's rule with no level above the boot; where the deployment declares spawn
    modes, :func:`compare_in_session`'s, which weighs them (the gate's rule would read a side that
    landed slow as a change)."""
    if rules.modes.declared:
        return compare_in_session(current, control, direction=direction, tolerance=tolerance, rules=rules,
                                  metric=metric, unit=unit)
    return compare_boots(current, control, direction=direction, tolerance=tolerance, prior_spread=rules.boot_spread,
                         metric=metric, unit=unit,
                         critical=None if rules.family is None else family_critical(rules.family))


def control_reach(boot_spread: float, boots: int, tolerance: float, rules: InSessionRules) -> float:
    """The regression a candidate against its control (``boots`` each) convicts with
    DETECTION_POWER, by the rule :func:`compare_with_control` applies."""
    if rules.modes.declared:
        return smallest_drop(boots, tolerance, rules)
    return smallest_change(boot_spread, boots, reference_boots=boots, tolerance=tolerance, critical=GATE_CRITICAL)


def compare_profiles(
    results: Sequence[TestResult], reference_profile: str, *, rules: InSessionRules = InSessionRules(),
    control: bool = False,
) -> list[tuple[str, str, str, Comparison]]:
    """(test, metric, profile, comparison) of each profile against the reference (or a
    ``control``); INVALID boots are samples of neither profile and are left out."""
    boots: dict[tuple[str, str], dict[str, list[BootSummary]]] = {}
    meta: dict[tuple[str, str], MetricResult] = {}
    for res in results:
        if res.invalid:
            continue
        for metric, mres in res.metrics.items():
            boots.setdefault((res.test, metric), {}).setdefault(res.profile, []).append(mres.boot_summary())
            meta.setdefault((res.test, metric), mres)
    if rules.family is None:
        rules = replace(rules, family=max(1, _family(boots, reference_profile)))
    rows: list[tuple[str, str, str, Comparison]] = []
    for (test, metric), per_profile in boots.items():
        ref = per_profile.get(reference_profile)
        if ref is None:
            continue
        spec = metric_spec(metric)
        mres = meta[(test, metric)]
        for profile, current in per_profile.items():
            if profile == reference_profile:
                continue
            compare = compare_with_control if control else compare_in_session
            rows.append((test, metric, profile, compare(
                current, ref, direction=Direction(mres.direction), tolerance=mres.tolerance,
                rules=rules.for_metric(metric), metric=spec.label, unit=mres.unit,
            )))
    return rows


def _family(boots: Mapping[tuple[str, str], Mapping[str, Sequence[BootSummary]]], reference_profile: str) -> int:
    """The comparisons a session's profiles make that compare something: each test's metric under
    each profile with a usable boot, where the reference has one too."""
    def usable(side: Sequence[BootSummary]) -> bool:
        return any(b.usable for b in side)

    return sum(sum(1 for profile, side in per_profile.items() if profile != reference_profile and usable(side))
               for per_profile in boots.values() if usable(per_profile.get(reference_profile, ())))


@dataclass(frozen=True)
class ProfileComparison:
    """One profile against the reference profile for one test and metric."""

    test: str
    metric: str
    profile: str
    reference_profile: str
    comparison: Comparison | None
    error: str | None = None  # why no comparison could be computed


def profile_comparisons(
    results: Sequence[TestResult], reference_profile: str, *, rules: InSessionRules = InSessionRules(),
    control: bool = False,
) -> list[ProfileComparison]:
    """Each profile against the reference, per test and metric; invalid runs are left out. Each
    test is compared on its own, so one whose samples cannot be compared (a reference median of 0)
    does not take the others' tables away."""
    by_test: dict[str, list[TestResult]] = {}
    measured: dict[tuple[str, str], dict[str, list[BootSummary]]] = {}
    for res in results:
        if not res.invalid:
            by_test.setdefault(res.test, []).append(res)
            for metric, mres in res.metrics.items():
                measured.setdefault((res.test, metric), {}).setdefault(res.profile, []).append(mres.boot_summary())
    if rules.family is None:
        # Every test's comparisons share the session's sign budget, though each is judged on its own.
        rules = replace(rules, family=max(1, _family(measured, reference_profile)))
    rows: list[ProfileComparison] = []
    for test, group in by_test.items():
        try:
            compared = compare_profiles(group, reference_profile, rules=rules, control=control)
        except ValueError as exc:
            rows.extend(
                ProfileComparison(test, metric, res.profile, reference_profile, None,
                                  error=f"cannot compare: {exc}")
                for res in group if res.profile != reference_profile for metric in res.metrics
            )
            continue
        rows.extend(
            ProfileComparison(test, metric, profile, reference_profile,
                              _on_two_clocks(metric, comparison, group, profile, reference_profile))
            for test, metric, profile, comparison in compared
        )
    return rows


def _on_two_clocks(metric: str, comparison: Comparison | None, group: Sequence[TestResult], profile: str,
                   reference: str) -> Comparison | None:
    """The comparison as the engine's clock leaves it (judge/engine_clock.py), decided here once:
    every output reads the comparison."""
    if comparison is None:
        return None

    def boots(name: str) -> list[TestResult]:
        return sorted((r for r in group if r.profile == name and r.invalid is None), key=lambda r: r.boot)

    cur, ref = boots(profile), boots(reference)
    only_engine = bool(cur and ref) and engine_only(cur[0].profile_env, ref[0].profile_env,
                                                    cur[0].profile_args, ref[0].profile_args)
    return on_two_clocks(metric, comparison, [b for r in cur if (b := engine_boot_of(r.run)) is not None],
                         [b for r in ref if (b := engine_boot_of(r.run)) is not None],
                         engine_only_profile=only_engine, reference_name=reference)


def session_plan(*, profiles: int, boots: int, max_boots: int, control: bool) -> SequentialPlan | None:
    """The boots on demand of a session's profile comparison, from its planned boots up to its
    cap; None where no two profiles are compared, or against a control (the gate's rule)."""
    if profiles < 2 or control:
        return None
    return SequentialPlan(boots, max(max_boots, boots))


class LookStep(Enum):
    """What a look decides: stop with its verdict, or book one more boot of each side."""

    STOP = "stop"
    BOOK = "book"


@dataclass(frozen=True)
class LookDecision:
    """A look's step and why: ``decided`` (a direction or "within"), ``cap`` (no more boots
    allowed) or ``undecided`` (book one more boot a side)."""

    step: LookStep
    why: str
    boots: int


def next_step(comparison: Comparison, plan: SequentialPlan) -> LookDecision:
    """After a look: stop at a verdict that answers the question or at the cap, otherwise book
    one more boot of each side."""
    boots = min(comparison.boots_current, comparison.boots_reference)
    if comparison.verdict in _DECIDED:
        return LookDecision(LookStep.STOP, "decided", boots)
    if plan.final(boots):
        return LookDecision(LookStep.STOP, "cap", boots)
    return LookDecision(LookStep.BOOK, "undecided", boots)


def profiles_to_book(boots: Mapping[str, Sequence[BootSummary]], reference: str, *, direction: Direction,
                     tolerance: float, rules: InSessionRules) -> tuple[str, ...]:
    """One test's profiles that get one more boot after a complete round (``boots``: each
    profile's boots of the primary metric so far): an undecided one books a boot of itself and of
    the reference. None without a plan, or with a profile that has no boot."""
    plan = rules.plan
    ref = boots.get(reference)
    if plan is None or not ref or any(not side for side in boots.values()):
        return ()
    booked: list[str] = []
    for profile, current in boots.items():
        if profile == reference:
            continue
        comparison = compare_in_session(current, ref, direction=direction, tolerance=tolerance, rules=rules)
        if next_step(comparison, plan).step is LookStep.BOOK:
            booked += [profile] if reference in booked else [reference, profile]
    return tuple(booked)
