"""The levels a figure varies at: requests, boots within a session, sessions, hosts.

**Levels.** A boot's median varies with the boot (spawn, compile, memory layout: ``stats``), but
boots of one session also share that session's state (the host's day, its neighbours, its thermal
and firmware state) and sessions of one host share the host. A baseline recorded in ONE session
knows nothing of the session level, and every boot of the next run shares that run's session effect,
so a comparison of the two must carry it: its uncertainty includes each level that the two sides do
not share (:func:`level_terms`). Each level is declared per deployment (``boot_spread``,
``session_spread``, ``host_spread``) with how sure it is (``*_spread_df``, degrees of freedom); the
history's units measure it (the method of moments of a nested random-effects model, below), and the
two are pooled at declared + measured df, the declaration a floor (:func:`history_level`).

The same estimator (:func:`nested_levels`) reads the noise corpus (benchmarks/noise_corpus.py), so
the study and the gate agree on what a level is. Whether the host itself changed is
``canary_check.py``; a history whose boots fall into spawn modes is ``modes.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import DEFAULT_LEVEL_SPREAD_DF, Spreads
from pytest_kimiperf.judge.boots import BootSummary
from pytest_kimiperf.judge.notes import LevelSpread, SpreadSeen, SpreadSource
from pytest_kimiperf.judge.stats import LevelTerm, boot_floor, pooled_variance, within_sessions

# Levels: what each level's spread is, declared and measured, and which ones a comparison carries.

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
    # The larger of the declared and the measured SD, not pooled (stats.Spread.plain_sd_log).
    plain_sd_log: float = math.nan
    # The units' mean square before the lower levels' share (``lower_var``) is taken out: what a
    # test of the level against a declaration reads (judge/spread_check.py). NaN: not measured.
    mean_square: float = math.nan
    lower_var: float = math.nan
    # What the units measured against the declaration, where a history level was measured.
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
    method of moments (unbalanced nested ANOVA): the boot level from the pooled variance inside
    sessions; the session level from the spread of session means inside hosts, less what their
    boots alone explain; the host level likewise from the host means. A level needs two units
    inside one unit above it; intervals are chi-square intervals of each mean square, less the
    lower levels' share (a negative estimate reads as 0). ``boot_var`` replaces the measured boot
    level in that subtraction (the gate's boot spread, the declared one or larger: a history of one boot
    per session measures no boot level of its own)."""
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
    measure (stats.pooled_variance: df = declared + measured, the declaration a floor the
    history can raise, never lower). A declaration is not exact: with the session spread taken
    as known, a 2% session effect declared as 1% gave 17-56% of unchanged sessions a direction
    (12.5-29% at 10 df: benchmarks/declared_spreads.py); at its df, the comparison's critical value is Student's t
    (stats.critical_at), so a declaration held loosely widens the interval and the history's
    own sessions pull the spread toward the truth. ``declared_df`` inf keeps the declaration
    exact. ``boot_var`` is the boot level's variance the comparison uses, taken out of the
    spread of the units' means."""
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
    variance each adds to the difference of their mean log-figures (stats.compare_boots)."""
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
