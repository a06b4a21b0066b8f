"""A run's boots against a metric's baseline history: its steps, the comparison, drift and appending.

In order: steps (:func:`find_steps`), the comparison (:func:`compare_with_history`, the one the gate
and the simulation make), drift against the history's anchor (:func:`drift_failures`), and when a
passing run may grow the history itself (:func:`append_refusal`, ``--kimiperf-append-on-pass``).

The method and why: docs/explanation/methods.md,
"Baseline histories: steps, the comparison, drift and appending".
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, ClassVar, TypeVar

import numpy as np
from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.baselines import BaselineEntry, BaselineFile
from pytest_kimiperf.judge.engine_clock import FIGURE_OF, place
from pytest_kimiperf.judge.noise import (
    MIN_UNITS, Modes, align_modes, canary_shift, find_modes, joint_modes, level_terms, mode_frequency,
    nested_levels, own_sides, placements_of, split_key, to_sides, unclear_boots, weights_sq,
)
from pytest_kimiperf.judge.notes import Drifted, HistoryModes, HistoryStep, HistorySteps, Note, note_kind
from pytest_kimiperf.judge.stats import (
    MIN_BOOTS_DIRECTIONAL, BootSummary, Comparison, EngineBoot, VerdictKind, VerdictLeaning, band_log,
    compare_boots, t_quantile,
)
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, EnvDiff, MetricResult, TestResult

# Each side of a step holds at least this many sessions: one session after a step is an offset
# of that session as much as a new level, and the gate judges a single slow session itself.
MIN_SEGMENT = 2
# The chance that a run whose histories hold no step reports one in any of them (Bonferroni over
# the run's histories and each history's candidate splits). Apache Otava documents its p-value
# threshold of 0.01 as about 1% false positives per series; ours is that budget per run.
STEP_ALPHA = 0.01
# The histories a run tests where the caller does not say: the shipped suite's gated metrics
# under two profiles (12 x 2). The gate passes its own count (gate.GateRules.family).
DEFAULT_HISTORIES = 24
# 1.4826 * MAD estimates an SD robustly; a difference of two boots has sqrt(2) times a boot's SD.
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class Noise:
    """The SD (log scale) of each level the step test charges: the boot, and above it."""

    boot: float
    session: float
    host: float


def history_noise(history: Sequence[BootSummary], spreads: Spreads) -> Noise:
    """The levels' SDs for the step test: the declared spreads, raised to what successive boots
    of the history show (within a session: the boot level; across sessions: boot and session
    together)."""
    boot = math.log1p(spreads.boot)
    session = math.log1p(spreads.session)
    logs = [math.log(b.median) for b in history]
    within = [abs(logs[i + 1] - logs[i]) for i in range(len(logs) - 1)
              if history[i].session == history[i + 1].session]
    across = [abs(logs[i + 1] - logs[i]) for i in range(len(logs) - 1)
              if history[i].session != history[i + 1].session and history[i].host == history[i + 1].host]
    # Three differences at least before a measured spread raises a declared one.
    if len(within) >= 3:
        boot = max(boot, _MAD_TO_SD * float(np.median(within)) / math.sqrt(2))
    own = [b.se_log for b in history if math.isfinite(b.se_log)]
    if own:
        boot = max(boot, float(np.median(own)))
    if len(across) >= 3:
        total = _MAD_TO_SD * float(np.median(across)) / math.sqrt(2)
        session = max(session, math.sqrt(max(total ** 2 - boot ** 2, 0.0)))
    return Noise(boot, session, math.log1p(spreads.host))


def _split_z(left: Sequence[BootSummary], right: Sequence[BootSummary], noise: Noise) -> tuple[float, float]:
    """(difference of mean log-figures right - left, its z score) under the nested levels."""
    mean_l = sum(math.log(b.median) for b in left) / len(left)
    mean_r = sum(math.log(b.median) for b in right) / len(right)
    var = noise.boot ** 2 * (1 / len(left) + 1 / len(right))
    var += noise.session ** 2 * weights_sq(right, left, "session")
    var += noise.host ** 2 * weights_sq(right, left, "host")
    diff = mean_r - mean_l
    return diff, (abs(diff) / math.sqrt(var) if var > 0 else math.inf if diff else 0.0)


def _threshold(candidates: int, alpha: float, df: float) -> float:
    """The two-sided quantile at ``alpha`` Bonferroni-corrected over ``candidates`` splits (normal
    for known spreads, Student t at ``df`` for a measured one)."""
    p = 1.0 - alpha / (2 * candidates)
    return NormalDist().inv_cdf(p) if math.isinf(df) else t_quantile(p, df)


def _session_key(b: BootSummary, index: int) -> str:
    """The boot's session; a boot of an unknown session (recorded before sessions were stored) is its own."""
    return b.session or f"#{index}"


