"""The noise a comparison assumes and the boots it takes to see through it.

In order:

* the host canary of each side compared: whether this run's host is the history's;
* the levels a figure varies at (requests, boots within a session, sessions, hosts);
* spawn modes: a history whose boots fall into clusters, and judging a run against it robustly;
* whether a run's boots show spreads beyond the ones its deployment declares;
* how many boots a verdict needs: the first-boot screen and the boot planner's advice, also a
  command (``kimiperf boots --from 81.4 --to 81.9 --spread 0.8%``).

The method and why: docs/explanation/methods.md, "The noise a comparison assumes".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field, replace
import functools
import hashlib
import math
import statistics

from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import DEFAULT_LEVEL_SPREAD_DF, LEVELS, Spreads
from pytest_kimiperf.judge.notes import HistoryModes, LevelSpread, Note, ResolvePlan, SpreadSeen, SpreadSource, note_kind
from pytest_kimiperf.judge.stats import (
    BootSummary, Comparison, DETECTION_POWER, GATE_CRITICAL, LevelTerm, MIN_BOOTS_DIRECTIONAL, RUN_ALPHA,
    VerdictKind, boot_floor, critical_at, pooled_variance, satterthwaite_df, within_sessions,
)
from pytest_kimiperf.numbers import is_real


# The canary moved when every probe is this much off the history's, all the same way (log
# scale). Measured on the noise corpus (benchmarks/noise_study.py --analyze), on one host shared
# with other engineers' test runs: the interpreter probe drifted up to 16% from a session's
# start to its end, the copy probe up to 30% (another process's memory traffic), and both
# varied 5% (SD) between sessions; so one probe alone cannot say "another host", and both must
# move 25%. A host 2x slower moves both by about 50%; one 1.2x slower is left to host_spread.
CANARY_MOVED_LOG = math.log(1.25)


@dataclass(frozen=True)
class CanaryCheck:
    """This session's canary against the history's: the change of each probe (fraction), and
    whether they all moved beyond :data:`CANARY_MOVED_LOG` the same way."""

    shifts: Mapping[str, float]
    moved: bool

    def to_dict(self) -> dict[str, object]:
        return {"shifts": dict(self.shifts), "moved": self.moved}


def canary_shift(current: Mapping[str, float] | None,
                 reference: Sequence[Mapping[str, float]]) -> CanaryCheck | None:
    """Each probe this session shares with the history: its change against the history's median
    score. None when either side has no canary (a history recorded before canaries)."""
    if not current:
        return None
    shifts = {}
    for probe, score in current.items():
        history = [c[probe] for c in reference if c.get(probe)]
        if history and score > 0:
            shifts[probe] = score / statistics.median(history) - 1.0
    if not shifts:
        return None
    logs = [math.log1p(s) for s in shifts.values()]
    moved = all(x > CANARY_MOVED_LOG for x in logs) or all(x < -CANARY_MOVED_LOG for x in logs)
    return CanaryCheck(shifts, moved)


# The step search (history.py) measures the session spread around its segments once the
# history spans this many sessions; the gate pools any measured df with the declared ones.
MIN_UNITS = 3
# Interval quoted for a measured level.
_LEVEL_INTERVAL = 0.90


@dataclass(frozen=True)
class Level:
    """One level's spread: the SD of its effect on a log-figure, its degrees of freedom, where
    it came from, and (when measured) its :data:`_LEVEL_INTERVAL` interval."""

    name: str
    sd_log: float
    df: float
    source: SpreadSource
    low: float = math.nan
    high: float = math.nan
    plain_sd_log: float = math.nan  # the larger of declared and measured, not pooled (stats.Spread)
    # The units' mean square before the lower levels' share (``lower_var``) is taken out: what a
    # test of the level against a declaration reads. NaN: not measured.
    mean_square: float = math.nan
    lower_var: float = math.nan
    seen: SpreadSeen | None = None

    @property
    def percent(self) -> float:
        """The spread in percent (exp(sd) - 1)."""
        return math.expm1(self.sd_log) * 100.0

    def to_json(self) -> dict[str, object]:
        """JSON-ready (NaN as None)."""
        def num(x: float) -> float | None:
            return round(x, 6) if math.isfinite(x) else None
        return {"name": self.name, "sd_log": num(self.sd_log), "df": num(self.df), "source": self.source.to_json(),
                "low": num(self.low), "high": num(self.high)}


@dataclass(frozen=True)
class Levels:
    """What the corpus (or a history) says about every level of one metric."""

    metric: str
    request_cv: float
    boot: Level
    session: Level
    host: Level
    boots: int
    sessions: int
    hosts: int

    def to_json(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"metric": self.metric, "request_cv": None if not math.isfinite(self.request_cv) else self.request_cv,
                "boot": self.boot.to_json(), "session": self.session.to_json(), "host": self.host.to_json(),
                "boots": self.boots, "sessions": self.sessions, "hosts": self.hosts}


def _chi2_interval(ss: float, df: float) -> tuple[float, float]:
    """The :data:`_LEVEL_INTERVAL` interval of a variance from its sum of squares and df."""
    tail = (1.0 - _LEVEL_INTERVAL) / 2.0
    return ss / _chi2_ppf(1.0 - tail, df), ss / _chi2_ppf(tail, df)


@functools.lru_cache(maxsize=4096)
def _chi2_ppf(q: float, df: float) -> float:
    """chi2's quantile, cached: the levels ask for the same few df over and over, and a scalar
    call of scipy's ppf costs ~180 us of argument checks."""
    return float(scipy_stats.chi2.ppf(q, df))


