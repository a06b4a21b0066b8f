"""The run's family of comparisons: one false-alarm budget for all the gated metrics of a run.

A run judges every gated metric of every test under every profile against its baseline: 24
comparisons for the shipped suite with two profiles, more in a user's suite. A critical value
fixed per comparison spends its budget once per comparison, so the run's false-alarm rate grows
with the suite. Here the budget is the run's, :data:`RUN_ALPHA`, whatever the family's size:

* :func:`family_critical`: the critical value a comparison needs when the run has ``m``
  comparisons and each is decided as it comes (Bonferroni, Holm's first step): what the gate
  applies per test when it knows the run's size (``gate.Rules.family``);
* :func:`holm`: Holm's step-down procedure over the run's p-values, uniformly more powerful
  and of the same family-wise level, for a decision taken once every comparison is in
  (:func:`decide_family`: each REGRESSION or IMPROVEMENT that Holm does not keep says what is
  left of it, "changed, size unresolved" or "inconclusive").

Holm (1979), "A simple sequentially rejective multiple test procedure", Scand. J. Statist. 6.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from scipy import stats as scipy_stats

from pytest_kimiperf.judge.stats import Comparison, Leaning, VerdictKind, leaning

# The run's budget: the chance that a run whose build changed nothing fails on any gated metric
# (one-sided: a false REGRESSION; the same for a false IMPROVEMENT).
RUN_ALPHA = 0.01


def family_critical(m: int, alpha: float = RUN_ALPHA) -> float:
    """The one-sided critical value (standard errors) of each of ``m`` comparisons decided one
    at a time, so that a run of them convicts an unchanged build with at most ``alpha``."""
    if m < 1:
        raise ValueError(f"family of {m!r} comparisons: a run makes at least one")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha!r}: use a probability between 0 and 1")
    return float(scipy_stats.norm.isf(alpha / m))


def holm(p_values: Sequence[float], alpha: float = RUN_ALPHA) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise level ``alpha``: the
    smallest p-value against alpha/m, the next against alpha/(m-1), ..., stopping at the first
    kept. NaN p-values are never rejected (and count in m)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    rejected = [False] * m
    for rank, i in enumerate(order):
        p = p_values[i]
        if math.isnan(p) or p > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def direction_p(c: Comparison) -> float:
    """The one-sided p-value of a comparison's direction: no change against the change it
    reads (NaN where it compared nothing)."""
    if not (math.isfinite(c.change) and math.isfinite(c.se_log)) or c.se_log <= 0:
        return math.nan
    return float(scipy_stats.norm.sf(abs(math.log1p(c.change)) / c.se_log))


def decide_family(comparisons: Sequence[Comparison], alpha: float = RUN_ALPHA) -> list[Comparison]:
    """The run's comparisons with their directions decided together: a REGRESSION or
    IMPROVEMENT stays only where Holm rejects "no change" for it at the run's ``alpha``; one it
    does not keep becomes "changed, size unresolved" where its interval excludes zero, else
    "inconclusive". The family is every comparison that compared something."""
    nothing = (VerdictKind.INSUFFICIENT_SAMPLES, VerdictKind.NOT_COMPARABLE, VerdictKind.NOT_JUDGED)
    judged = [i for i, c in enumerate(comparisons) if c.verdict not in nothing]
    keep = holm([direction_p(comparisons[i]) for i in judged], alpha)
    out = list(comparisons)
    for i, kept in zip(judged, keep):
        c = comparisons[i]
        if leaning(c.verdict) is Leaning.NEITHER or kept:
            continue
        unresolved = c.ci_low > 0.0 or c.ci_high < 0.0
        out[i] = dataclasses.replace(
            c, verdict=VerdictKind.CHANGED_SIZE_UNRESOLVED if unresolved else VerdictKind.INCONCLUSIVE)
    return out


def family_size(entries: Iterable[tuple[str, str, str]], collected: Iterable[tuple[str, str]]) -> int | None:
    """How many baseline comparisons a run makes: the stored ``(test, profile, metric)`` entries
    whose test and profile the run collected (a metric without an entry is never compared, so it
    spends nothing). None where it makes none."""
    wanted = set(collected)
    m = sum(1 for test, profile, _metric in entries if (test, profile) in wanted)
    return m or None
