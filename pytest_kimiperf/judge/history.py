"""A run's boots against a baseline history: the one comparison the gate and the simulation make.

:func:`compare_with_history` takes plain boots (a history of :class:`BootSummary` with their
sessions and hosts, oldest first) and returns the comparison: the history's last segment when
it stepped (``changepoints``), spawn modes (``modes``), then the levels
the two sides do not share (``levels``), then the boots (``stats``). :func:`against_history`
adds what only a stored entry knows: whether the host canary moved and whether the profile's
environment is the one recorded. ``gate.judge`` decides what the comparison means for the test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.baseline_schema import BaselineEntry
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.changepoints import find_steps, last_segment
from pytest_kimiperf.judge.levels import canary_shift, level_terms
from pytest_kimiperf.judge.modes import align_modes, find_modes
from pytest_kimiperf.judge.notes import HistorySteps
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, EnvDiff, MetricResult
from pytest_kimiperf.judge.stats import Comparison, compare_boots


def compare_with_history(
    current: Sequence[BootSummary], history: Sequence[BootSummary], *, direction: Direction,
    tolerance: float, spreads: Spreads, metric: str = "", unit: str = "", comparable: bool = True,
    segment: bool = True,
) -> Comparison:
    """This run's boots of one metric against a baseline history: the one comparison the gate
    and benchmarks/gate_power.py both make. Modes first (a history whose boots fall into two
    clusters is judged per mode, levels.align_modes) within the history's last segment when it
    stepped (changepoints.find_steps), then every level the two sides do not
    share (levels.level_terms), then the boots (stats.compare_boots). ``segment=False`` judges
    a stepped history as one pool (benchmarks/gate_power.py measures what segmenting buys)."""
    steps = find_steps(history, spreads=spreads) if segment else []
    if steps:
        history = last_segment(history, steps)
    modes = find_modes(history)
    if modes is not None:
        current, history = align_modes(current, modes)
    comparison = compare_boots(
        current, history, direction=direction, tolerance=tolerance, prior_spread=spreads.boot,
        metric=metric, unit=unit, comparable=comparable,
        levels=level_terms(current, history, spreads=spreads),
    )
    if steps:
        comparison = comparison.with_notes(HistorySteps(tuple(steps), len(history)))
    return comparison.with_notes(modes.note()) if modes is not None else comparison


def against_history(
    result: MetricResult, entry: BaselineEntry, *, current: Sequence[BootSummary], spreads: Spreads,
    canary: Mapping[str, float] | None, profile_env: Mapping[str, str], profile_args: Sequence[str] = (),
    state: BaselineState = BaselineState.JUDGED,
) -> tuple[Comparison, BaselineLine]:
    """One metric's boots against one baseline entry's history, and "not comparable" when the
    host canary moved or the profile's environment or server arguments differ."""
    check = canary_shift(canary, [b.origin.canary for b in entry.boots if b.origin is not None and b.origin.canary])
    same_env = dict(entry.profile_env) == dict(profile_env) and tuple(entry.profile_args) == tuple(profile_args)
    comparison = compare_with_history(
        current, entry.summaries(), direction=Direction(result.direction), tolerance=result.tolerance,
        spreads=spreads, metric=metric_spec(result.metric).label, unit=result.unit,
        comparable=same_env and not (check is not None and check.moved))
    env = None if same_env else EnvDiff(dict(entry.profile_env), tuple(entry.profile_args), dict(profile_env),
                                        tuple(profile_args))
    return comparison, BaselineLine(state, comparison.label, comparison,
                                    canary=check if check is not None and check.moved else None, env=env)
