"""The variance a comparison uses: each declared spread a prior held at its degrees of freedom,
pooled with what the boots measure, and the critical values at the resulting df.

A declared spread (a deployment's ``boot_spread``, ``session_spread``, ``host_spread``) is not an
exact value: each comes with how sure it is (``*_spread_df``), and :func:`pooled_variance` pools it
with a measured sum of squares at declared + measured df (a scaled inverse chi-square prior), the
declaration a floor. A rule stated in standard errors of a known variance (the gate's
stats.GATE_CRITICAL) is then held at its level with Student's t at the difference's
Welch-Satterthwaite df (:func:`critical_at`, :func:`satterthwaite_df`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.notes import SpreadSource

# The declared boot spread's weight as evidence, in degrees of freedom, for the intervals
# (Student's t): a guess, so "within +/-tol" on one boot a side needs a wide margin. The gate's
# directional rule takes it as known (GATE_CRITICAL is calibrated with it so).
PRIOR_DF = 3.0


@dataclass(frozen=True)
class Spread:
    """The between-boot spread a comparison used: SD of a boot's log-median, its degrees of
    freedom, and where it came from (said next to every verdict)."""

    sd_log: float
    df: float
    source: SpreadSource
    # The larger of the floor and what the boots measure, not pooled: the weight this level's df
    # carries in the Satterthwaite df (:func:`compare_boots`). NaN: ``sd_log``.
    plain_sd_log: float = math.nan

    @property
    def percent(self) -> float:
        """The spread as a percentage of the metric (exp(sd) - 1)."""
        return (math.exp(self.sd_log) - 1.0) * 100.0


def pooled_variance(declared_var: float, declared_df: float, sum_sq: float, df: float) -> tuple[float, float]:
    """A declared variance taken as a prior worth ``declared_df`` degrees of freedom (a scaled
    inverse chi-square), pooled with a measured sum of squares on ``df``: the variance a
    comparison uses and its degrees of freedom (declared + measured). The declaration stays a
    floor: the data can raise the variance, never lower it, so that declaring more df never
    widens an interval on the same data (the pooled value moves toward the declaration and the
    df grow). ``declared_df`` inf: the declaration is exact (the rule before declared df)."""
    if math.isinf(declared_df):
        return declared_var, math.inf
    pooled = (declared_df * declared_var + sum_sq) / (declared_df + df)
    return max(declared_var, pooled), declared_df + df


def within_sessions(current: Sequence[BootSummary], reference: Sequence[BootSummary]) -> tuple[float, float]:
    """The sum of squares of per-boot log-medians around their own session's mean, on both
    sides, and its degrees of freedom: what the boots measure of the boot level."""
    sum_sq = 0.0
    df = 0.0
    for side in (current, reference):
        sessions: dict[str, list[float]] = {}
        for b in side:
            sessions.setdefault(b.session, []).append(math.log(b.median))
        for logs in sessions.values():
            if len(logs) >= 2:
                mean = sum(logs) / len(logs)
                sum_sq += sum((x - mean) ** 2 for x in logs)
                df += len(logs) - 1
    return sum_sq, df


def boot_floor(current: Sequence[BootSummary], reference: Sequence[BootSummary], prior_sd_log: float) -> float:
    """The declared boot variance with the boots' own mean error of the median added: the
    floor of the boot level."""
    within = [b.se_log ** 2 for b in (*current, *reference) if math.isfinite(b.se_log)]
    return prior_sd_log ** 2 + (sum(within) / len(within) if within else 0.0)


def estimate_spread(
    current: Sequence[BootSummary], reference: Sequence[BootSummary], *, prior_sd_log: float,
    prior_df: float = PRIOR_DF,
) -> Spread:
    """The boot level: the declared spread (a prior worth ``prior_df`` degrees of freedom)
    pooled with the spread of per-boot log-medians *within sessions* (boots of one session
    share its effect, so only their spread around their own session's mean measures the boot
    level; the session level is judge/levels.py's), where a session has 2+ boots
    (:func:`pooled_variance`). The declaration is the floor: the boots can raise it, never lower
    it (a spread measured on 5 degrees of freedom is below the truth more than half the time,
    and below 0.6 of it one time in eight). Never below the boots' own within-boot error of the
    median either (a spread smaller than that is chance)."""
    if not (math.isfinite(prior_sd_log) and prior_sd_log >= 0):
        raise ValueError(f"prior spread {prior_sd_log!r}: use a finite SD of log-medians >= 0 (0.01 means 1%)")
    if math.isnan(prior_df) or prior_df < 1:
        raise ValueError(f"prior_df={prior_df!r}: use degrees of freedom >= 1, or inf for an exact declaration")
    sum_sq, df = within_sessions(current, reference)
    floor = boot_floor(current, reference, prior_sd_log)
    declared = math.expm1(prior_sd_log)
    var, pooled_df = pooled_variance(floor, prior_df, sum_sq, df)
    plain = math.sqrt(max(floor, sum_sq / df)) if df > 0 else math.sqrt(floor)
    if df == 0:
        return Spread(sd_log=math.sqrt(var), df=pooled_df, source=SpreadSource(SpreadSource.DECLARED, declared=declared),
                      plain_sd_log=plain)
    if var > floor:
        return Spread(sd_log=math.sqrt(var), df=pooled_df,
                      source=SpreadSource(SpreadSource.MEASURED, sides=(len(current), len(reference))),
                      plain_sd_log=plain)
    return Spread(sd_log=math.sqrt(var), df=pooled_df, source=SpreadSource(
        SpreadSource.FLOOR, declared=declared, measured=math.expm1(math.sqrt(sum_sq / df)), df=df,
        sides=(len(current), len(reference))), plain_sd_log=plain)


def critical_at(z: float, df: float) -> float:
    """The Student-t critical value at ``df`` degrees of freedom with the one-sided tail of the
    normal critical value ``z``: a rule stated in standard errors of a known variance (the
    gate's :data:`GATE_CRITICAL`, a family's) held at its level when the variance is estimated
    (declared spreads at their df pooled with measured ones). ``df`` inf gives ``z`` back."""
    if math.isinf(df):
        return z
    return _t_isf(float(scipy_stats.norm.sf(z)), df)


@functools.lru_cache(maxsize=4096)
def _t_isf(tail: float, df: float) -> float:
    return float(scipy_stats.t.isf(tail, df))


def satterthwaite_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates ``(var, df)``."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / d for v, d in parts if v > 0 and d > 0 and math.isfinite(d))
    if total <= 0:
        return min((d for _, d in parts), default=math.inf)
    if denom <= 0:
        # Every part that carries variance is exact; a part of no variance adds no uncertainty
        # (a declared spread of 0 at a few df is still 0).
        return math.inf
    return total * total / denom


@functools.lru_cache(maxsize=4096)
def t_quantile(level: float, df: float) -> float:
    """Student's t quantile (cached: the simulation asks for the same few thousands of times)."""
    return float(scipy_stats.t.ppf(level, df))
