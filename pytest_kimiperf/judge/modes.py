"""Spawn modes: a history whose boots fall into clusters, and judging a run against it robustly.

vLLM's decode speed can be "bimodal (~33 vs ~26 tok/s), fixed at process spawn"
(ROCm legacy-rocm-build #6347: 2 of 7 spawns fast); restarted instances fall into "different stable
regimes" (vllm-project/vllm #39903). A gate that pools such a history into one mean and one spread
has two failures at once: the spread is wide (a real 6% regression hides in it) and a boot that
lands in the other mode reads as a change (benchmarks/gate_power.py, bimodal cells: 10% false
REGRESSION, 28% detection of a 6% change before per-mode comparison).

The method, chosen on the simulation and the corpus (benchmarks/README.md, "Gate power, in
simulation"): **per-mode comparison**. :func:`find_modes` splits the history at its widest gap when
that gap is :data:`MODE_GAP` times wider than the spread inside the two clusters, each holds at
least :data:`_MIN_MODE_BOOTS` boots and the history :data:`MIN_HISTORY_BOOTS`. :func:`align_modes`
then expresses every boot relative to its mode: a history boot by its own cluster's centre, a
current boot by the mode it clearly lies in (the nearer centre), or the one the metrics of its test
place it in together (:func:`joint_modes`). A boot that lands in a mode the history already holds is
so no change, and a shift within a mode is judged against the spread inside the modes, which is the
spread a build change must beat.

Rejected: a rank test of the current boots against the history shifted by the tolerance needs
more current boots than a gate run has (1-3) to say anything; a two-component mixture fit
needs more history boots than 10-20 to place its weights. The limit, said in every verdict that
used modes: a true change of about the gap itself moves a boot into the other mode and is not
seen; the modes' own centres are reported so a reader can see when that happened. Two guards
narrow it: a boot between the modes (:data:`CLEAR_SHARE`) is judged both ways and gets no
direction the two readings do not share, and a run that lands in the worse mode more often
than the history's share of it explains (:func:`mode_frequency`) is a regression.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from pytest_kimiperf.judge.boots import BootSummary
from pytest_kimiperf.judge.notes import HistoryModes
from pytest_kimiperf.judge.stats import GATE_CRITICAL

# The widest gap between sorted boot log-medians must be this many times the pooled SD inside
# the two clusters it leaves, each of at least MIN_MODE_BOOTS boots, in a history of at least
# MIN_HISTORY_BOOTS. Simulated (5,000 histories of one normal mode each): the ratio exceeds 5
# in 0.9% of 8-boot histories, 0.4% of 10 and none of 20; with 2 boots a side allowed in 4-6
# boot histories it exceeded 4 in 7-11%, hence the minimum history. A history with 30% of its
# boots 20% slower (boot SD 1%) is split in 85% of 10-boot and 99.5% of 20-boot histories; the
# rest hold fewer than 2 slow boots (tests/unit/test_modes.py pins both rates).
MODE_GAP = 5.0
_MIN_MODE_BOOTS = 2
MIN_HISTORY_BOOTS = 8
# A current boot belongs to a mode only when it lies within this many predictive SDs of the
# mode's centre (``Modes.fit_sd``: the spread inside the modes, never below the declared levels
# together): the gate's own critical value, so an unchanged boot is misplaced about as rarely as
# an unchanged build is convicted (a two-sided 0.12% a boot). A boot that fits neither mode is a
# change, read against the better mode (history.compare_with_history); one that fits both is
# read both ways.
MODE_FIT_CRITICAL = GATE_CRITICAL


@dataclass(frozen=True)
class Modes:
    """The history's two clusters (low first): their centres (mean log-median) and boots."""

    low: tuple[BootSummary, ...]
    high: tuple[BootSummary, ...]
    low_center: float
    high_center: float
    gap_ratio: float
    # The SD of a boot's log figure around its own mode's centre: the spread inside the modes,
    # never below the declared levels (find_modes' ``floor_sd``).
    within_sd: float = 0.0

    @property
    def main_center(self) -> float:
        """The centre of the larger mode (the slower on a tie): the figures read in its units."""
        return self.low_center if len(self.low) >= len(self.high) else self.high_center

    def note(self, **more: object) -> HistoryModes:
        """What a verdict judged with these modes notes of them (``more``: the run's own boots,
        :class:`HistoryModes`)."""
        return HistoryModes(len(self.low), math.exp(self.low_center), len(self.high), math.exp(self.high_center),
                            **more)  # type: ignore[arg-type]

    def fits(self, b: BootSummary, side: str) -> bool:
        """Whether a boot of an unchanged build could lie where ``b`` does in mode ``side``
        (``"low"``/``"high"``): within :data:`MODE_FIT_CRITICAL` predictive SDs of its centre."""
        center, boots = (self.low_center, self.low) if side == "low" else (self.high_center, self.high)
        predictive = self.within_sd * math.sqrt(1.0 + 1.0 / len(boots))
        return abs(math.log(b.median) - center) <= MODE_FIT_CRITICAL * predictive

    def mode_of(self, b: BootSummary) -> str | None:
        """``"low"`` or ``"high"``: the mode a boot clearly belongs to (it fits that one and
        not the other); None when it fits both or neither."""
        low, high = self.fits(b, "low"), self.fits(b, "high")
        if low != high:
            return "low" if low else "high"
        return None


