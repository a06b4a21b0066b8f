"""Where a session's wall clock went: set-up, each boot and its phases, measuring, the rest.

Each process notes stretches of the wall clock (``time.time()``: xdist's workers that boot run on
the controller's host, so one clock serves them all): a server's boot and stop
(:class:`~pytest_kimiperf.server.boot_account.ServerSpan`, with each boot's phases from its
:class:`~pytest_kimiperf.server.boot_account.BootAccount`), each test's set-up, call and teardown
(pytest's reports carry their start and stop), and each measuring window of a perf test. The
controller's :class:`SessionClock` gathers them and :func:`account_time` lays them on one clock,
from the pytest process's start to the account's end: each second goes to the most specific
stretch that covers it (a window before the test that holds it, a boot's phase before the boot),
so the parts never count a second twice, even where xdist runs other tests beside the perf
worker. What no stretch covers is said as the unaccounted rest, never spread over the parts.

Beside the parts stands what ``--kimiperf-plan`` predicted (:class:`PlannedTime`): the boots and
their time to ready. It predicts no measuring time, and the account says so.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kimiperf.server.boot_account import BootAccount, ServerSpan

# The parts, in the order a reader meets them; and below, which one takes a second that several
# cover (the most specific first).
SESSION_START = "session start"  # interpreter, plugins, collection, xdist workers: before the first test
BOOTS = "boots"
MEASURING = "measuring"
MEASURED_AGAIN = "measured again"
PERF_TESTS_REST = "perf tests' set-up, checks and teardown"
STOPS = "server stops"
OTHER_TESTS = "other tests"
SESSION_END = "session end"  # after the last test: stopping what is left, judging the run, reports
PARTS = (SESSION_START, BOOTS, MEASURING, MEASURED_AGAIN, PERF_TESTS_REST, STOPS, OTHER_TESTS, SESSION_END)
_RANK = (MEASURED_AGAIN, MEASURING, "boot phase", BOOTS, STOPS, PERF_TESTS_REST, OTHER_TESTS, SESSION_END,
         SESSION_START)

# A boot's stretch outside the phases its log shows: the manager's own steps before the launch
# (host claim, sweep, port, weight cache) and after ready (reading the log for the account).
BOOT_OUTSIDE_LOG = "outside the server's log"
BOOT_UNTIL_FAILED = "until it failed"


@dataclass(frozen=True)
class Stretch:
    """A stretch of the wall clock (epoch seconds) that one part, row and detail took."""

    part: str
    start: float
    end: float
    row: str = ""
    detail: str = ""
    rank: int = 0  # lower: more specific, takes a second another stretch covers too


@dataclass(frozen=True)
class Window:
    """One measuring window of a perf test: an attempt of its scenario (0 is the first; a later
    attempt is the window measured again after the host or the client disturbed it)."""

    start: float
    end: float
    attempt: int = 0

    def to_json(self) -> list[float]:
        """``[start, end, attempt]``: how a report carries it from an xdist worker."""
        return [self.start, self.end, self.attempt]

    @classmethod
    def from_json(cls, data: Sequence[float]) -> Window:
        """Inverse of :meth:`to_json`."""
        return cls(float(data[0]), float(data[1]), int(data[2]))


@dataclass(frozen=True)
class PlannedTime:
    """What ``--kimiperf-plan`` predicts of the run's time: the boots, and each one's seconds to
    ready with where that figure comes from (None: the plan knows none)."""

    boots: int
    most_boots: int
    ready_s: float | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"boots": self.boots, "most_boots": self.most_boots, "ready_s_per_boot": self.ready_s,
                "ready_s": None if self.ready_s is None else round(self.ready_s * self.boots, 3),
                "source": self.source}


@dataclass
class SessionClock:
    """The controller's notes of the session's stretches: when the pytest process started, and
    each test's phases as its reports said (the servers' stretches come with their records)."""

    started_at: float
    tests: list[Stretch] = field(default_factory=list)
    windows: list[Stretch] = field(default_factory=list)
    perf_items: set[str] = field(default_factory=set)
    other_items: set[str] = field(default_factory=set)

    def note_report(self, nodeid: str, *, start: float, stop: float, test: str | None,
                    windows: Iterable[Window] = ()) -> None:
        """One phase of the test ``nodeid`` (``test``: the perf test's name without its profile
        and boot, None for a test that is no perf test) and, for a perf test's call, its windows."""
        if test is None:
            self.other_items.add(nodeid)
            self.tests.append(Stretch(OTHER_TESTS, start, stop, rank=_RANK.index(OTHER_TESTS)))
            return
        self.perf_items.add(nodeid)
        self.tests.append(Stretch(PERF_TESTS_REST, start, stop, rank=_RANK.index(PERF_TESTS_REST)))
        for w in windows:
            part = MEASURING if w.attempt == 0 else MEASURED_AGAIN
            self.windows.append(Stretch(part, w.start, w.end, row=test, rank=_RANK.index(part)))


