"""What a window measured of what it sent, judged read by read (measure/coverage.py), on timelines
in virtual time: every stamp, read and hold is set by the test, so no host can move an outcome.

The cases are issue 70's: a server's stall then burst, a server's whole-stream burst, a client
held at random phases, both at once, a fallback stamp, a last chunk read with ``[DONE]``, the
window whose only gaps are a burst's (the typical gap of 0), chunks of several tokens."""

from __future__ import annotations

import dataclasses
import json
import random
from types import MappingProxyType

import pytest

from pytest_kimiperf.config.deployments import TINY_CPU, HealthBounds, HostBounds
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.measure.coverage import (
    CLIENT_REASONS, FIGURES, HOLD_SLACK_MS, LOOP_PROBE_INTERVAL_MS, NO_HOLDS, TRUE_WITHIN, Coverage, Holds, Withheld, stamps, true_gaps_ms, withheld,
)
from pytest_kimiperf.measure.invalid_causes import InvalidCause
from pytest_kimiperf.measure.loop_probe import HOLD_MIN_LATENCY_S, PROBE_INTERVAL_S
from pytest_kimiperf.measure.results import RequestRecord, RoundResult, RunResult, Unmeasured
from pytest_kimiperf.measure.runner import cause_of, descheduled, measure_watched
from pytest_kimiperf.reports.sentences import say_invalid, say_measured_again
from pytest_kimiperf.server.process import ServerHandle
from tests.unit.test_results import HEALTHY, run_of

MS = 1_000_000
# make test's stub pace: 20 ms to the first token, 2.5 ms a token, 16 tokens.
TTFT_MS, GAP_MS, TOKENS = 20.0, 2.5, 16


def timeline(reads: list[tuple[float, float, int]], *, send_ms: float = 0.0, tokens: int = TOKENS,
             followed: tuple[int, ...] = (), counts: tuple[int, ...] = (), request_id: str = "r",
             ok: bool = True) -> RequestRecord:
    """A request whose chunks came in ``reads``: (kernel stamp ms, read time ms, chunks) each; a
    stamp equal to its read time is a fallback."""
    chunk_ns: list[int] = []
    read_ns: list[int] = []
    for stamp_ms, read_ms, chunks in reads:
        chunk_ns += [int(stamp_ms * MS)] * chunks
        read_ns += [int(read_ms * MS)] * chunks
    return RequestRecord(ok=ok, error="" if ok else "boom", prompt_tokens=8, output_tokens=tokens,
                         t_send_ns=int(send_ms * MS), chunk_ns=tuple(chunk_ns), t_done_ns=chunk_ns[-1] + MS,
                         request_id=request_id, chunk_read_ns=tuple(read_ns), chunk_tokens=counts, followed=followed)


def smooth(*, start_ms: float = 0.0, request_id: str = "r") -> list[tuple[float, float, int]]:
    """One chunk a read, each on the stub's pace, read 0.05 ms after it arrived."""
    return [(start_ms + TTFT_MS + i * GAP_MS, start_ms + TTFT_MS + i * GAP_MS + 0.05, 1) for i in range(TOKENS)]


def stall_then_burst(stall_ms: float = 100.0, *, start_ms: float = 0.0) -> list[tuple[float, float, int]]:
    """The first chunk on time, then the rest in one send ``stall_ms`` after the last one's due time."""
    first = start_ms + TTFT_MS
    rest = first + (TOKENS - 1) * GAP_MS + stall_ms
    return [(first, first + 0.05, 1), (rest, rest + 0.05, TOKENS - 1)]


def hold(start_ms: float, end_ms: float) -> Holds:
    return Holds([(int(start_ms * MS), int(end_ms * MS))])


def figures(r: RequestRecord, holds: Holds = NO_HOLDS) -> dict[str, Withheld | None]:
    judged = stamps(r, holds)
    return {f: withheld(f, r, judged) for f in FIGURES}


