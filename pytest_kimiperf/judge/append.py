"""When a passing run may grow the baseline history itself (``--kimiperf-append-on-pass``).

A scheduled job on the default branch that passes appends its boots (with their session, host
and canary, within the history's window, baselines.HISTORY_BOOTS) to the baseline, so the
history spans many sessions without anyone recording by hand. Two ways a regression could creep
in, and what keeps each out:

- **One that landed** fails the gate, and a failing run appends nothing: the history stays at
  the level before it, and every later run fails too until it is fixed or recorded on purpose
  (``--update-baselines``).
- **Boots of another host or configuration**: a metric "not comparable" to its history (the
  host canary moved, or the profile's environment or server arguments differ) appends nothing,
  whatever its figure: a new host or configuration joins the history only on purpose
  (``--update-baselines``). A boot 86% slower on a host whose canary had moved would otherwise
  pass unjudged and enter the history (seen in CI).
- **A slow drift**, each step inside the tolerance, would pass every night and pull the history
  with it. A run appends only when no judged metric is worse than the history by
  :data:`DRIFT_SHARE` of its tolerance at a bound in its favour (:func:`favourable_bound`, at half
  the tolerance): once a drift has moved that far from the window, the history stops following
  it and the drift goes on to fail the gate.

Measured (benchmarks/gate_power.py --cells append, 100 series of 40 nights): a drift of -0.25%
a night first failed the gate after a median 15 nights (-3.8%) with this rule, 20 nights
(-4.4%, and 10 of 100 series never within 40 nights) without it. Rejected: the point estimate
beyond half the tolerance refused 75% of quiet nights (ten metrics' noise), and the nights it
kept were the fast ones: the history crept up and 2.1% of quiet nights failed (0.3% with
this rule, 0.3% with none).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pytest_kimiperf.judge.notes import Note, note_kind
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import Comparison, VerdictKind, t_quantile
from pytest_kimiperf.judge.verdicts import TestResult

# A run whose figure is worse than the history by this share of the tolerance, even at the
# bound most in its favour (favourable_bound), appends nothing.
DIRECTIONAL_CONFIDENCE = 0.84
LEVEL_CONFIDENCE = 0.975
DRIFT_SHARE = 0.5


class AppendWhy(str, enum.Enum):
    """Why a run appended nothing."""

    FAILED = "failed"
    BRANCH = "branch"
    NOT_COMPARABLE = "not-comparable"
    DRIFT = "drift"


@note_kind("not-appended")
@dataclass(frozen=True)
class NotAppended(Note):
    """A run with append-on-pass that appended nothing, and why: it failed (``failed`` tests),
    it ran on another ``branch`` than ``allowed``, a metric was not comparable to its history
    (``canary_moved``: the host canary moved; else the profile's environment or arguments
    differ), or a metric drifted (``gain``, the change signed so that negative is worse, and
    ``bound``, the gain at the drift guard's favourable bound, against ``tolerance``)."""

    why: AppendWhy
    branch: str | None
    allowed: tuple[str, ...]
    failed: int = 0
    test: str = ""
    profile: str = ""
    metric: str = ""
    gain: float = math.nan
    bound: float = math.nan
    tolerance: float = math.nan
    canary_moved: bool = False

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
    worst: NotAppended | None = None
    for res in last.values():
        for mres in res.metrics.values():
            c = mres.baseline
            if c is not None and c.verdict is VerdictKind.NOT_COMPARABLE:
                line = mres.baseline_line
                return NotAppended(AppendWhy.NOT_COMPARABLE, branch, allowed, test=res.test, profile=res.profile,
                                   metric=mres.metric, gain=c.gain, tolerance=c.tolerance,
                                   canary_moved=line is not None and line.canary is not None)
            if c is None or c.verdict is VerdictKind.INSUFFICIENT_SAMPLES:
                continue
            bound = favourable_bound(c)
            if not math.isfinite(bound) or bound >= -DRIFT_SHARE * c.tolerance:
                continue
            if worst is None or bound / c.tolerance < worst.bound / worst.tolerance:
                worst = NotAppended(AppendWhy.DRIFT, branch, allowed, test=res.test, profile=res.profile,
                                    metric=mres.metric, gain=c.gain, bound=bound, tolerance=c.tolerance)
    return worst


def favourable_bound(c: Comparison) -> float:
    """The change at the drift guard's bound most favourable to this run, signed so that
    negative is worse: the boots' share of the difference at :data:`DIRECTIONAL_CONFIDENCE` (a
    second boot re-draws it), each level's at :data:`LEVEL_CONFIDENCE` (no boot of this run
    re-draws the session or host it shares). The boot spread is the history's
    (``reference_spread_sd_log``), never one this run's own boots widened: two boots 20x apart
    (one CI run's, 39.6 and 776 tok/s against a history of 1093) would otherwise put the bound
    at +3800% and append a boot 96% slower."""
    sd, df = ((c.reference_spread_sd_log, c.reference_spread_df) if math.isfinite(c.reference_spread_sd_log)
              else (c.spread_sd_log, c.spread_df))
    boot_var = sd ** 2 * (1.0 / c.boots_current + 1.0 / c.boots_reference)
    margin = math.sqrt(t_quantile(DIRECTIONAL_CONFIDENCE, df) ** 2 * boot_var
                       + sum(_level_quantile(t.df) ** 2 * t.var_log for t in c.levels))
    d = math.log1p(c.change)
    return math.expm1(d + margin) if c.direction is Direction.HIGHER_IS_BETTER else -math.expm1(d - margin)


def _level_quantile(df: float) -> float:
    return t_quantile(LEVEL_CONFIDENCE, df if math.isfinite(df) else 1e9)
