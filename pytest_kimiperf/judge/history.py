"""A run's boots against a baseline history: the one comparison the gate and the simulation make.

:func:`compare_with_history` takes plain boots (a history of :class:`BootSummary` with their
sessions and hosts, oldest first) and returns the comparison: the history's last segment when
it stepped (``changepoints``), spawn modes (``modes``), then the levels
the two sides do not share (``levels``), then the boots (``stats``). :func:`against_history`
adds what only a stored entry knows: whether the host canary moved and whether the profile's
environment is the one recorded. ``gate.judge`` decides what the comparison means for the test.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.baseline_schema import BaselineEntry
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.changepoints import DEFAULT_HISTORIES, find_steps, last_segment, segment_spreads
from pytest_kimiperf.judge.levels import canary_shift, level_terms
from pytest_kimiperf.judge.modes import (
    Modes, align_modes, find_modes, joint_modes, mode_frequency, own_sides, placements_of, split_key, to_sides,
    unclear_boots,
)
from pytest_kimiperf.judge.notes import HistoryModes, HistoryStep, HistorySteps
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, EnvDiff, MetricResult
from pytest_kimiperf.judge.stats import MIN_BOOTS_DIRECTIONAL, Comparison, Leaning, VerdictKind, compare_boots, leaning

T = TypeVar("T")


def compare_with_history(
    current: Sequence[BootSummary], history: Sequence[BootSummary], *, direction: Direction,
    tolerance: float, spreads: Spreads, metric: str = "", unit: str = "", comparable: bool = True,
    segment: bool = True, steps: Sequence[HistoryStep] | None = None, placements: Sequence[str] | None = None,
    critical: float | None = None, histories: int = DEFAULT_HISTORIES,
) -> Comparison:
    """This run's boots of one metric against a baseline history: the one comparison the gate
    and benchmarks/gate_power.py both make. Modes first (a history whose boots fall into two
    clusters is judged per mode, levels.align_modes) within the history's last segment when it
    stepped (changepoints.find_steps), then every level the two sides do not
    share (levels.level_terms), then the boots (stats.compare_boots). ``segment=False`` judges
    a stepped history as one pool (benchmarks/gate_power.py measures what segmenting buys);
    ``steps`` are the history's when the caller found them already (history_steps);
    ``placements`` each current boot's spawn mode as the test's metrics placed it together
    (:func:`joint_placements`), in place of this metric's own placing; ``critical`` the
    standard errors a direction needs (stats.GATE_CRITICAL where None; family.family_critical
    for a run of a known size); ``histories`` the run's histories that share the budget for a
    false step (changepoints.history_alpha)."""
    if steps is None:
        steps = history_steps(history, spreads=spreads, segment=segment, histories=histories)
    if steps:
        spreads = segment_spreads(history, steps, spreads)
        history = last_segment(history, steps)
    modes = find_modes(history, floor_sd=math.hypot(*(math.log1p(x) for _, x in spreads.by_level())))
    if modes is None:
        comparison = _compare(current, history, direction, tolerance, spreads, metric, unit, comparable, critical)
    else:
        comparison = _judge_modes(current, modes, direction, tolerance, spreads, metric, unit, comparable, placements,
                                  split_key(modes, history, worse=_worse(direction)), critical)
    if steps:
        comparison = comparison.with_notes(HistorySteps(tuple(steps), len(history)))
    return comparison


def _compare(current: Sequence[BootSummary], history: Sequence[BootSummary], direction: Direction, tolerance: float,
             spreads: Spreads, metric: str, unit: str, comparable: bool, critical: float | None = None) -> Comparison:
    return compare_boots(current, history, direction=direction, tolerance=tolerance, prior_spread=spreads.boot,
                         prior_spread_df=spreads.boot_df, metric=metric, unit=unit, comparable=comparable,
                         levels=level_terms(current, history, spreads=spreads), critical=critical)


def _judge_modes(current: Sequence[BootSummary], modes: Modes, direction: Direction, tolerance: float,
                 spreads: Spreads, metric: str, unit: str, comparable: bool,
                 placements: Sequence[str] | None = None, split: str = "",
                 critical: float | None = None) -> Comparison:
    """Each boot against the mode it clearly belongs to (modes.Modes.mode_of), or the one the
    test's metrics place it in together (``placements``); a boot that belongs to neither is
    read against the better mode: the reading least in the build's favour. A direction only
    where it holds for every assignment of the boots to the modes that is not negligible:

    * REGRESSION when that least favourable reading convicts, and still does with every boot
      that fits both modes read against the worse one;
    * IMPROVEMENT only when the run is better even with every boot read against the better mode
      (a boot between the modes may be a fast spawn made slower: a true -14% with modes 20%
      apart lies 7% above the slow mode and read there as an improvement);
    * a run that lands in the worse mode more often than chance allows (modes.mode_frequency,
      at the gate's own level) is a regression whatever the aligned figures say.
    Otherwise the least favourable reading's figures, with no direction."""
    worse = _worse(direction)
    better = "high" if worse == "low" else "low"
    sides = own_sides(current, modes) if placements is None else to_sides(placements, worse=worse)

    def reading(unclear_to: str, every: str | None = None) -> Comparison:
        aligned, history = align_modes(current, modes, sides=[every] * len(current) if every else sides,
                                       unclear_to=unclear_to)
        return _compare(aligned, history, direction, tolerance, spreads, metric, unit, comparable, critical)

    least = reading(better)
    unclear = unclear_boots(current, modes, sides)
    fits_both = any(side is None and b.usable and modes.fits(b, "low") and modes.fits(b, "high")
                    for b, side in zip(current, sides))
    most = reading(worse) if fits_both else least
    all_better = reading(better, every=better)
    if least.verdict is VerdictKind.REGRESSION and most.verdict is VerdictKind.REGRESSION:
        comparison, disagree = least, False
    elif all_better.verdict is VerdictKind.IMPROVEMENT:
        comparison, disagree = all_better, False
    else:
        # A direction another likely placing does not share: no direction, and the figures of the
        # reading least in the build's favour, so that a gate run that may be slower asks for
        # another boot.
        disagree = leaning(least.verdict) is not Leaning.NEITHER
        comparison = min((least, all_better), key=lambda c: c.gain) if disagree else least
    hits, placed, share, p = mode_frequency(current, modes, worse=worse, sides=sides)
    verdict, decided = comparison.verdict, ""
    if comparable and disagree:
        verdict, decided = VerdictKind.INCONCLUSIVE, "between"
    if comparable and placed >= MIN_BOOTS_DIRECTIONAL and p < 1.0 - comparison.confidence:
        verdict, decided = VerdictKind.REGRESSION, "frequency"
    note = modes.note(unclear=unclear, disagree=disagree, worse=hits, placed=placed, worse_share=share, p=p,
                      decided=decided, boot_modes=placements_of(sides, worse=worse), split=split,
                      joint=placements is not None)
    return dataclasses.replace(comparison, verdict=verdict).with_notes(note)


def _worse(direction: Direction) -> str:
    """The worse spawn mode of a metric: the lower of a throughput, the higher of a latency."""
    return "low" if Direction(direction) is Direction.HIGHER_IS_BETTER else "high"


def joint_placements(comparisons: Sequence[Comparison | None]) -> dict[int, tuple[str, ...]]:
    """Where the metrics of one test place a boot in different spawn modes: the one placement
    (modes.joint_modes) of each boot, for each comparison (by its index) that placed a boot
    otherwise on its own and should be judged again with it. Only metrics whose histories split
    into the same boots (modes.split_key) are taken together: their modes are one spawn mode."""
    groups: dict[tuple[str, int], list[tuple[int, tuple[str, ...]]]] = {}
    for i, c in enumerate(comparisons):
        note = next((n for n in c.notes if isinstance(n, HistoryModes)), None) if c is not None else None
        if note is not None and note.split and not note.joint:
            groups.setdefault((note.split, len(note.boot_modes)), []).append((i, note.boot_modes))
    again: dict[int, tuple[str, ...]] = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        joint = joint_modes([own for _, own in members])
        again.update({i: joint for i, own in members if tuple(own) != joint})
    return again


def history_steps(history: Sequence[BootSummary], *, spreads: Spreads, segment: bool = True,
                  histories: int = DEFAULT_HISTORIES) -> list[HistoryStep]:
    """The steps a run is judged after (none with ``segment=False``), the run's false-step
    budget shared by its ``histories``."""
    return find_steps(history, spreads=spreads, histories=histories) if segment else []


def judged_part(history: Sequence[T], summaries: Sequence[BootSummary], steps: Sequence[HistoryStep]) -> list[T]:
    """The items of ``history`` (one per boot, as ``summaries``) a run is judged against: the
    usable ones since the last step (every one when it has none): whose canaries say whether
    the host moved."""
    if not steps:
        return list(history)
    usable = [item for item, s in zip(history, summaries) if s.usable]
    return usable[len(usable) - steps[-1].boots_after:]


def against_history(
    result: MetricResult, entry: BaselineEntry, *, current: Sequence[BootSummary], spreads: Spreads,
    canary: Mapping[str, float] | None, profile_env: Mapping[str, str], profile_args: Sequence[str] = (),
    state: BaselineState = BaselineState.JUDGED, placements: Sequence[str] | None = None,
    critical: float | None = None, histories: int = DEFAULT_HISTORIES,
) -> tuple[Comparison, BaselineLine]:
    """One metric's boots against one baseline entry's history, and "not comparable" when the
    host canary moved from the boots it is judged against (those since the history's last step)
    or the profile's environment or server arguments differ."""
    summaries = entry.summaries()
    steps = history_steps(summaries, spreads=spreads, histories=histories)
    judged = judged_part(entry.boots, summaries, steps)
    check = canary_shift(canary, [b.origin.canary for b in judged if b.origin is not None and b.origin.canary])
    same_env = dict(entry.profile_env) == dict(profile_env) and tuple(entry.profile_args) == tuple(profile_args)
    comparison = compare_with_history(
        current, summaries, direction=Direction(result.direction), tolerance=result.tolerance,
        spreads=spreads, metric=metric_spec(result.metric).label, unit=result.unit,
        comparable=same_env and not (check is not None and check.moved), steps=steps, placements=placements,
        critical=critical)
    env = None if same_env else EnvDiff(dict(entry.profile_env), tuple(entry.profile_args), dict(profile_env),
                                        tuple(profile_args))
    return comparison, BaselineLine(state, comparison.label, comparison,
                                    canary=check if check is not None and check.moved else None, env=env)
