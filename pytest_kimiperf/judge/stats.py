"""Boots and the statistics behind a verdict: each boot's figure, and is this build's metric
really different from its baseline?

In order: one boot's figure per metric (:class:`BootSummary`, :func:`summarize_metric`), the
session's boot order (:func:`schedule`: interleaved A B B A ..., so a linear drift over the
session falls equally on every profile, Abedi & Brecht, ICPE 2017; or seeded random per round;
never A A B B), what each test measured boot by boot (:class:`BootLedger`), the variance a
comparison uses (:func:`estimate_spread`, :func:`critical_at`), and the comparison itself
(:func:`compare_boots`).

The method and why: docs/explanation/methods.md,
"The statistics: the boot as the unit, the rule, the variance".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableSequence, Sequence
import dataclasses
from dataclasses import dataclass, field, replace
from enum import Enum
import functools
import math
import random
from typing import Any, TypeVar, assert_never

import numpy as np
import numpy.typing as npt
from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import MIN_BOOTS_DIRECTIONAL as MIN_BOOTS_DIRECTIONAL
from pytest_kimiperf.config.metric_specs import Direction, MIN_SAMPLES_PER_BOOT, SampleKind, metric_spec
from pytest_kimiperf.judge.notes import (
    LevelSpread, NeedsBoots, Note, SpreadSeen, SpreadSource, TooFewSamples, notes_from_json,
)
from pytest_kimiperf.numbers import is_real


Samples = Sequence[float] | npt.NDArray[np.floating]

# A tail quantile q needs this many samples beyond it in each boot: n >= 3 / (1 - q), so 30 for
# a p90, 300 for a p99 (ITL pools every gap of a boot, so 20 requests of 128 tokens are 2540).
_TAIL_SAMPLES_BEYOND = 3
_TAIL_BOOTSTRAP = 200
# Asymptotic standard error of a sample median is sqrt(pi/2) ~ 1.2533 times that of the mean
# for normal data; 1.4826 * MAD estimates the standard deviation robustly (outliers do not
# widen it).
_MEDIAN_SE_FACTOR = 1.2533
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class EngineBoot:
    """One boot's two clocks over the same requests: the engine's mean time per output token and
    its queue plus prefill (ms, from its histograms), the client's mean TPOT and TTFT over the
    measured requests (ms), the requests and decode tokens the engine's figures rest on, and the
    vLLM version whose metric names they were read under."""

    engine_tpot_ms: float | None = None
    engine_ttft_ms: float | None = None
    client_tpot_ms: float | None = None
    client_ttft_ms: float | None = None
    requests: float | None = None
    tokens: float | None = None
    vllm: str = ""

    def pair(self, figure: str) -> tuple[float, float] | None:
        """(client, engine) milliseconds of ``figure`` ("tpot" or "ttft"), None where either is missing."""
        client, engine = ((self.client_tpot_ms, self.engine_tpot_ms) if figure == "tpot"
                          else (self.client_ttft_ms, self.engine_ttft_ms))
        if client is None or engine is None or not (math.isfinite(client) and math.isfinite(engine)):
            return None
        return float(client), float(engine)

    @property
    def has_engine(self) -> bool:
        """Whether the engine exported either figure for this boot."""
        return self.engine_tpot_ms is not None or self.engine_ttft_ms is not None

    def to_json(self) -> dict[str, Any]:
        """The fields a baseline boot stores (None where not known)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineBoot:
        """Inverse of :meth:`to_json`; TypeError/ValueError on a field of the wrong type."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = data.get(f.name)
            if f.name == "vllm":
                if raw is not None and not isinstance(raw, str):
                    raise TypeError("vllm must be a string")
                values[f.name] = raw or ""
            elif raw is None:
                values[f.name] = None
            elif isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
                raise ValueError(f"{f.name} must be a number or null")
            else:
                values[f.name] = float(raw)
        return cls(**values)

    @classmethod
    def of_run(cls, view: Mapping[str, Any] | None, *, client_tpot_ms: float | None,
               client_ttft_ms: float | None, vllm: str = "") -> EngineBoot | None:
        """A boot's two clocks from its server view's JSON (measure/server_view.py) and the
        client's means; None where the server exported no engine figure."""
        if not view:
            return None
        boot = cls(_number(view.get("engine_tpot_ms")), _number(view.get("engine_ttft_ms")), client_tpot_ms,
                   client_ttft_ms, _number(view.get("engine_requests")), _number(view.get("engine_tokens")), vllm)
        return boot if boot.has_engine else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class BootSummary:
    """One server boot's figure for one metric, the unit of replication: its median (or tail
    quantile), the standard error of its log from the boot's own samples (NaN below two), how many
    valid samples it rests on, and which boot it was (``ring-ll boot 2``, or a recording time)."""

    median: float
    n: int
    se_log: float
    label: str = ""
    # Samples a boot needs to count (:attr:`needed`): 0 for a median's default, more for a tail,
    # 1 for a boot metric (the boot's own seconds: one exact figure per boot).
    min_n: int = 0
    # Where the boot ran and the commit it was recorded at; "" when not known (boots recorded
    # before they were stored count as one unknown session and host).
    session: str = ""
    host: str = ""
    commit: str = ""

    @property
    def needed(self) -> int:
        """Samples this boot needs to count: ``min_n`` where the metric sets it (a tail's more,
        a boot metric's one), else MIN_SAMPLES_PER_BOOT."""
        return self.min_n or MIN_SAMPLES_PER_BOOT

    @property
    def usable(self) -> bool:
        """Whether this boot has enough valid samples to stand for its server boot."""
        return self.n >= self.needed and math.isfinite(self.median) and self.median > 0

    def to_json(self) -> dict[str, object]:
        """JSON-ready fields (NaN as None)."""
        return {"median": self.median, "n": self.n,
                "se_log": None if not math.isfinite(self.se_log) else self.se_log, "label": self.label,
                "min_n": self.min_n, "session": self.session, "host": self.host, "commit": self.commit}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BootSummary:
        """Inverse of :meth:`to_json`."""
        se = data.get("se_log")
        return cls(median=float(data["median"]), n=int(data["n"]),
                   se_log=math.nan if se is None else float(se), label=str(data.get("label") or ""),
                   min_n=int(data.get("min_n") or 0),
                   session=str(data.get("session") or ""), host=str(data.get("host") or ""),
                   commit=str(data.get("commit") or ""))


