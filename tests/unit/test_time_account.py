"""The session's time account: each second to the most specific stretch that covers it, the
parts and the unaccounted rest adding up to the wall clock, and the block and JSON made of it."""

from __future__ import annotations

import json

import pytest

from pytest_kimiperf.measure.time_account import (
    BOOT_OUTSIDE_LOG,
    BOOT_UNTIL_FAILED,
    PlannedTime,
    SessionClock,
    Stretch,
    Window,
    account_time,
    covered,
)
from pytest_kimiperf.server.boot_account import BootAccount, PhaseTime, ServerSpan

T0 = 1_000_000.0  # the pytest process's start, in epoch seconds


def _boot(profile: str, ordinal: int, phases: dict[str, float], *, first: bool = False) -> BootAccount:
    return BootAccount(profile=profile, ordinal=ordinal, total_s=sum(phases.values()), first_of_deployment=first,
                       phases=tuple(PhaseTime(p, s) for p, s in phases.items()))


def _session() -> tuple[SessionClock, list[ServerSpan], list[BootAccount]]:
    """A session of two boots of one test, alone: 10 s of start-up; default's boot from 10 s
    (launched at 12 s, ready at 42 s, done at 43 s), the test's call 45-70 s with a window 46-56 s
    and one measured again 57-67 s; the stop 71-73 s; ring-ll's boot from 75 s failing at 80 s;
    one other test 81-82 s; the session's end at 90 s."""
    clock = SessionClock(started_at=T0)
    test = "test_perf.py::test_decode"
    clock.note_report("a[default-boot1]", start=T0 + 10, stop=T0 + 45, test=test)
    clock.note_report("a[default-boot1]", start=T0 + 45, stop=T0 + 70, test=test,
                      windows=[Window(T0 + 46, T0 + 56, 0), Window(T0 + 57, T0 + 67, 1)])
    clock.note_report("a[default-boot1]", start=T0 + 70, stop=T0 + 74, test=test)
    clock.note_report("a[ring-ll-boot1]", start=T0 + 74, stop=T0 + 80.5, test=test)
    clock.note_report("test_other.py::test_x", start=T0 + 81, stop=T0 + 82, test=None)
    spans = [ServerSpan("boot", "default", 1, T0 + 10, 33.0, launch_s=2.0),
             ServerSpan("stop", "default", 1, T0 + 71, 2.0),
             ServerSpan("boot", "ring-ll", 1, T0 + 75, 5.0)]
    accounts = [_boot("default", 1, {"process start": 10.0, "loading weights": 5.0, "compiling": 15.0}, first=True)]
    return clock, spans, accounts


def test_a_second_goes_to_the_most_specific_stretch_and_is_counted_once() -> None:
    stretches = [Stretch("outer", 0, 10, rank=5), Stretch("inner", 2, 4, rank=1),
                 Stretch("beside", 3, 12, rank=7), Stretch("inner", 3.5, 5, rank=1)]
    assert covered(stretches, 0, 15) == pytest.approx({("outer", "", ""): 7.0, ("inner", "", ""): 3.0,
                                                       ("beside", "", ""): 2.0})
    # Clipped to the account's own stretch of the clock.
    assert covered(stretches, 3, 8) == pytest.approx({("inner", "", ""): 2.0, ("outer", "", ""): 3.0})


def test_the_parts_and_the_rest_add_up_to_the_wall_clock() -> None:
    clock, spans, accounts = _session()
    account = account_time(clock, end=T0 + 90, spans=spans, accounts=accounts)
    parts = {p.name: p.seconds for p in account.parts}
    assert parts == pytest.approx({
        "session start": 10.0,
        "boots": 33.0 + 5.0,
        "measuring": 10.0,
        "measured again": 10.0,
        # 43-45 and 74-75 of set-up, 45-46, 56-57, 67-70 of the call, 70-71 and 73-74 of teardown
        "perf tests' set-up, checks and teardown": 2.0 + 1.0 + 1.0 + 1.0 + 3.0 + 1.0 + 1.0 + 0.5,
        "server stops": 2.0,
        "other tests": 1.0,
        "session end": 8.0,
    })
    assert account.unaccounted_s == pytest.approx(0.5)  # 80.5-81: between two tests
    assert sum(parts.values()) + account.unaccounted_s == pytest.approx(account.wall_clock_s) == 90.0
    assert (account.boots, account.ready_s) == (1, 30.0)


def test_a_boots_phases_are_laid_from_its_launch_and_a_failed_boot_is_said() -> None:
    clock, spans, accounts = _session()
    boots = account_time(clock, end=T0 + 90, spans=spans, accounts=accounts).part("boots")
    assert boots is not None and boots.count == 2
    first, failed = boots.rows
    assert first.label == "boot 1 of default (first of the deployment)"
    assert dict(first.details) == pytest.approx({BOOT_OUTSIDE_LOG: 3.0, "process start": 10.0,
                                                 "loading weights": 5.0, "compiling": 15.0})
    assert (failed.label, failed.details) == ("boot 1 of ring-ll", ((BOOT_UNTIL_FAILED, 5.0),))


