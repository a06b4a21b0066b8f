"""Two profiles measured in one session, boot against boot: is one of them really different?

The profile comparison (``--nccl-profile default,ring-ll``) boots each profile a few times,
interleaved (A B B A), on one host in one session. Nothing above the boot differs between the
sides, so the boot is the only level; but with two boots a side the boot level itself is known
badly, and it is not always normal. Three rules, each from a failure seen on a real host:

* **The spread is never below the declared one.** The measured spread of the boots inside each
  side is pooled with the deployment's declared ``boot_spread`` (worth its declared degrees of
  freedom) and floored at it: two boots that happen to agree (155.5 and 155.1 tok/s) must not
  shrink the spread that judges the other side, whose boots were 27% apart (207 and 271).
* **Spawn modes are part of the null.** vLLM's decode speed can be "bimodal, fixed at process
  spawn" (ROCm/legacy-rocm-build #6347; "different stable regimes" after restarts,
  vllm-project/vllm #39903), and so is the CPU engine's (598 against 1135-1285 tok/s on one
  host, 146 against 271 on another). With two boots a side, both boots of one side slow and both
  of the other fast happens in 1 session in 8 at even odds, and then the sides differ by the
  whole gap with no spread inside either. A deployment declares its modes (:class:`SpawnModes`:
  the slow mode's drop and its share of boots); every way the boots could fall into the modes
  is weighed by its prior and by how well it explains the spread *inside* each side (a side
  whose two boots agree was not split between modes; one whose boots differ by the gap likely
  was), and the p-value of a direction is the mixture's. A direction is claimed only when the
  tolerance's edge, with every likely mode assignment, cannot explain the difference.
* **A symmetric tolerance.** A tolerance of 25% is the band ``[0.75, 1/0.75]`` on the ratio: the
  same data with the sides swapped reads the same, mirrored.

A direction needs :data:`IN_SESSION_ALPHA` (one-sided, per metric and direction) and the sides'
boots may not overlap. "Within +/-tol" is a TOST at 5%: both one-sided :data:`EQUIVALENCE_LEVEL`
(95%) bounds inside the band under every likely mode assignment (a true halving whose reference
boots were slow and whose current boots were fast reads as no change). Short of those the verdict says what
the data does allow, and :func:`boots_to_decide` what would decide it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.notes import BootsForWithin, BootsToDecide, DeclaredModes, Note, SpreadSource
from pytest_kimiperf.judge.spending import SequentialPlan
from pytest_kimiperf.judge.stats import (
    DETECTION_POWER,
    EQUIVALENCE_CONFIDENCE,
    MIN_BOOTS_DIRECTIONAL,
    Comparison,
    VerdictKind,
    _insufficient_note,
    band_log,
    satterthwaite_df,
    t_quantile,
)

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
EQUIVALENCE_ALPHA = 1.0 - EQUIVALENCE_LEVEL
# The two-sided interval every row shows, "within" rows included: the gate's. Under boots on
# demand a "within" row's interval is the repeated confidence interval at that look (Jennison &
# Turnbull 2000, ch. 9): wider than the look's fixed 90%, and covering at 90% over every look.
WITHIN_INTERVAL = EQUIVALENCE_CONFIDENCE
INTERVAL_LEGEND = f"{EQUIVALENCE_CONFIDENCE * 100:g}% CI"
# A mode assignment whose posterior weight is below this is ignored by the "within" claim.
MODE_WEIGHT_IGNORED = 0.01
# The planner looks this far for the boots that would decide a comparison.
MAX_PLANNED_BOOTS = 8
# Boots a side beyond which the mode assignments are not enumerated one by one (2**k each).
MAX_ENUMERATED_BOOTS = 12
# The verdicts that answer a profile comparison's question: a direction, or "within".
DECIDED = (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT, VerdictKind.WITHIN_TOLERANCE)


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
    # Boots booked on demand (judge/sequential.py, judge/spending.py): each look's levels spend part of ``alpha``
    # and of the TOST's 5%, so that booking until a verdict keeps both rates. None: one look.
    plan: SequentialPlan | None = None

    @classmethod
    def of(cls, deployment: Deployment, plan: SequentialPlan | None = None) -> InSessionRules:
        """The rules a deployment declares (``plan``: the session books boots on demand)."""
        return cls(deployment.boot_spread, deployment.boot_spread_df,
                   SpawnModes(deployment.spawn_mode_drop, deployment.spawn_mode_share), plan=plan)

    def levels(self, boots: int) -> tuple[float, float]:
        """The one-sided levels of the direction and of each side of the TOST at the look with
        ``boots`` boots a side: the whole ``alpha`` and 5% without a plan, the spent share with one."""
        if self.plan is None or boots < 1:
            return self.alpha, EQUIVALENCE_ALPHA
        return (self.plan.level(self.alpha, boots, self.plan.direction_shape),
                self.plan.level(EQUIVALENCE_ALPHA, boots, self.plan.equivalence_shape))


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
    if k > MAX_ENUMERATED_BOOTS:
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
    return float(scipy_stats.t.sf(x, df))


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
    both measured in this session (see the module docstring for the rules)."""
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
                  confidence=1.0 - rules.alpha)
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
    likely = [off for off, w in fit.pairs if w >= MODE_WEIGHT_IGNORED]
    inside = all(abs(fit.d - off) + t_eq * fit.se <= band for off in likely)
    # The intervals hold every likely mode assignment's (the modes are part of what is unknown).
    def interval(t: float) -> tuple[float, float]:
        return min(fit.d - off for off in likely) - t * fit.se, max(fit.d - off for off in likely) + t * fit.se

    clo, chi = interval(t_ci)
    if enough and p_worse <= alpha and apart_worse:
        verdict = VerdictKind.REGRESSION
    elif enough and p_better <= alpha and apart_better:
        verdict = VerdictKind.IMPROVEMENT
    elif inside:
        verdict = VerdictKind.WITHIN_TOLERANCE
    elif clo > 0.0 or chi < 0.0:
        verdict = VerdictKind.CHANGED_SIZE_UNRESOLVED
    elif abs(fit.d) > band:
        verdict = VerdictKind.INCONCLUSIVE
    else:
        verdict = VerdictKind.NO_DETECTABLE_CHANGE
    if verdict is VerdictKind.WITHIN_TOLERANCE:
        clo, chi = interval(t_eq)
    # Reported on the metric's own scale (change > 0: the current side's figure is higher). The
    # bounds are this look's at the comparison's stated confidence; a look of boots on demand
    # decides at its spent share instead (far out at an early look, even unbounded at 1 df).
    t_shown = t_quantile(1.0 - rules.alpha, fit.df_dir)
    lo, hi = fit.d - t_shown * fit.se_dir, fit.d + t_shown * fit.se_dir
    if sign < 0:
        lo, hi, clo, chi = -hi, -lo, -chi, -clo
    change = math.expm1(sign * fit.d)
    notes: list[Note] = [DeclaredModes(rules.modes.drop, rules.modes.slow_share)] if rules.modes.declared else []
    have = min(len(cur), len(ref))
    if rules.plan is not None and not rules.plan.final(have) and verdict not in DECIDED:
        pass  # an early look of boots on demand: the session books the next boot a side
    elif verdict in (VerdictKind.CHANGED_SIZE_UNRESOLVED, VerdictKind.INCONCLUSIVE) and abs(fit.d) > band:
        needed = boots_to_decide(fit.d, fit.sd, band, rules)
        notes.append(BootsToDecide(needed, MAX_PLANNED_BOOTS, have_them=needed is not None and needed <= have))
    elif verdict not in DECIDED:
        notes.append(BootsForWithin(boots_for_within(fit.d, fit.sd, band, rules), have, MAX_PLANNED_BOOTS))
    source = (SpreadSource(SpreadSource.DECLARED, declared=rules.boot_spread, whole=True)
              if fit.sd <= math.log1p(rules.boot_spread) + 1e-12
              else SpreadSource(SpreadSource.SIDES, measured=math.expm1(fit.sd), whole=True))
    return Comparison(
        **common, median_current=math.exp(sum(math.log(b.median) for b in cur_b) / len(cur_b)),
        median_reference=math.exp(sum(math.log(b.median) for b in ref_b) / len(ref_b)),
        change=change, bound_low=math.expm1(lo), bound_high=math.expm1(hi), ci_low=math.expm1(clo),
        ci_high=math.expm1(chi), spread_sd_log=fit.sd, spread_df=fit.df, spread_source=source, se_log=fit.se,
        mdc=_mdc(fit, band, rules), verdict=verdict, notes=tuple(notes),
        equivalence_confidence=WITHIN_INTERVAL if verdict is VerdictKind.WITHIN_TOLERANCE else EQUIVALENCE_CONFIDENCE)


