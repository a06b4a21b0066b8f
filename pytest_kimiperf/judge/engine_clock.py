"""The engine's clock beside the client's: where a change the client saw lives (pure).

The client's clock is the verdict's: it is what users get, and a slower API server is a real
regression of the build. The engine's own figures (measure/server_view.py: its core's stamps, one
figure per boot) explain the client's change without stating a sign of their own:

* the client's comparison claims a direction and the engine's interval lies beyond zero the same
  way: **the engine changed**;
* the client claims a direction and the engine's interval holds zero, or lies the other way:
  **the time went outside the engine** (the API server, the network or the client).

One exception (docs/explanation/statistics.md, "Two clocks"): a profile that differs from its
reference only in what reaches the engine's workers (NCCL's variables, CUDA's connection count)
cannot move the API server or the client. A change the client sees and the engine does not is
then not the profile's, and the comparison is UNRESOLVED instead of stating the client's sign.
That only ever withdraws a sign, so the run's budget for signs holds as it did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pytest_kimiperf.judge.stats import Comparison, VerdictKind, satterthwaite_df, t_quantile

# The client's metric -> the engine's figure that explains it (server_view.EngineFigures' JSON key).
ENGINE_FIGURE_OF: Mapping[str, str] = {
    "decode_tok_s": "engine_decode_tok_s",
    "tpot_ms": "engine_tpot_ms",
    "itl_ms": "engine_tpot_ms",
    "ttft_ms": "engine_ttft_ms",
}
# What the engine's figure is called in a sentence.
ENGINE_WORDS: Mapping[str, str] = {
    "engine_decode_tok_s": "engine decode", "engine_tpot_ms": "engine time per token",
    "engine_ttft_ms": "engine queue+prefill",
}
# The interval the engine's change is shown with (the profiles' and the gate's equivalence level).
ENGINE_LEVEL = 0.90
# Variables that reach only the engine's workers: NCCL's own, and CUDA's connection count, which
# sets how many hardware queues the workers' streams share.
ENGINE_ONLY_PREFIXES: tuple[str, ...] = ("NCCL_",)
ENGINE_ONLY_VARIABLES: frozenset[str] = frozenset({"CUDA_DEVICE_MAX_CONNECTIONS"})
# The verdicts that state a direction (leaning's two, and a change whose size is unresolved).
SIGN_VERDICTS: frozenset[VerdictKind] = frozenset(
    {VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT, VerdictKind.CHANGED_SIZE_UNRESOLVED})


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


class Where(StrEnum):
    """Where a change the client's clock saw lives."""

    ENGINE = "engine"  # the engine's figure moved the same way
    OUTSIDE = "outside"  # the engine's did not: the API server, the network or the client
    NO_CLAIM = "no-claim"  # the client's comparison states no direction: nothing to place
    UNKNOWN = "unknown"  # the engine's figure has no interval (one boot a side)


def engine_change(figure: str, current: Sequence[float], reference: Sequence[float],
                  level: float = ENGINE_LEVEL) -> EngineChange | None:
    """The engine's ``figure`` on the current boots against the reference boots (one value a
    boot); None where a side has no value."""
    cur = [math.log(v) for v in current if v > 0 and math.isfinite(v)]
    ref = [math.log(v) for v in reference if v > 0 and math.isfinite(v)]
    if not cur or not ref:
        return None
    diff = sum(cur) / len(cur) - sum(ref) / len(ref)
    if len(cur) < 2 or len(ref) < 2:
        return EngineChange(figure, math.expm1(diff), None, None, len(cur), len(ref), level)
    parts = [(_var(cur) / len(cur), len(cur) - 1.0), (_var(ref) / len(ref), len(ref) - 1.0)]
    se = math.sqrt(sum(v for v, _ in parts))
    half = t_quantile(0.5 + level / 2, satterthwaite_df(parts)) * se
    return EngineChange(figure, math.expm1(diff), math.expm1(diff - half), math.expm1(diff + half),
                        len(cur), len(ref), level)


def _var(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def where_change_lives(client: Comparison, engine: EngineChange) -> Where:
    """Where the client's change lives, on the engine's evidence (the module's rule)."""
    if client.verdict not in SIGN_VERDICTS:
        return Where.NO_CLAIM
    if engine.low is None:
        return Where.UNKNOWN
    client_sign = 1 if client.change > 0 else -1
    return Where.ENGINE if engine.beyond_zero == client_sign else Where.OUTSIDE


def engine_only(profile_env: Mapping[str, str], reference_env: Mapping[str, str],
                profile_args: Sequence[str] = (), reference_args: Sequence[str] = ()) -> bool:
    """Whether two profiles differ only in variables that reach the engine's workers alone."""
    if list(profile_args) != list(reference_args):
        return False
    differing = {k for k in {*profile_env, *reference_env} if profile_env.get(k) != reference_env.get(k)}
    return bool(differing) and all(k.startswith(ENGINE_ONLY_PREFIXES) or k in ENGINE_ONLY_VARIABLES
                                   for k in differing)