def test_under_xdist_a_test_beside_the_perf_worker_takes_no_second_twice() -> None:
    clock = SessionClock(started_at=T0)
    clock.note_report("perf[default-boot1]", start=T0 + 1, stop=T0 + 9, test="perf",
                      windows=[Window(T0 + 2, T0 + 8)])
    clock.note_report("other", start=T0 + 0.5, stop=T0 + 9.5, test=None)  # another worker, meanwhile
    account = account_time(clock, end=T0 + 10)
    assert {p.name: p.seconds for p in account.parts} == pytest.approx({
        "session start": 0.5, "measuring": 6.0, "perf tests' set-up, checks and teardown": 2.0,
        "other tests": 1.0, "session end": 0.5})
    assert account.unaccounted_s == 0.0


def test_the_json_carries_the_parts_their_rows_and_the_plan() -> None:
    clock, spans, accounts = _session()
    planned = PlannedTime(boots=2, most_boots=6, ready_s=40.0, source="declared by deployment tiny-cpu (load_s)")
    data = json.loads(json.dumps(account_time(clock, end=T0 + 90, spans=spans, accounts=accounts,
                                              planned=planned).to_json()))
    assert data["wall_clock_s"] == 90.0 and data["unaccounted_s"] == 0.5
    assert [p["part"] for p in data["parts"]] == [
        "session start", "boots", "measuring", "measured again", "perf tests' set-up, checks and teardown",
        "server stops", "other tests", "session end"]
    measuring = data["parts"][2]
    assert measuring["rows"] == [{"row": "test_perf.py::test_decode", "seconds": 10.0, "count": 1, "details": {}}]
    assert data["planned"] == {"boots": 2, "most_boots": 6, "ready_s_per_boot": 40.0, "ready_s": 80.0,
                               "source": "declared by deployment tiny-cpu (load_s)"}


def test_a_server_records_spans_travel_from_a_worker_and_add_up() -> None:
    from pytest_kimiperf.server.manager import ServerRecord

    rec = ServerRecord("ring-ll", boots=1, spans=[ServerSpan("boot", "ring-ll", 1, T0, 40.0, launch_s=1.5)])
    back = ServerRecord.from_json(json.loads(json.dumps(rec.to_json())))  # as workeroutput carries it
    assert back.spans == rec.spans
    back.merge(ServerRecord("ring-ll", spans=[ServerSpan("stop", "ring-ll", 1, T0 + 50, 2.0)]))
    assert [s.kind for s in back.spans] == ["boot", "stop"]


def test_the_block_lists_each_part_its_rows_the_rest_the_total_and_the_plan() -> None:
    from pytest_kimiperf.reports.terminal import time_account_lines

    clock, spans, accounts = _session()
    planned = PlannedTime(boots=2, most_boots=2, ready_s=40.0, source="declared by deployment tiny-cpu (load_s)")
    account = account_time(clock, end=T0 + 90, spans=spans, accounts=accounts, planned=planned)
    lines = time_account_lines(account, quiet=False)
    assert (lines[0].sep, lines[0].text) == ("=", "kimiperf: where the time went")
    assert [line.text for line in lines[1:]] == [
        "  part                                                            s  share",
        "  session start                                                10.0    11%",
        "  boots (2 boots)                                              38.0    42%",
        "    boot 1 of default (first of the deployment)                33.0",
        "      outside the server's log 3.0 s, process start 10.0 s, loading weights 5.0 s, compiling 15.0 s",
        "    boot 1 of ring-ll                                           5.0",
        "      until it failed 5.0 s",
        "  measuring (1 window)                                         10.0    11%",
        "    test_perf.py::test_decode (1 window)                       10.0",
        "  measured again (1 window)                                    10.0    11%",
        "    test_perf.py::test_decode (1 window)                       10.0",
        "  perf tests' set-up, checks and teardown (2 tests)            10.5    12%",
        "  server stops (1 stop)                                         2.0     2%",
        "  other tests (1 test)                                          1.0     1%",
        "  session end                                                   8.0     9%",
        "  other / unaccounted                                           0.5     1%",
        "  total: the pytest process, from its start to session finish  90.0   100%",
        "  plan (--kimiperf-plan): 2 boots, 40.0 s each to ready: 80.0 s (declared by deployment tiny-cpu",
        "      (load_s)); this run: 1 boot, 30.0 s to ready; the plan predicts no measuring time",
    ]
    quiet = " ".join(line.text.strip() for line in time_account_lines(account, quiet=True))
    assert quiet.startswith("kimiperf: time, total: the pytest process, from its start to session finish: 90.0 s: "
                            "session start 10.0 s, boots 38.0 s,")
    assert quiet.endswith("session end 8.0 s, other / unaccounted 0.5 s")