def _sd(var: float) -> float:
    return math.sqrt(max(var, 0.0))


def nested_levels(groups: Mapping[str, Mapping[str, Sequence[float]]], metric: str = "",
                  request_cv: float = math.nan, *, boot_var: float | None = None) -> Levels:
    """Levels of log-figures ``groups[host][session] = [per-boot log figure, ...]`` by the
    method of moments (unbalanced nested ANOVA): each level from the spread of its units' means
    inside the unit above, less what the lower levels explain (a negative estimate reads as 0),
    with chi-square intervals. ``boot_var`` replaces the measured boot level in that subtraction
    (a history of one boot per session measures none of its own)."""
    ss_w = df_w = 0.0
    session_means: dict[str, list[tuple[float, int]]] = {}
    for host_name, host_sessions in groups.items():
        for values in host_sessions.values():
            if not values:
                continue
            mean = sum(values) / len(values)
            ss_w += sum((v - mean) ** 2 for v in values)
            df_w += len(values) - 1
            session_means.setdefault(host_name, []).append((mean, len(values)))
    boots = sum(n for means in session_means.values() for _, n in means)
    sessions = sum(len(m) for m in session_means.values())
    if df_w > 0:
        ms_w = ss_w / df_w
        lo, hi = _chi2_interval(ss_w, df_w)
        boot = Level("boot", _sd(ms_w), df_w, SpreadSource(SpreadSource.MEASURED, count=boots, within=sessions), _sd(lo), _sd(hi))
    else:
        ms_w = math.nan
        boot = Level("boot", math.nan, 0.0, SpreadSource(SpreadSource.NONE))
    ss_s = df_s = 0.0
    inv_m: list[float] = []
    host_means: list[tuple[float, int, float]] = []
    for means in session_means.values():
        host_mean = sum(m for m, _ in means) / len(means)
        ss_s += sum((m - host_mean) ** 2 for m, _ in means)
        df_s += len(means) - 1
        inv_m.extend(1.0 / n for _, n in means)
        host_means.append((host_mean, len(means), sum(1.0 / n for _, n in means) / len(means)))
    if boot_var is not None:
        ms_w = boot_var
    within_share = (ms_w if math.isfinite(ms_w) else 0.0) * (sum(inv_m) / len(inv_m) if inv_m else 0.0)
    if df_s > 0:
        ms_s = ss_s / df_s
        lo, hi = _chi2_interval(ss_s, df_s)
        session = Level("session", _sd(ms_s - within_share), df_s, SpreadSource(SpreadSource.MEASURED, "session", count=sessions),
                        _sd(lo - within_share), _sd(hi - within_share), mean_square=ms_s, lower_var=within_share)
    else:
        ms_s = math.nan
        session = Level("session", math.nan, 0.0, SpreadSource(SpreadSource.NONE, "session"))
    if len(host_means) >= 2:
        grand = sum(m for m, _, _ in host_means) / len(host_means)
        ss_h = sum((m - grand) ** 2 for m, _, _ in host_means)
        df_h = len(host_means) - 1.0
        sess_var = max(ms_s - within_share, 0.0) if math.isfinite(ms_s) else 0.0
        lower = sum(sess_var / k + (ms_w if math.isfinite(ms_w) else 0.0) * inv / k
                    for _, k, inv in host_means) / len(host_means)
        lo, hi = _chi2_interval(ss_h, df_h)
        host = Level("host", _sd(ss_h / df_h - lower), df_h, SpreadSource(SpreadSource.MEASURED, "host", count=len(host_means)),
                     _sd(lo - lower), _sd(hi - lower), mean_square=ss_h / df_h, lower_var=lower)
    else:
        host = Level("host", math.nan, 0.0, SpreadSource(SpreadSource.NONE, "host"))
    return Levels(metric, request_cv, boot, session, host, boots, sessions, len(host_means))