def window(records: list[RequestRecord], *, holds: tuple[tuple[float, float], ...] = (),
           loop_max_ms: float = 0.1) -> RunResult:
    health = dataclasses.replace(HEALTHY, loop_latency_ms=(0.02, 0.03, loop_max_ms),
                                 loop_holds_ns=tuple((int(a * MS), int(b * MS)) for a, b in holds))
    return dataclasses.replace(run_of(RoundResult(records=tuple(records), wall_s=1.0, health=(health,))),
                               load={"kind": "single-stream", "timing": "kernel"})


# --------------------------------------------------------------------------- the server's doing


def test_a_server_that_stalls_then_bursts_keeps_every_figure_as_the_user_got_it() -> None:
    r = timeline(stall_then_burst(100.0))
    assert figures(r) == dict.fromkeys(FIGURES)
    last_ms = TTFT_MS + (TOKENS - 1) * GAP_MS + 100.0
    assert r.value("ttft_ms") == pytest.approx(TTFT_MS)
    assert r.value("e2el_ms") == pytest.approx(last_ms)
    assert r.value("decode_tok_s") == pytest.approx((TOKENS - 1) / ((last_ms - TTFT_MS) / 1000))
    # The tail holds the stall and the burst's near-zero gaps: a stall in 1% of gaps reaches p99.
    assert r.measured_itl_ms() == pytest.approx([last_ms - TTFT_MS] + [0.0] * (TOKENS - 2))
    run = window([dataclasses.replace(r, request_id=str(i)) for i in range(20)])
    assert run.valid and run.unmeasured(FIGURES) is None and not descheduled(run)
    shape = run.coverage.stream
    assert (shape.requests, shape.stalled_requests, shape.written_together_requests) == (20, 20, 20)
    assert shape.stall_ms == (pytest.approx(last_ms - TTFT_MS),) * 20
    assert run.samples("decode_tok_s") == pytest.approx([r.decode_tok_s] * 20)


def test_a_stall_read_under_a_short_hold_keeps_the_stall_and_drops_only_the_gaps_the_hold_could_move() -> None:
    # Seen on a loaded host: a reading due 0.5 ms before a 128-token burst arrived ran 1 ms after
    # it (the probe's thread late, or the loop parsing the burst). The burst's earlier stamps may
    # then be up to the hold and an interval early: nothing to a 418 ms stall, everything to the
    # 0 ms gaps inside it.
    first, rest = TTFT_MS, TTFT_MS + 127 * GAP_MS + 100.0
    r = timeline([(first, first + 0.05, 1), (rest, rest + 0.1, 127)], tokens=128)
    held = hold(rest - 0.5, rest + 1.0)
    judged = stamps(r, held)
    assert judged.client_reads == 1 and max(judged.early_ns) <= (0.5 + LOOP_PROBE_INTERVAL_MS) * MS
    assert true_gaps_ms(r, judged) == pytest.approx([rest - first])  # the stall, and no burst gap
    assert figures(r, held) == dict.fromkeys(FIGURES)
    run = window([r], holds=((rest - 0.5, rest + 1.0),))
    assert run.coverage.stream.stall_ms == (pytest.approx(rest - first, abs=0.001),)


def test_a_loop_parsing_the_burst_it_just_read_does_not_spoil_that_burst_but_what_queued_meanwhile() -> None:
    # The burst's read returned at 158 ms; parsing it delayed the reading due at 158.3 to 160:
    # the burst's own stamps hold, and the next read, whose chunks queued while the loop parsed,
    # is the client's.
    first, burst, after = 20.0, 157.9, 159.8
    r = timeline([(first, first + 0.05, 1), (burst, 158.0, TOKENS - 3), (after, 160.05, 2)])
    run = window([r], holds=((158.3, 160.0),))
    judged = stamps(r, run.holds)
    assert judged.early_ns[1:TOKENS - 3] == (0,) * (TOKENS - 4)  # the burst: the server's
    assert judged.early_ns[TOKENS - 2] > 0 and judged.early_ns[-1] == 0  # queued while parsing
    assert (judged.client_reads, judged.server_reads) == (1, 1)