def _splits(boots: Sequence[BootSummary], keys: Sequence[str]) -> list[int]:
    """The candidate steps: between two sessions of one host, with at least :data:`MIN_SEGMENT`
    sessions on each side (methods.md, "Steps")."""
    return [k for k in range(1, len(boots)) if keys[k - 1] != keys[k] and boots[k - 1].host == boots[k].host
            and len(set(keys[:k])) >= MIN_SEGMENT and len(set(keys[k:])) >= MIN_SEGMENT]


def _segment(boots: Sequence[BootSummary], keys: Sequence[str], start: int, noise: Noise,
             alpha: float, candidates: int) -> list[tuple[int, float, float]]:
    """(index of the first boot after each step, change in log, z) within ``boots``, a segment
    that starts at ``start`` in the history; each split tested at ``alpha`` Bonferroni-corrected
    over the whole history's ``candidates`` splits, at every depth of the search."""
    splits = _splits(boots, keys)
    if not splits:
        return []
    scored = [(_split_z(boots[:k], boots[k:], noise), k) for k in splits]
    (diff, z), k = max(scored, key=lambda s: (s[0][1], -s[1]))
    if z < _threshold(candidates, alpha, math.inf):
        return []
    # Confirmed against the noise left around the two segments' means, where it is more than
    # declared: a session spread declared too small must not make its sessions steps.
    wider, df = _residual_noise(boots[:k], boots[k:], noise)
    diff, z = _split_z(boots[:k], boots[k:], wider)
    if z < _threshold(candidates, alpha, df):
        return []
    return (_segment(boots[:k], keys[:k], start, noise, alpha, candidates) + [(start + k, diff, z)]
            + _segment(boots[k:], keys[k:], start + k, noise, alpha, candidates))


def _residual_noise(left: Sequence[BootSummary], right: Sequence[BootSummary], noise: Noise) -> tuple[Noise, float]:
    """``noise`` raised to the boot and session spreads measured on the boots' residuals
    around their segments' means, and the degrees of freedom of the measured spread that
    raised it (infinite when none did)."""
    groups: dict[str, dict[str, list[float]]] = {}
    for side in (left, right):
        mean = _mean_log(side)
        for b in side:
            groups.setdefault(b.host, {}).setdefault(b.session, []).append(math.log(b.median) - mean)
    found = nested_levels(groups, boot_var=noise.boot ** 2)
    boot, session, df = noise.boot, noise.session, math.inf
    # Two means were fitted: the residuals' degrees of freedom are one fewer than nested_levels counts.
    if found.session.df > 1 and math.isfinite(found.session.sd_log):
        scale = math.sqrt(found.session.df / (found.session.df - 1))
        if found.session.sd_log * scale > session:
            session, df = found.session.sd_log * scale, found.session.df - 1
    if found.boot.df > 1 and math.isfinite(found.boot.sd_log) and found.boot.sd_log > boot:
        boot, df = found.boot.sd_log, min(df, found.boot.df)
    return Noise(boot, session, noise.host), df


def _contiguous(history: Sequence[BootSummary], modes: Modes) -> bool:
    """Whether the modes' boots follow each other in time (all of one, then all of the other): a step."""
    low = {id(b) for b in modes.low}
    marks = [id(b) in low for b in history if b.usable]
    changes = sum(1 for i in range(len(marks) - 1) if marks[i] != marks[i + 1])
    return changes <= 1


def history_alpha(histories: int, alpha: float = STEP_ALPHA) -> float:
    """The level each of a run's ``histories`` is searched at, so that the run reports a step
    where none is with at most ``alpha`` (Bonferroni over the histories)."""
    if histories < 1:
        raise ValueError(f"histories={histories!r}: a run searches at least one history")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r}: use a probability between 0 and 1")
    return alpha / histories