def summarize_boot(samples: Samples, label: str = "") -> BootSummary:
    """One boot's median of one metric (non-finite samples dropped)."""
    values = _valid_samples("boot", samples)
    positive = values[values > 0]
    if values.size == 0:
        return BootSummary(median=math.nan, n=0, se_log=math.nan, label=label)
    median = float(np.median(values))
    se = math.nan
    if positive.size >= 2:
        logs = np.log(positive)
        mad = float(np.median(np.abs(logs - np.median(logs))))
        se = _MEDIAN_SE_FACTOR * _MAD_TO_SD * mad / math.sqrt(positive.size)
    return BootSummary(median=median, n=int(values.size), se_log=se, label=label)


def tail_min_samples(quantile: float) -> int:
    """Samples one boot needs before its ``quantile`` means anything: at least
    :data:`_TAIL_SAMPLES_BEYOND` of them beyond it (a p99 of 20 requests is their maximum,
    one slow request's luck; MLPerf LoadGen's early stopping makes the same point)."""
    return math.ceil(_TAIL_SAMPLES_BEYOND / (1.0 - quantile) - 1e-9)


def summarize_boot_quantile(samples: Samples, quantile: float, label: str = "") -> BootSummary:
    """One boot's ``quantile`` (e.g. 0.99) of a metric, with the standard error of its log
    from a seeded bootstrap of the boot's own samples."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile={quantile!r}: use a fraction between 0 and 1 (0.99 for p99)")
    values = _valid_samples("boot", samples)
    min_n = tail_min_samples(quantile)
    if values.size == 0:
        return BootSummary(median=math.nan, n=0, se_log=math.nan, label=label, min_n=min_n)
    value = float(np.quantile(values, quantile))
    se = math.nan
    positive = values[values > 0]
    if positive.size >= 2:
        rng = np.random.default_rng(0)
        draws = rng.choice(np.log(positive), size=(_TAIL_BOOTSTRAP, positive.size), replace=True)
        se = float(np.std(np.quantile(draws, quantile, axis=1), ddof=1))
    return BootSummary(median=value, n=int(values.size), se_log=se, label=label, min_n=min_n)


def summarize_metric(metric: str, samples: Samples, label: str = "") -> BootSummary:
    """One boot's figure of ``metric`` as its spec says: the median, a tail's quantile, or a
    boot metric's one sample."""
    spec = metric_spec(metric)
    if spec.quantile is not None:
        return summarize_boot_quantile(samples, spec.quantile, label)
    summary = summarize_boot(samples, label)
    return replace(summary, min_n=1) if spec.sample is SampleKind.BOOT else summary


def min_samples(metric: str) -> int:
    """The ``min_n`` a stored boot of ``metric`` carries (0: the median's default)."""
    spec = metric_spec(metric)
    if spec.quantile is not None:
        return tail_min_samples(spec.quantile)
    return 1 if spec.sample is SampleKind.BOOT else 0