@dataclass(frozen=True)
class BootOrigin:
    """Where a boot ran: its session (one pytest run), its host (measure.canary.host_identity)
    and the session's host canary scores. Stored with every recorded boot."""

    session: str
    host: str
    canary: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """JSON-ready (xdist transport, baselines)."""
        return {"session": self.session, "host": self.host, "canary": dict(self.canary)}

    @classmethod
    def from_json(cls, data: object) -> BootOrigin | None:
        """Inverse of :meth:`to_json`; None for None."""
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ValueError(f"boot origin {data!r}: expected an object with session, host and canary")
        return cls(session=str(data.get("session") or ""), host=str(data.get("host") or ""),
                   canary={str(k): float(v) for k, v in (data.get("canary") or {}).items()})


def weights_sq(current: Sequence[BootSummary], reference: Sequence[BootSummary], unit: str) -> float:
    """sum over units u of (share of current boots in u - share of reference boots in u)^2: the
    factor by which a level's variance enters the difference of the two sides' means. 0 when
    the sides share their units alike (two profiles interleaved in one session), 2 for one
    session against one other session, 1 + 1/k against a history spread evenly over k."""
    wc: dict[str, int] = {}
    wr: dict[str, int] = {}
    for side, counts in ((current, wc), (reference, wr)):
        for b in side:
            key = getattr(b, unit)
            counts[key] = counts.get(key, 0) + 1
    return sum((wc.get(u, 0) / len(current) - wr.get(u, 0) / len(reference)) ** 2 for u in {*wc, *wr})


def history_level(reference: Sequence[BootSummary], name: str, declared: float, *, boot_var: float,
                  declared_df: float = DEFAULT_LEVEL_SPREAD_DF) -> Level:
    """The ``session`` or ``host`` level as the reference history shows it: the declared spread,
    a prior worth ``declared_df`` degrees of freedom, pooled with what the history's units
    measure (stats.pooled_variance). Taken as exact, a 2% session effect declared as 1% gave
    17-56% of unchanged sessions a direction (12.5-29% at 10 df: benchmarks/declared_spreads.py).
    ``boot_var``: the boot level's variance, taken out of the spread of the units' means."""
    if name not in ("session", "host"):
        raise ValueError(f"level {name!r}: use 'session' or 'host'")
    groups: dict[str, dict[str, list[float]]] = {}
    for b in reference:
        groups.setdefault(b.host, {}).setdefault(b.session, []).append(math.log(b.median))
    found = nested_levels(groups, boot_var=boot_var)
    measured = found.session if name == "session" else found.host
    units = found.sessions if name == "session" else found.hosts
    prior = math.log1p(declared)
    observed = math.isfinite(measured.sd_log) and measured.df > 0
    sum_sq, df = (measured.sd_log ** 2 * measured.df, measured.df) if observed else (0.0, 0.0)
    var, pooled_df = pooled_variance(prior ** 2, declared_df, sum_sq, df)
    plain = max(prior, measured.sd_log) if observed else prior
    seen = (SpreadSeen(name, measured.mean_square * measured.df, measured.df, prior ** 2 + measured.lower_var,
                       declared, units, lower_var=measured.lower_var)
            if observed and math.isfinite(measured.mean_square) else None)
    if not observed or math.isinf(declared_df):
        return Level(name, prior, pooled_df, SpreadSource(SpreadSource.DECLARED, name, declared=declared),
                     plain_sd_log=plain, seen=seen)
    if var > prior ** 2:
        return Level(name, math.sqrt(var), pooled_df, SpreadSource(SpreadSource.MEASURED, name, count=units),
                     measured.low, measured.high, plain_sd_log=plain, seen=seen)
    return Level(name, prior, pooled_df, SpreadSource(SpreadSource.FLOOR, name, declared=declared,
                                                      measured=math.expm1(measured.sd_log), count=units),
                 plain_sd_log=plain, seen=seen)


