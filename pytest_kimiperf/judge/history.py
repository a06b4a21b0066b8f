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
from collections.abc import Mapping, Sequence
from typing import TypeVar

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.baseline_schema import BaselineEntry
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.changepoints import find_steps, last_segment, segment_spreads
from pytest_kimiperf.judge.levels import canary_shift, level_terms
from pytest_kimiperf.judge.modes import Modes, align_modes, find_modes, mode_frequency, unclear_boots
from pytest_kimiperf.judge.notes import HistoryStep, HistorySteps
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, EnvDiff, MetricResult
from pytest_kimiperf.judge.stats import MIN_BOOTS_DIRECTIONAL, Comparison, VerdictKind, compare_boots

T = TypeVar("T")


def compare_with_history(
    current: Sequence[BootSummary], history: Sequence[BootSummary], *, direction: Direction,
    tolerance: float, spreads: Spreads, metric: str = "", unit: str = "", comparable: bool = True,
    segment: bool = True, steps: Sequence[HistoryStep] | None = None,
) -> Comparison:
    """This run's boots of one metric against a baseline history: the one comparison the gate
    and benchmarks/gate_power.py both make. Modes first (a history whose boots fall into two
    clusters is judged per mode, levels.align_modes) within the history's last segment when it
    stepped (changepoints.find_steps), then every level the two sides do not
    share (levels.level_terms), then the boots (stats.compare_boots). ``segment=False`` judges
    a stepped history as one pool (benchmarks/gate_power.py measures what segmenting buys);
    ``steps`` are the history's when the caller found them already (history_steps)."""
    if steps is None:
        steps = history_steps(history, spreads=spreads, segment=segment)
    if steps:
        spreads = segment_spreads(history, steps, spreads)
        history = last_segment(history, steps)
    modes = find_modes(history)
    if modes is None:
        comparison = _compare(current, history, direction, tolerance, spreads, metric, unit, comparable)
    else:
        comparison = _judge_modes(current, modes, direction, tolerance, spreads, metric, unit, comparable)
    if steps:
        comparison = comparison.with_notes(HistorySteps(tuple(steps), len(history)))
    return comparison


def _compare(current: Sequence[BootSummary], history: Sequence[BootSummary], direction: Direction, tolerance: float,
             spreads: Spreads, metric: str, unit: str, comparable: bool) -> Comparison:
    return compare_boots(current, history, direction=direction, tolerance=tolerance, prior_spread=spreads.boot,
                         metric=metric, unit=unit, comparable=comparable,
                         levels=level_terms(current, history, spreads=spreads))


def _judge_modes(current: Sequence[BootSummary], modes: Modes, direction: Direction, tolerance: float,
                 spreads: Spreads, metric: str, unit: str, comparable: bool) -> Comparison:
    """Each boot against its mode (modes.align_modes). A boot between the modes is judged both
    ways, and a verdict the two readings do not share is inconclusive; a run that lands in the
    worse mode more often than chance allows (modes.mode_frequency, at the gate's own level) is
    a regression whatever the aligned figures say."""
    aligned, history = align_modes(current, modes)
    comparison = _compare(aligned, history, direction, tolerance, spreads, metric, unit, comparable)
    unclear = unclear_boots(current, modes)
    disagree = False
    if unclear:
        readings = [comparison, *(_compare(align_modes(current, modes, unclear_to=side)[0], history, direction,
                                           tolerance, spreads, metric, unit, comparable) for side in ("low", "high"))]
        directions = {c.verdict if c.verdict in _DIRECTIONAL else None for c in readings}
        disagree = len(directions) > 1
        if disagree:
            # Reported as the worse reading, so a run that may be slower asks for another boot.
            comparison = min(readings, key=lambda c: c.gain)
    worse = "low" if Direction(direction) is Direction.HIGHER_IS_BETTER else "high"
    hits, placed, share, p = mode_frequency(current, modes, worse=worse)
    verdict, decided = comparison.verdict, ""
    if comparable and disagree:
        verdict, decided = VerdictKind.INCONCLUSIVE, "between"
    if comparable and placed >= MIN_BOOTS_DIRECTIONAL and p < 1.0 - comparison.confidence:
        verdict, decided = VerdictKind.REGRESSION, "frequency"
    note = modes.note(unclear=unclear, disagree=disagree, worse=hits, placed=placed, worse_share=share, p=p,
                      decided=decided)
    return dataclasses.replace(comparison, verdict=verdict).with_notes(note)


_DIRECTIONAL = (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)


def history_steps(history: Sequence[BootSummary], *, spreads: Spreads, segment: bool = True) -> list[HistoryStep]:
    """The steps a run is judged after (none with ``segment=False``)."""
    return find_steps(history, spreads=spreads) if segment else []


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
    state: BaselineState = BaselineState.JUDGED,
) -> tuple[Comparison, BaselineLine]:
    """One metric's boots against one baseline entry's history, and "not comparable" when the
    host canary moved from the boots it is judged against (those since the history's last step)
    or the profile's environment or server arguments differ."""
    summaries = entry.summaries()
    steps = history_steps(summaries, spreads=spreads)
    judged = judged_part(entry.boots, summaries, steps)
    check = canary_shift(canary, [b.origin.canary for b in judged if b.origin is not None and b.origin.canary])
    same_env = dict(entry.profile_env) == dict(profile_env) and tuple(entry.profile_args) == tuple(profile_args)
    comparison = compare_with_history(
        current, summaries, direction=Direction(result.direction), tolerance=result.tolerance,
        spreads=spreads, metric=metric_spec(result.metric).label, unit=result.unit,
        comparable=same_env and not (check is not None and check.moved), steps=steps)
    env = None if same_env else EnvDiff(dict(entry.profile_env), tuple(entry.profile_args), dict(profile_env),
                                        tuple(profile_args))
    return comparison, BaselineLine(state, comparison.label, comparison,
                                    canary=check if check is not None and check.moved else None, env=env)
