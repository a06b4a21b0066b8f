"""Every note the gate can return crosses xdist as JSON and has its sentence (reports/sentences.py)."""

from __future__ import annotations

import json
import math

import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge import notes
from pytest_kimiperf.judge.history import AppendWhy, NotAppended
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.engine_clock import Part, TwoClocks, ChangeLocation
from pytest_kimiperf.judge.notes import floor_check
from pytest_kimiperf.judge.noise import CanaryCheck
from pytest_kimiperf.judge.noise import SpreadBeyond, SpreadsMisdeclared
from pytest_kimiperf.judge.stats import compare_boots
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, EnvDiff, MissingBaselines, VerdictNote
from pytest_kimiperf.reports.sentences import note_text


def _boots(*medians: float, session: str = "s") -> list[BootSummary]:
    return [BootSummary(median=m, n=20, se_log=0.002, session=session, host="h") for m in medians]


COMPARISON = compare_boots(_boots(90, 91), _boots(100, 101, 99, 100, 100, session="old"),
                           direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, prior_spread=0.01,
                           metric="decode", unit="tok/s")
SPREAD = notes.SpreadSource(notes.SpreadSource.FLOOR, "session", declared=0.01, measured=0.004, count=3)
LOOK = notes.ChangeSoFar("decode", -0.2, 1, 0.05)
BEYOND = SpreadBeyond("boot", 0.023, 0.01, 4.0, 6, "decode tok/s of single_stream_decode [ring-ll vs default]", 2e-5,
                      3, 10)
LINE = BaselineLine(BaselineState.JUDGED, "decode tok/s", COMPARISON, canary=CanaryCheck({"copy_gbs": -0.4}, True),
                    env=EnvDiff({"NCCL_PROTO": "LL"}, (), {}, ()),
                    left_out=notes.LeftOut(2, (notes.NoDecode(),)))

EVERY_KIND = [
    notes.SavedLine("a line"), notes.NeedsBoots(2), notes.TooFewSamples(300, 8, tail=True),
    notes.HistoryModes(7, 80.0, 3, 100.0),
    NotAppended(AppendWhy.NOT_COMPARABLE, "main", ("main",), test="t.py::t", profile="default",
                metric="decode_tok_s", gain=-0.02, tolerance=0.03, canary_moved=True),
    notes.HistoryStep(-0.041, 5.2, 6, 4, "2026-11-02T10:00:00+00:00", "abc1234", "2026-11-05T10:00:00+00:00", ""),
    notes.HistorySteps((notes.HistoryStep(0.05, 4.0, 3, 3, "a", "", "b", "c"),), 3), notes.DeclaredModes(0.5, 0.3), notes.BootsToDecide(None, 8, False),
    notes.BootsForWithin(4, 2, 8), notes.BootsForWithin(None, 2, 8),
    notes.LeftOut(1, (notes.InvalidRun("busy host"),)), notes.InvalidRun("busy host"),
    notes.FailedRequests(2, 10, (("HTTP 500", 2),), 0.1), notes.GoodputSlos((("tpot_ms", 5.0),)),
    notes.SloCheck("p99_itl_ms", "p99 ITL", 50.0, "ms", True, notes.SloCheck.MISSED, 61.0, 20, 3),
    notes.FloorNote(floor_check(30.0, 40.0, 50.0, "tok/s", "decode")), notes.NoDecode(), notes.BootPlanned(1, 3),
    notes.BootAsked("default", 2, (LOOK,)), notes.Unresolved((LOOK,), "remote", 2),
    notes.SoftFingerprint(("kernel: 6.8 -> 6.9",)), SPREAD,
    notes.Drifted("decode_tok_s", "decode tok/s", -0.041, -0.032, 17, 0.03, "2026-11-02T10:00:00Z"),
    notes.ResolvePlan(0.06, 0.01, 5, sessions=4, levels=(notes.LevelSpread("session", 0.01, SPREAD),)),
    LINE, VerdictNote(COMPARISON, notes.ResolvePlan(0.06, 0.01, 5, boots=4)), MissingBaselines((LINE,)),
    notes.HostWatched(2, 0.04, 0.0, psi=(("cpu_some", 0.12),), nodes=(("gpu-b", 0.01),), nodes_here=("gpu-a",),
                      remarks=("GPU 3's PCIe link ran at Gen4 x8 (Gen5 x16 possible)",)),
    notes.PrefixCacheReused(2048.0, 2400.0), notes.BootsBooked("decode tok/s", 2, ("default", "ring-ll"), 6),
    notes.MeasuredAgain(("unmeasured: decode_tok_s lost for 9 of 20 requests", "host busy: other processes used 40%")),
    BEYOND, SpreadsMisdeclared((BEYOND,), 20, 0.01, "kimi-k25-int4-tp8"),
    TwoClocks("tpot", ChangeLocation.OUTSIDE, client_ms=2.1, engine=Part(0.02, -0.1, 0.14, math.inf),
              outside=Part(2.08, 1.9, 2.3, 4.2), boots_current=3, boots_reference=3, engine_change=0.002,
              engine_low=-0.01, engine_high=0.014, withdrawn=True, reference="default"),
]