def find_steps(history: Sequence[BootSummary], *, spreads: Spreads, alpha: float = STEP_ALPHA,
               histories: int = DEFAULT_HISTORIES) -> list[HistoryStep]:
    """The steps in ``history`` (oldest boot first), oldest step first: each with the boots
    either side of it (label and commit) and the change of the level, a fraction. ``alpha`` is
    the run's budget for a false step, shared by the run's ``histories``
    (:func:`history_alpha`)."""
    per_history = history_alpha(histories, alpha)
    boots = [b for b in history if b.usable]
    if len(boots) < 2 * MIN_SEGMENT or len({b.host for b in boots}) > 1:
        # Steps on one machine only: across hosts they read 0.0% -> 4.0% false alarms (methods.md).
        return []
    modes = find_modes(boots)
    series = boots
    if modes is not None and not _contiguous(boots, modes):
        low = {id(b) for b in modes.low}
        main = modes.main_center
        series = [_moved(b, main - (modes.low_center if id(b) in low else modes.high_center)) for b in boots]
    noise = history_noise(series, spreads)
    keys = [_session_key(b, i) for i, b in enumerate(series)]
    candidates = len(_splits(series, keys))
    if not candidates:
        return []
    found = _segment(series, keys, 0, noise, per_history, candidates)
    if found:
        # The whole history's sessions, each around its segment's level, may stray more than
        # declared: then the steps must stand out from that spread too.
        shown = _session_around_segments(series, [0, *(i for i, _, _ in found), len(series)], keys, spreads)
        if shown is not None and shown > noise.session:
            found = _segment(series, keys, 0, Noise(noise.boot, shown, noise.host), per_history, candidates)
    steps = []
    for index, _, z in found:
        # The change is the level's, between the neighbouring segments' means.
        bounds = [0] + [i for i, _, _ in found] + [len(series)]
        at = bounds.index(index)
        before, after = series[bounds[at - 1]:index], series[index:bounds[at + 1]]
        change = math.expm1(_mean_log(after) - _mean_log(before))
        last, first = boots[index - 1], boots[index]
        steps.append(HistoryStep(change=change, z=z, boots_before=len(before), boots_after=len(after),
                                 before=last.label, before_commit=last.commit, after=first.label,
                                 after_commit=first.commit))
    return steps


def last_segment(history: Sequence[BootSummary], steps: Sequence[HistoryStep]) -> list[BootSummary]:
    """The usable boots of ``history`` since its last step (all of them when it has none)."""
    boots = [b for b in history if b.usable]
    if not steps:
        return boots
    return boots[len(boots) - steps[-1].boots_after:]


def _session_around_segments(boots: Sequence[BootSummary], edges: Sequence[int], sessions: Sequence[str],
                             spreads: Spreads) -> float | None:
    """The session spread (log SD) the boots show around their segments' levels (segment ``i``
    from ``edges[i]`` to ``edges[i + 1]``; steps fall between sessions, so none is cut); None
    below MIN_UNITS sessions."""
    groups: dict[str, dict[str, list[float]]] = {}
    for lo, hi in zip(edges, edges[1:]):
        mean = _mean_log(boots[lo:hi])
        for i in range(lo, hi):
            groups.setdefault(boots[i].host, {}).setdefault(sessions[i], []).append(math.log(boots[i].median) - mean)
    found = nested_levels(groups, boot_var=math.log1p(spreads.boot) ** 2)
    fitted = len(edges) - 2  # segment means beyond the one a single level has
    if found.sessions < MIN_UNITS or found.session.df <= fitted or not math.isfinite(found.session.sd_log):
        return None
    return found.session.sd_log * math.sqrt(found.session.df / (found.session.df - fitted))


def segment_spreads(history: Sequence[BootSummary], steps: Sequence[HistoryStep], spreads: Spreads) -> Spreads:
    """The declared spreads, the session spread raised to what the whole history shows around its
    segments' levels: a step moves the level, not the noise. The host level stays the declared
    one (steps are found on one host only)."""
    boots = [b for b in history if b.usable]
    edges = [0, *(sum(s.boots_before for s in steps[:i + 1]) for i in range(len(steps))), len(boots)]
    sd = _session_around_segments(boots, edges, [b.session for b in boots], spreads)
    return replace(spreads, session=spreads.session if sd is None else max(spreads.session, math.expm1(sd)))


