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
