"""What a window measured of what it sent: the shared-read rules (measure/coverage.py), their
counts on a run, and what the runner and the recorder do with a window that lost too many."""

from __future__ import annotations

import dataclasses
import json
from types import MappingProxyType

import pytest

from pytest_kimiperf.config.deployments import TINY_CPU, HealthBounds, HostBounds
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.measure.coverage import FIGURES, Coverage, HeldBy, Withheld, measured_gaps_ms, withheld
from pytest_kimiperf.measure.invalid_causes import InvalidCause
from pytest_kimiperf.measure.results import ProcessHealth, RoundResult, RunResult, Unmeasured
from pytest_kimiperf.measure.runner import cause_of, descheduled, measure_watched, say_invalid
from pytest_kimiperf.server.process import ServerHandle
from tests.unit.test_results import HEALTHY, record, run_of


def _withheld(figure: str, chunks_ms: list[float], tokens: int | None = None, ok: bool = True) -> Withheld | None:
    r = record(chunks_ms, tokens if tokens is not None else len(chunks_ms), ok=ok)
    return withheld(figure, ok=r.ok, output_tokens=r.output_tokens, chunk_ns=r.chunk_ns)


def test_a_gap_counts_only_where_its_later_chunk_ended_a_read_of_its_own() -> None:
    # Chunks 2-4 came in one read stamped at 30 ms (the last segment's arrival): the gap into
    # the read (10 -> 30) and the two inside it (0 ms) are the client's reads, not the server's gaps;
    # 30 -> 35 is true again (both stamps end their reads).
    stamps_ms = [10.0, 30.0, 30.0, 30.0, 35.0]
    ns = [int(t * 1_000_000) for t in stamps_ms]
    assert measured_gaps_ms(ns) == pytest.approx([5.0])
    assert measured_gaps_ms([int(t * 1_000_000) for t in (10.0, 15.0, 20.0)]) == pytest.approx([5.0, 5.0])


@pytest.mark.parametrize(("figure", "chunks_ms", "tokens", "why"), [
    ("ttft_ms", [20.0, 25.0, 30.0], None, None),
    ("ttft_ms", [20.0, 20.0, 30.0], None, Withheld.FIRST_READ_SHARED),  # the first chunk's stamp is the read's
    ("e2el_ms", [20.0, 30.0, 30.0], None, None),  # the last stamp of a read is its own arrival
    ("decode_tok_s", [20.0, 25.0, 30.0, 30.0, 35.0, 40.0], None, None),  # 3 of 5 gaps measured: first and last stand
    ("decode_tok_s", [20.0, 20.0, 25.0, 30.0], None, Withheld.FIRST_READ_SHARED),
    ("decode_tok_s", [20.0, 30.0, 30.0, 30.0], None, Withheld.BURST),  # most of the stream in one read
    ("decode_tok_s", [20.0, 20.0, 20.0], None, Withheld.BURST),  # the whole stream in one read
    ("decode_tok_s", [20.0], 5, Withheld.BURST),  # five tokens in one chunk
    ("decode_tok_s", [20.0], 1, Withheld.ONE_TOKEN),
    ("tpot_ms", [20.0, 20.0, 25.0, 30.0], None, Withheld.FIRST_READ_SHARED),
    ("itl_ms", [20.0, 20.0, 25.0, 30.0], None, None),  # its gaps 20->25 (no: 25 ends its read) hold
    ("itl_ms", [20.0, 30.0, 30.0, 30.0], None, Withheld.BURST),
    ("ttft_ms", [], 0, Withheld.NO_TOKEN),
])
def test_each_figure_is_withheld_exactly_where_the_stamps_it_rests_on_do_not_hold(
        figure: str, chunks_ms: list[float], tokens: int | None, why: Withheld | None) -> None:
    assert _withheld(figure, chunks_ms, tokens) is why


def test_a_failed_request_gives_no_figure_and_an_unknown_figure_is_refused() -> None:
    assert {_withheld(f, [20.0, 25.0], ok=False) for f in FIGURES} == {Withheld.FAILED}
    with pytest.raises(ValueError, match="'output_throughput' is not a per-request figure"):
        _withheld("output_throughput", [20.0, 25.0])


def test_a_run_accounts_for_every_request_and_its_samples_are_the_measured_ones() -> None:
    held = ProcessHealth(cpu_fraction=0.2, loop_latency_ms=(0.05,) * 99 + (40.0,), wall_s=1.0)
    records = (record([20.0, 25.0, 30.0], 3, request_id="a"), record([20.0, 20.0, 30.0], 3, request_id="b"),
               record([20.0, 20.0, 20.0], 3, request_id="c"), record([20.0], 3, ok=False, request_id="d"))
    run = run_of(RoundResult(records=records, wall_s=1.0, health=(held,)))
    account = run.coverage
    decode = account.of("decode_tok_s")
    assert (decode.sent, decode.measured) == (4, 1)
    assert decode.withheld == {"first-read-shared": 1, "burst": 1, "failed": 1}
    assert decode.lost_to_reads == 2
    assert len(run.samples("decode_tok_s")) == 1 and len(run.samples("e2el_ms")) == 3
    # 5 ms is the measured gap; the loop was 40 ms late: the client held the stream.
    assert account.held_by is HeldBy.CLIENT and account.gaps_measured == 3 and account.gaps_in_shared_reads == 3
    # The tail pools the measured gaps: b's 20 -> 30 ends its read; no 0 ms gap of a shared read.
    assert sorted(g for r in run.valid_records for g in r.measured_itl_ms) == pytest.approx([5.0, 5.0, 10.0])
    assert Coverage.from_json(account.to_json()) == account
    assert run.summary().to_json()["measured"] == account.to_json()
    # Two of three valid requests lost decode to their reads, past a quarter: unfit for decode.
    unfit = run.unmeasured(["decode_tok_s", "e2el_ms"])
    assert isinstance(unfit, Unmeasured) and [loss.figure for loss in unfit.losses] == ["decode_tok_s"]
    assert cause_of(unfit) is InvalidCause.CLIENT_HELD
    assert say_invalid(unfit) == (
        "unmeasured: more than 25% of the window's requests lost a figure to shared reads: decode_tok_s lost for 2 "
        "of 4 requests (1 whose first chunk came in one read with the next, 1 that came in bursts); the client was "
        "held off the CPU (its loop ran up to 40.0 ms late) while chunks queued")
    # The switch: a deployment that takes every loss keeps the window.
    assert dataclasses.replace(run, bounds=HealthBounds(max_unmeasured_fraction=1.0)).unmeasured(["decode_tok_s"]) is None


