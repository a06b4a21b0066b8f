"""A slow drift against the history's anchor: the cumulative test append-on-pass needs.

A history that grows itself (``--kimiperf-append-on-pass``) follows whatever it is fed: a drift
of -0.1% a night passes every night's gate against the moving window it itself appended, and
the window walks with it (under the window rule alone, 7 of 40 simulated series never failed
while the server lost 12%). So the appended nights are judged together against the
**anchor**, the last deliberate recording (``--update-baselines``), which no passing night moves.

The test: a weighted least-squares line through the anchor (night 0) and each appended night's
mean log figure, each point weighted by the variance the declared levels give it (the boot
level over its boots, the session level whole: a night is one session). Its slope times the
nights since the anchor is the cumulative change; a drift **fails** when that change is beyond
the tolerance's band and :data:`DRIFT_ALPHA` one-sided from none, and the last night itself is
worse than the anchor beyond the band (a line can be pulled by one night's spike: up and back,
it falls). A line, not the last night against the anchor alone: the anchor's own session
effect, which no later night re-draws, would otherwise stand in every comparison (a 1% session
spread alone keeps a level test from telling 3% from 6% with a one-session anchor), while a
slope sees it once, at its leverage. A step
(a change landed in one night and stayed) fits a line too, less well: the residual spread of the
nights before the one judged, which floors the noise where it exceeds the declared, says so.
The night judged is left out of it, so a worse night never widens its own bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.baseline_schema import BaselineEntry, BaselineFile
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.notes import Drifted
from pytest_kimiperf.judge.stats import VerdictKind, band_log
from pytest_kimiperf.judge.verdicts import TestResult

# One-sided, per metric and night, where the run's family does not set it (the gate passes its
# critical value, family.family_critical, so the drift tests share the run's budget): the chance
# that an undrifted history fails a night.
DRIFT_ALPHA = 0.005
# Residuals measure the noise (raising the declared) once the line has this many points.
MIN_POINTS_MEASURED = 5


@dataclass(frozen=True)
class Drift:
    """The cumulative change since the anchor (a fraction; negative is worse, whatever the
    metric's direction), its bound at :data:`DRIFT_ALPHA` in the build's favour, the nights
    it rests on and whether it fails."""

    change: float
    bound: float
    nights: int
    failed: bool


def _variance(boots: int, sessions: int, hosts: int, spreads: Spreads) -> float:
    """The variance of a group's mean log figure: the boot level over its boots, the session
    and host levels once per distinct session and host."""
    return (math.log1p(spreads.boot) ** 2 / boots + math.log1p(spreads.session) ** 2 / sessions
            + math.log1p(spreads.host) ** 2 / hosts)


def _point(boots: Sequence[BootSummary], spreads: Spreads) -> tuple[float, float] | None:
    """A group of boots as (mean log figure, its variance); None when no boot is usable."""
    usable = [b for b in boots if b.usable]
    if not usable:
        return None
    logs = [math.log(b.median) for b in usable]
    var = _variance(len(usable), len({b.session for b in usable}), len({b.host for b in usable}), spreads)
    return sum(logs) / len(logs), var


def drift_since_anchor(anchor: Sequence[BootSummary], nights: Sequence[Sequence[BootSummary]], *,
                       direction: Direction, tolerance: float, spreads: Spreads,
                       critical: float | None = None) -> Drift:
    """The appended ``nights`` (oldest first, each the boots one passing run appended) against
    the ``anchor`` (the boots of the last deliberate recording): the cumulative change the line
    through them gives at the last night, and whether it fails (module docstring)."""
    points = [(float(t), *p) for t, g in enumerate([anchor, *nights]) if (p := _point(g, spreads)) is not None]
    return _line(points, direction=direction, tolerance=tolerance, critical=critical)


def drift_of_entry(entry: BaselineEntry, current: Sequence[BootSummary], *, tolerance: float, spreads: Spreads,
                   critical: float | None = None) -> Drift | None:
    """This run's boots (``current``, one more night) and the nights a history appended since its
    anchor (``--kimiperf-append-on-pass``), against the anchor; None where no night was appended
    (the gate against the history's window is then the whole test) or the anchor or this run has
    no usable boot."""
    if not entry.nights or not entry.anchor:
        return None
    anchor = _point(entry.anchor_summaries(), spreads)
    now = _point(current, spreads)
    if anchor is None or now is None:
        return None
    stored = [(float(t), math.log(n.median), _variance(n.boots, 1, 1, spreads))
              for t, n in enumerate(entry.nights, start=1)]
    points = [(0.0, *anchor), *stored, (float(len(entry.nights) + 1), *now)]
    return _line(points, direction=entry.direction, tolerance=tolerance, critical=critical)


def _line(points: Sequence[tuple[float, float, float]], *, direction: Direction, tolerance: float,
          critical: float | None) -> Drift:
    """The weighted line through (night, mean log figure, variance) points, the anchor at
    night 0: its change at the last night, and whether that fails (module docstring)."""
    if len(points) < 2 or points[0][0] != 0:
        return Drift(math.nan, math.nan, len(points) - 1, False)
    slope, sxx, _ = _fit(points)
    span = points[-1][0]
    scale = _residual_scale(points[:-1])
    cumulative = slope * span
    se = math.sqrt(scale / sxx) * span
    gain = cumulative if direction is Direction.HIGHER_IS_BETTER else -cumulative
    z = float(scipy_stats.norm.isf(DRIFT_ALPHA)) if critical is None else critical
    # The line alone can be pulled by one night: a spike up and back fits a falling line while no
    # figure was ever worse than the anchor. So the last point itself must also be worse than the
    # anchor beyond the band (the sign invariant: a history never worse than its anchor never drifts).
    last = points[-1][1] - points[0][1]
    last_gain = last if direction is Direction.HIGHER_IS_BETTER else -last
    failed = gain < -band_log(tolerance) and gain + z * se < 0.0 and last_gain < -band_log(tolerance)
    return Drift(math.expm1(gain), math.expm1(gain + z * se), int(span), failed)


def _residual_scale(points: Sequence[tuple[float, float, float]]) -> float:
    """How much the residuals about a weighted line through ``points`` raise the declared
    variance (at least 1: the declared levels are a floor), from :data:`MIN_POINTS_MEASURED`
    points on. Measured without the last point, the night being judged: a worse night that
    widened the bound it is judged by could clear a drift the better night failed, and moving
    the run's boots the bad way must never give a better verdict."""
    if len(points) < MIN_POINTS_MEASURED:
        return 1.0
    return max(1.0, _fit(points)[2] / (len(points) - 2))


def _fit(points: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """The weighted least-squares line through (night, mean log figure, variance) points, each
    weighted by its inverse variance: its slope, the weighted spread of the nights about their
    mean (the slope's variance is 1 over it) and the weighted sum of squared residuals."""
    weights = [1.0 / v for _, _, v in points]
    total = sum(weights)
    t_mean = sum(w * t for w, (t, _, _) in zip(weights, points)) / total
    y_mean = sum(w * y for w, (_, y, _) in zip(weights, points)) / total
    sxx = sum(w * (t - t_mean) ** 2 for w, (t, _, _) in zip(weights, points))
    slope = sum(w * (t - t_mean) * (y - y_mean) for w, (t, y, _) in zip(weights, points)) / sxx
    resid = sum(w * (y - y_mean - slope * (t - t_mean)) ** 2 for w, (t, y, _) in zip(weights, points))
    return slope, sxx, resid


def drift_failures(result: TestResult, base_file: BaselineFile, current: Mapping[str, Sequence[BootSummary]], *,
                   spreads: Spreads, critical: float | None) -> list[Drifted]:
    """Each metric of ``result`` whose history passing runs have grown, judged against its
    anchor with this run's boots (``current``, by metric) as one more night: the drifts that
    fail. A metric not comparable to its history (another host canary or profile environment)
    is not judged; the gate calls this at a test's last boot."""
    failed = []
    for mres in result.metrics.values():
        entry = base_file.entry(result.test, result.profile, mres.metric)
        if entry is None or mres.baseline is None or mres.baseline.verdict is VerdictKind.NOT_COMPARABLE:
            continue
        drift = drift_of_entry(entry, current.get(mres.metric, []), tolerance=mres.tolerance, spreads=spreads,
                               critical=critical)
        if drift is not None and drift.failed:
            failed.append(Drifted(mres.metric, metric_spec(mres.metric).label, drift.change, drift.bound,
                                  drift.nights, mres.tolerance, entry.anchor[-1].recorded_at))
    return failed