def _mean_log(boots: Sequence[BootSummary]) -> float:
    return sum(math.log(b.median) for b in boots) / len(boots)


def _moved(b: BootSummary, by_log: float) -> BootSummary:
    return replace(b, median=b.median * math.exp(by_log))


T = TypeVar("T")


def compare_with_history(
    current: Sequence[BootSummary], history: Sequence[BootSummary], *, direction: Direction,
    tolerance: float, spreads: Spreads, metric: str = "", unit: str = "", comparable: bool = True,
    segment: bool = True, steps: Sequence[HistoryStep] | None = None, placements: Sequence[str] | None = None,
    critical: float | None = None, histories: int = DEFAULT_HISTORIES,
) -> Comparison:
    """This run's boots of one metric against a baseline history: the one comparison the gate
    and benchmarks/gate_power.py both make (methods.md, "The comparison"). ``segment=False``
    judges a stepped history as one pool; ``steps``: the history's, where the caller found them
    already; ``placements``: each current boot's spawn mode as the test's metrics placed it
    together (:func:`joint_placements`); ``critical``: stats.GATE_CRITICAL where None."""
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
    """Each boot against the mode it clearly belongs to, or the one ``placements`` give it; a
    boot that belongs to neither against the better mode (the reading least in the build's
    favour). A direction only where every likely assignment of boots to modes holds it: an
    IMPROVEMENT even with every boot read against the better mode (a true -14% with modes 20%
    apart lies 7% above the slow mode); a REGRESSION also where the run lands in the worse mode
    more often than chance allows (:func:`mode_frequency`)."""
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
    elif least.claim is VerdictLeaning.WORSE and most.claim is VerdictLeaning.WORSE:
        # Worse under every placing, beyond the tolerance not under all: the sign without its size.
        comparison = dataclasses.replace(least, verdict=VerdictKind.CHANGED_SIZE_UNRESOLVED)
        disagree = False
    elif all_better.claim is VerdictLeaning.BETTER:
        comparison, disagree = all_better, False
    else:
        # A sign another likely placing does not share: no sign, and the figures of the reading
        # least in the build's favour, so that a gate run that may be slower asks for another
        # boot.
        disagree = least.claim is not VerdictLeaning.NEITHER
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
    """For each comparison (by index) that placed a boot otherwise on its own, the one placement
    (noise.joint_modes) the test's metrics agree on. Only metrics whose histories split into the
    same boots (noise.split_key) are taken together: their modes are one spawn mode."""
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
    critical: float | None = None, histories: int = DEFAULT_HISTORIES, engine: Sequence[EngineBoot] = (),
) -> tuple[Comparison, BaselineLine]:
    """One metric's boots against one baseline entry's history: "not comparable" when the host
    canary moved from the judged boots or the profile's environment or server arguments differ;
    the two clocks (``engine``) beside the judged boots' say where its change lives."""
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
    history_engine = [b.engine for b in judged if b.engine is not None]
    if comparison.verdict is not VerdictKind.NOT_COMPARABLE and (
            clocks := place(result.metric, comparison, engine, history_engine)) is not None:
        comparison = comparison.with_notes(clocks)
    client_only = bool(engine) and not history_engine and result.metric in FIGURE_OF
    return comparison, BaselineLine(state, comparison.label, comparison,
                                    canary=check if check is not None and check.moved else None, env=env,
                                    client_clock_only=client_only)


# One-sided, per metric and night, where the run's family does not set it (the gate passes its
# critical value, gate.family_critical, so the drift tests share the run's budget): the chance
# that an undrifted history fails a night.
DRIFT_ALPHA = 0.005
# Residuals measure the noise (raising the declared) once the line has this many points.
MIN_POINTS_MEASURED = 5


@dataclass(frozen=True)
class Drift:
    """The cumulative change since the anchor (negative is worse, whatever the metric's
    direction), its bound at :data:`DRIFT_ALPHA` in the build's favour, and its nights."""

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