def test_a_stall_in_every_second_stream_is_in_the_figures_of_those_streams_only() -> None:
    run = window([timeline(stall_then_burst() if i % 2 else smooth(), request_id=str(i)) for i in range(20)])
    smooth_decode = (TOKENS - 1) / ((TOKENS - 1) * GAP_MS / 1000)
    decode = sorted(run.samples("decode_tok_s"))
    assert len(decode) == 20 and decode[10:] == pytest.approx([smooth_decode] * 10)
    assert run.coverage.stream.stalled_requests == 10 and run.unmeasured(FIGURES) is None


def test_a_stream_the_server_wrote_whole_has_no_decode_and_is_the_server_s_not_the_client_s() -> None:
    at_ms = TTFT_MS + (TOKENS - 1) * GAP_MS
    r = timeline([(at_ms, at_ms + 0.05, TOKENS)])
    assert figures(r) == {"decode_tok_s": Withheld.ONE_READ, "itl_ms": None, "tpot_ms": Withheld.ONE_READ,
                          "ttft_ms": None, "e2el_ms": None}
    assert r.value("ttft_ms") == pytest.approx(at_ms) and r.value("itl_ms") == 0.0
    assert Withheld.ONE_READ.value not in CLIENT_REASONS
    run = window([dataclasses.replace(r, request_id=str(i)) for i in range(8)])
    assert run.valid and run.unmeasured(FIGURES) is None and not descheduled(run)
    assert run.coverage.of("decode_tok_s").withheld == {"one-read": 8}
    assert run.coverage.stream.one_read_requests == 8
    # Five tokens in one chunk: the same, the server's.
    assert figures(timeline([(20.0, 20.05, 1)], tokens=5))["decode_tok_s"] is Withheld.ONE_READ


