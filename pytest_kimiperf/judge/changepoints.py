"""Steps in a metric's boot history: where its level moved and stayed, and the segment a run is judged against.

A baseline history grows over weeks (``--update-baselines``, the fleet's merged recordings), and
the hardware, driver or a landed change can move it for good: a history that stepped -4% judged
as one pool is a wide spread around a centre no current build has, which hides a regression of
the current build and, after a step up, calls an unchanged build a regression.

The method: **binary segmentation of the boots' log-figures with a test that knows the noise
levels**, the boot as the unit. A step can only fall between two sessions (a build, a driver or
a machine changes between recordings, not inside one), with at least :data:`MIN_SEGMENT`
sessions each side: one session's offset is the session level, and a step that one session
shows alone is indistinguishable from it. Each candidate split of a segment is scored by the difference of the
two sides' mean log-figures over its
standard error under the nested model the gate uses (levels.py): the boot level with weight
1/n1 + 1/n2, and each level above it (session, host) with the weight its units give it, the
same factor ``levels.weights_sq`` gives a run against a history. The best split is a step when
its two-sided p-value, Bonferroni-corrected over the history's candidate splits *and* over the
run's histories, is below :data:`STEP_ALPHA`; then each side is searched again at the same
threshold. So :data:`STEP_ALPHA` is the chance that a run whose histories hold no step reports
one in any of them (the gate tests every gated metric's history of every profile: 24 for the
shipped suite), not a budget per history re-spent at every split: under no step, a step is
reported only when the first search of some history finds one, which the Bonferroni over the
histories and the whole history's splits holds at :data:`STEP_ALPHA` (the sub-segments'
candidates are a subset of the history's, searched at the history's threshold).

The segment after a step is a selected one: the split is where the two sides differ most, so
its mean is pushed away from the level before, most of all where no step is. It is used only
with what makes it trustworthy: a step found at the run's corrected level, at least
:data:`MIN_SEGMENT` sessions on each side, and the comparison then rests on that segment's own
boots and sessions (its size, not the whole history's), with the session spread measured around
every segment's level (:func:`segment_spreads`).

Steps are looked for in a history of one host only: across hosts of one fingerprint the host
level explains a difference (and the canary a large one); the corpus replay, whose histories
mix hosts 3x apart in TTFT, read host changes as steps (0.0% -> 4.0% false alarms) before.
The noise is never taken smaller than the deployment declares, and raised where the history
shows more: the boot level from successive boots of one session, the level above it from
successive boots of different sessions (both by the median absolute difference, so a step or
an outlier among them barely moves them). Spawn modes interleaved in time are not steps: the
history is first aligned to its modes (modes.py) unless the two clusters are contiguous in time,
which is a step and judged as one.

Why not the others: E-divisive means (Apache Otava/Hunter, MongoDB) is a permutation
test that assumes exchangeable points: boots of one session are not (they share the session's
effect), so a session's offset would read as a step. Hunter's Student-t windows are the same
test as ours with a sample variance of a few boots in place of the known levels. asv's penalized
step fit needs a penalty tuned per series. With 20 boots at most (baselines.HISTORY_BOOTS) an
exact search would cost nothing, but binary segmentation with a known-variance test keeps the
false-step rate a stated number: benchmarks/gate_power.py --cells steps measures it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.levels import MIN_UNITS, nested_levels, weights_sq
from pytest_kimiperf.judge.modes import Modes, find_modes
from pytest_kimiperf.judge.notes import HistoryStep
from pytest_kimiperf.judge.stats import t_quantile

# Each side of a step holds at least this many sessions: one session after a step is an offset
# of that session as much as a new level, and the gate judges a single slow session itself.
MIN_SEGMENT = 2
# The chance that a run whose histories hold no step reports one in any of them (Bonferroni over
# the run's histories and each history's candidate splits). Apache Otava documents its p-value
# threshold of 0.01 as about 1% false positives per series; ours is that budget per run.
STEP_ALPHA = 0.01
# The histories a run tests where the caller does not say: the shipped suite's gated metrics
# under two profiles (12 x 2). The gate passes its own count (gate.Rules.family).
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
    """The candidate steps: between two sessions of one host (a build or a driver changes
    between sessions, not inside one; where the host changes, the host level explains the
    difference, and the gate charges it already), with at least :data:`MIN_SEGMENT` sessions
    on each side (one session's offset is the session level, not a step)."""
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
        # A step is a change of one machine's level. Across hosts the host level explains a
        # difference (the canary a large one), and a history of several hosts of one
        # fingerprint read as steps in the corpus replay (hosts 3x apart in TTFT): 0.0% -> 4.0%
        # false alarms. Such a history is judged whole.
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
        shown = _shown_session(series, [i for i, _, _ in found], spreads)
        if shown > noise.session:
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


def _shown_session(boots: Sequence[BootSummary], cuts: Sequence[int], spreads: Spreads) -> float:
    """The session spread (log SD) the boots show around their segments' levels (0 below
    MIN_UNITS sessions)."""
    edges = [0, *cuts, len(boots)]
    groups: dict[str, dict[str, list[float]]] = {}
    for lo, hi in zip(edges, edges[1:]):
        mean = _mean_log(boots[lo:hi])
        for i in range(lo, hi):
            groups.setdefault(boots[i].host, {}).setdefault(_session_key(boots[i], i), []).append(
                math.log(boots[i].median) - mean)
    found = nested_levels(groups, boot_var=math.log1p(spreads.boot) ** 2)
    fitted = len(edges) - 2
    if found.sessions < MIN_UNITS or found.session.df <= fitted or not math.isfinite(found.session.sd_log):
        return 0.0
    return found.session.sd_log * math.sqrt(found.session.df / (found.session.df - fitted))


def segment_spreads(history: Sequence[BootSummary], steps: Sequence[HistoryStep], spreads: Spreads) -> Spreads:
    """The spreads a run is judged with against the last segment: the declared ones, the session
    spread raised to what the whole history shows around its segments' levels. A step moves the
    level, not the noise: the boots before it still measured how far sessions stray, and the
    last segment alone (two sessions, say) would forget it."""
    boots = [b for b in history if b.usable]
    edges = [0, *(sum(s.boots_before for s in steps[:i + 1]) for i in range(len(steps))), len(boots)]
    groups: dict[str, dict[str, list[float]]] = {}
    for lo, hi in zip(edges, edges[1:]):
        mean = _mean_log(boots[lo:hi])
        for b in boots[lo:hi]:
            # A session cut by no step lies in one segment: steps fall between sessions.
            groups.setdefault(b.host, {}).setdefault(b.session, []).append(math.log(b.median) - mean)
    found = nested_levels(groups, boot_var=math.log1p(spreads.boot) ** 2)
    fitted = len(edges) - 2  # segment means beyond the one a single level has
    session = spreads.session
    if found.sessions >= MIN_UNITS and found.session.df > fitted and math.isfinite(found.session.sd_log):
        scale = math.sqrt(found.session.df / (found.session.df - fitted))
        session = max(session, math.expm1(found.session.sd_log * scale))
    # One host (find_steps looks for steps on one machine only): its host level is the declared one.
    return replace(spreads, session=session)


def _mean_log(boots: Sequence[BootSummary]) -> float:
    return sum(math.log(b.median) for b in boots) / len(boots)


def _moved(b: BootSummary, by_log: float) -> BootSummary:
    return replace(b, median=b.median * math.exp(by_log))
