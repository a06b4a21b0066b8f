"""Where a verdict is decided: is this run's metric a regression against its baseline, or noise?

One sample is one request (or one round, for run-level metrics). The gate combines two questions
that a single threshold on the median mixes up:

* did the metric move at all? A one-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``)
  asks whether the current samples are stochastically worse (or better) than the reference ones.
  It makes no normality assumption, which matters for latencies with a long right tail, and a
  few outliers shift ranks, not a mean.
* did it move by more than we care about? The ratio of medians, with a 95% percentile-bootstrap
  CI (``scipy.stats.bootstrap``, each side resampled on its own), is compared to the tolerance.

A regression needs both (significant *and* beyond tolerance); "no significant change" needs the
whole CI inside +/- tolerance; anything else is "inconclusive", which says "measure more", not
"pass".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt
from scipy import stats as scipy_stats

from pytest_kimiperf.metric_specs import Direction

Samples = Sequence[float] | npt.NDArray[np.floating]


class VerdictKind(str, Enum):
    """The gate's answer for one metric of one test under one NCCL profile."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_SIGNIFICANT_CHANGE = "no significant change"
    INCONCLUSIVE = "inconclusive"
    INSUFFICIENT_SAMPLES = "insufficient samples"
    NOT_COMPARABLE = "not comparable"