def test_the_window_whose_only_gaps_are_a_burst_s_is_not_the_client_s() -> None:
    # The gate's case of issue 70: every gap measured is 0 ms or the stall, so the typical gap
    # was 0 and a loop that read anything named the client. The loop was never late.
    run = window([timeline(stall_then_burst(), request_id=str(i)) for i in range(20)], loop_max_ms=0.3)
    assert sorted(run.itl_timeline_ms())[len(run.itl_timeline_ms()) // 2] == 0.0
    assert run.invalid is None and run.unmeasured(FIGURES) is None and not descheduled(run)
    assert run.coverage.client_held_requests == 0


# --------------------------------------------------------------------------- the client's doing


def test_a_client_held_mid_stream_loses_only_the_stamps_its_hold_joined() -> None:
    # Held from 29 ms to 45 ms: the chunks that arrived meanwhile (30, 32.5 .. 42.5) were read
    # together when it ran again, stamped with the last one's arrival.
    arrivals = [TTFT_MS + i * GAP_MS for i in range(TOKENS)]
    joined = [t for t in arrivals if 29.0 < t < 45.0]
    reads = [(t, t + 0.05, 1) for t in arrivals if t <= 29.0]
    reads += [(joined[-1], 45.0, len(joined))]
    reads += [(t, t + 0.05, 1) for t in arrivals if t >= 45.0]
    r = timeline(reads)
    held = hold(29.0, 45.0)
    assert figures(r, held) == dict.fromkeys(FIGURES)  # first, last and send stamps hold
    judged = stamps(r, held)
    assert judged.client_reads == 1 and judged.server_reads == 0
    assert [e > 0 for e in judged.early_ns].count(True) == len(joined) - 1
    # Each is at most the hold (and the probe's interval before it) earlier than its stamp.
    assert max(judged.early_ns) <= (joined[-1] - (29.0 - LOOP_PROBE_INTERVAL_MS)) * MS
    assert r.value("decode_tok_s", held) == pytest.approx((TOKENS - 1) / ((TOKENS - 1) * GAP_MS / 1000))
    # No gap across the joined read enters the tail; the rest are the pace.
    assert true_gaps_ms(r, judged) == pytest.approx([GAP_MS] * (TOKENS - 1 - len(joined)))
    # Without the hold the same read would be the server's, its stamps true.
    assert not any(stamps(r).early_ns)


def test_a_client_held_over_the_first_chunk_loses_ttft_and_decode_but_keeps_e2el() -> None:
    reads = [(TTFT_MS + GAP_MS, 24.0, 2)] + [(TTFT_MS + i * GAP_MS, TTFT_MS + i * GAP_MS + 0.05, 1)
                                               for i in range(2, TOKENS)]
    r = timeline(reads)
    held = hold(18.0, 24.0)
    assert figures(r, held) == {"decode_tok_s": Withheld.CLIENT_HELD, "itl_ms": None, "tpot_ms": Withheld.CLIENT_HELD,
                                "ttft_ms": Withheld.CLIENT_HELD, "e2el_ms": None}
    assert Withheld.CLIENT_HELD.value in CLIENT_REASONS


def test_a_send_stamp_is_as_late_as_the_call_that_sent_it_and_without_that_a_hold_over_it_spoils_it() -> None:
    # A record that says when its send() returned: 0.01 ms after the stamp, the request went out
    # on time whatever the probe read (a loop busy sending is not a client held off).
    sent_at_once = dataclasses.replace(timeline(smooth(), send_ms=1.0), send_done_ns=int(1.01 * MS))
    assert figures(sent_at_once, hold(0.5, 3.0)) == dict.fromkeys(FIGURES)
    # A send() that returned 2 ms later: TTFT (19 ms) may be 2 ms long, past 1% of it.
    sent_late = dataclasses.replace(sent_at_once, send_done_ns=int(3.0 * MS))
    assert figures(sent_late)["ttft_ms"] is Withheld.CLIENT_HELD and figures(sent_late)["decode_tok_s"] is None
    # A record without the send's return: a hold over the stamp spoils TTFT and E2EL.
    r = timeline(smooth(), send_ms=1.0)
    assert figures(r, hold(0.5, 3.0))["ttft_ms"] is Withheld.CLIENT_HELD
    assert figures(r, hold(0.5, 3.0))["e2el_ms"] is Withheld.CLIENT_HELD
    assert figures(r, hold(0.5, 3.0))["decode_tok_s"] is None


def test_a_client_stopped_at_random_phases_keeps_exactly_the_figures_its_stops_left_true() -> None:
    # 120 ms stops in every 400 at seeded phases, against 64-token streams at 5 ms a token.
    rng = random.Random(4)
    stops = [(p + rng.uniform(0, 280.0), 0.0) for p in range(0, 4000, 400)]
    stops = [(a, a + 120.0) for a, _ in stops]
    records, now = [], 0.0
    for i in range(30):
        send, arrivals = now, [now + 20.0 + k * 5.0 for k in range(64)]

        def resumed(t: float) -> float:
            return next((b for a, b in stops if a <= t < b), t)

        reads: list[tuple[float, float, int]] = []
        for t in arrivals:
            at = resumed(t) + 0.05
            if reads and reads[-1][1] == at:
                reads[-1] = (t, at, reads[-1][2] + 1)
            else:
                reads.append((t, at, 1))
        records.append(timeline(reads, send_ms=resumed(send), tokens=64, request_id=str(i)))
        now = reads[-1][1] + 1.0
    # The probe's thread stops with the process: its reading due at the stop runs when it ends.
    holds = tuple((a + rng.uniform(0, LOOP_PROBE_INTERVAL_MS), b) for a, b in stops)
    run = window(records, holds=holds, loop_max_ms=120.0)
    for r in run.valid_records:
        judged = stamps(r, run.holds)
        truth_first, truth_last = r.t_send_ns, r.chunk_ns[-1]
        value = r.value("decode_tok_s", run.holds)
        if value is not None:  # a kept decode is the pace within TRUE_WITHIN, and its stamps say so
            assert value == pytest.approx(63 / 0.315, rel=TRUE_WITHIN)
            assert judged.early_ns[0] + judged.early_ns[-1] <= TRUE_WITHIN * (r.chunk_ns[-1] - r.chunk_ns[0])
        ttft = r.value("ttft_ms", run.holds)
        if ttft is not None:
            assert ttft == pytest.approx(20.0)
        assert truth_first <= truth_last
        assert all(g == pytest.approx(5.0, rel=2 * TRUE_WITHIN) for g in r.measured_itl_ms(run.holds))
    account = run.coverage
    assert account.client_held_requests > 0 and account.stream.stalled_requests == 0
    assert account.gaps_measured + account.gaps_client_held == 30 * 63


def test_a_server_s_burst_and_a_held_client_at_once_are_each_judged_by_their_own_read() -> None:
    held = (100.0, 140.0)
    server_burst = timeline(stall_then_burst(50.0), request_id="s")  # its reads at 20 and 127.5: inside the hold
    elsewhere = timeline(stall_then_burst(50.0, start_ms=300.0), request_id="e")  # clear of it
    run = window([server_burst, elsewhere], holds=(held,), loop_max_ms=40.0)
    # The burst read at 127.5 ms fell in the hold: its earlier chunks may be the client's.
    assert run.coverage.of("decode_tok_s").withheld == {}
    assert stamps(server_burst, run.holds).client_reads == 1
    assert stamps(elsewhere, run.holds).server_reads == 1
    assert run.coverage.stream.stalled_requests == 1  # only the stall whose stamps hold is said
    assert run.coverage.gaps_client_held == TOKENS - 1


# --------------------------------------------------------------------------- stamps the kernel did not give


def test_a_fallback_stamp_holds_unless_a_hold_touches_it() -> None:
    reads = [(t, t, 1) for t, _, _ in smooth()]  # stamped at read time: no kernel stamp
    r = timeline(reads)
    assert figures(r) == dict.fromkeys(FIGURES)
    late = figures(r, hold(TTFT_MS - 1.0, TTFT_MS + 0.5))
    assert late["ttft_ms"] is Withheld.CLIENT_HELD and late["decode_tok_s"] is Withheld.CLIENT_HELD
    assert late["e2el_ms"] is None
    # A record from before the read times were kept: reads are told apart by their stamps.
    old = dataclasses.replace(r, chunk_read_ns=())
    assert not any(stamps(old).early_ns)


def test_a_last_chunk_read_with_done_keeps_its_stamp_and_an_earlier_chunk_followed_in_its_read_does_not() -> None:
    # The usage chunk and [DONE] the server writes as it finishes the last token chunk: a hold
    # that joined them moves the stamp only by the server's gap between them.
    r = timeline(smooth(), followed=(TOKENS - 1,))
    last_ms = TTFT_MS + (TOKENS - 1) * GAP_MS
    assert figures(r, hold(last_ms - 3.0, last_ms + 1.0)) == dict.fromkeys(FIGURES)
    # A token chunk whose read went on to bring the start of the next token chunk: its stamp is
    # the later bytes', true only where no hold touches it.
    early = timeline(smooth(), followed=(0,))
    assert figures(early)["ttft_ms"] is None
    late = figures(early, hold(TTFT_MS - 1.0, TTFT_MS + 0.5))
    assert late["ttft_ms"] is Withheld.CLIENT_HELD and late["decode_tok_s"] is Withheld.CLIENT_HELD
    assert late["e2el_ms"] is None


# --------------------------------------------------------------------------- tokens per chunk


def test_decode_and_tpot_rest_on_the_server_s_token_counts_where_it_gives_them() -> None:
    # Two tokens a chunk at 2.5 ms a token: a chunk every 5 ms, the first one of two tokens.
    reads = [(TTFT_MS + i * 5.0, TTFT_MS + i * 5.0 + 0.05, 1) for i in range(8)]
    counted = timeline(reads, counts=tuple(2 * (i + 1) for i in range(8)))
    assert counted.decode_tok_s == pytest.approx(14 / 0.035) == pytest.approx(1000 / GAP_MS)
    assert counted.tpot_ms == pytest.approx(GAP_MS)
    assert counted.tokens_per_chunk_max == 2
    # Without counts, bench serve's assumption (one token in the first chunk) reads 15 tokens.
    uncounted = dataclasses.replace(counted, chunk_tokens=())
    assert uncounted.decode_tok_s == pytest.approx(15 / 0.035) and uncounted.tokens_per_chunk_max is None
    run = window([counted, dataclasses.replace(uncounted, request_id="u")])
    assert (run.coverage.stream.counted_requests, run.coverage.stream.tokens_per_chunk_max) == (1, 2)
    # A first chunk that held every token leaves no decode: the server's.
    assert figures(timeline([(20.0, 20.05, 1), (22.0, 22.05, 1)], tokens=2, counts=(2, 2)))["decode_tok_s"] \
        is Withheld.ONE_READ


# --------------------------------------------------------------------------- holds, counts, the window's bound


def test_holds_reach_back_to_when_the_loop_last_ran_and_touch_with_the_probe_s_slack() -> None:
    # Readings due at 10, 22 and 100 ms ran at 20, 30 and 101: the loop may not have run since an
    # interval before each was due (the reading then due was on time).
    holds = Holds([(10 * MS, 20 * MS), (22 * MS, 30 * MS), (100 * MS, 101 * MS)])
    slack, interval = HOLD_SLACK_MS, LOOP_PROBE_INTERVAL_MS
    assert holds.touch(int((10 - interval) * MS)) and holds.touch(21 * MS) and holds.touch(int((30 + slack) * MS))
    assert not holds.touch(int((10 - interval) * MS) - 1) and not holds.touch(int((30 + slack) * MS) + 1)
    assert not holds.touch(50 * MS) and holds.touch(99 * MS)
    # A read at 99.5 ms shows the loop running then: the hold starts there, not an interval back.
    after_a_read = Holds([(100 * MS, 101 * MS)], ran_ns=[int(99.5 * MS)])
    assert not after_a_read.touch(99 * MS) and after_a_read.touch(int(99.5 * MS))
    assert not NO_HOLDS and holds
    assert LOOP_PROBE_INTERVAL_MS == PROBE_INTERVAL_S * 1000
    assert HOLD_MIN_LATENCY_S < PROBE_INTERVAL_S


def test_a_failed_request_gives_no_figure_and_an_unknown_figure_is_refused() -> None:
    r = timeline(smooth(), ok=False)
    assert set(figures(r).values()) == {Withheld.FAILED}
    with pytest.raises(ValueError, match="'output_throughput' is not a per-request figure"):
        withheld("output_throughput", r, stamps(r))


def test_a_window_held_past_its_bound_is_the_client_s_with_its_counts_and_round_trips() -> None:
    held = [timeline([(TTFT_MS + GAP_MS, 24.0, 2)] + smooth()[2:], request_id=str(i)) for i in range(3)]
    clean = [timeline(smooth(start_ms=1000.0), request_id=str(i + 3)) for i in range(3)]
    run = window([*held, *clean], holds=((18.0, 24.0),), loop_max_ms=6.0)
    account = run.coverage
    decode = account.of("decode_tok_s")
    assert (decode.sent, decode.measured, decode.withheld, decode.lost_to_client) == (6, 3, {"client-held": 3}, 3)
    unfit = run.unmeasured(["decode_tok_s", "e2el_ms"])
    assert isinstance(unfit, Unmeasured) and [loss.figure for loss in unfit.losses] == ["decode_tok_s"]
    assert cause_of(unfit) is InvalidCause.CLIENT_HELD and descheduled(run)
    assert say_invalid(unfit) == ("unmeasured: the client was held off the CPU (its loop ran up to 6.0 ms late) while "
                                  "more than 25% of the window's stamps were taken: decode_tok_s lost for 3 of 6 requests")
    assert Coverage.from_json(json.loads(json.dumps(account.to_json()))) == account
    assert run.summary().to_json()["measured"] == account.to_json()
    assert dataclasses.replace(run, bounds=HealthBounds(max_unmeasured_fraction=1.0)).unmeasured(["decode_tok_s"]) is None
    # A report of an earlier version: its reasons read as themselves, none of them the client's.
    old = Coverage.from_json({"figures": {"decode_tok_s": {"sent": 4, "measured": 2, "withheld": {"burst": 2}}}})
    assert old.of("decode_tok_s").lost_to_client == 0 and old.stream.requests == 0


def test_a_late_loop_over_stamps_it_never_touched_is_not_client_bound_but_over_https_it_is() -> None:
    clean = [timeline(smooth(start_ms=1000.0 * i), request_id=str(i)) for i in range(8)]
    late = dataclasses.replace(HEALTHY, loop_latency_ms=(0.02,) * 95 + (450.0,) * 5,
                               loop_holds_ns=((int(500.5 * MS), int(950 * MS)),))
    kernel = dataclasses.replace(run_of(RoundResult(records=tuple(clean), wall_s=1.0, health=(late,))),
                                 load={"kind": "single-stream", "timing": "kernel"})
    assert kernel.valid and not descheduled(kernel)
    assert not dataclasses.replace(kernel, load={"kind": "single-stream", "timing": "event-loop"}).valid


def test_max_unmeasured_fraction_is_a_share_of_the_windows_requests() -> None:
    for bad in (0, -0.1, 1.5, "0.5"):
        with pytest.raises(ConfigError, match="HealthBounds.max_unmeasured_fraction="):
            HealthBounds(max_unmeasured_fraction=bad)  # type: ignore[arg-type]
    assert HealthBounds(max_unmeasured_fraction=1).max_unmeasured_fraction == 1


def test_a_window_the_client_s_holds_spoiled_is_measured_again_and_a_server_s_stall_is_not() -> None:
    unbounded = dataclasses.replace(TINY_CPU, host_bounds=MappingProxyType(
        {f.name: "none" for f in dataclasses.fields(HostBounds) if f.name != "forbidden_throttle_reasons"}))
    server = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="default",
                          log_path=None)
    spoiled = [timeline([(TTFT_MS + GAP_MS, 24.0, 2)] + smooth()[2:], request_id=str(i)) for i in range(4)]
    stalled = [timeline(stall_then_burst(), request_id=str(i)) for i in range(4)]
    played: list[int] = []

    def play(attempt: int) -> RunResult:
        played.append(attempt)
        return window(spoiled if attempt == 0 else stalled, holds=((18.0, 24.0),) if attempt == 0 else ())

    watched = measure_watched(play, server, unbounded)
    assert played == [0, 1] and watched.run.coverage.of("decode_tok_s").measured == 4
    (why,) = watched.measured_again
    assert isinstance(why, Unmeasured)
    assert say_measured_again(why) == ("unmeasured: the client was held off the CPU (its loop ran up to 0.1 ms late) while more than 25% "
                   "of the window's stamps were taken: decode_tok_s lost for 4 of 4 requests; tpot_ms lost for 4 of 4 "
                   "requests; ttft_ms lost for 4 of 4 requests")
    # The stalled server's window is kept at once: its stall is the finding.
    played.clear()
    assert measure_watched(lambda attempt: play(attempt + 1), server, unbounded).measured_again == []
    assert played == [1]


def test_a_floor_that_finds_no_decode_figure_says_what_became_of_every_request_sent() -> None:
    from pytest_kimiperf.judge.notes import NoDecode, note_from_json
    from pytest_kimiperf.reports.sentences import note_text

    note = NoDecode(20, (("one-read", 12), ("client-held", 8)))
    assert note_text(note) == ("single-stream decode: none of the 20 requests sent gave a decode figure (12 the server "
                               "wrote whole in one read, 8 whose stamps the client's hold spoiled)")
    assert note_from_json(json.loads(json.dumps(note.to_json()))) == note  # as xdist and the JSON report carry it
    assert note_text(NoDecode()) == "single-stream decode: no valid request to measure"  # a report from before the counts