def find_modes(history: Sequence[BootSummary], *, floor_sd: float = 0.0) -> Modes | None:
    """The history's two modes, or None when its boots form one cluster (or are too few).
    ``floor_sd`` (log) is the least spread a boot has around its mode's centre: the declared
    levels together, which a run's boot (another session, maybe another host) carries."""
    boots = sorted((b for b in history if b.usable), key=lambda b: b.median)
    if len(boots) < MIN_HISTORY_BOOTS:
        return None
    logs = [math.log(b.median) for b in boots]
    gaps = [(logs[i + 1] - logs[i], i + 1) for i in range(_MIN_MODE_BOOTS - 1, len(logs) - _MIN_MODE_BOOTS)]
    if not gaps:
        return None
    gap, cut = max(gaps)
    low, high = logs[:cut], logs[cut:]
    low_mean, high_mean = sum(low) / len(low), sum(high) / len(high)
    ss = sum((x - low_mean) ** 2 for x in low) + sum((x - high_mean) ** 2 for x in high)
    within = math.sqrt(ss / (len(logs) - 2))
    # The boots' own error of their medians is a floor: two tight clusters of 2 boots each
    # are no modes if their gap is within what the requests alone explain.
    floor = max((b.se_log for b in boots if math.isfinite(b.se_log)), default=0.0)
    within = max(within, floor)
    if within <= 0 or gap < MODE_GAP * within:
        return None
    return Modes(tuple(boots[:cut]), tuple(boots[cut:]), low_mean, high_mean, gap / within, max(within, floor_sd))


def align_modes(current: Sequence[BootSummary], modes: Modes, *, sides: Sequence[str | None] | None = None,
                unclear_to: str | None = None) -> tuple[list[BootSummary], list[BootSummary]]:
    """Every boot moved by its mode's offset from the main mode: history boots by their own
    cluster, current boots by their side (``sides``, one per current boot: ``"low"``, ``"high"``,
    or None between the modes; default :meth:`Modes.mode_of`); a boot between by ``unclear_to``'s
    centre when given, else by the centre nearest it."""
    main = modes.main_center

    def moved(b: BootSummary, center: float) -> BootSummary:
        return dataclasses.replace(b, median=b.median * math.exp(main - center))

    history = [moved(b, modes.low_center) for b in modes.low] + [moved(b, modes.high_center) for b in modes.high]
    aligned = []
    for b, side in zip(current, _sides(current, modes, sides)):
        if not b.usable:
            aligned.append(b)
            continue
        x = math.log(b.median)
        if side is None:
            side = unclear_to or ("low" if abs(x - modes.low_center) <= abs(x - modes.high_center) else "high")
        aligned.append(moved(b, modes.low_center if side == "low" else modes.high_center))
    return aligned, history


def _sides(current: Sequence[BootSummary], modes: Modes, sides: Sequence[str | None] | None) -> list[str | None]:
    if sides is None:
        return [modes.mode_of(b) if b.usable else None for b in current]
    if len(sides) != len(current):
        raise ValueError(f"sides={list(sides)!r}: give one per current boot ({len(current)})")
    return list(sides)