def _valid_samples(side: str, samples: Samples) -> npt.NDArray[np.float64]:
    try:
        arr = np.asarray(samples, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{side} samples must be numbers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{side} samples must be a flat sequence of numbers, got shape {arr.shape}")
    finite: npt.NDArray[np.float64] = arr[np.isfinite(arr)]
    negative = finite[finite < 0]
    if negative.size:
        raise ValueError(
            f"{side} samples include negative value {float(negative[0])!r}: tok/s, req/s and ms "
            "are never negative, so the measurement is broken"
        )
    return finite


_BOOT_ID_SEPARATOR = "-boot"
T = TypeVar("T")


@dataclass(frozen=True)
class BootSlot:
    """One boot of one profile: the value the server tests are parametrized with."""

    profile: Any  # NcclProfile
    boot: int

    @property
    def name(self) -> str:
        """The profile's name (what reports and baselines are keyed by)."""
        return str(self.profile.name)

    @property
    def id(self) -> str:
        """The parameter id: ``ring-ll`` for the first boot, ``ring-ll-boot2`` for the second."""
        return self.name if self.boot == 1 else f"{self.name}{_BOOT_ID_SEPARATOR}{self.boot}"

    def __repr__(self) -> str:
        return f"BootSlot({self.id})"


def schedule(profiles: Sequence[Any], max_boots: int, *, order: str = "interleaved", seed: int = 0) -> list[BootSlot]:
    """Every slot of the session in the order the boots happen."""
    rng = random.Random(f"kimiperf-boot-order:{seed}")
    slots: list[BootSlot] = []
    names = list(profiles)
    for boot in range(1, max_boots + 1):
        if order == "random":
            round_order = names[:]
            rng.shuffle(round_order)
        else:
            round_order = names if boot % 2 == 1 else names[::-1]
        slots += [BootSlot(p, boot) for p in round_order]
    return slots


def group_by_slot(items: MutableSequence[T], slot_of: Callable[[T], BootSlot | None],
                  order: Sequence[BootSlot]) -> None:
    """Reorder ``items`` in place so each boot slot's items run together, slots in ``order``
    (the schedule's A B B A ...); within a slot, and for every item without one, the order
    stays as it was (pytest boots a session fixture again whenever its parameter changes back,
    and for Kimi each boot is a 36-minute load)."""
    rank = {slot.id: i for i, slot in enumerate(order)}
    placed = [(i, slot) for i, slot in ((i, slot_of(item)) for i, item in enumerate(items)) if slot is not None]
    grouped = [items[i] for i, slot in sorted(placed, key=lambda p: rank.get(p[1].id, 0))]  # stable
    for (i, _), item in zip(placed, grouped):
        items[i] = item


@dataclass
class TestBoots:
    """What one test measured under one profile, boot by boot, and whether it wants another."""

    summaries: dict[str, list[BootSummary]] = field(default_factory=dict)  # metric -> per boot
    boots: list[int] = field(default_factory=list)
    wants_boot: int | None = None  # the next boot this test asked for
    engine: dict[int, EngineBoot] = field(default_factory=dict)  # boot -> its two clocks, where it had them

    def add(self, boot: int, per_metric: dict[str, BootSummary]) -> None:
        """Record one boot's summaries (a boot measured twice keeps the last)."""
        if boot in self.boots:
            index = self.boots.index(boot)
            for metric, summary in per_metric.items():
                self.summaries.setdefault(metric, [])[index:index + 1] = [summary]
            return
        self.boots.append(boot)
        for metric, summary in per_metric.items():
            self.summaries.setdefault(metric, []).append(summary)


class BootLedger:
    """Per (test, profile): the boots measured so far; lives in the process that runs them."""

    def __init__(self) -> None:
        self._tests: dict[tuple[str, str], TestBoots] = {}

    def of(self, test: str, profile: str) -> TestBoots:
        """The (possibly new) record of ``test`` under ``profile``."""
        return self._tests.setdefault((test, profile), TestBoots())

    def needed(self, test: str, slot: BootSlot, planned: int) -> tuple[bool, str]:
        """Whether ``test`` runs in ``slot``, and why not when it does not."""
        if slot.boot <= planned:
            return True, ""
        record = self._tests.get((test, slot.name))
        if record is not None and record.wants_boot is not None and record.wants_boot >= slot.boot:
            return True, ""
        last = max(record.boots) if record is not None and record.boots else None
        why = ("boot {b} of {p} not needed: boot {last} settled this test" if last is not None else
               "boot {b} of {p} not needed: no earlier boot of this test was measured")
        return False, why.format(b=slot.boot, p=slot.name, last=last)


def strip_slot(nodeid: str, slot_id: str) -> str:
    """The node id without the slot's part of the parameter id, other parameters kept.

    ``test_tp.py::test_out[ring-ll-boot2-8]`` -> ``test_tp.py::test_out[8]``: baselines,
    boot records and profile comparisons are keyed by it, so each concurrency keeps its own.
    """
    base, _, params = nodeid.partition("[")
    params = params.removesuffix("]")
    if params in ("", slot_id):
        return base
    if params.startswith(f"{slot_id}-"):
        rest = params[len(slot_id) + 1:]
    elif params.endswith(f"-{slot_id}"):
        rest = params[: -len(slot_id) - 1]
    else:
        rest = params.replace(f"-{slot_id}-", "-", 1)
    return f"{base}[{rest}]"


# The declared boot spread's weight as evidence, in degrees of freedom, for the intervals
# (Student's t): a guess, so "within +/-tol" on one boot a side needs a wide margin. The gate's
# directional rule takes it as known (GATE_CRITICAL is calibrated with it so).
PRIOR_DF = 3.0


@dataclass(frozen=True)
class Spread:
    """The between-boot spread a comparison used: SD of a boot's log-median, its degrees of
    freedom, and where it came from (said next to every verdict)."""

    sd_log: float
    df: float
    source: SpreadSource
    # The larger of the floor and what the boots measure, not pooled: the weight this level's df
    # carries in the Satterthwaite df (:func:`compare_boots`). NaN: ``sd_log``.
    plain_sd_log: float = math.nan

    @property
    def percent(self) -> float:
        """The spread as a percentage of the metric (exp(sd) - 1)."""
        return (math.exp(self.sd_log) - 1.0) * 100.0


def pooled_variance(declared_var: float, declared_df: float, sum_sq: float, df: float) -> tuple[float, float]:
    """A declared variance as a prior worth ``declared_df`` degrees of freedom, pooled with a
    measured sum of squares on ``df``: the variance and its df (methods.md, "The variance"). The
    declaration stays a floor, so declaring more df never widens an interval on the same data;
    ``declared_df`` inf: the declaration is exact."""
    if math.isinf(declared_df):
        return declared_var, math.inf
    pooled = (declared_df * declared_var + sum_sq) / (declared_df + df)
    return max(declared_var, pooled), declared_df + df


def within_sessions(current: Sequence[BootSummary], reference: Sequence[BootSummary]) -> tuple[float, float]:
    """The sum of squares of per-boot log-medians around their own session's mean, on both
    sides, and its degrees of freedom: what the boots measure of the boot level."""
    sum_sq = 0.0
    df = 0.0
    for group in _sessions_of(current, reference):
        if len(group) >= 2:
            logs = [math.log(b.median) for b in group]
            mean = sum(logs) / len(logs)
            sum_sq += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    return sum_sq, df


def boot_floor(current: Sequence[BootSummary], reference: Sequence[BootSummary], prior_sd_log: float) -> float:
    """The declared boot variance with the boots' own mean error of the median added: the
    floor of the boot level."""
    within = [b.se_log ** 2 for b in (*current, *reference) if math.isfinite(b.se_log)]
    return prior_sd_log ** 2 + (sum(within) / len(within) if within else 0.0)


def _boot_seen(current: Sequence[BootSummary], reference: Sequence[BootSummary], declared: float) -> SpreadSeen | None:
    """What the boots measure of the boot level against the ``declared`` boot spread; None where
    no session has two boots."""
    sum_sq, df = within_sessions(current, reference)
    if df <= 0:
        return None
    floor = boot_floor(current, reference, math.log1p(declared))
    units = sum(len(group) for group in _sessions_of(current, reference) if len(group) >= 2)
    return SpreadSeen("boot", sum_sq, df, floor, declared, units, lower_var=floor - math.log1p(declared) ** 2)


def _sessions_of(current: Sequence[BootSummary], reference: Sequence[BootSummary]) -> list[list[BootSummary]]:
    """Each side's boots by session, the current side's first."""
    groups: list[list[BootSummary]] = []
    for side in (current, reference):
        sessions: dict[str, list[BootSummary]] = {}
        for b in side:
            sessions.setdefault(b.session, []).append(b)
        groups.extend(sessions.values())
    return groups


def estimate_spread(
    current: Sequence[BootSummary], reference: Sequence[BootSummary], *, prior_sd_log: float,
    prior_df: float = PRIOR_DF,
) -> Spread:
    """The boot level: the declared spread (a prior worth ``prior_df`` degrees of freedom)
    pooled with the spread of per-boot log-medians *within sessions* (boots of one session share
    its effect). The declaration is the floor (a spread measured on 5 df is below the truth more
    than half the time, and below 0.6 of it one time in eight), and so is the boots' own
    within-boot error of the median (a spread smaller than that is chance)."""
    if not (math.isfinite(prior_sd_log) and prior_sd_log >= 0):
        raise ValueError(f"prior spread {prior_sd_log!r}: use a finite SD of log-medians >= 0 (0.01 means 1%)")
    if math.isnan(prior_df) or prior_df < 1:
        raise ValueError(f"prior_df={prior_df!r}: use degrees of freedom >= 1, or inf for an exact declaration")
    sum_sq, df = within_sessions(current, reference)
    floor = boot_floor(current, reference, prior_sd_log)
    declared = math.expm1(prior_sd_log)
    var, pooled_df = pooled_variance(floor, prior_df, sum_sq, df)
    plain = math.sqrt(max(floor, sum_sq / df)) if df > 0 else math.sqrt(floor)
    if df == 0:
        return Spread(sd_log=math.sqrt(var), df=pooled_df, source=SpreadSource(SpreadSource.DECLARED, declared=declared),
                      plain_sd_log=plain)
    if var > floor:
        return Spread(sd_log=math.sqrt(var), df=pooled_df,
                      source=SpreadSource(SpreadSource.MEASURED, sides=(len(current), len(reference))),
                      plain_sd_log=plain)
    return Spread(sd_log=math.sqrt(var), df=pooled_df, source=SpreadSource(
        SpreadSource.FLOOR, declared=declared, measured=math.expm1(math.sqrt(sum_sq / df)), df=df,
        sides=(len(current), len(reference))), plain_sd_log=plain)


def critical_at(z: float, df: float) -> float:
    """The Student-t critical value at ``df`` with the one-sided tail of the normal critical
    value ``z``: a rule stated for a known variance held at its level when the variance is
    estimated. ``df`` inf gives ``z`` back."""
    if math.isinf(df):
        return z
    return _t_isf(_norm_sf(z), df)


@functools.lru_cache(maxsize=4096)
def _norm_sf(z: float) -> float:
    return float(scipy_stats.norm.sf(z))


@functools.lru_cache(maxsize=4096)
def _t_isf(tail: float, df: float) -> float:
    return float(scipy_stats.t.isf(tail, df))


def satterthwaite_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates ``(var, df)``."""
    total = sum(v for v, _ in parts)
    denom = sum(v * v / d for v, d in parts if v > 0 and d > 0 and math.isfinite(d))
    if total <= 0:
        return min((d for _, d in parts), default=math.inf)
    if denom <= 0:
        # Every part that carries variance is exact; a part of no variance adds no uncertainty
        # (a declared spread of 0 at a few df is still 0).
        return math.inf
    return total * total / denom


@functools.lru_cache(maxsize=4096)
def t_quantile(level: float, df: float) -> float:
    """Student's t quantile (cached: the simulation asks for the same few thousands of times)."""
    return float(scipy_stats.t.ppf(level, df))


EQUIVALENCE_CONFIDENCE = 0.90
# Power at which the minimum detectable change is quoted ("detects changes of X% or more").
DETECTION_POWER = 0.90
# A sign (REGRESSION, IMPROVEMENT, or a change with its size unresolved): the change this many
# standard errors from none, where the run's size is not given (a run of a known size uses
# family_critical). Chosen for the procedure as a whole (benchmarks/gate_power.py --cells
# calibrate): boots on demand, every gated metric of a session, levels and modes.
GATE_CRITICAL = 3.25
# The run's budget for signs: the chance that a run whose build changed nothing says which way any
# of its metrics moved (a REGRESSION, an IMPROVEMENT, or a change with its size unresolved, either
# way), all its comparisons together.
RUN_ALPHA = 0.01


def family_critical(m: int, alpha: float = RUN_ALPHA) -> float:
    """The critical value (standard errors) each of ``m`` comparisons needs before it states a
    sign, either way, so that a run of them states one on an unchanged build with at most
    ``alpha``: Bonferroni over the comparisons and their two sides."""
    if m < 1:
        raise ValueError(f"family of {m!r} comparisons: a run makes at least one")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r}: use a probability between 0 and 1")
    return float(scipy_stats.norm.isf(alpha / (2.0 * m)))