def boots_to_decide(d: float, sd: float, band: float, rules: InSessionRules) -> int | None:
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


def boots_for_within(d: float, sd: float, band: float, rules: InSessionRules) -> int | None:
    """The boots a side, booked up front (one look, the TOST at 5%), at which a difference ``d``
    (log) shows "within" the ``band`` with :data:`DETECTION_POWER`, were the true difference
    ``d`` and the boot spread ``sd``; None when no number up to :data:`MAX_PLANNED_BOOTS` does
    (or ``d`` lies outside the band). The modes are left out: they can only ask for more."""
    z_power = float(scipy_stats.norm.ppf(DETECTION_POWER))
    for k in range(MIN_BOOTS_DIRECTIONAL, MAX_PLANNED_BOOTS + 1):
        se = sd * math.sqrt(2.0 / k)
        if abs(d) + (t_quantile(EQUIVALENCE_LEVEL, rules.boot_spread_df + 2 * (k - 1)) + z_power) * se <= band:
            return k
    return None


def smallest_drop(boots: int, tolerance: float, rules: InSessionRules) -> float:
    """The smallest regression (a positive fraction: 0.3 is 30% slower) that ``boots`` boots a
    side, at the declared boot spread, convict beyond ``tolerance`` with 90% power, the modes
    left out: what a candidate against its control (--kimiperf-control) resolves in one session."""
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