def test_the_list_holds_every_registered_kind() -> None:
    assert {type(n).kind for n in EVERY_KIND} == set(notes._KINDS)


@pytest.mark.parametrize("note", EVERY_KIND, ids=lambda n: type(n).kind)
def test_a_note_crosses_json_whole_and_is_said_the_same_on_both_sides(note: notes.Note) -> None:
    wire = json.loads(json.dumps(note.to_json(), allow_nan=False))
    back = notes.note_from_json(wire)
    assert type(back) is type(note)
    assert note_text(back) == note_text(note) and note_text(note).strip()


def test_what_the_measurement_saw_is_said_from_its_facts() -> None:
    watched = notes.HostWatched(2, 0.04, 0.005, psi=(("memory_some", 0.0), ("cpu_some", 0.12)),
                                nodes=(("gpu-b", 0.01),), nodes_here=("gpu-a",),
                                remarks=("GPU 3's PCIe link ran at Gen4 x8 (Gen5 x16 possible)",))
    assert note_text(watched) == (
        "host watch (2 attempt(s)): foreign CPU 4% of the host, steal 0%, PSI cpu some 12%, PSI memory some 0%; "
        "node gpu-b: foreign CPU 1%; node gpu-a: this machine, read above; "
        "GPU 3's PCIe link ran at Gen4 x8 (Gen5 x16 possible)")
    blind = notes.HostWatched(1, 0.0, 0.0, blind=("/proc/stat's cpu line did not advance",))
    assert note_text(blind) == "host watch (1 attempt(s)): /proc/stat's cpu line did not advance"
    assert note_text(notes.PrefixCacheReused(2048.0, 0.0)).startswith(
        "vLLM's prefix cache served 2048 prompt tokens of this run though its prompts are unique")
    assert note_text(notes.BootsBooked("decode tok/s", 2, ("default", "ring-ll"), 6)) == (
        "profiles: decode tok/s undecided at 2 boots a profile (within the tolerance or a direction, at this "
        "look's share of the error budget); boot 3 of default, ring-ll booked (at most 6)")


def test_a_comparison_keeps_its_notes_across_json() -> None:
    noted = COMPARISON.with_notes(notes.NeedsBoots(2))
    back = type(COMPARISON).from_dict(json.loads(json.dumps(noted.to_dict(), allow_nan=False)))
    assert back.notes == (notes.NeedsBoots(2),) and back.verdict is noted.verdict
    assert math.isclose(back.change, noted.change) and back.spread_source == noted.spread_source


def test_an_unknown_kind_is_named() -> None:
    with pytest.raises(ValueError, match="unknown note kind 'nope'; known: .*baseline"):
        notes.note_from_json({"kind": "nope"})