class VerdictKind(str, Enum):
    """The gate's answer for one metric of one test under one NCCL profile."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    WITHIN_TOLERANCE = "within tolerance"
    NO_DETECTABLE_CHANGE = "no detectable change"
    CHANGED_SIZE_UNRESOLVED = "changed, size unresolved"
    INCONCLUSIVE = "inconclusive"
    INSUFFICIENT_SAMPLES = "insufficient samples"
    NOT_COMPARABLE = "not comparable"
    NOT_JUDGED = "not judged"


class VerdictLeaning(int, Enum):
    """Where a verdict stands on the one scale verdicts are ordered by: worse, neither, better
    (the order every invariant of docs/explanation/statistics.md is stated on)."""

    WORSE = -1
    NEITHER = 0
    BETTER = 1

    @property
    def mirrored(self) -> VerdictLeaning:
        """The leaning with the sides swapped."""
        return VerdictLeaning(-self.value)


def leaning(verdict: VerdictKind) -> VerdictLeaning:
    """The order of verdicts, defined once: REGRESSION < every verdict that claims no direction
    < IMPROVEMENT."""
    match verdict:
        case VerdictKind.REGRESSION:
            return VerdictLeaning.WORSE
        case VerdictKind.IMPROVEMENT:
            return VerdictLeaning.BETTER
        case (VerdictKind.WITHIN_TOLERANCE | VerdictKind.NO_DETECTABLE_CHANGE | VerdictKind.CHANGED_SIZE_UNRESOLVED
              | VerdictKind.INCONCLUSIVE | VerdictKind.INSUFFICIENT_SAMPLES | VerdictKind.NOT_COMPARABLE
              | VerdictKind.NOT_JUDGED):
            return VerdictLeaning.NEITHER
        case _:
            assert_never(verdict)


@dataclass(frozen=True)
class LevelTerm:
    """A level the two sides of a comparison do not share (sessions, hosts: judge/noise.py):
    the variance it adds to the difference of their mean log-figures, its degrees of freedom,
    and the spread it came from (said as "session spread 0.8% (declared 0.8%)")."""

    name: str
    var_log: float
    df: float
    level: LevelSpread
    # var_log is the level's variance times this weight: sum over units of the difference of
    # the two sides' shares in it, squared (2 for one session against one other).
    weight: float = 1.0
    # The larger of the declared and the measured variance (not pooled), times ``weight``: the
    # weight this level's df carries in the Satterthwaite df. NaN: ``var_log``.
    plain_var_log: float = math.nan
    # What the reference's units measured of this level against its declaration (None: nothing);
    # the comparison carries it on (Comparison.spreads_seen).
    seen: SpreadSeen | None = None


@dataclass(frozen=True)
class Comparison:
    """The current boots against the reference boots for one metric, and the verdict.

    ``change``: -0.004 means 0.4% lower, whatever the metric's direction. ``bound_low`` and
    ``bound_high``: the change the critical value's standard errors either way (one-sided at
    ``confidence``), which every sign needs beyond zero; ``ci_low``/``ci_high``: the
    :data:`EQUIVALENCE_CONFIDENCE` interval that decides "within". ``mdc``: the smallest change
    this design reports as a regression with :data:`DETECTION_POWER`.
    """

    metric: str
    unit: str
    direction: Direction
    tolerance: float
    boots_current: int
    boots_reference: int
    n_current: int
    n_reference: int
    median_current: float
    median_reference: float
    change: float
    bound_low: float
    bound_high: float
    ci_low: float
    ci_high: float
    spread_sd_log: float
    spread_df: float
    spread_source: SpreadSource | None
    se_log: float
    mdc: float
    verdict: VerdictKind
    confidence: float = 0.9994229749576092  # of the bounds: norm.cdf(GATE_CRITICAL), tested
    equivalence_confidence: float = EQUIVALENCE_CONFIDENCE
    notes: tuple[Note, ...] = ()  # what else the verdict rests on (judge/notes.py)
    sessions_current: int = 1
    sessions_reference: int = 1
    levels: tuple[LevelTerm, ...] = ()
    # The boot spread without this run's boots (the reference's, floored by the declared one)
    # and its degrees of freedom, reported beside the pooled one. NaN where not computed.
    reference_spread_sd_log: float = math.nan
    reference_spread_df: float = math.nan
    # What the comparison's own boots measured of each level against its declaration, for the
    # run's line on misdeclared spreads (judge/noise.py).
    spreads_seen: tuple[SpreadSeen, ...] = ()

    @property
    def gain(self) -> float:
        """The change signed so that positive is better, whatever the metric's direction."""
        return self.change if self.direction is Direction.HIGHER_IS_BETTER else -self.change

    @property
    def claim(self) -> VerdictLeaning:
        """Which way this comparison says the metric moved: a direction's leaning, the side of
        its estimate for a change with its size unresolved, NEITHER for every verdict that states
        no sign. Every sign comes from the run's budget (:data:`RUN_ALPHA`), as a direction does."""
        if self.verdict is VerdictKind.CHANGED_SIZE_UNRESOLVED:
            return VerdictLeaning.BETTER if self.gain > 0 else VerdictLeaning.WORSE
        return leaning(self.verdict)

    @property
    def failed(self) -> bool:
        """True when the verdict should fail the perf test."""
        return self.verdict is VerdictKind.REGRESSION

    @property
    def unresolved_beyond_tolerance(self) -> bool:
        """The point estimate is beyond the tolerance without a directional verdict: what
        warns (InconclusiveWarning) and what ``--kimiperf-strict`` fails, whether or not the
        interval excludes zero."""
        return (self.verdict in (VerdictKind.INCONCLUSIVE, VerdictKind.CHANGED_SIZE_UNRESOLVED)
                and abs(math.log1p(self.change)) > band_log(self.tolerance))

    @property
    def label(self) -> str:
        """The metric and unit a line about this comparison opens with ("decode tok/s")."""
        return " ".join(part for part in (self.metric, self.unit) if part)

    def with_notes(self, *more: Note) -> Comparison:
        """This comparison with ``more`` notes after its own."""
        return dataclasses.replace(self, notes=(*self.notes, *more))

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (enums as their values, NaN as None) for reports and xdist transport."""
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, Enum):
                value = value.value
            elif name == "levels":
                value = [{"name": t.name, "var_log": t.var_log, "df": t.df if math.isfinite(t.df) else None,
                          "weight": t.weight, "level": t.level.to_dict(),
                          "plain_var_log": t.plain_var_log if math.isfinite(t.plain_var_log) else None} for t in value]
            elif name == "spread_source":
                value = value.to_json() if value is not None else None
            elif name == "notes":
                value = [n.to_json() for n in value]
            elif name == "spreads_seen":
                value = [seen.to_dict() for seen in value]
            elif isinstance(value, float) and not math.isfinite(value):
                value = None
            out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        """Inverse of :meth:`to_dict` (None back to NaN)."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            raw = data[f.name]
            if f.name == "direction":
                values[f.name] = Direction(raw)
            elif f.name == "verdict":
                values[f.name] = VerdictKind(raw)
            elif f.name == "levels":
                values[f.name] = tuple(LevelTerm(str(t["name"]), float(t["var_log"]),
                                                 math.inf if t["df"] is None else float(t["df"]),
                                                 LevelSpread.from_dict(t["level"]), float(t["weight"]),
                                                 math.nan if t.get("plain_var_log") is None else float(t["plain_var_log"]))
                                       for t in raw)
            elif f.name == "spread_source":
                values[f.name] = SpreadSource.from_fields(raw) if raw else None
            elif f.name == "notes":
                values[f.name] = tuple(notes_from_json(raw))
            elif f.name == "spreads_seen":
                values[f.name] = tuple(SpreadSeen.from_dict(seen) for seen in raw or ())
            elif f.type in ("float",) and raw is None:
                values[f.name] = math.nan
            else:
                values[f.name] = raw
        return cls(**values)