def level_terms(current: Sequence[BootSummary], reference: Sequence[BootSummary], *,
                spreads: Spreads) -> list[LevelTerm]:
    """The levels above the boot that ``current`` and ``reference`` do not share, as the
    variance each adds to the difference of their mean log-figures."""
    cur = [b for b in current if b.usable]
    ref = [b for b in reference if b.usable]
    if not cur or not ref:
        return []
    terms = []
    # The boot level taken out of the spread of the units' means: the larger of its floor and
    # what the boots measure, whatever df the boot declaration holds (pooling it here would let
    # a surer boot declaration raise the session level, and widen the comparison).
    sum_sq, df = within_sessions(cur, ref)
    floor = boot_floor(cur, ref, math.log1p(spreads.boot))
    boot_var = max(floor, sum_sq / df) if df > 0 else floor
    for name, declared in spreads.above_boot():
        weight = weights_sq(cur, ref, name)
        if weight <= 1e-12:
            continue
        level = history_level(ref, name, declared, boot_var=boot_var, declared_df=spreads.df_of(name))
        terms.append(LevelTerm(name, level.sd_log ** 2 * weight, level.df,
                               LevelSpread(name, math.expm1(level.sd_log), level.source), weight,
                               level.plain_sd_log ** 2 * weight, seen=level.seen))
    return terms


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
        """What a verdict judged with these modes notes of them (``more``: :class:`HistoryModes`)."""
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
    cluster, current boots by their ``sides`` (default :meth:`Modes.mode_of`); a boot between the
    modes by ``unclear_to``'s centre when given, else by the nearest."""
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
    """How many of the run's clearly placed boots landed in the ``worse`` mode, of how many, the
    history's share of that mode, and the binomial chance of at least that many: a build that
    lands in the slow mode more often is a regression the alignment cannot show. With 3 boots
    and a slow mode of 30%, all 3 slow has a chance of 2.7%: a gate run of 2-3 boots convicts on
    it only where the worse mode is rare (3 of 3 needs under 8% of the history; 4 of 4, 15%)."""
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
    """Which boots of ``history`` the worse mode holds, as a short digest: two metrics of one test
    whose histories split alike saw the same spawn modes (history.joint_placements). A boot is
    known by its recording time, session, host and its place among the boots that share them
    (one recording stamps all its boots alike)."""
    seen: dict[tuple[str, str, str], int] = {}
    keys: dict[int, str] = {}
    for b in history:
        base = (b.label, b.session, b.host)
        keys[id(b)] = f"{b.label}|{b.session}|{b.host}|{seen.get(base, 0)}"
        seen[base] = seen.get(base, 0) + 1
    boots = modes.low if worse == "low" else modes.high
    return hashlib.sha256("\n".join(sorted(keys.get(id(b), "?") for b in boots)).encode()).hexdigest()[:12]


