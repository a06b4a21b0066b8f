"""Whether a run's boots show spreads beyond the ones its deployment declares.

A declared spread (``boot_spread``, ``session_spread``, ``host_spread``) is the floor of the
variance every verdict uses: the judge pools it with what the boots measure and takes the larger
(stats.pooled_variance), so a spread declared too small costs little where the boots measure a
lot, and a lot where they measure little: at twice the declared spread, an unchanged build states
a sign in far more runs than the budget allows (benchmarks/sign_claims.md). A run cannot fix the
declaration, but it can say when its own boots contradict it.

Each comparison carries what its own boots measured of each level (``Comparison.spreads_seen``:
the boots within their sessions, the history's sessions within their hosts, the hosts). Under
the declaration, a level's sum of squares over the variance the declaration allows it is a
chi-square on its degrees of freedom; :func:`misdeclared` tests every such check of the run at
the run's level (stats.RUN_ALPHA, Bonferroni over the checks, so that a run whose spreads are as
declared says so in at most 1% of runs) and returns, per level, the largest spread it finds
beyond the declaration, with where it was seen. The sentence names the declaration to change.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import LEVELS
from pytest_kimiperf.judge.notes import Note, SpreadSeen, note_kind
from pytest_kimiperf.judge.stats import RUN_ALPHA, Comparison


@note_kind("spread-beyond")
@dataclass(frozen=True)
class SpreadBeyond(Note):
    """One level whose spread, as ``units`` units on ``df`` degrees of freedom of ``where`` show
    it, is beyond the ``declared`` one at the run's level: ``measured`` (a fraction), and the
    chance ``p`` of a spread this wide were the declaration right; the widest of the level's
    ``flagged`` checks beyond it, of ``checked``."""

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
    """The levels whose spread the run's ``comparisons`` (each with where it was made, as the
    line names it) show beyond the declared at the run's ``alpha`` over all their checks; None
    where every check is within it."""
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