def compare_boots(
    current: Sequence[BootSummary],
    reference: Sequence[BootSummary],
    *,
    direction: Direction,
    tolerance: float,
    prior_spread: float,
    metric: str = "",
    unit: str = "",
    comparable: bool = True,
    min_boots_directional: int = MIN_BOOTS_DIRECTIONAL,
    levels: Sequence[LevelTerm] = (),
    critical: float | None = None,
    prior_spread_df: float = PRIOR_DF,
) -> Comparison:
    """Decide whether the ``current`` boots regressed, improved or held against ``reference``
    (methods.md, "The statistics").

    ``prior_spread``: the declared boot spread as a fraction, held at ``prior_spread_df``.
    Boots without enough valid samples are left out. ``comparable=False`` computes everything
    but says NOT_COMPARABLE, so it never fails a test. ``levels``: the levels above the boot the
    sides do not share (noise.level_terms). ``critical`` (:data:`GATE_CRITICAL` where None) is
    applied at the difference's Satterthwaite df (:func:`critical_at`).
    """
    direction = Direction(direction)
    _check_unit_interval("tolerance", tolerance)
    if not is_real(prior_spread) or not 0.0 <= prior_spread < 1.0:
        raise ValueError(f"prior_spread={prior_spread!r}: use a fraction >= 0 and below 1 (0.01 means 1%)")
    cur = [b for b in current if b.usable]
    ref = [b for b in reference if b.usable]
    nan = math.nan
    common: dict[str, Any] = dict(metric=metric, unit=unit, direction=direction, tolerance=float(tolerance),
                  boots_current=len(cur), boots_reference=len(ref),
                  n_current=sum(b.n for b in cur), n_reference=sum(b.n for b in ref),
                  sessions_current=len({b.session for b in cur}), sessions_reference=len({b.session for b in ref}),
                  levels=tuple(levels))
    if not cur or not ref:
        return Comparison(
            **common, median_current=_geomean(cur), median_reference=_geomean(ref), change=nan,
            bound_low=nan, bound_high=nan, ci_low=nan, ci_high=nan, spread_sd_log=nan, spread_df=nan,
            spread_source=None, se_log=nan, mdc=nan, verdict=VerdictKind.INSUFFICIENT_SAMPLES,
            notes=_insufficient_note(current, reference))
    spread = estimate_spread(cur, ref, prior_sd_log=math.log1p(prior_spread), prior_df=prior_spread_df)
    seen = _boot_seen(cur, ref, prior_spread)
    reference_spread = estimate_spread((), ref, prior_sd_log=math.log1p(prior_spread), prior_df=prior_spread_df)
    mean_cur = sum(math.log(b.median) for b in cur) / len(cur)
    mean_ref = sum(math.log(b.median) for b in ref) / len(ref)
    d = mean_cur - mean_ref
    boot_var = spread.sd_log ** 2 * (1.0 / len(cur) + 1.0 / len(ref))
    fixed_var = sum(term.var_log for term in levels)
    se = math.sqrt(boot_var + fixed_var)
    # Satterthwaite's df, each level weighed by its variance before pooling (the larger of the
    # declared and the measured): weights that do not move with how sure a declaration is keep
    # "declaring more df never widens the interval" true (tests/unit/test_declared_spreads.py);
    # weighed by the pooled variances, a surer boot declaration shrank the boot's share and
    # left a session level of 2 df to set the df, 1.5x wider bounds.
    plain_boot_var = (spread.plain_sd_log if math.isfinite(spread.plain_sd_log) else spread.sd_log) ** 2 * (
        1.0 / len(cur) + 1.0 / len(ref))
    df = round(satterthwaite_df([(plain_boot_var, spread.df),
                                 *((t.plain_var_log if math.isfinite(t.plain_var_log) else t.var_log, t.df)
                                   for t in levels)]), 2)
    t_eq = t_quantile(1.0 - (1.0 - EQUIVALENCE_CONFIDENCE) / 2.0, df)
    z_crit = GATE_CRITICAL if critical is None else critical
    crit = critical_at(z_crit, df)
    bound_low, bound_high = math.expm1(d - crit * se), math.expm1(d + crit * se)
    ci_low, ci_high = math.expm1(d - t_eq * se), math.expm1(d + t_eq * se)
    change = math.expm1(d)
    # The tolerance is a band symmetric on the log ratio (band_log): x read higher-is-better and
    # 1/x read lower-is-better give one verdict.
    band = band_log(tolerance)
    gain_log = d if direction is Direction.HIGHER_IS_BETTER else -d
    worst, best = ((bound_high, bound_low) if direction is Direction.HIGHER_IS_BETTER
                   else (-bound_low, -bound_high))
    k = max(len(cur), min_boots_directional)
    se_k = math.sqrt(spread.sd_log ** 2 * (1.0 / k + 1.0 / len(ref)) + fixed_var)
    power_z = _z(DETECTION_POWER) if math.isinf(df) else t_quantile(DETECTION_POWER, df)
    mdc = -math.expm1(-(max(band, crit * se_k) + power_z * se_k))
    enough = len(cur) >= min_boots_directional
    # A sign, with its size or without, only from the bounds a direction needs: the run's budget
    # (the 90% interval excluding zero said "changed" in a third to half of unchanged runs).
    if not comparable:
        verdict = VerdictKind.NOT_COMPARABLE
    elif enough and worst < 0.0 and gain_log < -band:
        verdict = VerdictKind.REGRESSION
    elif enough and best > 0.0 and gain_log > band:
        verdict = VerdictKind.IMPROVEMENT
    elif -band <= d - t_eq * se and d + t_eq * se <= band:
        verdict = VerdictKind.WITHIN_TOLERANCE
    elif bound_low > 0.0 or bound_high < 0.0:
        verdict = VerdictKind.CHANGED_SIZE_UNRESOLVED
    elif abs(gain_log) > band:
        verdict = VerdictKind.INCONCLUSIVE
    else:
        verdict = VerdictKind.NO_DETECTABLE_CHANGE
    notes: tuple[Note, ...] = ()
    if not enough and ((worst < 0.0 and gain_log < -band) or (best > 0.0 and gain_log > band)):
        notes = (NeedsBoots(min_boots_directional),)
    return Comparison(
        **common, median_current=_geomean(cur), median_reference=_geomean(ref), change=change,
        bound_low=bound_low, bound_high=bound_high, ci_low=ci_low, ci_high=ci_high,
        spread_sd_log=spread.sd_log, spread_df=spread.df, spread_source=spread.source, se_log=se,
        mdc=mdc, verdict=verdict, notes=notes, confidence=float(scipy_stats.norm.cdf(z_crit)),
        reference_spread_sd_log=reference_spread.sd_log, reference_spread_df=reference_spread.df,
        spreads_seen=(*((seen,) if seen is not None else ()), *(t.seen for t in levels if t.seen is not None)))