def joint_modes(readings: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """One placement per boot from several metrics' own: the mode every metric that places the
    boot clearly agrees on; :data:`BETWEEN` where none does, or two disagree (a change the size
    of the gap, moving a boot into the other mode in one metric only, makes it unclear for all,
    so it is judged both ways)."""
    joint = []
    for marks in zip(*readings):
        clear = {m for m in marks if m != BETWEEN}
        joint.append(clear.pop() if len(clear) == 1 else BETWEEN)
    return tuple(joint)


@note_kind("spread-beyond")
@dataclass(frozen=True)
class SpreadBeyond(Note):
    """One level whose spread, as ``units`` units on ``df`` degrees of freedom of ``where`` show
    it, is beyond the ``declared`` one at the run's level; ``p``: the chance of a spread this
    wide were the declaration right."""

    level: str
    measured: float
    declared: float
    df: float
    units: int
    where: str
    p: float
    flagged: int = 1  # the level's checks beyond the declaration, this the widest of them
    checked: int = 1  # the level's checks in all


@note_kind("spreads-misdeclared")
@dataclass(frozen=True)
class SpreadsMisdeclared(Note):
    """The levels a run's boots show beyond the ``deployment``'s declaration ("" where the
    spreads came from the command line), each its largest; ``checks`` tested at ``alpha`` in all."""

    beyond: tuple[SpreadBeyond, ...]
    checks: int
    alpha: float
    deployment: str = ""


def beyond_p(seen: SpreadSeen) -> float:
    """The chance of a sum of squares this large were the level's spread as declared."""
    if seen.df <= 0 or seen.allowed_var <= 0:
        return 1.0 if seen.sum_sq <= 0 else 0.0
    return _chi2_sf(seen.sum_sq / seen.allowed_var, seen.df)


@functools.lru_cache(maxsize=4096)
def _chi2_sf(x: float, df: float) -> float:
    return float(scipy_stats.chi2.sf(x, df))


def misdeclared(comparisons: Sequence[tuple[str, Comparison]], *, deployment: str = "",
                alpha: float = RUN_ALPHA) -> SpreadsMisdeclared | None:
    """The levels whose spread the run's ``comparisons`` (each with where it was made) show
    beyond the declared at the run's ``alpha`` over all their checks; None where none do."""
    checks = [(where, seen) for where, c in comparisons for seen in c.spreads_seen if seen.df > 0]
    if not checks:
        return None
    level = alpha / len(checks)
    found: dict[str, SpreadBeyond] = {}
    flagged: dict[str, int] = {}
    for where, seen in checks:
        p = beyond_p(seen)
        if p > level:
            continue
        flagged[seen.level] = flagged.get(seen.level, 0) + 1
        beyond = SpreadBeyond(seen.level, seen.measured, seen.declared, seen.df, seen.units, where, p)
        if seen.level not in found or beyond.measured > found[seen.level].measured:
            found[seen.level] = beyond
    if not found:
        return None
    checked = {name: sum(1 for _, seen in checks if seen.level == name) for name in found}
    ordered = tuple(replace(found[name], flagged=flagged[name], checked=checked[name])
                    for name in LEVELS if name in found)
    return SpreadsMisdeclared(ordered, len(checks), alpha, deployment)


# First-boot screen: another boot when the change looks worse than this share of the tolerance.
_SCREEN_FRACTION = 1.0


def wants_another_boot(c: Comparison, *, screen_fraction: float = _SCREEN_FRACTION) -> bool:
    """Whether another boot of the current side is worth its cost: the comparison looks worse
    than ``screen_fraction`` of the tolerance without a verdict. Only the worse side screens:
    the gate exists to catch regressions, and every extra boot costs a full model load."""
    if c.verdict not in (VerdictKind.INCONCLUSIVE, VerdictKind.CHANGED_SIZE_UNRESOLVED,
                         VerdictKind.NO_DETECTABLE_CHANGE):
        return False
    return c.gain < -screen_fraction * c.tolerance


def _allowed_variance(change: float, tolerance: float, *, confidence: float = 0.95,
                     power: float = DETECTION_POWER, critical: float | None = None) -> float:
    """The largest variance of the log difference at which a true ``change`` clears
    ``tolerance`` at one-sided ``confidence`` with ``power``, or by the gate's rule at
    ``critical`` standard errors where given."""
    z_power = float(scipy_stats.norm.ppf(power))
    size = math.log1p(abs(change))
    if critical is not None:
        return min((size - math.log1p(tolerance)) / z_power, size / (critical + z_power)) ** 2
    z = float(scipy_stats.norm.ppf(confidence)) + z_power
    return ((size - math.log1p(tolerance)) / z) ** 2


def boots_needed(
    change: float, spread: float, *, tolerance: float = 0.0, reference_boots: int | None = None,
    power: float = DETECTION_POWER, confidence: float = 0.95, max_boots: int = 10_000,
    fixed_var: float = 0.0, critical: float | None = None,
) -> int | None:
    """Boots per side that resolve a true ``change`` (fraction, e.g. 0.006) at boot ``spread``:
    N boots each of two profiles booted alike (``reference_boots=None``), else N boots of the
    current side against a baseline of ``reference_boots``. The spread is taken as known.
    ``fixed_var``: the variance no boot of this run shrinks (levels the sides do not share).
    None when no number of boots can do it (the baseline alone, or ``fixed_var``, fills the room).
    """
    for name, value in (("change", change), ("spread", spread)):
        if not is_real(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}={value!r}: use a fraction above 0 (0.006 means 0.6%)")
    if not is_real(tolerance) or not 0 <= tolerance < abs(change):
        raise ValueError(f"tolerance={tolerance!r}: use a fraction >= 0 and below the change {change!r}")
    sd = math.log1p(spread)
    allowed_var = _allowed_variance(change, tolerance, confidence=confidence, power=power, critical=critical) - fixed_var
    if allowed_var <= 0:
        return None
    if reference_boots is None:
        n = math.ceil(2.0 * sd ** 2 / allowed_var)
    else:
        if reference_boots < 1:
            raise ValueError(f"reference_boots={reference_boots!r}: use a count of at least 1")
        room = allowed_var / sd ** 2 - 1.0 / reference_boots
        if room <= 0:
            return None
        n = math.ceil(1.0 / room)
    n = max(n, MIN_BOOTS_DIRECTIONAL)
    return n if n <= max_boots else None


def smallest_change(spread: float, boots: int, *, reference_boots: int | None = None, tolerance: float = 0.0,
                    fixed_var: float = 0.0, confidence: float = 0.95, power: float = DETECTION_POWER,
                    critical: float | None = None) -> float:
    """The smallest true change that ``boots`` boots of the current side resolve with ``power``:
    the inverse of :func:`boots_needed`, its arguments as there."""
    if not is_real(spread) or not math.isfinite(spread) or spread < 0:
        raise ValueError(f"spread={spread!r}: use a fraction >= 0 (0.01 means 1%)")
    if boots < 1 or (reference_boots is not None and reference_boots < 1):
        raise ValueError(f"boots={boots!r}, reference_boots={reference_boots!r}: use counts of at least 1")
    sd2 = math.log1p(spread) ** 2
    var = sd2 * (1.0 / boots + 1.0 / (reference_boots if reference_boots is not None else boots)) + fixed_var
    se = math.sqrt(var)
    z_power = float(scipy_stats.norm.ppf(power))
    if critical is not None:
        return math.expm1(max(math.log1p(tolerance), critical * se) + z_power * se)
    return math.expm1(math.log1p(tolerance) + (float(scipy_stats.norm.ppf(confidence)) + z_power) * se)


def sessions_for(change: float, spread: float, session_var: float, *, tolerance: float = 0.0,
                 confidence: float = 0.95, boots_per_session: int = MIN_BOOTS_DIRECTIONAL,
                 max_sessions: int = 100) -> int | None:
    """Sessions per side (each of ``boots_per_session`` boots) that resolve a true ``change``
    when every session adds its own effect of variance ``session_var``."""
    return _sessions_to_resolve(_allowed_variance(change, tolerance, confidence=confidence), math.log1p(spread) ** 2,
                               [(session_var, None)], boots_per_session=boots_per_session, reference_boots=None,
                               max_sessions=max_sessions)


def _sessions_needed(c: Comparison, goal: float, *, boots_per_session: int = MIN_BOOTS_DIRECTIONAL,
                    max_sessions: int = 100) -> int | None:
    """Sessions of this profile that resolve a true change ``goal`` where the levels above the
    boot stand in the way (each session re-draws their effects, which more boots of one run never
    do); the history is taken to span at least as many. None when ``max_sessions`` cannot."""
    # A term holds spread^2 * weight, its weight 1 (this run's one session) + the history's share.
    levels = [(t.var_log / t.weight, max(t.weight - 1.0, 0.0)) for t in c.levels if t.weight > 0]
    return _sessions_to_resolve(_allowed_variance(goal, c.tolerance, critical=critical_of(c)), c.spread_sd_log ** 2, levels,
                               boots_per_session=boots_per_session, reference_boots=max(c.boots_reference, 1),
                               max_sessions=max_sessions)


def _sessions_to_resolve(allowed: float, boot_var: float, levels: Sequence[tuple[float, float | None]], *,
                        boots_per_session: int, reference_boots: int | None, max_sessions: int) -> int | None:
    """The fewest sessions k of this side whose comparison's variance fits in ``allowed``.
    ``levels``: each level's variance and the history's share of it (None: the history runs as
    many sessions as this side, and ``reference_boots`` None as many boots)."""
    for k in range(1, max_sessions + 1):
        fixed = sum(var * (1.0 / k + (1.0 / k if share is None else min(share, 1.0 / k))) for var, share in levels)
        boots = k * boots_per_session
        reference = boots if reference_boots is None else reference_boots
        if boot_var * (1.0 / boots + 1.0 / reference) + fixed <= allowed:
            return k
    return None


def sessions_of_history(boot_spread: float, session_spread: float, boots: int, *, reference_boots: int,
                        sessions: int, tolerance: float, goal: float, max_sessions: int = 200,
                        boot_df: float = math.inf, session_df: float = math.inf) -> int | None:
    """The fewest sessions of history (grown by one boot a session from the ``sessions`` and
    ``reference_boots`` recorded) at which ``boots`` boots of one new session convict a true
    ``goal`` beyond ``tolerance`` by the gate's rule with DETECTION_POWER; None when this run's
    own session effect leaves no room. ``boot_df``, ``session_df``: how sure the declarations are
    (:func:`design_critical`)."""
    boot_var, session_var = math.log1p(boot_spread) ** 2, math.log1p(session_spread) ** 2
    for k in range(max(sessions, 1), max_sessions + 1):
        reference = reference_boots + k - sessions
        parts = (boot_var * (1.0 / boots + 1.0 / reference), session_var * (1.0 + 1.0 / k))
        critical = design_critical(parts[0], boot_df + (boots - 1) + max(reference - k, 0),
                                   [(parts[1], session_df + k - 1)])
        if sum(parts) <= _allowed_variance(goal, tolerance, critical=critical):
            return k
    return None


def design_critical(boot_var: float, boot_df: float, levels: Sequence[tuple[float, float]],
                    z: float = GATE_CRITICAL) -> float:
    """The gate's critical value ``z`` for a planned comparison of ``(variance, df)`` parts:
    Student's t at their Satterthwaite df, as stats.compare_boots applies it."""
    return critical_at(z, satterthwaite_df([(boot_var, boot_df), *levels]))


def critical_of(c: Comparison) -> float:
    """The normal critical value the comparison was judged at, so the plan promises what the
    same run would convict; stats.GATE_CRITICAL where the comparison states none."""
    if 0.5 < c.confidence < 1.0:
        return float(scipy_stats.norm.ppf(c.confidence))
    return GATE_CRITICAL


def plan(c: Comparison, *, target: float | None = None) -> ResolvePlan | None:
    """What the planner says next to an unresolved or "no detectable change" verdict: in boots,
    or in sessions where the levels above the boot stand in the way. None without a spread."""
    if not math.isfinite(c.spread_sd_log) or c.spread_sd_log <= 0:
        return None
    spread = math.expm1(c.spread_sd_log)
    goal = target if target is not None else c.tolerance * 2.0
    fixed = sum(t.var_log for t in c.levels)
    n = boots_needed(goal, spread, tolerance=c.tolerance, reference_boots=c.boots_reference, fixed_var=fixed,
                     critical=critical_of(c))
    if n is None and fixed > 0:
        return ResolvePlan(goal, spread, c.boots_reference, sessions=_sessions_needed(c, goal),
                    levels=tuple(t.level for t in c.levels), boots_per_session=MIN_BOOTS_DIRECTIONAL)
    return ResolvePlan(goal, spread, c.boots_reference, boots=n, boots_per_session=MIN_BOOTS_DIRECTIONAL)
