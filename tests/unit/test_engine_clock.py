"""The engine's clock beside the client's (judge/engine_clock.py): its change over the boots is
symmetric in the sides, it only ever withdraws a sign, and the profiles it applies to are those
that reach the engine's workers alone."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kimiperf.judge.engine_clock import engine_change, engine_only

boots = st.lists(st.floats(min_value=10.0, max_value=1000.0, allow_nan=False), min_size=1, max_size=6)


# Derandomized, no deadline: the same examples on every run, whatever the host's speed.
@settings(derandomize=True, deadline=None, database=None)
@given(boots, boots)
def test_swapping_the_sides_mirrors_the_engines_change_and_its_interval(current: list[float],
                                                                        reference: list[float]) -> None:
    ahead, back = engine_change("f", current, reference), engine_change("f", reference, current)
    assert ahead is not None and back is not None
    assert math.isclose(math.log1p(ahead.change), -math.log1p(back.change), abs_tol=1e-9)
    assert ahead.beyond_zero == -back.beyond_zero
    if ahead.low is not None and ahead.high is not None and back.low is not None and back.high is not None:
        assert math.isclose(math.log1p(ahead.low), -math.log1p(back.high), abs_tol=1e-9)


def test_one_boot_a_side_has_no_interval_and_so_places_nothing() -> None:
    change = engine_change("f", [100.0], [50.0])
    assert change is not None and change.low is None and change.beyond_zero == 0
    assert engine_change("f", [], [50.0]) is None


def test_only_variables_that_reach_the_engines_workers_alone_make_a_profile_engine_only() -> None:
    ring = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    assert engine_only(ring, {}) and engine_only({}, ring)
    assert engine_only({"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, {})
    assert not engine_only({**ring, "VLLM_USE_V1": "1"}, {})  # reaches the API server too
    assert not engine_only(ring, {}, ["--max-num-seqs", "8"], [])  # a server argument
    assert not engine_only(ring, ring)  # no difference: nothing to place


# --- where the client's change lives: the engine's part and the part outside it, in ms --------

import dataclasses  # noqa: E402

from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary, EngineBoot  # noqa: E402
from pytest_kimiperf.judge.engine_clock import (  # noqa: E402
    MATERIAL_SHARE, TwoClocks, UnplacedWhy, ChangeLocation, claimed_ms_sign, on_two_clocks, place,
)
from pytest_kimiperf.judge.stats import Comparison, VerdictLeaning, VerdictKind, compare_boots  # noqa: E402
from pytest_kimiperf.reports.sentences import note_text  # noqa: E402

_TEMPLATE = compare_boots([BootSummary(100.0, 20, 0.01)] * 3, [BootSummary(100.0, 20, 0.01)] * 3,
                          direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, prior_spread=0.01)
_DIRECTION = {"decode_tok_s": Direction.HIGHER_IS_BETTER, "tpot_ms": Direction.LOWER_IS_BETTER,
              "ttft_ms": Direction.LOWER_IS_BETTER}


def _client(metric: str, verdict: VerdictKind, worse: bool, size: float = 0.1) -> Comparison:
    """A comparison of ``metric`` stating ``verdict``, its estimate on the worse side or the better."""
    direction = _DIRECTION[metric]
    gain = -size if worse else size
    change = gain if direction is Direction.HIGHER_IS_BETTER else -gain
    return dataclasses.replace(_TEMPLATE, direction=direction, verdict=verdict, change=change)


def _mirrored(c: Comparison) -> Comparison:
    flip = {VerdictKind.REGRESSION: VerdictKind.IMPROVEMENT, VerdictKind.IMPROVEMENT: VerdictKind.REGRESSION}
    return dataclasses.replace(c, verdict=flip.get(c.verdict, c.verdict), change=1.0 / (1.0 + c.change) - 1.0)


def _boots(figure: str, pairs: list[tuple[float, float]]) -> list[EngineBoot]:
    """Boots of (client ms, engine ms) of ``figure``."""
    if figure == "tpot":
        return [EngineBoot(engine_tpot_ms=e, client_tpot_ms=c) for c, e in pairs]
    return [EngineBoot(engine_ttft_ms=e, client_ttft_ms=c) for c, e in pairs]


_FIGURE = {"decode_tok_s": "tpot", "tpot_ms": "tpot", "ttft_ms": "ttft"}
# A boot: the engine's ms and the part outside it (the client's is their sum).
_boot = st.tuples(st.floats(5.0, 50.0), st.floats(0.0, 20.0))
_side = st.lists(_boot, min_size=1, max_size=6)
_metric = st.sampled_from(sorted(_FIGURE))
_verdict = st.sampled_from(list(VerdictKind))


def _pairs(side: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(engine + outside, engine) for engine, outside in side]


@settings(derandomize=True, deadline=None, database=None, max_examples=300)
@given(_metric, _verdict, st.booleans(), _side, _side)
def test_swapping_the_sides_mirrors_the_words(metric: str, verdict: VerdictKind, worse: bool,
                                              current: list[tuple[float, float]],
                                              reference: list[tuple[float, float]]) -> None:
    figure, client = _FIGURE[metric], _client(metric, verdict, worse)
    ahead = place(metric, client, _boots(figure, _pairs(current)), _boots(figure, _pairs(reference)))
    back = place(metric, _mirrored(client), _boots(figure, _pairs(reference)), _boots(figure, _pairs(current)))
    assert ahead is not None and back is not None
    assert (ahead.where, ahead.why) == (back.where, back.why)
    if ahead.client_ms is not None and back.client_ms is not None:
        assert math.isclose(ahead.client_ms, -back.client_ms, abs_tol=1e-9)
    for mine, theirs in ((ahead.engine, back.engine), (ahead.outside, back.outside)):
        if mine is not None and theirs is not None:
            mirrored = theirs.mirrored()
            assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in
                       ((mine.ms, mirrored.ms), (mine.low, mirrored.low), (mine.high, mirrored.high)))


@settings(derandomize=True, deadline=None, database=None, max_examples=300)
@given(_metric, st.sampled_from([VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT, VerdictKind.CHANGED_SIZE_UNRESOLVED]),
       st.booleans(), _side, _side, st.floats(0.01, 30.0))
def test_growing_the_part_outside_the_engine_never_makes_it_the_engines(
        metric: str, verdict: VerdictKind, worse: bool, current: list[tuple[float, float]],
        reference: list[tuple[float, float]], more_ms: float) -> None:
    figure, client = _FIGURE[metric], _client(metric, verdict, worse)
    sign = claimed_ms_sign(client)
    before = place(metric, client, _boots(figure, _pairs(current)), _boots(figure, _pairs(reference)))
    grown = [(engine, outside + sign * more_ms) for engine, outside in current]
    after = place(metric, client, _boots(figure, _pairs(grown)), _boots(figure, _pairs(reference)))
    assert before is not None and after is not None
    # A change the client's own means did not show is unplaced whatever the engine did; from
    # every other reading, more time outside the engine never hands the change to the engine.
    if before.where is not ChangeLocation.ENGINE and before.why is not UnplacedWhy.MEANS_DISAGREE:
        assert after.where is not ChangeLocation.ENGINE, (before, after)
    if before.where is ChangeLocation.OUTSIDE:
        assert after.where is ChangeLocation.OUTSIDE


@settings(derandomize=True, deadline=None, database=None, max_examples=300)
@given(_metric, _verdict, st.booleans(), _side, _side)
def test_the_words_never_state_a_sign_the_clients_comparison_did_not(
        metric: str, verdict: VerdictKind, worse: bool, current: list[tuple[float, float]],
        reference: list[tuple[float, float]]) -> None:
    figure, client = _FIGURE[metric], _client(metric, verdict, worse)
    clocks = place(metric, client, _boots(figure, _pairs(current)), _boots(figure, _pairs(reference)))
    assert clocks is not None
    words = note_text(clocks)
    if client.claim is VerdictLeaning.NEITHER:
        assert clocks.where is ChangeLocation.NO_CLAIM
        assert "client" not in words and "the engine's" not in words and "outside the engine" not in words
        return
    sign = "+" if claimed_ms_sign(client) > 0 else "-"
    other = "-" if sign == "+" else "+"
    assert f"client {other}" not in words and f"client TTFT {other}" not in words, words
    if clocks.client_ms is not None:
        assert words.startswith((f"client {sign}", f"client TTFT {sign}")), words


def _gate_client(metric: str) -> Comparison:
    return _client(metric, VerdictKind.REGRESSION, worse=True)


def test_the_engine_accounting_for_the_change_says_the_engines() -> None:
    # client +8.1 ms a token, the engine +7.9: the engine's (decode fell).
    current = [(17.8 + d + o, 17.8 + d) for d, o in ((-0.1, 0.25), (0.0, 0.15), (0.1, 0.2))]
    reference = [(9.9 + d + o, 9.9 + d) for d, o in ((-0.05, 0.02), (0.0, -0.01), (0.05, -0.01))]
    clocks = place("decode_tok_s", _gate_client("decode_tok_s"), _boots("tpot", current), _boots("tpot", reference))
    assert clocks is not None and clocks.where is ChangeLocation.ENGINE
    assert note_text(clocks).startswith("client +8.1 ms a token, engine +7.9 (")
    assert note_text(clocks).endswith(": the engine's")


def test_a_small_engine_change_beside_a_large_one_outside_says_outside_the_engine() -> None:
    # client TTFT +50 ms, engine queue+prefill +1 ms (beyond zero, but far from a material share).
    current = [(150.0 + d, 31.0 + d / 10) for d in (-2.0, 0.0, 2.0)]
    reference = [(100.0 + d, 30.0 + d / 10) for d in (-2.0, 0.0, 2.0)]
    clocks = place("ttft_ms", _gate_client("ttft_ms"), _boots("ttft", current), _boots("ttft", reference))
    assert clocks is not None and clocks.where is ChangeLocation.OUTSIDE
    assert clocks.engine is not None and clocks.engine.low > 0  # the engine did move, by 1 ms of 50
    assert clocks.engine.ms < MATERIAL_SHARE * 50.0
    assert note_text(clocks).startswith("client TTFT +50.0 ms, engine queue+prefill +1.0 ms (")
    assert note_text(clocks).endswith(": outside the engine (API server, network or client)")


def test_two_boots_a_side_place_nothing_whatever_the_figures() -> None:
    # Welch's 1-2 degrees of freedom: one stalled request on one boot widens it past zero.
    current, reference = [(18.0, 17.8), (18.4, 17.9)], [(9.9, 9.9), (10.1, 10.0)]
    clocks = place("decode_tok_s", _gate_client("decode_tok_s"), _boots("tpot", current), _boots("tpot", reference))
    assert clocks is not None and (clocks.where, clocks.why) == (ChangeLocation.UNPLACED, UnplacedWhy.FEW_DF)
    assert "unplaced: 2 vs 2 boots give" in note_text(clocks) and "too few to place it (more than 2)" in note_text(clocks)


def test_an_nccl_only_profile_whose_engine_did_not_move_loses_its_sign_and_the_verdict_says_so() -> None:
    client = _gate_client("decode_tok_s")
    unmoved = [(12.0 + d, 10.0 + d / 10) for d in (-0.1, 0.0, 0.1)]
    reference = [(10.0 + d, 10.0 + d / 10) for d in (-0.1, 0.0, 0.1)]
    withdrawn = on_two_clocks("decode_tok_s", client, _boots("tpot", unmoved), _boots("tpot", reference),
                              engine_only_profile=True, reference_name="default")
    assert withdrawn.verdict is VerdictKind.INCONCLUSIVE
    note = next(n for n in withdrawn.notes if isinstance(n, TwoClocks))
    assert note.withdrawn and "sign withdrawn: this profile differs from default only in" in note_text(note)
    # Another profile (not engine-only) keeps the client's verdict: a slower API server is a slower build.
    kept = on_two_clocks("decode_tok_s", client, _boots("tpot", unmoved), _boots("tpot", reference),
                         engine_only_profile=False)
    assert kept.verdict is VerdictKind.REGRESSION
    # An engine that moved with the client keeps the sign, NCCL-only or not.
    moved = [(12.0 + d, 11.9 + d / 10) for d in (-0.1, 0.0, 0.1)]
    assert on_two_clocks("decode_tok_s", client, _boots("tpot", moved), _boots("tpot", reference),
                         engine_only_profile=True).verdict is VerdictKind.REGRESSION


def test_a_boot_keeps_its_two_clocks_through_json() -> None:
    boot = EngineBoot(10.0, 30.0, 10.4, 55.0, 20.0, 2540.0, "0.32.0")
    assert EngineBoot.from_json(boot.to_json()) == boot
    assert EngineBoot.from_json({}) == EngineBoot()