def _insufficient_note(current: Sequence[BootSummary], reference: Sequence[BootSummary]) -> tuple[Note, ...]:
    need = max(b.needed for b in (*current, *reference)) if (*current, *reference) else MIN_SAMPLES_PER_BOOT
    have = max([b.n for b in current] + [0])
    if need > MIN_SAMPLES_PER_BOOT:
        return (TooFewSamples(need, have, tail=True),)
    if current and have < need:
        # Failed requests are NaN, never samples: the test's warnings count them by reason.
        return (TooFewSamples(need, have, tail=False),)
    return ()


@functools.lru_cache(maxsize=16)
def _z(level: float) -> float:
    return float(scipy_stats.norm.ppf(level))


def _check_unit_interval(name: str, value: float) -> None:
    if not is_real(value) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value!r}: use a fraction between 0 and 1 (0.03 means 3%)")


def band_log(tolerance: float) -> float:
    """The tolerance as a band symmetric on the log ratio: 25% is [log 0.75, -log 0.75], so a
    figure 25% lower and one 1/0.75 higher are both at its edge, whichever way is better."""
    return -math.log1p(-tolerance)


def fmt_tolerance(fraction: float) -> str:
    """A tolerance (or a target change) as written in verdicts: ``3%``, ``0.5%``."""
    return f"{fraction * 100:g}%"


def _geomean(boots: Sequence[BootSummary]) -> float:
    if not boots:
        return math.nan
    return math.exp(sum(math.log(b.median) for b in boots) / len(boots))
