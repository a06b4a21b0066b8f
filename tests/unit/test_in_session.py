"""Profiles compared in one session: no direction from chance agreement, spawn modes or an
asymmetric tolerance; a change beyond what the modes explain still gets one."""

from __future__ import annotations

import math

import dataclasses

import pytest

from pytest_kimiperf.config.deployment_tables import resolve_deployments
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS, TINY_CPU
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.profiles import InSessionRules, SpawnModes, band_log, compare_in_session
from pytest_kimiperf.judge.stats import VerdictKind, compare_boots
from pytest_kimiperf.reports.sentences import comparison_line, source_text

HIGHER = Direction.HIGHER_IS_BETTER
LOWER = Direction.LOWER_IS_BETTER
DIRECTIONAL = (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
MIRROR = {VerdictKind.REGRESSION: VerdictKind.IMPROVEMENT, VerdictKind.IMPROVEMENT: VerdictKind.REGRESSION}
TINY = InSessionRules.of(TINY_CPU)
# Tight boots and no modes: the rules under which a direction is easy to get.
GPU = InSessionRules(boot_spread=0.01, boot_spread_df=3.0)


def boots(*medians: float) -> list[BootSummary]:
    return [BootSummary(median=m, n=20, se_log=0.01, label=f"boot {i + 1}") for i, m in enumerate(medians)]


def test_the_slow_hosts_inert_ring_ll_gets_no_direction() -> None:
    # A fresh slow host's first `make perf`: ring-ll does nothing on the CPU engine, yet the
    # boot-pooled rule called it "better, +52.7%" (default's two boots agreed by chance).
    ring_ll, default = boots(207.3, 271.2), boots(155.5, 155.1)
    # The baseline gate's rule, whose declared spread is a floor the boots never lower, gives it
    # no direction either.
    gate = compare_boots(ring_ll, default, direction=HIGHER, tolerance=0.25, prior_spread=0.18)
    assert gate.verdict not in DIRECTIONAL
    new = compare_in_session(ring_ll, default, direction=HIGHER, tolerance=0.25, rules=TINY)
    assert new.verdict not in DIRECTIONAL
    assert new.change == pytest.approx(271.2 ** 0.5 * 207.3 ** 0.5 / (155.5 * 155.1) ** 0.5 - 1, rel=1e-9)


def _p99_itl(*medians_and_se: tuple[float, float]) -> list[BootSummary]:
    return [BootSummary(median=m, n=2540, se_log=se, label=f"boot {i + 1}") for i, (m, se) in enumerate(medians_and_se)]


def test_a_tail_judged_by_its_own_declared_spread_gets_no_direction_from_a_quiet_hosts_identical_boots() -> None:
    # One quiet session of the identical server (benchmarks/data/noise/20261206-be9b2608-*): p99 ITL
    # 4.7-6.0 ms on three boots, 2.2-2.7 on the other three. At the deployment's 18% this A/A split
    # read IMPROVEMENT; tiny-cpu declares p99 ITL's own 33% (the corpus: 27.6-40.4%, 50 df).
    slow = _p99_itl((6.037, 0.0256), (5.010, 0.0526), (4.735, 0.0269))
    fast = _p99_itl((2.507, 0.5084), (2.169, 0.0256), (2.738, 0.0281))
    tail = TINY.for_metric("p99_itl_ms")
    assert tail.boot_spread == 0.33 and TINY.for_metric("decode_tok_s") == TINY
    assert compare_in_session(fast, slow, direction=LOWER, tolerance=0.25, rules=TINY).verdict is \
        VerdictKind.IMPROVEMENT
    assert compare_in_session(fast, slow, direction=LOWER, tolerance=0.25, rules=tail).verdict not in DIRECTIONAL
    # What the wider spread still convicts: the slow boots three times slower.
    tripled = [dataclasses.replace(b, median=b.median * 3) for b in slow]
    assert compare_in_session(tripled, slow, direction=LOWER, tolerance=0.25, rules=tail).verdict is \
        VerdictKind.REGRESSION


def test_a_side_whose_boots_agree_never_shrinks_the_spread_below_the_declared() -> None:
    c = compare_in_session(boots(100.0, 100.0), boots(100.0, 100.0), direction=HIGHER, tolerance=0.25, rules=TINY)
    assert c.spread_sd_log >= 0.18 / 1.18 - 1e-9 and "declared 18%" in source_text(c.spread_source)


def test_swapping_the_sides_mirrors_the_verdict() -> None:
    for a, b in (((100.0, 101.0), (130.0, 131.0)), ((100.0, 101.0), (97.5, 97.0)), ((100.0, 100.4), (100.2, 99.9))):
        there = compare_in_session(boots(*a), boots(*b), direction=HIGHER, tolerance=0.03, rules=GPU)
        back = compare_in_session(boots(*b), boots(*a), direction=HIGHER, tolerance=0.03, rules=GPU)
        assert MIRROR.get(there.verdict, there.verdict) is back.verdict, (a, b, there.verdict, back.verdict)


def test_the_tolerance_is_a_symmetric_band_on_the_ratio() -> None:
    assert band_log(0.25) == pytest.approx(-__import__("math").log(0.75))
    # 30% faster is inside a 25% band mirrored (1/0.75 = +33%): not "better", whatever the boots.
    c = compare_in_session(boots(130.0, 130.0, 130.0), boots(100.0, 100.0, 100.0), direction=HIGHER,
                           tolerance=0.25, rules=InSessionRules(0.001, 30.0))
    assert c.verdict is not VerdictKind.IMPROVEMENT


def test_opposite_spawn_modes_are_no_direction_when_the_deployment_declares_them() -> None:
    slow, fast = boots(100.0, 101.0), boots(200.0, 199.0)
    plain = compare_in_session(fast, slow, direction=HIGHER, tolerance=0.03, rules=GPU)
    assert plain.verdict is VerdictKind.IMPROVEMENT  # tight sides 2x apart: a real doubling, if no modes
    moded = dataclasses.replace(GPU, modes=SpawnModes(drop=0.5, slow_share=0.5))
    c = compare_in_session(fast, slow, direction=HIGHER, tolerance=0.03, rules=moded)
    assert c.verdict not in DIRECTIONAL and c.verdict is not VerdictKind.WITHIN_TOLERANCE
    assert "spawn modes 50% apart declared (50% of boots slow)" in comparison_line(c)


def test_a_change_beyond_the_modes_still_gets_its_direction() -> None:
    moded = dataclasses.replace(GPU, modes=SpawnModes(drop=0.5, slow_share=0.5))
    # 8x slower: more than the mode gap (2x) and the tolerance together, on both metrics' scales.
    worse = compare_in_session(boots(12.5, 12.6), boots(100.0, 101.0), direction=HIGHER, tolerance=0.03, rules=moded)
    assert worse.verdict is VerdictKind.REGRESSION
    latency = compare_in_session(boots(80.0, 81.0), boots(10.0, 10.1), direction=LOWER, tolerance=0.03, rules=moded)
    assert latency.verdict is VerdictKind.REGRESSION


def test_a_side_split_between_the_modes_is_seen_as_split() -> None:
    # One boot of each side in each mode: the sides agree once the modes are weighed.
    moded = dataclasses.replace(GPU, modes=SpawnModes(drop=0.5, slow_share=0.5))
    c = compare_in_session(boots(100.0, 200.0), boots(101.0, 199.0), direction=HIGHER, tolerance=0.03, rules=moded)
    assert c.verdict not in DIRECTIONAL


def test_boots_that_overlap_get_no_direction() -> None:
    # A large mean difference carried by one boot: the sides' boots overlap.
    c = compare_in_session(boots(100.0, 100.0, 400.0), boots(100.0, 100.0, 100.0), direction=HIGHER,
                           tolerance=0.03, rules=InSessionRules(0.5, 1000.0))
    assert c.verdict not in DIRECTIONAL


def test_identical_servers_within_tolerance_say_so() -> None:
    c = compare_in_session(boots(100.3, 99.8), boots(100.0, 100.2), direction=HIGHER, tolerance=0.03, rules=GPU)
    assert c.verdict is VerdictKind.WITHIN_TOLERANCE
    assert comparison_line(c).startswith("within +/-3% (-0.1%, 90% CI -2.0%..+2.0%; 2 boots (40 samples) vs 2 reference boots")


def test_a_profile_without_usable_boots_is_insufficient() -> None:
    c = compare_in_session([BootSummary(100.0, 1, 0.0)], boots(100.0), direction=HIGHER, tolerance=0.03, rules=GPU)
    assert c.verdict is VerdictKind.INSUFFICIENT_SAMPLES


def test_the_deployment_declares_the_rules_and_a_table_can_set_them() -> None:
    tiny = InSessionRules.of(BUILTIN_DEPLOYMENTS["tiny-cpu"])
    assert tiny.modes.declared and tiny.boot_spread == TINY_CPU.boot_spread
    mine = resolve_deployments({"mine": {"extends": "tiny-cpu", "spawn_mode_drop": 0.3, "spawn_mode_share": 0.2,
                                         "boot_spread_df": 12}}, source="pyproject.toml")["mine"]
    assert InSessionRules.of(mine).modes == SpawnModes(0.3, 0.2) and mine.boot_spread_df == 12.0


def test_how_sure_each_declared_spread_is_reaches_the_comparison() -> None:
    mine = resolve_deployments({"mine": {"extends": "kimi-k25-int4-tp8", "session_spread_df": 4,
                                         "host_spread_df": float("inf")}}, source="pyproject.toml")["mine"]
    assert (mine.spreads.boot_df, mine.spreads.session_df, mine.spreads.host_df) == (3.0, 4.0, math.inf)
    assert resolve_deployments({"d": {"extends": "kimi-k25-int4-tp8"}}, source="x")["d"].spreads.session_df == 10.0


@pytest.mark.parametrize(("table", "message"), [
    ({"spawn_mode_drop": 0.3, "spawn_mode_share": 0.0},
     "pyproject.toml [deployments.x]: spawn_mode_drop = 0.3 and spawn_mode_share = 0.0; declare both (modes) or neither"),
    ({"spawn_mode_drop": 1.5},
     "pyproject.toml [deployments.x]: spawn_mode_drop = 1.5; must be a fraction >= 0 and below 1 (how much slower "
     "the slow spawn mode is: 0.5 = half as fast; 0: no modes)"),
    ({"boot_spread_df": 0.5},
     "pyproject.toml [deployments.x]: boot_spread_df = 0.5; must be a number >= 1 or inf (how sure boot_spread "
     "is, in degrees of freedom: the units it was measured on less one, 3 for a guess, inf for exact)"),
    ({"session_spread_df": 0},
     "pyproject.toml [deployments.x]: session_spread_df = 0.0; must be a number >= 1 or inf (how sure "
     "session_spread is, in degrees of freedom: the units it was measured on less one, 10 by default, inf for exact)"),
    ({"host_spread_df": float("nan")},
     "pyproject.toml [deployments.x]: host_spread_df = nan; must be a number >= 1 or inf (how sure "
     "host_spread is, in degrees of freedom: the units it was measured on less one, 10 by default, inf for exact)"),
])
def test_bad_mode_declarations_are_usage_errors_naming_the_value(table: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_deployments({"x": {"extends": "kimi-k25-int4-tp8", **table}}, source="pyproject.toml")
    assert str(info.value) == message