@dataclass(frozen=True)
class Comparison:
    """Current samples against reference samples for one metric, and the verdict drawn from them.

    ``change`` is the raw signed change of the median (``median_current / median_reference - 1``):
    -0.004 means the median went down by 0.4%, whatever the metric's direction. ``ci_low`` and
    ``ci_high`` bound the same quantity. Both one-sided Mann-Whitney p-values are kept:
    ``p_worse`` tests "current is worse than reference" (lower tok/s, higher ms), ``p_better``
    the opposite; ``p_value`` is the one matching the direction the median moved. Figures that
    could not be computed (too few samples) are NaN.
    """

    metric: str
    unit: str
    direction: Direction
    tolerance: float
    alpha: float
    confidence: float
    min_samples: int
    n_current: int
    n_reference: int
    median_current: float
    median_reference: float
    change: float
    ci_low: float
    ci_high: float
    p_worse: float
    p_better: float
    # Half-width of the CI on the ratio that comes from the reference samples alone: the floor
    # on the CI width that more current samples cannot remove (see needs_more_samples).
    reference_ci_half_width: float
    verdict: VerdictKind

    @property
    def gain(self) -> float:
        """The change signed so that positive is better, whatever the metric's direction."""
        return self.change if self.direction is Direction.HIGHER_IS_BETTER else -self.change

    @property
    def p_value(self) -> float:
        """The one-sided p-value in the direction the median moved (worse, else better)."""
        return self.p_worse if self.gain < 0 else self.p_better

    @property
    def failed(self) -> bool:
        """True when the verdict should fail the perf test."""
        return self.verdict is VerdictKind.REGRESSION

    def message(self) -> str:
        """One line for the test report; it states what the data shows and nothing more."""
        prefix = " ".join(part for part in (self.metric, self.unit) if part)
        prefix = f"{prefix}: " if prefix else ""
        tol = _fmt_tolerance(self.tolerance)
        ci = f"CI {_fmt_pct(self.ci_low)}..{_fmt_pct(self.ci_high)}"
        change = _fmt_pct(self.change)
        p = _fmt_p(self.p_value)
        kind = self.verdict
        if kind is VerdictKind.REGRESSION:
            body = f"REGRESSION {change} ({ci}, {p}, tolerance {tol})"
        elif kind is VerdictKind.IMPROVEMENT:
            body = f"improvement {change} ({ci}, {p}, tolerance {tol})"
        elif kind is VerdictKind.NO_SIGNIFICANT_CHANGE:
            body = f"no significant change ({change}, {ci}, within +/-{tol})"
        elif kind is VerdictKind.INSUFFICIENT_SAMPLES:
            body = (
                f"insufficient samples ({self.n_current} current, {self.n_reference} reference; "
                f"need at least {self.min_samples} valid samples on each side)"
            )
        elif kind is VerdictKind.NOT_COMPARABLE:
            body = f"not comparable to the baseline ({change}, {ci}, {p}; reported only)"
        else:
            body = f"inconclusive ({change}, {ci}{self._why_inconclusive()})"
        return prefix + body

    def _why_inconclusive(self) -> str:
        tol = self.tolerance
        p = _fmt_p(self.p_value)
        if abs(self.change) > tol and not self.p_value < self.alpha:
            return f"; beyond {_fmt_tolerance(tol)} but {p} is not below {self.alpha:g}"
        if self.ci_low < -tol and self.ci_high > tol:
            why = f" is wider than +/-{_fmt_tolerance(tol)}; {p}"
        else:
            why = f" reaches past +/-{_fmt_tolerance(tol)}; {p}"
        if self.reference_ci_half_width > tol / 2:
            # More current samples cannot fix this: the baseline's own median is that uncertain.
            why += (f"; the baseline alone is uncertain by +/-{self.reference_ci_half_width * 100:.1f}% "
                    f"({self.n_reference} samples): re-record it with --update-baselines on a quiet host")
        return why

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (enums as their values, NaN as None) for reports and xdist transport."""
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            out[name] = value
        out["p_value"] = None if math.isnan(self.p_value) else self.p_value
        out["message"] = self.message()
        return out


def compare(
    current: Samples,
    reference: Samples,
    *,
    direction: Direction,
    tolerance: float,
    metric: str = "",
    unit: str = "",
    alpha: float = 0.01,
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    min_samples: int = 5,
    comparable: bool = True,
) -> Comparison:
    """Decide whether ``current`` regressed, improved or held against ``reference`` samples.

    Non-finite samples (a failed request recorded as NaN) are dropped before counting. With
    ``comparable=False`` (the baseline comes from another fingerprint) everything is computed but
    the verdict is NOT_COMPARABLE, so it can be shown and never fails a test.
    """
    direction = Direction(direction)
    _check_unit_interval("tolerance", tolerance)
    _check_unit_interval("alpha", alpha)
    _check_unit_interval("confidence", confidence)
    if not isinstance(n_boot, int) or n_boot < 100:
        raise ValueError(f"n_boot={n_boot!r}: use an integer of at least 100 bootstrap resamples")
    if not isinstance(min_samples, int) or min_samples < 2:
        raise ValueError(f"min_samples={min_samples!r}: use an integer of at least 2")
    cur = _valid_samples("current", current)
    ref = _valid_samples("reference", reference)

    median_current = float(np.median(cur)) if cur.size else math.nan
    median_reference = float(np.median(ref)) if ref.size else math.nan
    if median_reference == 0.0:
        raise ValueError(
            f"reference median of {metric or 'metric'} is 0 ({ref.size} samples): a ratio to it is "
            "undefined; re-record the baseline"
        )
    change = median_current / median_reference - 1.0

    ci_low = ci_high = ref_half = p_worse = p_better = math.nan
    if cur.size >= 2 and ref.size >= 2:
        ci_low, ci_high = _bootstrap_ratio_ci(cur, ref, confidence, n_boot, seed)
        ref_half = _reference_half_width(ref, confidence, n_boot, seed)
    if cur.size >= 1 and ref.size >= 1:
        # "worse" for tok/s is smaller current values; for latencies it is larger ones.
        worse_alt, better_alt = (
            ("less", "greater") if direction is Direction.HIGHER_IS_BETTER else ("greater", "less")
        )
        p_worse = float(scipy_stats.mannwhitneyu(cur, ref, alternative=worse_alt).pvalue)
        p_better = float(scipy_stats.mannwhitneyu(cur, ref, alternative=better_alt).pvalue)

    gain = change if direction is Direction.HIGHER_IS_BETTER else -change
    if not comparable:
        verdict = VerdictKind.NOT_COMPARABLE
    elif cur.size < min_samples or ref.size < min_samples:
        verdict = VerdictKind.INSUFFICIENT_SAMPLES
    elif p_worse < alpha and gain < -tolerance:
        verdict = VerdictKind.REGRESSION
    elif p_better < alpha and gain > tolerance:
        verdict = VerdictKind.IMPROVEMENT
    elif -tolerance <= ci_low and ci_high <= tolerance:
        verdict = VerdictKind.NO_SIGNIFICANT_CHANGE
    else:
        verdict = VerdictKind.INCONCLUSIVE

    return Comparison(
        metric=metric,
        unit=unit,
        direction=direction,
        tolerance=float(tolerance),
        alpha=float(alpha),
        confidence=float(confidence),
        min_samples=min_samples,
        n_current=int(cur.size),
        n_reference=int(ref.size),
        median_current=median_current,
        median_reference=median_reference,
        change=change,
        ci_low=ci_low,
        ci_high=ci_high,
        p_worse=p_worse,
        p_better=p_better,
        reference_ci_half_width=ref_half,
        verdict=verdict,
    )


def needs_more_samples(c: Comparison) -> bool:
    """True when an INCONCLUSIVE comparison could still be resolved by taking more current samples.

    Only the current side can grow (the reference is a stored baseline), so the CI can never get
    narrower than the part the reference contributes (``reference_ci_half_width``). More samples
    help when the median change is already beyond tolerance (only significance is missing), or
    when a change the current samples still allow, plus that floor, fits inside tolerance (the CI
    can then shrink inside it). The current side's share of the CI half-width is estimated as
    ``sqrt(h**2 - h_ref**2)``, the two sides' medians being independent. A change settled near the
    tolerance against a noisy reference cannot be resolved however long the scenario runs: the
    baseline needs more samples instead.
    """
    if c.verdict is not VerdictKind.INCONCLUSIVE:
        return False
    if abs(c.change) > c.tolerance:
        return True
    half_width = (c.ci_high - c.ci_low) / 2.0
    current_half_width = math.sqrt(max(half_width**2 - c.reference_ci_half_width**2, 0.0))
    closest_plausible = max(abs(c.change) - current_half_width, 0.0)
    return closest_plausible + c.reference_ci_half_width < c.tolerance


class FloorStatus(str, Enum):
    """Where an absolute figure sits against its hard floor and its target."""

    BELOW_FLOOR = "below floor"
    BELOW_TARGET = "below target"
    OK = "ok"


@dataclass(frozen=True)
class FloorResult:
    """An absolute check of a higher-is-better median (e.g. decode tok/s) against floor/target."""

    label: str
    unit: str
    median: float
    floor: float | None
    target: float | None
    status: FloorStatus

    @property
    def failed(self) -> bool:
        """True below the floor: the test fails."""
        return self.status is FloorStatus.BELOW_FLOOR

    @property
    def warned(self) -> bool:
        """True above the floor but below the target: the test passes with a warning."""
        return self.status is FloorStatus.BELOW_TARGET

    def message(self) -> str:
        """One line, e.g. "decode 38.2 tok/s is below the floor of 40 tok/s"."""
        unit = f" {self.unit}" if self.unit else ""
        head = f"{self.label} {_fmt_value(self.median)}{unit}".strip()
        if self.status is FloorStatus.BELOW_FLOOR:
            return f"{head} is below the floor of {_fmt_value(self.floor)}{unit}"
        if self.status is FloorStatus.BELOW_TARGET:
            floor = "" if self.floor is None else f"above the floor of {_fmt_value(self.floor)}{unit} but "
            return f"{head} is {floor}below the target of {_fmt_value(self.target)}{unit}"
        if self.target is not None:
            return f"{head} meets the target of {_fmt_value(self.target)}{unit}"
        if self.floor is not None:
            return f"{head} meets the floor of {_fmt_value(self.floor)}{unit} (no target set)"
        return f"{head} (no floor or target set)"


def floor_check(
    median: float, floor: float | None, target: float | None, unit: str, label: str
) -> FloorResult:
    """Check a higher-is-better median against an absolute floor (fail) and target (warn)."""
    if not _is_real(median) or not math.isfinite(median):
        raise ValueError(f"{label} median {median!r} is not a finite number; nothing to check")
    for name, value in (("floor", floor), ("target", target)):
        if value is not None and (not _is_real(value) or not math.isfinite(value) or value < 0):
            raise ValueError(f"{label} {name} {value!r}: use a finite number >= 0, or no {name}")
    if floor is not None and target is not None and floor > target:
        raise ValueError(
            f"{label} floor {floor!r} {unit} is above its target {target!r} {unit}: the floor is "
            "the hard minimum, the target what we aim for, so floor <= target"
        )
    if floor is not None and median < floor:
        status = FloorStatus.BELOW_FLOOR
    elif target is not None and median < target:
        status = FloorStatus.BELOW_TARGET
    else:
        status = FloorStatus.OK
    return FloorResult(
        label=label,
        unit=unit,
        median=float(median),
        floor=None if floor is None else float(floor),
        target=None if target is None else float(target),
        status=status,
    )


def single_threshold_regression(
    current: Samples, reference: Samples, direction: Direction, threshold: float
) -> bool:
    """pytest-benchmark's ``--benchmark-compare-fail=median:<threshold>`` rule, for comparison only.

    pytest-benchmark fails when ``current / reference * 100 - 100 > percentage`` on the chosen
    field (pytest_benchmark/utils.py, PercentageRegressionCheck); times only get worse upwards.
    Here "worse" follows ``direction`` and the change is the same raw median ratio the gate uses,
    so both rules see the same number. Used by benchmarks/gate_power.py, never by the plugin.
    """
    direction = Direction(direction)
    _check_unit_interval("threshold", threshold)
    cur = _valid_samples("current", current)
    ref = _valid_samples("reference", reference)
    if cur.size == 0 or ref.size == 0:
        raise ValueError(
            f"single-threshold rule needs samples on both sides ({cur.size} current, "
            f"{ref.size} reference valid samples)"
        )
    change = float(np.median(cur)) / float(np.median(ref)) - 1.0
    gain = change if direction is Direction.HIGHER_IS_BETTER else -change
    return -gain > threshold


def _bootstrap_ratio_ci(
    cur: npt.NDArray[np.float64],
    ref: npt.NDArray[np.float64],
    confidence: float,
    n_boot: int,
    seed: int,
) -> tuple[float, float]:
    def ratio_minus_one(
        c: npt.NDArray[np.float64], r: npt.NDArray[np.float64], axis: int = -1
    ) -> npt.NDArray[np.float64]:
        # A resample whose reference median is 0 gives inf, which is what the CI should show.
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio: npt.NDArray[np.float64] = np.median(c, axis=axis) / np.median(r, axis=axis) - 1.0
        return ratio

    # Percentile, not BCa: BCa's jackknife of a median with n=10 is degenerate (scipy warns and
    # returns NaN on tied data), and percentile intervals need no such acceleration estimate.
    result = scipy_stats.bootstrap(
        (cur, ref),
        ratio_minus_one,
        n_resamples=n_boot,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _reference_half_width(
    ref: npt.NDArray[np.float64], confidence: float, n_boot: int, seed: int
) -> float:
    median_reference = float(np.median(ref))

    def ratio_from_reference(r: npt.NDArray[np.float64], axis: int = -1) -> npt.NDArray[np.float64]:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio: npt.NDArray[np.float64] = median_reference / np.median(r, axis=axis) - 1.0
        return ratio

    result = scipy_stats.bootstrap(
        (ref,),
        ratio_from_reference,
        n_resamples=n_boot,
        vectorized=True,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed + 1),
    )
    return float(result.confidence_interval.high - result.confidence_interval.low) / 2.0


def _valid_samples(side: str, samples: Samples) -> npt.NDArray[np.float64]:
    try:
        arr = np.asarray(samples, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{side} samples must be numbers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{side} samples must be a flat sequence of numbers, got shape {arr.shape}")
    finite: npt.NDArray[np.float64] = arr[np.isfinite(arr)]
    negative = finite[finite < 0]
    if negative.size:
        raise ValueError(
            f"{side} samples include negative value {float(negative[0])!r}: tok/s, req/s and ms "
            "are never negative, so the measurement is broken"
        )
    return finite


def _check_unit_interval(name: str, value: float) -> None:
    if not _is_real(value) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value!r}: use a fraction between 0 and 1 (0.03 means 3%)")


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _fmt_pct(fraction: float) -> str:
    if math.isnan(fraction):
        return "n/a"
    return f"{fraction * 100:+.1f}%"


def _fmt_tolerance(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _fmt_p(p: float) -> str:
    if math.isnan(p):
        return "p=n/a"
    if p < 0.0001:
        return "p<0.0001"
    # .2g stays in plain notation down to 1e-4, which is as far as we print.
    return f"p={p:.2g}"


def _fmt_value(value: float | None) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.4g}"
    # .4g turns 12345 into 1.234e+04; tok/s and ms read better as plain numbers.
    return f"{value:.0f}" if "e" in text else text
