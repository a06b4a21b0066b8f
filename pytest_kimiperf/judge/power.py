"""How many boots a verdict needs: the first-boot screen and the boot planner's advice.

A comparison that looks worse than the tolerance without a verdict asks for another boot
(:func:`wants_another_boot`); an inconclusive, "changed, size unresolved" or "no detectable
change" verdict says how many boots would resolve a change of interest (:func:`plan`,
from :func:`boots_needed`: the normal-approximation power calculation against the baseline's
boot history). The verdicts themselves, and the minimum detectable change quoted with them,
are ``stats``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as scipy_stats

from pytest_kimiperf.judge.stats import (
    DETECTION_POWER, GATE_CRITICAL, MIN_BOOTS_DIRECTIONAL, Comparison, VerdictKind, critical_at, satterthwaite_df,
)
from pytest_kimiperf.judge.notes import Plan
from pytest_kimiperf.numbers import is_real

# First-boot screen: another boot when the change looks worse than this share of the tolerance.
_SCREEN_FRACTION = 1.0


def wants_another_boot(c: Comparison, *, screen_fraction: float = _SCREEN_FRACTION) -> bool:
    """Whether another boot of the current side is worth its cost for this comparison.

    Boots on demand: a run boots once; a comparison asks for another boot while it looks worse
    than ``screen_fraction`` of the tolerance without a verdict (inconclusive, or a regression
    that one boot cannot convict). Only the worse side screens: the gate exists to catch
    regressions, and every extra boot costs a full model load. The caller stops at the
    deployment's maximum.
    """
    if c.verdict not in (VerdictKind.INCONCLUSIVE, VerdictKind.CHANGED_SIZE_UNRESOLVED,
                         VerdictKind.NO_DETECTABLE_CHANGE):
        return False
    return c.gain < -screen_fraction * c.tolerance


def _allowed_variance(change: float, tolerance: float, *, confidence: float = 0.95,
                     power: float = DETECTION_POWER, critical: float | None = None) -> float:
    """The largest variance of the log difference at which a true ``change`` clears
    ``tolerance`` at one-sided ``confidence`` with ``power``: the SE may be at most margin / z.
    With ``critical`` (the gate's rule, stats.GATE_CRITICAL): at which the estimate lands beyond
    the tolerance and ``critical`` standard errors from no change with ``power``."""
    z_power = float(scipy_stats.norm.ppf(power))
    size = math.log1p(abs(change))
    if critical is not None:
        return min((size - math.log1p(tolerance)) / z_power, size / (critical + z_power)) ** 2
    z = float(scipy_stats.norm.ppf(confidence)) + z_power
    return ((size - math.log1p(tolerance)) / z) ** 2


def boots_needed(
    change: float, spread: float, *, tolerance: float = 0.0, reference_boots: int | None = None,
    power: float = DETECTION_POWER, confidence: float = 0.95, max_boots: int = 10_000,
    fixed_var: float = 0.0, critical: float | None = None,
) -> int | None:
    """Boots per side that resolve a true ``change`` (fraction, e.g. 0.006) at boot ``spread``.

    Two profiles booted alike (``reference_boots=None``): N boots each, so that the one-sided
    ``confidence`` bound of the difference clears ``tolerance`` (0: "tell them apart") with
    ``power``. Against a baseline of ``reference_boots``: N boots of the current side. None when
    no number of boots can do it (the baseline alone is too uncertain): record more baseline
    boots. Uses the normal quantile: the spread is taken as known. ``fixed_var`` is the variance
    that no boot of this run shrinks (the session and host levels the sides do not share:
    judge/levels.py); when it alone fills the room, no number of boots can do it either.
    ``critical``: the gate's rule instead of ``confidence`` (:func:`_allowed_variance`).
    """
    for name, value in (("change", change), ("spread", spread)):
        if not is_real(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r}: use a fraction above 0 (0.006 means 0.6%)")
    if not is_real(tolerance) or not 0 <= tolerance < abs(change):
        raise ValueError(f"tolerance={tolerance!r}: use a fraction >= 0 and below the change {change!r}")
    sd = math.log1p(spread)
    allowed_var = _allowed_variance(change, tolerance, confidence=confidence, power=power, critical=critical) - fixed_var
    if allowed_var <= 0:
        return None
    if reference_boots is None:
        n = math.ceil(2.0 * sd ** 2 / allowed_var)
    else:
        if reference_boots < 1:
            raise ValueError(f"reference_boots={reference_boots!r}: use a count of at least 1")
        room = allowed_var / sd ** 2 - 1.0 / reference_boots
        if room <= 0:
            return None
        n = math.ceil(1.0 / room)
    n = max(n, MIN_BOOTS_DIRECTIONAL)
    return n if n <= max_boots else None


def smallest_change(spread: float, boots: int, *, reference_boots: int | None = None, tolerance: float = 0.0,
                    fixed_var: float = 0.0, confidence: float = 0.95, power: float = DETECTION_POWER,
                    critical: float | None = None) -> float:
    """The smallest true change (fraction) that ``boots`` boots of the current side resolve with
    ``power``, the inverse of :func:`boots_needed`: against ``reference_boots`` boots of a
    baseline, or (None) against as many boots of another profile; ``fixed_var`` and ``critical``
    as there."""
    if not is_real(spread) or not math.isfinite(spread) or spread < 0:
        raise ValueError(f"spread={spread!r}: use a fraction >= 0 (0.01 means 1%)")
    if boots < 1 or (reference_boots is not None and reference_boots < 1):
        raise ValueError(f"boots={boots!r}, reference_boots={reference_boots!r}: use counts of at least 1")
    sd2 = math.log1p(spread) ** 2
    var = sd2 * (1.0 / boots + 1.0 / (reference_boots if reference_boots is not None else boots)) + fixed_var
    se = math.sqrt(var)
    z_power = float(scipy_stats.norm.ppf(power))
    if critical is not None:
        return math.expm1(max(math.log1p(tolerance), critical * se) + z_power * se)
    return math.expm1(math.log1p(tolerance) + (float(scipy_stats.norm.ppf(confidence)) + z_power) * se)


def sessions_for(change: float, spread: float, session_var: float, *, tolerance: float = 0.0,
                 confidence: float = 0.95, boots_per_session: int = MIN_BOOTS_DIRECTIONAL,
                 max_sessions: int = 100) -> int | None:
    """Sessions per side (each of ``boots_per_session`` boots at boot ``spread``) that resolve a
    true ``change`` when every session adds its own effect of variance ``session_var``: both
    sides run that many sessions (the planner's question, before any history exists)."""
    return _sessions_to_resolve(_allowed_variance(change, tolerance, confidence=confidence), math.log1p(spread) ** 2,
                               [(session_var, None)], boots_per_session=boots_per_session, reference_boots=None,
                               max_sessions=max_sessions)


def _sessions_needed(c: Comparison, goal: float, *, boots_per_session: int = MIN_BOOTS_DIRECTIONAL,
                    max_sessions: int = 100) -> int | None:
    """Sessions of this profile (runs on separate days or hosts, each ``boots_per_session``
    boots) that resolve a true change ``goal`` when the levels above the boot are what stands
    in the way: each session re-draws the session (and host) effect, which more boots of one run
    never do; the baseline history is taken to span at least as many. None when even
    ``max_sessions`` cannot."""
    # A term holds spread^2 * weight, its weight 1 (this run's one session) + the history's share.
    levels = [(t.var_log / t.weight, max(t.weight - 1.0, 0.0)) for t in c.levels if t.weight > 0]
    return _sessions_to_resolve(_allowed_variance(goal, c.tolerance, critical=critical_of(c)), c.spread_sd_log ** 2, levels,
                               boots_per_session=boots_per_session, reference_boots=max(c.boots_reference, 1),
                               max_sessions=max_sessions)


def _sessions_to_resolve(allowed: float, boot_var: float, levels: Sequence[tuple[float, float | None]], *,
                        boots_per_session: int, reference_boots: int | None, max_sessions: int) -> int | None:
    """The one formula behind both questions: the fewest sessions k of this side whose
    comparison's variance fits in ``allowed``. ``levels`` holds each level's variance and the
    history's share of it (None: the history runs as many sessions as this side); this side's k
    sessions carry 1/k of each, and a history spread over at least k sessions at most 1/k.
    ``reference_boots`` None: the history has as many boots as this side."""
    for k in range(1, max_sessions + 1):
        fixed = sum(var * (1.0 / k + (1.0 / k if share is None else min(share, 1.0 / k))) for var, share in levels)
        boots = k * boots_per_session
        reference = boots if reference_boots is None else reference_boots
        if boot_var * (1.0 / boots + 1.0 / reference) + fixed <= allowed:
            return k
    return None


def sessions_of_history(boot_spread: float, session_spread: float, boots: int, *, reference_boots: int,
                        sessions: int, tolerance: float, goal: float, max_sessions: int = 200,
                        boot_df: float = math.inf, session_df: float = math.inf) -> int | None:
    """The fewest sessions of history (the ``sessions`` recorded, ``reference_boots`` boots over
    them, grown by one boot a session: a nightly append) at which ``boots`` boots of one new
    session convict a true ``goal`` beyond ``tolerance`` by the gate's rule with DETECTION_POWER.
    This run's own session effect is in every comparison, however long the history: None when
    it alone leaves no room (or ``max_sessions`` cannot). ``boot_df`` and ``session_df``: how
    sure the declarations are (the deployment's ``*_spread_df``); the gate's critical value is
    then Student's t at the design's df (:func:`design_critical`), the declared and the
    history's own together."""
    boot_var, session_var = math.log1p(boot_spread) ** 2, math.log1p(session_spread) ** 2
    for k in range(max(sessions, 1), max_sessions + 1):
        reference = reference_boots + k - sessions
        parts = (boot_var * (1.0 / boots + 1.0 / reference), session_var * (1.0 + 1.0 / k))
        critical = design_critical(parts[0], boot_df + (boots - 1) + max(reference - k, 0),
                                   [(parts[1], session_df + k - 1)])
        if sum(parts) <= _allowed_variance(goal, tolerance, critical=critical):
            return k
    return None


def design_critical(boot_var: float, boot_df: float, levels: Sequence[tuple[float, float]],
                    z: float = GATE_CRITICAL) -> float:
    """The gate's critical value ``z`` (in standard errors of a known variance: the run's
    gate.family_critical, else stats.GATE_CRITICAL) for a planned comparison whose boot part
    of variance ``boot_var`` rests on ``boot_df`` degrees of freedom and whose ``levels`` are
    ``(variance, df)``: Student's t at their Satterthwaite df, as stats.compare_boots applies it."""
    return critical_at(z, satterthwaite_df([(boot_var, boot_df), *levels]))


def critical_of(c: Comparison) -> float:
    """The normal critical value the comparison was judged at (its ``confidence``: the run's
    gate.family_critical where the gate knew the run's size), so the plan promises what the
    same run would convict; stats.GATE_CRITICAL where the comparison states none."""
    if 0.5 < c.confidence < 1.0:
        return float(scipy_stats.norm.ppf(c.confidence))
    return GATE_CRITICAL


def plan(c: Comparison, *, target: float | None = None) -> Plan | None:
    """What the planner says next to an unresolved or "no detectable change" verdict: in
    boots of this run, or, where the session and host levels stand in the way, in sessions
    (reports/sentences.py says it). None where the comparison has no spread to plan with."""
    if not math.isfinite(c.spread_sd_log) or c.spread_sd_log <= 0:
        return None
    spread = math.expm1(c.spread_sd_log)
    goal = target if target is not None else c.tolerance * 2.0
    fixed = sum(t.var_log for t in c.levels)
    n = boots_needed(goal, spread, tolerance=c.tolerance, reference_boots=c.boots_reference, fixed_var=fixed,
                     critical=critical_of(c))
    if n is None and fixed > 0:
        return Plan(goal, spread, c.boots_reference, sessions=_sessions_needed(c, goal),
                    levels=tuple(t.level for t in c.levels), boots_per_session=MIN_BOOTS_DIRECTIONAL)
    return Plan(goal, spread, c.boots_reference, boots=n, boots_per_session=MIN_BOOTS_DIRECTIONAL)
