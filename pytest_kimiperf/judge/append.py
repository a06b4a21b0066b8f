"""When a passing run may grow the baseline history itself (``--kimiperf-append-on-pass``).

A scheduled job on the default branch that passes appends its boots (with their session, host
and canary, within the history's window, baselines.HISTORY_BOOTS) to the baseline, so the
history spans many sessions without anyone recording by hand. Three ways a regression could
creep in, and what keeps each out:

- **One that landed** fails the gate, and a failing run appends nothing: the history stays at
  the level before it, and every later run fails too until it is fixed or recorded on purpose
  (``--update-baselines``).
- **Boots of another host or configuration**: a metric "not comparable" to its history (the
  host canary moved, or the profile's environment or server arguments differ) appends nothing,
  whatever its figure: a new host or configuration joins the history only on purpose
  (``--update-baselines``). A boot 86% slower on a host whose canary had moved would otherwise
  pass unjudged and enter the history (seen in CI).
- **A slow drift**, each step inside the tolerance, would pass every night and pull the window
  with it. The baseline file keeps the anchor (the last deliberate recording) and the nights
  appended since, and the gate judges the line through them (judge/drift.py): a drift that adds
  up beyond the tolerance fails, and a failing run appends nothing. That test replaced a guard
  here that refused a run worse than the window by half its tolerance at a bound in its favour
  (three constants; with the anchor test in force it changed no figure of
  ``verdict_soundness.py nightly --no-guard``).
- **A run that looked worse than the tolerance without a verdict** ("inconclusive", "changed,
  size unresolved": it passes with a warning) appends nothing: a change it could not rule out
  is not taken into the history. One CI run's two boots, 39.6 and 776 tok/s against a
  recording of 1093, read inconclusive on their own 20x spread and, appended, would have moved
  the window 96% down on one night.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pytest_kimiperf.judge.notes import Note, note_kind
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.judge.verdicts import TestResult


class AppendWhy(str, enum.Enum):
    """Why a run appended nothing."""

    FAILED = "failed"
    BRANCH = "branch"
    NOT_COMPARABLE = "not-comparable"
    UNRESOLVED = "unresolved"


@note_kind("not-appended")
@dataclass(frozen=True)
class NotAppended(Note):
    """A run with append-on-pass that appended nothing, and why: it failed (``failed`` tests),
    it ran on another ``branch`` than ``allowed``, a metric was not comparable to its history
    (``canary_moved``: the host canary moved; else the profile's environment or arguments
    differ), or a metric looked worse than its tolerance without a verdict (``gain``, the
    change signed so that negative is worse, against ``tolerance``)."""

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