def drift_of_entry(entry: BaselineEntry, current: Sequence[BootSummary], *, tolerance: float, spreads: Spreads,
                   critical: float | None = None) -> Drift | None:
    """This run's boots (one more night) and the nights appended since the anchor, against the
    anchor; None where no night was appended or either end has no usable boot."""
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
    # The last point itself must be worse than the anchor too: a spike up and back fits a
    # falling line (the sign invariant: a history never worse than its anchor never drifts).
    last = points[-1][1] - points[0][1]
    last_gain = last if direction is Direction.HIGHER_IS_BETTER else -last
    failed = gain < -band_log(tolerance) and gain + z * se < 0.0 and last_gain < -band_log(tolerance)
    return Drift(math.expm1(gain), math.expm1(gain + z * se), int(span), failed)


def _residual_scale(points: Sequence[tuple[float, float, float]]) -> float:
    """How much the residuals about a weighted line through ``points`` raise the declared
    variance (at least 1), from :data:`MIN_POINTS_MEASURED` points on. The caller leaves out the
    night judged: a worse night must never widen its own bound."""
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
    """The drifts that fail: each metric of ``result`` whose history passing runs have grown,
    judged against its anchor with this run's boots as one more night (a metric not comparable
    to its history is not judged)."""
    failed = []
    for mres in result.metrics.values():
        entry = base_file.entry(result.test, result.profile, mres.metric)
        if entry is None or mres.baseline is None or mres.baseline.verdict is VerdictKind.NOT_COMPARABLE:
            continue
        drift = drift_of_entry(entry, current.get(mres.metric, []), tolerance=mres.tolerance,
                               spreads=spreads.of(mres.metric), critical=critical)
        if drift is not None and drift.failed:
            failed.append(Drifted(mres.metric, metric_spec(mres.metric).label, drift.change, drift.bound,
                                  drift.nights, mres.tolerance, entry.anchor[-1].recorded_at))
    return failed


class AppendWhy(str, enum.Enum):
    """Why a run appended nothing."""

    FAILED = "failed"
    BRANCH = "branch"
    NOT_COMPARABLE = "not-comparable"
    UNRESOLVED = "unresolved"


@note_kind("not-appended")
@dataclass(frozen=True)
class NotAppended(Note):
    """A run with append-on-pass that appended nothing, and why (:class:`AppendWhy`; ``gain`` is
    signed so that negative is worse)."""

    why: AppendWhy
    branch: str | None
    allowed: tuple[str, ...]
    failed: int = 0
    test: str = ""
    profile: str = ""
    metric: str = ""
    gain: float = math.nan
    tolerance: float = math.nan
    canary_moved: bool = False
    verdict: str = ""

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"why": AppendWhy}


def append_refusal(results: Sequence[TestResult], *, passed: bool, branch: str | None,
                   allowed: Sequence[str]) -> NotAppended | None:
    """Why this run must not append its boots (None: it may). ``passed``: pytest's own outcome
    (every test of the session passed)."""
    allowed = tuple(allowed)
    failed = sum(1 for r in results if r.failures or r.invalid or r.unresolved is not None)
    if not passed or failed:
        return NotAppended(AppendWhy.FAILED, branch, allowed, failed=failed)
    if branch not in allowed:
        return NotAppended(AppendWhy.BRANCH, branch, allowed)
    last: dict[tuple[str, str], TestResult] = {}
    for res in results:
        if (res.test, res.profile) not in last or res.boot >= last[(res.test, res.profile)].boot:
            last[(res.test, res.profile)] = res
    for res in last.values():
        for mres in res.metrics.values():
            c = mres.baseline
            if c is not None and c.verdict is VerdictKind.NOT_COMPARABLE:
                line = mres.baseline_line
                return NotAppended(AppendWhy.NOT_COMPARABLE, branch, allowed, test=res.test, profile=res.profile,
                                   metric=mres.metric, gain=c.gain, tolerance=c.tolerance,
                                   canary_moved=line is not None and line.canary is not None)
    for res in last.values():
        for mres in res.metrics.values():
            c = mres.baseline
            if c is not None and c.unresolved_beyond_tolerance and c.gain < 0:
                return NotAppended(AppendWhy.UNRESOLVED, branch, allowed, test=res.test, profile=res.profile,
                                   metric=mres.metric, gain=c.gain, tolerance=c.tolerance, verdict=c.verdict.value)
    return None