def test_a_server_that_wrote_in_bursts_is_named_and_a_late_loop_over_unshared_reads_is_not_client_bound() -> None:
    on_time = ProcessHealth(cpu_fraction=0.2, loop_latency_ms=(0.05, 0.2, 0.9), wall_s=1.0)
    bursts = tuple(record([20.0, 25.0, 30.0] if i % 2 else [20.0, 20.0, 20.0], 3, request_id=str(i)) for i in range(8))
    run = dataclasses.replace(run_of(RoundResult(records=bursts, wall_s=1.0, health=(on_time,))),
                              load={"kind": "single-stream", "timing": "kernel"})
    unfit = run.unmeasured(["ttft_ms"])
    assert unfit is not None and unfit.held_by is HeldBy.SERVER and cause_of(unfit) is InvalidCause.SERVER_BURSTS
    assert descheduled(run)  # measured again: a starved API server's burst may pass
    # Kernel stamps and no shared read: a loop 450 ms late at times spoiled no stamp.
    late = ProcessHealth(cpu_fraction=0.01, loop_latency_ms=(0.02,) * 95 + (450.0,) * 5, wall_s=1.0)
    clean = tuple(record([20.0, 25.0, 30.0], 3, request_id=str(i)) for i in range(8))
    kernel = dataclasses.replace(run_of(RoundResult(records=clean, wall_s=1.0, health=(late,))),
                                 load={"kind": "single-stream", "timing": "kernel"})
    assert kernel.valid and not descheduled(kernel)
    # Timed in the event loop (HTTPS), the same loop makes every stamp late.
    assert not dataclasses.replace(kernel, load={"kind": "single-stream", "timing": "event-loop"}).valid


def test_max_unmeasured_fraction_is_a_share_of_the_windows_requests() -> None:
    for bad in (0, -0.1, 1.5, "0.5"):
        with pytest.raises(ConfigError, match="HealthBounds.max_unmeasured_fraction="):
            HealthBounds(max_unmeasured_fraction=bad)  # type: ignore[arg-type]
    assert HealthBounds(max_unmeasured_fraction=1).max_unmeasured_fraction == 1


def test_a_window_that_lost_its_figures_is_measured_again_saying_why_and_the_next_one_is_kept() -> None:
    unbounded = dataclasses.replace(TINY_CPU, host_bounds=MappingProxyType(
        {f.name: "none" for f in dataclasses.fields(HostBounds) if f.name != "forbidden_throttle_reasons"}))
    server = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="default",
                          log_path=None)
    shared = tuple(record([20.0, 20.0, 30.0], 3, request_id=str(i)) for i in range(4))
    clean = tuple(record([20.0, 25.0, 30.0], 3, request_id=str(i)) for i in range(4))
    played: list[int] = []

    def play(attempt: int) -> RunResult:
        played.append(attempt)
        rnd = RoundResult(records=shared if attempt == 0 else clean, wall_s=1.0, health=(HEALTHY,))
        return dataclasses.replace(run_of(rnd), load={"kind": "single-stream", "timing": "kernel"})

    watched = measure_watched(play, server, unbounded)
    assert played == [0, 1] and watched.run.coverage.of("decode_tok_s").measured == 4
    (why,) = watched.measured_again
    assert why.startswith("unmeasured: more than 25% of the window's requests lost a figure to shared reads: "
                          "decode_tok_s lost for 4 of 4 requests (4 whose first chunk came in one read with the next)")
    assert why.endswith("the server wrote them together (a read joined more of its pace than the client's loop, at "
                        "most 0.1 ms late, could have held)")


def test_a_floor_that_finds_no_decode_figure_says_what_became_of_every_request_sent() -> None:
    from pytest_kimiperf.judge.notes import NoDecode, note_from_json
    from pytest_kimiperf.reports.sentences import note_text

    note = NoDecode(20, (("burst", 12), ("first-read-shared", 8)))
    assert note_text(note) == ("single-stream decode: none of the 20 requests sent gave a decode figure (12 that came "
                               "in bursts, 8 whose first chunk came in one read with the next)")
    assert note_from_json(json.loads(json.dumps(note.to_json()))) == note  # as xdist and the JSON report carry it
    assert note_text(NoDecode()) == "single-stream decode: no valid request to measure"  # a report from before the counts
