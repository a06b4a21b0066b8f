"""The engine's clock beside the client's: where a change the client saw lives, and the one
verdict it can change (pure).

The client's clock is the verdict's (what users get). Beside it, each boot's engine figures
(:class:`EngineBoot`) say where a change lives (:func:`place`: the engine's part, the part outside
it, both, or unplaced), which explains and decides nothing; and a profile that can only move the
engine keeps its sign only where the engine confirms it (:func:`on_two_clocks`), which only ever
withdraws a sign. The rules and why: docs/explanation/statistics.md, "Two clocks".
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pytest_kimiperf.judge.notes import Note, note_kind
from pytest_kimiperf.judge.stats import (
    Comparison, EngineBoot, VerdictKind, VerdictLeaning, satterthwaite_df, t_quantile,
)
from pytest_kimiperf.measure.results import RunSummary

# The client's metric -> the pair of like figures its change is placed with: the client's mean
# time per output token against the engine's (decode and TPOT), the client's mean TTFT against the
# engine's queue plus prefill. ITL is per chunk on the client's side (a chunk may carry several
# tokens) while the engine's figure is per token, so ITL is not set beside it.
FIGURE_OF: Mapping[str, str] = {"decode_tok_s": "tpot", "tpot_ms": "tpot", "ttft_ms": "ttft"}
# The interval the engine's change is shown and tested with (the profiles' and the gate's
# equivalence level).
ENGINE_LEVEL = 0.90
# At or below this many Welch degrees of freedom a part's interval is too wide to place a change
# by: 2 boots a side give 1-2 (t at 95% is 6.3 at 1 df, 2.9 at 2, 2.4 at 3), and the engine's
# figure is a ratio of sums over the window, so one stalled request on one boot moves it. 3 boots
# a side give 2-4, 3 against a history of 10 about 3.
UNPLACED_DF = 2.0
# A part that moves less than this share of the client's change does not account for it: client
# TTFT +50 ms with engine +1 ms beyond its interval is still "outside the engine".
MATERIAL_SHARE = 0.25
# The least boot-to-boot spread (log sd) the engine's figure is held to when it confirms a sign:
# its own boots may agree by chance at 2-3 a side. 0.5%: the engine noise the A/A benchmark
# assumes (benchmarks/engine_clock_aa.py); a boot's engine figure on the CPU engine moved 1-3%.
ENGINE_SPREAD_FLOOR = 0.005
# The declared spread's own degrees of freedom (as a deployment's *_spread_df).
ENGINE_SPREAD_FLOOR_DF = 3.0
# Variables that reach only the engine's workers: NCCL's own, and CUDA's connection count, which
# sets how many hardware queues the workers' streams share.
ENGINE_ONLY_PREFIXES: tuple[str, ...] = ("NCCL_",)
ENGINE_ONLY_VARIABLES: frozenset[str] = frozenset({"CUDA_DEVICE_MAX_CONNECTIONS"})


def engine_boot_of(run: RunSummary | None, vllm: str = "") -> EngineBoot | None:
    """A boot's run on the two clocks (its first server view: the measured window), None where
    the server exported no engine figure."""
    if run is None or not run.server_metrics:
        return None
    return EngineBoot.of_run(run.server_metrics[0], client_tpot_ms=run.stat("tpot_ms", "mean"),
                             client_ttft_ms=run.stat("ttft_ms", "mean"), vllm=vllm)


def vllm_named(hard: Mapping[str, str]) -> str:
    """The vLLM version a fingerprint's hard facts name (the server's, else the installed
    package's): the version whose metric names the engine's figures were read under."""
    for key in ("server.vllm", "software.vllm"):
        value = hard.get(key, "")
        if value and value != "unknown":
            return value
    return ""


@dataclass(frozen=True)
class EngineChange:
    """The engine's figure, current boots against reference boots: the change of their geometric
    means and its ``level`` interval (None with fewer than two boots a side)."""

    figure: str
    change: float
    low: float | None
    high: float | None
    boots_current: int
    boots_reference: int
    level: float = ENGINE_LEVEL

    @property
    def beyond_zero(self) -> int:
        """+1 or -1 where the interval lies wholly above or below no change, else 0."""
        if self.low is None or self.high is None:
            return 0
        return 1 if self.low > 0 else -1 if self.high < 0 else 0


def engine_change(figure: str, current: Sequence[float], reference: Sequence[float],
                  level: float = ENGINE_LEVEL, floor_sd_log: float = 0.0) -> EngineChange | None:
    """The engine's ``figure`` on the current boots against the reference boots (one value a
    boot); None where a side has no value. ``floor_sd_log`` is the least boot spread each side is
    held to (a declared floor, pooled with the boots' own at :data:`ENGINE_SPREAD_FLOOR_DF`)."""
    cur = [math.log(v) for v in current if v > 0 and math.isfinite(v)]
    ref = [math.log(v) for v in reference if v > 0 and math.isfinite(v)]
    if not cur or not ref:
        return None
    diff = sum(cur) / len(cur) - sum(ref) / len(ref)
    if len(cur) < 2 or len(ref) < 2:
        return EngineChange(figure, math.expm1(diff), None, None, len(cur), len(ref), level)
    parts = []
    for side in (cur, ref):
        df = len(side) - 1.0
        var = _var(side)
        if floor_sd_log > 0:
            # The declaration as a floor: pooled with the measured sum of squares (stats.pooled_variance's rule).
            var = max(var, (df * var + ENGINE_SPREAD_FLOOR_DF * floor_sd_log ** 2) / (df + ENGINE_SPREAD_FLOOR_DF))
            df += ENGINE_SPREAD_FLOOR_DF
        parts.append((var / len(side), df))
    half = _half_width(parts, level)
    return EngineChange(figure, math.expm1(diff), math.expm1(diff - half), math.expm1(diff + half),
                        len(cur), len(ref), level)


def _var(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _half_width(parts: Sequence[tuple[float, float]], level: float) -> float:
    se = math.sqrt(sum(v for v, _ in parts))
    return 0.0 if se == 0 else t_quantile(0.5 + level / 2, satterthwaite_df(parts)) * se


class ChangeLocation(enum.StrEnum):
    """Where a change the client's clock saw lives."""

    ENGINE = "engine"  # the engine's part moved the client's way; the part outside it did not
    OUTSIDE = "outside"  # the part outside the engine did (API server, network or client); the engine's did not
    BOTH = "both"  # each part moved the client's way, each a material share of it
    UNPLACED = "unplaced"  # the figures cannot place it (UnplacedWhy says why)
    NO_CLAIM = "no-claim"  # the client's comparison states no direction: nothing to place


class UnplacedWhy(enum.StrEnum):
    """Why a change the client claimed is not placed."""

    NONE = ""
    FEW_BOOTS = "few-boots"  # fewer than two boots a side carry both clocks
    FEW_DF = "few-df"  # UNPLACED_DF degrees of freedom or fewer
    MEANS_DISAGREE = "means-disagree"  # the client's means moved the other way from its comparison
    NEITHER = "neither"  # no part moved on its own beyond its interval and by a material share


@dataclass(frozen=True)
class Part:
    """One part of the change in milliseconds, current less reference, with its interval."""

    ms: float
    low: float
    high: float
    df: float

    def beyond_zero(self, sign: int) -> bool:
        """Whether the interval lies wholly beyond zero on the ``sign`` side."""
        return self.low > 0 if sign > 0 else self.high < 0

    def mirrored(self) -> Part:
        """The same part with the sides swapped."""
        return Part(-self.ms, -self.high, -self.low, self.df)

    def to_dict(self) -> dict[str, float | None]:
        """JSON-ready fields (an infinite df, an exact difference, as None)."""
        return {"ms": self.ms, "low": self.low, "high": self.high, "df": self.df if math.isfinite(self.df) else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Part:
        """Inverse of :meth:`to_dict`."""
        df = data.get("df")
        return cls(float(data["ms"]), float(data["low"]), float(data["high"]), math.inf if df is None else float(df))


def _part(current: Sequence[float], reference: Sequence[float], level: float) -> Part:
    parts = [(_var(side) / len(side), len(side) - 1.0) for side in (current, reference)]
    total = sum(v for v, _ in parts)
    # No spread at all on either side: the difference is exact, whatever the boots.
    df = math.inf if total == 0 else satterthwaite_df(parts)
    diff = sum(current) / len(current) - sum(reference) / len(reference)
    half = _half_width(parts, level)
    return Part(diff, diff - half, diff + half, df)


@note_kind("two-clocks")
@dataclass(frozen=True)
class TwoClocks(Note):
    """What the engine's clock says of one comparison: the client's change in milliseconds of
    ``figure`` ("tpot", "ttft"), the engine's part and the part outside it, where the change
    lives, the engine's own relative change, and whether it withdrew the comparison's sign."""

    figure: str
    where: ChangeLocation
    why: UnplacedWhy = UnplacedWhy.NONE
    client_ms: float | None = None
    engine: Part | None = None
    outside: Part | None = None
    boots_current: int = 0
    boots_reference: int = 0
    level: float = ENGINE_LEVEL
    engine_change: float | None = None  # the engine's own figure, relative (time a token, or queue+prefill)
    engine_low: float | None = None
    engine_high: float | None = None
    withdrawn: bool = False
    reference: str = ""  # the profile compared with where withdrawn

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "where": ChangeLocation, "why": UnplacedWhy, "engine": Part.from_dict, "outside": Part.from_dict}


def claimed_ms_sign(comparison: Comparison) -> int:
    """Which way the client's comparison says the time of its figure moved: +1 longer, -1
    shorter, 0 where it claims no direction. Every metric of :data:`FIGURE_OF` is worse when
    slower (a lower decode rate, a longer TPOT or TTFT), so worse is longer."""
    match comparison.claim:
        case VerdictLeaning.WORSE:
            return 1
        case VerdictLeaning.BETTER:
            return -1
        case _:
            return 0


def place(metric: str, comparison: Comparison, current: Sequence[EngineBoot], reference: Sequence[EngineBoot],
          level: float = ENGINE_LEVEL) -> TwoClocks | None:
    """Where ``comparison``'s change of ``metric`` lives, on the boots' two clocks; None where its
    metric has no engine figure or no boot a side carries one."""
    figure = FIGURE_OF.get(metric)
    if figure is None:
        return None
    cur = [p for b in current if (p := b.pair(figure)) is not None]
    ref = [p for b in reference if (p := b.pair(figure)) is not None]
    if not cur or not ref:
        return None
    relative = engine_change(figure, [e for _, e in cur], [e for _, e in ref], level)
    said = TwoClocks(figure, ChangeLocation.NO_CLAIM, boots_current=len(cur), boots_reference=len(ref), level=level,
                     engine_change=relative.change if relative else None,
                     engine_low=relative.low if relative else None, engine_high=relative.high if relative else None)
    sign = claimed_ms_sign(comparison)
    if sign == 0:
        return said
    client_ms = sum(c for c, _ in cur) / len(cur) - sum(c for c, _ in ref) / len(ref)
    if len(cur) < 2 or len(ref) < 2:
        return dataclasses.replace(said, where=ChangeLocation.UNPLACED, why=UnplacedWhy.FEW_BOOTS)
    if client_ms * sign <= 0:
        return dataclasses.replace(said, where=ChangeLocation.UNPLACED, why=UnplacedWhy.MEANS_DISAGREE)
    engine = _part([e for _, e in cur], [e for _, e in ref], level)
    outside = _part([c - e for c, e in cur], [c - e for c, e in ref], level)
    said = dataclasses.replace(said, client_ms=client_ms, engine=engine, outside=outside)
    if min(engine.df, outside.df) <= UNPLACED_DF:
        return dataclasses.replace(said, where=ChangeLocation.UNPLACED, why=UnplacedWhy.FEW_DF)

    def moved(part: Part) -> bool:
        return part.beyond_zero(sign) and part.ms * sign >= MATERIAL_SHARE * client_ms * sign

    in_engine, outside_it = moved(engine), moved(outside)
    where = (ChangeLocation.BOTH if in_engine and outside_it else ChangeLocation.ENGINE if in_engine
             else ChangeLocation.OUTSIDE if outside_it else ChangeLocation.UNPLACED)
    why = UnplacedWhy.NEITHER if where is ChangeLocation.UNPLACED else UnplacedWhy.NONE
    return dataclasses.replace(said, where=where, why=why)


def engine_confirms(metric: str, comparison: Comparison, current: Sequence[EngineBoot], reference: Sequence[EngineBoot]) -> bool:
    """Whether the engine's own figure moved the way ``comparison`` claims beyond its interval
    (floored by :data:`ENGINE_SPREAD_FLOOR`); False where no boot carries the engine's figure."""
    figure = FIGURE_OF.get(metric)
    sign = claimed_ms_sign(comparison)
    if figure is None or sign == 0:
        return True
    values = {side: [p[1] for b in boots if (p := b.pair(figure)) is not None]
              for side, boots in (("cur", current), ("ref", reference))}
    change = engine_change(figure, values["cur"], values["ref"], floor_sd_log=ENGINE_SPREAD_FLOOR)
    return change is not None and change.beyond_zero == sign


def on_two_clocks(metric: str, comparison: Comparison, current: Sequence[EngineBoot], reference: Sequence[EngineBoot], *,
                  engine_only_profile: bool, reference_name: str = "") -> Comparison:
    """``comparison`` with a :class:`TwoClocks` note, and for an ``engine_only_profile`` whose
    engine did not confirm its sign, INCONCLUSIVE: the one place the engine's clock changes a
    verdict."""
    clocks = place(metric, comparison, current, reference)
    if clocks is None:
        return comparison
    if engine_only_profile and claimed_ms_sign(comparison) and not engine_confirms(
            metric, comparison, current, reference):
        clocks = dataclasses.replace(clocks, withdrawn=True, reference=reference_name)
        return dataclasses.replace(comparison.with_notes(clocks), verdict=VerdictKind.INCONCLUSIVE)
    return comparison.with_notes(clocks)


def two_clocks_of(comparison: Comparison | None) -> TwoClocks | None:
    """The engine's clock's note on ``comparison``, None where it has none."""
    if comparison is None:
        return None
    return next((n for n in comparison.notes if isinstance(n, TwoClocks)), None)


def engine_only(profile_env: Mapping[str, str], reference_env: Mapping[str, str],
                profile_args: Sequence[str] = (), reference_args: Sequence[str] = ()) -> bool:
    """Whether two profiles differ only in variables that reach the engine's workers alone."""
    if list(profile_args) != list(reference_args):
        return False
    differing = {k for k in {*profile_env, *reference_env} if profile_env.get(k) != reference_env.get(k)}
    return bool(differing) and all(k.startswith(ENGINE_ONLY_PREFIXES) or k in ENGINE_ONLY_VARIABLES
                                   for k in differing)
