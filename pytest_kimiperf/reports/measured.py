"""What each boot measured of what its test sent, figure by figure (measure/coverage.py's counts).

A figure that could not be taken is a fact with a reason and a count, shown where the figure is:
one line per test and figure in the summary (every boot's count), and a remark on an answer
whenever a side it compares lost any.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.config.metric_specs import SampleKind, metric_spec
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.coverage import CLIENT_REASONS, Coverage, StreamShape
from pytest_kimiperf.measure.results import median, withheld_words
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
        held = account.gaps_client_held
        return account.gaps_measured, account.gaps_measured + held, Counter({"client-held": held} if held else {})
    count = account.of("e2el_ms" if figure == COMPLETED else figure)
    return count.measured, count.sent, Counter(count.withheld)


class _ClientLoop:
    """The client's worst loop latency over the boots a line counts."""

    def __init__(self) -> None:
        self.worst_ms: float | None = None

    def add(self, account: Coverage) -> None:
        if account.loop_max_ms is not None:
            self.worst_ms = max(self.worst_ms or 0.0, account.loop_max_ms)

    def words(self) -> str:
        late = f" (its loop ran up to {self.worst_ms:.1f} ms late)" if self.worst_ms is not None else ""
        return f"the client was held off the CPU{late}"


def _why(withheld: Counter[str], loop: _ClientLoop) -> str:
    reasons = ", ".join(f"{n} {withheld_words(reason)}" for reason, n in withheld.most_common())
    held = any(r in CLIENT_REASONS for r in withheld)
    return reasons + (f"; {loop.words()}" if held else "")


@dataclass(frozen=True)
class _FigureAccount:
    """One test's figure over its boots: each profile's measured/sent per boot, and why the rest
    were not measured."""

    test: str
    name: str
    counts: str
    not_measured: int
    why: str


def _accounts(report: SessionReport) -> list[_FigureAccount]:
    by_test: dict[str, list[TestResult]] = {}
    for res in report.results:
        if res.run is not None and res.run.measured is not None:
            by_test.setdefault(res.test, []).append(res)
    accounts = []
    for test, results in by_test.items():
        for figure in _figures(results):
            profiles: dict[str, list[str]] = {}
            lost: Counter[str] = Counter()
            loop = _ClientLoop()
            for res in sorted(results, key=lambda r: r.boot):
                assert res.run is not None and res.run.measured is not None
                measured, sent, withheld = _count(res.run.measured, figure)
                if not sent:
                    continue  # a boot that sent nothing (its run failed before its window) counts nothing
                profiles.setdefault(res.profile, []).append(f"{measured}/{sent}")
                lost += withheld
                loop.add(res.run.measured)
            if not profiles:
                continue
            name = GAPS if figure == GAPS else "requests completed" if figure == COMPLETED else metric_spec(figure).label
            counts = "; ".join(f"{profile} {', '.join(boots)}" for profile, boots in profiles.items())
            accounts.append(_FigureAccount(short_test(test), name, counts, sum(lost.values()), _why(lost, loop)))
    return accounts


def measured_lines(report: SessionReport, *, only_lost: bool = False) -> list[str]:
    """One line per test and figure it checks: every boot's measured of sent, by profile, and why
    the rest were not measured (``only_lost``: only the lines where some were not)."""
    return [f"{a.test}, {a.name} measured of sent: {a.counts}"
            + (f" ({a.not_measured} not measured: {a.why})" if a.not_measured else "")
            for a in _accounts(report) if a.not_measured or not only_lost]


def unmeasured_line(report: SessionReport) -> str | None:
    """One line on every figure the run did not measure for every request it sent, all tests and
    boots together (None: it measured every one): what ``-q`` keeps of the lines above."""
    parts = [f"{a.test}, {a.name}: {a.not_measured} ({a.why})" for a in _accounts(report) if a.not_measured]
    return "kimiperf: not measured: " + " | ".join(parts) if parts else None


def lost_remark(report: SessionReport, test: str, metric: str, profiles: Sequence[str]) -> str:
    """'' where every boot of ``profiles`` measured ``metric``'s figure for every request it sent;
    else what each side measured of what it sent, and why not the rest."""
    figure = figure_of(metric)
    if figure is None:
        return ""
    sides = []
    lost: Counter[str] = Counter()
    for profile in profiles:
        boots = [res for res in report.results if res.test == test and res.profile == profile
                 and res.run is not None and res.run.measured is not None]
        measured = sent = 0
        for res in boots:
            assert res.run is not None and res.run.measured is not None
            m, s, withheld = _count(res.run.measured, figure)
            measured, sent, lost = measured + m, sent + s, lost + withheld
        if sent:
            sides.append(f"{measured} of {sent} on {profile}")
    if not sum(lost.values()):
        return ""
    name = GAPS if figure == GAPS else metric_spec(figure).label
    short = ", ".join(f"{n} {_SHORT.get(reason, reason)}" for reason, n in lost.most_common())
    return f" ({name} measured {', '.join(sides)}: {short})"


# The answers' remark says why in few words; the summary's lines say it in full.
_SHORT: dict[str, str] = {
    "failed": "failed", "no-token": "without a token", "one-token": "of one token",
    "client-held": "held by the client", "one-read": "written whole in one read",
}


def _shapes(report: SessionReport, test: str, profiles: Sequence[str]) -> list[tuple[str, StreamShape]]:
    return [(res.profile, res.run.measured.stream) for res in report.results
            if res.test == test and res.profile in profiles and res.run is not None and res.run.measured is not None]


def stream_remark(report: SessionReport, test: str, profiles: Sequence[str]) -> str:
    """What the streams of ``test`` on ``profiles`` showed of the server, where they showed
    anything a smooth stream of one token a chunk does not: its stalls, chunks it wrote
    together, tokens several to a chunk, and a server that counted no chunk's tokens ('' else)."""
    shapes = _shapes(report, test, profiles)
    if not shapes:
        return ""
    said = []
    for profile in dict.fromkeys(p for p, _ in shapes):
        mine = [shape for p, shape in shapes if p == profile]
        requests = sum(shape.requests for shape in mine)
        where = f" on {profile}" if len(profiles) > 1 else ""
        stalls = [ms for shape in mine for ms in shape.stall_ms]
        if stalls:
            said.append(f"the server stalled about {median(stalls):.0f} ms mid-stream in {len(stalls)} of {requests} "
                        f"requests{where}")
        whole = sum(shape.one_read_requests for shape in mine)
        together = sum(shape.written_together_requests for shape in mine) - whole
        if whole:
            said.append(f"it wrote {whole} of {requests} streams whole in one read{where}")
        if together > 0:
            said.append(f"it wrote chunks together in {together} of {requests} streams{where}")
        widest = max((shape.tokens_per_chunk_max or 0 for shape in mine), default=0)
        if widest > 1:
            said.append(f"its chunks carried up to {widest} tokens{where} (decode counts each token)")
    return f" ({'; '.join(said)})" if said else ""


def no_counts_line(report: SessionReport) -> str | None:
    """Once a session: the server put no running token count in its chunks, so decode and TPOT
    take the first chunk for one token, as bench serve does (None: every run had the counts, or
    its report predates them)."""
    uncounted = sorted({res.profile for res in report.results if res.run is not None and res.run.measured is not None
                        and res.run.measured.stream.requests and not res.run.measured.stream.counted_requests})
    if not uncounted:
        return None
    return (f"token counts: the server on {', '.join(uncounted)} gave none per chunk (stream_options."
            "continuous_usage_stats): decode and TPOT take each first chunk for one token, as bench serve does")