@dataclass(frozen=True)
class TimeRow:
    """One row of a part: a boot, or a test; ``details`` split its seconds (a boot's phases)."""

    label: str
    seconds: float
    details: tuple[tuple[str, float], ...] = ()
    count: int = 0  # the stretches it holds: a test's windows


@dataclass(frozen=True)
class TimePart:
    """One part of the session's time, with its rows."""

    name: str
    seconds: float
    count: int = 0  # the things it holds: boots, windows, stops, tests
    rows: tuple[TimeRow, ...] = ()


@dataclass(frozen=True)
class TimeAccount:
    """Where the session's wall clock went: the parts add up to ``wall_clock_s`` with
    ``unaccounted_s``, what no noted stretch covers; beside them, the plan's prediction."""

    wall_clock_s: float
    parts: tuple[TimePart, ...]
    unaccounted_s: float
    boots: int  # the boots that became ready
    ready_s: float  # their seconds to ready (launch to serving), the figure the plan predicts
    planned: PlannedTime | None = None

    def part(self, name: str) -> TimePart | None:
        """The part called ``name``, if the session spent time in it."""
        return next((p for p in self.parts if p.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The JSON report's ``time_account``."""
        return {
            "wall_clock_s": round(self.wall_clock_s, 3),
            "parts": [{"part": p.name, "seconds": round(p.seconds, 3), "count": p.count,
                       "rows": [{"row": r.label, "seconds": round(r.seconds, 3), "count": r.count,
                                 "details": {name: round(s, 3) for name, s in r.details}} for r in p.rows]}
                      for p in self.parts],
            "unaccounted_s": round(self.unaccounted_s, 3),
            "boots": self.boots, "ready_s": round(self.ready_s, 3),
            "planned": None if self.planned is None else self.planned.to_json(),
        }


def server_stretches(spans: Iterable[ServerSpan], accounts: Iterable[BootAccount]) -> list[Stretch]:
    """The servers' stretches: each boot, with its phases laid from its launch, and each stop."""
    by_boot = {(a.profile, a.ordinal): a for a in accounts}
    out: list[Stretch] = []
    for span in spans:
        if span.kind == "stop":
            out.append(Stretch(STOPS, span.started_at, span.started_at + span.seconds, row=span.profile,
                               rank=_RANK.index(STOPS)))
            continue
        account = by_boot.get((span.profile, span.boot))
        first = " (first of the deployment)" if account is not None and account.first_of_deployment else ""
        row = f"boot {span.boot} of {span.profile}{first}"
        end = span.started_at + span.seconds
        outside = BOOT_OUTSIDE_LOG if account is not None else BOOT_UNTIL_FAILED
        out.append(Stretch(BOOTS, span.started_at, end, row=row, detail=outside, rank=_RANK.index(BOOTS)))
        if account is None or span.launch_s is None:
            continue
        at = span.started_at + span.launch_s
        for phase in account.phases:
            out.append(Stretch(BOOTS, at, min(at + phase.seconds, end), row=row, detail=phase.phase,
                               rank=_RANK.index("boot phase")))
            at += phase.seconds
    return out


def covered(stretches: Iterable[Stretch], start: float, end: float) -> dict[tuple[str, str, str], float]:
    """Seconds of [``start``, ``end``] each (part, row, detail) takes, a second going to the
    most specific stretch that covers it (lowest rank, then the earliest begun)."""
    events: list[tuple[float, int, int]] = []  # (time, 0 ends before 1 begins, index)
    items = [s for s in stretches if min(s.end, end) > max(s.start, start)]
    for i, s in enumerate(items):
        events += [(max(s.start, start), 1, i), (min(s.end, end), 0, i)]
    events.sort()
    seconds: dict[tuple[str, str, str], float] = {}
    active: list[tuple[int, float, int]] = []  # a heap of (rank, start, index); ended ones dropped lazily
    ended: set[int] = set()
    last = start
    for t, begins, i in events:
        while active and active[0][2] in ended:
            heapq.heappop(active)
        if active and t > last:
            s = items[active[0][2]]
            key = (s.part, s.row, s.detail)
            seconds[key] = seconds.get(key, 0.0) + t - last
        last = max(last, t)
        if begins:
            heapq.heappush(active, (items[i].rank, items[i].start, i))
        else:
            ended.add(i)
    return seconds


def account_time(clock: SessionClock, *, end: float, spans: Iterable[ServerSpan] = (),
                 accounts: Iterable[BootAccount] = (), planned: PlannedTime | None = None) -> TimeAccount:
    """The session's time from the pytest process's start to ``end``, part by part."""
    accounts = list(accounts)
    spans = list(spans)
    stretches = [*clock.tests, *clock.windows, *server_stretches(spans, accounts)]
    tests = clock.tests
    first = min((s.start for s in tests), default=end)
    last = max((s.end for s in tests), default=first)
    stretches += [Stretch(SESSION_START, clock.started_at, first, rank=_RANK.index(SESSION_START)),
                  Stretch(SESSION_END, last, end, rank=_RANK.index(SESSION_END))]
    taken = covered(stretches, clock.started_at, end)
    counts = {
        BOOTS: sum(1 for s in spans if s.kind == "boot"), STOPS: sum(1 for s in spans if s.kind == "stop"),
        MEASURING: sum(1 for w in clock.windows if w.part == MEASURING),
        MEASURED_AGAIN: sum(1 for w in clock.windows if w.part == MEASURED_AGAIN),
        PERF_TESTS_REST: len(clock.perf_items), OTHER_TESTS: len(clock.other_items),
    }
    window_counts: dict[tuple[str, str], int] = {}
    for w in clock.windows:
        window_counts[w.part, w.row] = window_counts.get((w.part, w.row), 0) + 1
    parts = []
    for name in PARTS:
        mine = {key: s for key, s in taken.items() if key[0] == name}
        if not mine:
            continue
        rows = _rows(name, mine, window_counts) if name in (BOOTS, MEASURING, MEASURED_AGAIN) else ()
        parts.append(TimePart(name, sum(mine.values()), counts.get(name, 0), rows))
    wall = max(0.0, end - clock.started_at)
    ready = [a.total_s for a in accounts]
    return TimeAccount(wall_clock_s=wall, parts=tuple(parts), unaccounted_s=max(0.0, wall - sum(taken.values())),
                       boots=len(ready), ready_s=sum(ready), planned=planned)


def _rows(part: str, taken: Mapping[tuple[str, str, str], float],
          window_counts: Mapping[tuple[str, str], int]) -> tuple[TimeRow, ...]:
    """A part's rows in the order they first appear (boots by their start, tests as they ran),
    each with its details in the order the stretches were noted."""
    rows: dict[str, dict[str, float]] = {}
    for (_, row, detail), s in taken.items():
        rows.setdefault(row, {})
        rows[row][detail] = rows[row].get(detail, 0.0) + s
    return tuple(TimeRow(label, sum(details.values()),
                         tuple((d, s) for d, s in details.items() if d) if part == BOOTS else (),
                         window_counts.get((part, label), 0))
                 for label, details in rows.items())
