"""Profiles of one session compared with each other, boot against boot: each profile against
the reference profile (judge/in_session.py), or a candidate against its control
(``--kimiperf-control``), at session end. The gate against a baseline is judge/gate.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.in_session import InSessionRules, compare_in_session, smallest_drop
from pytest_kimiperf.judge.power import smallest_change
from pytest_kimiperf.judge.stats import GATE_CRITICAL, Comparison, compare_boots
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult


def compare_with_control(current: Sequence[BootSummary], control: Sequence[BootSummary], *, direction: Direction,
                         tolerance: float, rules: InSessionRules, metric: str = "", unit: str = "") -> Comparison:
    """The candidate's boots against its control's (--kimiperf-control), booted interleaved in one
    session on one host: the gate's rule (stats.compare_boots, GATE_CRITICAL) with no level above
    the boot, since the sides share them. Where the deployment declares spawn modes, the profile
    comparison's rule instead (in_session.compare_in_session), which weighs every way the boots
    could have fallen into them: the gate's rule would read a side that landed slow as a change."""
    if rules.modes.declared:
        return compare_in_session(current, control, direction=direction, tolerance=tolerance, rules=rules,
                                  metric=metric, unit=unit)
    return compare_boots(current, control, direction=direction, tolerance=tolerance, prior_spread=rules.boot_spread,
                         metric=metric, unit=unit)


def control_reach(boot_spread: float, boots: int, tolerance: float, rules: InSessionRules) -> float:
    """The regression a candidate against its control (``boots`` each, one session) convicts with
    DETECTION_POWER, by the rule :func:`compare_with_control` applies: the gate's with no level
    above the boot; the profile comparison's where the deployment declares spawn modes."""
    if rules.modes.declared:
        return smallest_drop(boots, tolerance, rules)
    return smallest_change(boot_spread, boots, reference_boots=boots, tolerance=tolerance, critical=GATE_CRITICAL)


def compare_profiles(
    results: Sequence[TestResult], reference_profile: str, *, rules: InSessionRules = InSessionRules(),
    control: bool = False,
) -> list[tuple[str, str, str, Comparison]]:
    """Each profile against the reference, per test and metric, boot against boot in this
    session (judge/in_session.py; against a ``control``, :func:`compare_with_control`): (test,
    metric, profile, comparison). Boots measured on a disturbed host (INVALID) are not samples of
    either profile and are left out."""
    boots: dict[tuple[str, str], dict[str, list[BootSummary]]] = {}
    meta: dict[tuple[str, str], MetricResult] = {}
    for res in results:
        if res.invalid:
            continue
        for metric, mres in res.metrics.items():
            boots.setdefault((res.test, metric), {}).setdefault(res.profile, []).append(mres.boot_summary())
            meta.setdefault((res.test, metric), mres)
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
                rules=rules, metric=spec.label, unit=mres.unit,
            )))
    return rows


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
    """Each profile against the reference, per test and metric; invalid runs are left out.

    A run the client could not trust (``invalid``) measured the client, not NCCL, so comparing it
    would make a verdict out of noise. Each test is compared on its own so that one test whose
    samples cannot be compared (a reference median of 0) does not take the others' tables away.
    """
    by_test: dict[str, list[TestResult]] = {}
    for res in results:
        if not res.invalid:
            by_test.setdefault(res.test, []).append(res)
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
            ProfileComparison(test, metric, profile, reference_profile, comparison)
            for test, metric, profile, comparison in compared
        )
    return rows