def unclear_boots(current: Sequence[BootSummary], modes: Modes, sides: Sequence[str | None] | None = None) -> int:
    """The usable current boots that lie between the modes (by ``sides`` where given)."""
    return sum(1 for b, side in zip(current, _sides(current, modes, sides)) if b.usable and side is None)


def mode_frequency(current: Sequence[BootSummary], modes: Modes, *, worse: str,
                   sides: Sequence[str | None] | None = None) -> tuple[int, int, float, float]:
    """How many of the run's clearly placed boots landed in the ``worse`` mode (``"low"`` for a
    higher-is-better metric), of how many, the history's share of that mode, and the chance of
    at least that many were the run's boots drawn as the history's were (a binomial tail): a
    build that lands in the slow mode more often is a regression the alignment cannot show.
    With 3 boots and a slow mode of 30%, all 3 slow has a chance of 2.7%: a gate run of 2-3
    boots convicts on it only where the worse mode is rare (3 of 3 needs a mode that holds under
    8% of the history; 4 of 4, 15%). ``sides`` as :func:`align_modes`."""
    placed = [side for b, side in zip(current, _sides(current, modes, sides)) if b.usable and side is not None]
    share = len(modes.low if worse == "low" else modes.high) / (len(modes.low) + len(modes.high))
    hits = sum(1 for m in placed if m == worse)
    p = float(scipy_stats.binom.sf(hits - 1, len(placed), share)) if placed else 1.0
    return hits, len(placed), share, p


# A boot's mode in the metric's own terms, the same for every metric: "worse" (the lower mode of a
# throughput, the higher of a latency), "better", or "" (between the modes, or not usable).
WORSE, BETTER, BETWEEN = "worse", "better", ""


def to_sides(placements: Sequence[str], *, worse: str) -> list[str | None]:
    """Placements (:data:`WORSE`, :data:`BETTER`, :data:`BETWEEN`) as a metric's sides
    (``"low"``/``"high"``/None), ``worse`` being its worse side."""
    better = "high" if worse == "low" else "low"
    return [worse if p == WORSE else better if p == BETTER else None for p in placements]


def placements_of(sides: Sequence[str | None], *, worse: str) -> tuple[str, ...]:
    """The inverse of :func:`to_sides`."""
    return tuple(BETWEEN if s is None else WORSE if s == worse else BETTER for s in sides)


def own_sides(current: Sequence[BootSummary], modes: Modes) -> list[str | None]:
    """Each current boot's side as this metric alone places it (None: between, or not usable)."""
    return _sides(current, modes, None)


def split_key(modes: Modes, history: Sequence[BootSummary], *, worse: str) -> str:
    """Which boots of ``history`` (the one ``modes`` were found in, oldest first) the worse mode
    holds, as a short digest: two metrics of one test whose histories split alike saw the same
    spawn modes, so one boot is in one mode for both (history.joint_placements). A boot is
    known by its recording time, session and host, and its place among the boots that share
    them (one recording stamps all its boots alike, and writes every metric's in boot order)."""
    seen: dict[tuple[str, str, str], int] = {}
    keys: dict[int, str] = {}
    for b in history:
        base = (b.label, b.session, b.host)
        keys[id(b)] = f"{b.label}|{b.session}|{b.host}|{seen.get(base, 0)}"
        seen[base] = seen.get(base, 0) + 1
    boots = modes.low if worse == "low" else modes.high
    return hashlib.sha256("\n".join(sorted(keys.get(id(b), "?") for b in boots)).encode()).hexdigest()[:12]


def joint_modes(readings: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """One placement per boot from several metrics' own (each a sequence of :data:`WORSE`,
    :data:`BETTER`, :data:`BETWEEN`, one per boot): the mode every metric that places the boot
    clearly agrees on; :data:`BETWEEN` where none places it, or two place it in different modes.
    A metric the change moved into the middle is so placed by one it left alone; a change the
    size of the gap, which moves a boot clearly into the other mode in one metric only, makes
    the boot unclear for all, so it is judged both ways."""
    joint = []
    for marks in zip(*readings):
        clear = {m for m in marks if m != BETWEEN}
        joint.append(clear.pop() if len(clear) == 1 else BETWEEN)
    return tuple(joint)
