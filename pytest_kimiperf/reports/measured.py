"""What each boot measured of what its test sent, figure by figure (measure/coverage.py's counts).

A figure that could not be taken is a fact with a reason and a count, shown where the figure is:
one line per test and figure in the summary (every boot's count), and a remark on an answer
whenever a side it compares lost any.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pytest_kimiperf.config.metric_specs import SampleKind, metric_spec
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.coverage import Coverage, HeldBy
from pytest_kimiperf.measure.results import held_words, withheld_words
from pytest_kimiperf.reports.model import SessionReport, short_test

# A tail of the inter-token gaps counts gaps, not requests.
GAPS = "inter-token gaps"


def figure_of(metric: str) -> str | None:
    """The per-request figure whose count a checked metric rests on (GAPS for the ITL tail);
    None for a metric of rounds or boots."""
    spec = metric_spec(metric)
    if spec.sample is SampleKind.REQUEST:
        return metric
    if spec.sample is SampleKind.TAIL and spec.base is not None:
        return GAPS if spec.base == "itl_ms" else spec.base
    return None


# A test of rounds (throughputs) checks no per-request figure: its line counts its requests by the
# one every request that completed gives (E2EL rests on the last stamp, which always holds).
COMPLETED = "requests"


def _figures(results: Sequence[TestResult]) -> list[str]:
    found = list(dict.fromkeys(f for res in results for m in res.metrics if (f := figure_of(m)) is not None))
    return found or [COMPLETED]


def _count(account: Coverage, figure: str) -> tuple[int, int, Counter[str]]:
    """(measured, sent, withheld by reason) of one figure in one boot's window."""
    if figure == GAPS:
        shared = account.gaps_in_shared_reads
        return account.gaps_measured, account.gaps_measured + shared, Counter({"gap-in-shared-read": shared} if shared else {})
    count = account.of("e2el_ms" if figure == COMPLETED else figure)
    return count.measured, count.sent, Counter(count.withheld)


class _Holders:
    """Who held the streams of the boots a line counts, each with its worst loop latency."""

    def __init__(self) -> None:
        self.worst_loop_ms: dict[HeldBy, float | None] = {}

    def add(self, account: Coverage) -> None:
        if account.held_by is None:
            return
        known = [x for x in (self.worst_loop_ms.get(account.held_by), account.loop_max_ms) if x is not None]
        self.worst_loop_ms[account.held_by] = max(known) if known else None

    def words(self) -> str:
        return "; ".join(held_words(who, loop) for who, loop in sorted(self.worst_loop_ms.items()))


def _why(withheld: Counter[str], holders: _Holders) -> str:
    reasons = ", ".join(f"{n} {withheld_words(reason)}" for reason, n in withheld.most_common())
    by_reads = any(r in withheld for r in ("first-read-shared", "burst", "gap-in-shared-read"))
    who = holders.words() if by_reads else ""
    return reasons + (f"; {who}" if who else "")


def measured_lines(report: SessionReport, *, only_lost: bool = False) -> list[str]:
    """One line per test and figure it checks: every boot's measured of sent, by profile, and why
    the rest were not measured (``only_lost``: only the lines where some were not)."""
    by_test: dict[str, list[TestResult]] = {}
    for res in report.results:
        if res.run is not None and res.run.measured is not None:
            by_test.setdefault(res.test, []).append(res)
    lines = []
    for test, results in by_test.items():
        for figure in _figures(results):
            profiles: dict[str, list[str]] = {}
            lost: Counter[str] = Counter()
            holders = _Holders()
            for res in sorted(results, key=lambda r: r.boot):
                assert res.run is not None and res.run.measured is not None
                measured, sent, withheld = _count(res.run.measured, figure)
                if not sent:
                    continue  # a boot that sent nothing (its run failed before its window) counts nothing
                profiles.setdefault(res.profile, []).append(f"{measured}/{sent}")
                lost += withheld
                holders.add(res.run.measured)
            name = GAPS if figure == GAPS else "requests completed" if figure == COMPLETED else metric_spec(figure).label
            counts = "; ".join(f"{profile} {', '.join(boots)}" for profile, boots in profiles.items())
            total = sum(lost.values())
            if (only_lost and not total) or not profiles:
                continue
            why = f" ({total} not measured: {_why(lost, holders)})" if total else ""
            lines.append(f"{short_test(test)}, {name} measured of sent: {counts}{why}")
    return lines


def lost_remark(report: SessionReport, test: str, metric: str, profiles: Sequence[str]) -> str:
    """'' where every boot of ``profiles`` measured ``metric``'s figure for every request it sent;
    else what each side measured of what it sent, and why not the rest."""
    figure = figure_of(metric)
    if figure is None:
        return ""
    sides = []
    lost: Counter[str] = Counter()
    holders = _Holders()
    for profile in profiles:
        boots = [res for res in report.results if res.test == test and res.profile == profile
                 and res.run is not None and res.run.measured is not None]
        measured = sent = 0
        for res in boots:
            assert res.run is not None and res.run.measured is not None
            m, s, withheld = _count(res.run.measured, figure)
            measured, sent, lost = measured + m, sent + s, lost + withheld
            holders.add(res.run.measured)
        if sent:
            sides.append(f"{measured} of {sent} on {profile}")
    if not sum(lost.values()):
        return ""
    name = GAPS if figure == GAPS else metric_spec(figure).label
    short = ", ".join(f"{n} {_SHORT[reason]}" for reason, n in lost.most_common())
    held = "".join(f", {who.value} held the stream" for who in sorted(holders.worst_loop_ms))
    return f" ({name} measured {', '.join(sides)}: {short}{held})"


# The answers' remark says why in few words; the summary's lines say it in full.
_SHORT: dict[str, str] = {
    "failed": "failed", "no-token": "without a token", "one-token": "of one token",
    "first-read-shared": "first chunks in a shared read", "burst": "in bursts",
    "gap-in-shared-read": "inside shared reads",
}
