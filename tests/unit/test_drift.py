"""A drift that adds up fails against the anchor, however slowly it comes; quiet nights do not."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime, timedelta

import pytest

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from benchmarks.nightly import drift_tonight

SPREADS = Spreads(0.01, 0.01)
WOBBLE = (0.004, -0.006, 0.002, -0.001, 0.005, -0.004, 0.0, 0.003, -0.002, -0.003)  # a quiet night's session


def night(level: float, name: str) -> list[BootSummary]:
    return [BootSummary(median=100.0 * math.exp(level + d), n=20, se_log=0.003, session=name, host="h")
            for d in (-0.004, 0.004)]


ANCHOR = night(0.0, "anchor-1") + night(0.002, "anchor-2")


def series(per_night: float, count: int) -> list[list[BootSummary]]:
    return [night(math.log1p(per_night) * t + WOBBLE[t % len(WOBBLE)], f"n{t}") for t in range(1, count + 1)]


def first_failure(per_night: float, count: int, direction: Direction = Direction.HIGHER_IS_BETTER) -> int | None:
    nights = series(per_night, count)
    if direction is Direction.LOWER_IS_BETTER:
        nights = [[BootSummary(1.0 / b.median, b.n, b.se_log, session=b.session, host=b.host) for b in n]
                  for n in nights]
    anchor = ANCHOR if direction is Direction.HIGHER_IS_BETTER else [
        BootSummary(1.0 / b.median, b.n, b.se_log, session=b.session, host=b.host) for b in ANCHOR]
    for t in range(1, count + 1):
        d = drift_tonight(anchor, nights[:t - 1], nights[t - 1], direction=direction, tolerance=0.03, spreads=SPREADS)
        if d is not None and d.failed:
            return t
    return None


@pytest.mark.parametrize("per_night", [-0.0005, -0.001, -0.0025])
def test_a_drift_that_adds_up_to_the_tolerance_fails_before_twice_the_tolerance(per_night: float) -> None:
    twice = math.log(0.94) / math.log1p(per_night)  # nights until the drift totals -6%
    first = first_failure(per_night, int(twice) + 5)
    assert first is not None and first < twice
    # ... and not before the drift is of the tolerance's order: a quiet wobble is no drift.
    assert math.expm1(math.log1p(per_night) * first) < -0.015


def test_quiet_nights_never_fail_and_a_drift_of_a_latency_fails_alike() -> None:
    assert first_failure(0.0, 150) is None
    assert first_failure(-0.0025, 30) == first_failure(-0.0025, 30, Direction.LOWER_IS_BETTER)


def test_before_a_night_is_appended_there_is_no_drift_test() -> None:
    # The gate against the history's window is then the whole test (history.drift_of_entry).
    assert drift_tonight(ANCHOR, [], night(-0.2, "n1"), direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                         spreads=SPREADS) is None


def test_the_cumulative_change_is_the_lines_and_its_bound_lies_in_the_builds_favour() -> None:
    nights = series(-0.001, 60)
    d = drift_tonight(ANCHOR, nights[:-1], nights[-1], direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                      spreads=SPREADS)
    assert d is not None and d.nights == 60 and d.change == pytest.approx(-0.06, abs=0.01) and d.bound > d.change and d.failed


# --- wired: the baseline file keeps the anchor and the nights, the gate judges them ------------

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from pytest_kimiperf.errors import BaselineError  # noqa: E402
from pytest_kimiperf.judge import baselines  # noqa: E402
from pytest_kimiperf.judge import stats as boots  # noqa: E402
from pytest_kimiperf.judge.baselines import AppendedNight  # noqa: E402
from pytest_kimiperf.storage.baselines import parse_baseline  # noqa: E402
from pytest_kimiperf.judge.baselines import LoadedBaselines, append_history  # noqa: E402
from pytest_kimiperf.storage import baselines as storage  # noqa: E402
from pytest_kimiperf.storage.baselines import load_baselines  # noqa: E402
from pytest_kimiperf.judge.history import drift_of_entry  # noqa: E402
from pytest_kimiperf.judge.baselines import Fingerprint  # noqa: E402
from pytest_kimiperf.judge.gate import BootRun, GateRules, judge  # noqa: E402
from pytest_kimiperf.judge.notes import Drifted  # noqa: E402
from pytest_kimiperf.judge.verdicts import TestResult  # noqa: E402
from pytest_kimiperf.reports.sentences import note_text  # noqa: E402

FP = Fingerprint(hard={"gpu.count": "0", "cpu.model": "test", "cpu.cores": "2"}, soft={})
TEST = "t.py::test"
RULES = GateRules(tolerances={"decode_tok_s": 0.05}, decode_floor_tok_s=1.0, decode_target_tok_s=1.0,
              spreads=Spreads(0.01, 0.01), boots=2, max_boots=2)


def _samples(level: float, rng: np.random.Generator) -> list[float]:
    return list(100.0 * math.exp(level) * rng.lognormal(0.0, 0.01, 20))


def _entry(levels: list[float], rng: np.random.Generator, minute: int) -> baselines.BaselineEntry:
    per_boot = [_samples(level, rng) for level in levels]
    return baselines.make_entry(test=TEST, profile="default", metric="decode_tok_s", unit="tok/s",
                                direction=Direction.HIGHER_IS_BETTER, samples=per_boot[-1], git_commit=None,
                                profile_env={}, boot_samples=per_boot,
                                recorded_at=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=minute))


def _history(tmp_path: Path, per_night: float, nights: int) -> tuple[LoadedBaselines, float]:
    """A deliberate recording of 2 sessions x 2 boots, then ``nights`` passing runs of 2 boots
    appended on pass, drifting by ``per_night``; the view and the level the drift has reached."""
    rng = np.random.default_rng(11)
    path = storage.baseline_path(tmp_path, "tiny-cpu", FP.key)
    for session in range(2):
        storage.update_baseline(path, "tiny-cpu", FP, [_entry([0.0, 0.0], rng, session)])
    level = 0.0
    for night in range(1, nights + 1):
        level = math.log1p(per_night) * night + rng.normal(0.0, 0.005)
        storage.update_baseline(path, "tiny-cpu", FP, [_entry([level, level], rng, 10 + night)], on_pass=True)
    return load_baselines(tmp_path, "tiny-cpu", FP), math.log1p(per_night) * (nights + 1)


def _run_tonight(view: LoadedBaselines, level: float, rules: GateRules = RULES) -> TestResult:
    rng = np.random.default_rng(5)
    earlier = boots.TestBoots()
    result = None
    for boot in (1, 2):
        shell = TestResult(test=TEST, nodeid=f"{TEST}[default]", profile="default", deployment="tiny-cpu",
                           scenario="single_stream", boot=boot)
        judged = judge(shell, ["decode_tok_s"], BootRun(samples={"decode_tok_s": _samples(level, rng)}, requests=20),
                       rules, baselines=view, earlier=earlier)
        assert judged.recorded is not None
        earlier.add(boot, judged.recorded)
        result = judged.result
    assert result is not None
    return result


def test_the_file_keeps_the_anchor_and_one_night_per_passing_run(tmp_path: Path) -> None:
    view, _ = _history(tmp_path, 0.0, 12)
    file = view.file()
    assert file is not None
    [entry] = file.entries.values()
    assert len(entry.boots) == baselines.HISTORY_BOOTS  # the window moved on ...
    assert len(entry.anchor) == 4 and {b.recorded_at[:16] for b in entry.anchor} == {
        "2026-11-01T00:00", "2026-11-01T00:01"}  # ... the anchor (both sessions of the recording) did not
    assert len(entry.nights) == 12 and all(n.boots == 2 for n in entry.nights)
    assert parse_baseline(file.path, file.path.read_text()) == file


def test_a_deliberate_recording_starts_afresh_and_a_file_without_anchor_takes_its_window() -> None:
    rng = np.random.default_rng(3)
    legacy = _entry([0.0, 0.0], rng, 0)
    legacy = dataclasses.replace(legacy, anchor=(), nights=())
    grown = append_history(legacy, _entry([0.0], rng, 1), on_pass=True)
    assert grown.anchor == legacy.boots and len(grown.nights) == 1
    recorded = append_history(grown, _entry([0.0, 0.0], rng, 2))
    assert recorded.anchor == recorded.boots[-2:] and recorded.nights == ()
    other_env = dataclasses.replace(_entry([0.0], rng, 3), profile_env={"NCCL_PROTO": "LL"})
    assert append_history(grown, other_env, on_pass=True).nights == ()


@pytest.mark.parametrize("field, value, says", [
    ("nights", [{"median": -1, "boots": 2}], r"nights\[0\]\.median must be a number > 0"),
    ("nights", [{"median": 10.0, "boots": 0}], r"nights\[0\]\.boots must be an integer >= 1"),
    ("nights", {"median": 10.0}, r"nights must be a list"),
    ("anchor", [{"median": 10.0, "n": "x"}], r"anchor\[0\]\.n must be an integer >= 1"),
])
def test_a_damaged_anchor_or_night_names_the_field(tmp_path: Path, field: str, value: object, says: str) -> None:
    view, _ = _history(tmp_path, 0.0, 1)
    file = view.file()
    assert file is not None
    data = json.loads(file.path.read_text())
    [raw] = data["entries"].values()
    raw[field] = value
    with pytest.raises(BaselineError, match=says):
        parse_baseline(file.path, json.dumps(data))


def test_nights_without_an_anchor_are_refused(tmp_path: Path) -> None:
    view, _ = _history(tmp_path, 0.0, 1)
    file = view.file()
    assert file is not None
    data = json.loads(file.path.read_text())
    [raw] = data["entries"].values()
    del raw["anchor"]
    with pytest.raises(BaselineError, match="nights without an anchor"):
        parse_baseline(file.path, json.dumps(data))


def test_a_drift_that_passed_every_night_fails_the_gate_against_its_anchor(tmp_path: Path) -> None:
    view, level = _history(tmp_path, -0.0025, 30)  # -7.2% in all; each night within 5% of its window
    result = _run_tonight(view, level)
    [comparison] = [m.baseline for m in result.metrics.values()]
    assert comparison is not None and comparison.verdict.value != "REGRESSION"  # the window followed it
    [drifted] = [f for f in result.failures if isinstance(f, Drifted)]
    assert drifted.nights == 31 and drifted.change < -0.05 and drifted.bound < 0
    assert note_text(drifted).startswith("DRIFT: decode -7.6% since the baseline was recorded (2026-11-01T00:01:00Z)")


def test_quiet_nights_and_a_fresh_recording_do_not_fail_on_drift(tmp_path: Path) -> None:
    view, level = _history(tmp_path, 0.0, 30)
    assert not [f for f in _run_tonight(view, level).failures if isinstance(f, Drifted)]
    # The drifted history recorded anew: the new level is the anchor, and nothing drifted since.
    drifted_view, drifted_level = _history(tmp_path / "d", -0.0025, 30)
    rng = np.random.default_rng(9)
    path = drifted_view.path
    storage.update_baseline(path, "tiny-cpu", FP, [_entry([drifted_level] * 2, rng, 100)])
    fresh = load_baselines(tmp_path / "d", "tiny-cpu", FP)
    file = fresh.file()
    assert file is not None and not next(iter(file.entries.values())).nights
    assert not [f for f in _run_tonight(fresh, drifted_level).failures if isinstance(f, Drifted)]


def test_the_drift_test_needs_a_night_and_a_usable_boot(tmp_path: Path) -> None:
    view, _ = _history(tmp_path, 0.0, 0)
    file = view.file()
    assert file is not None
    [entry] = file.entries.values()
    assert drift_of_entry(entry, [BootSummary(100.0, 20, 0.002)], tolerance=0.05, spreads=SPREADS) is None
    grown = dataclasses.replace(entry, nights=(AppendedNight(99.0, 2, "", None),))
    assert drift_of_entry(grown, [], tolerance=0.05, spreads=SPREADS) is None
    assert drift_of_entry(grown, [BootSummary(100.0, 20, 0.002)], tolerance=0.05, spreads=SPREADS) is not None


def test_a_spike_up_and_back_is_no_drift() -> None:
    # Found by Hypothesis (test_verdict_invariants.py, drift sign): an anchor at 100, a night at
    # +28%, then back at 100: the line through them falls -7%, but no figure was ever worse.
    spreads = Spreads(0.015625, 0.0, 0.0)
    anchor = [BootSummary(100.0, 20, 0.003, session="a", host="h")]
    nights = [[BootSummary(100.0 * math.exp(0.25), 20, 0.003, session="n1", host="h")],
              [BootSummary(100.0, 20, 0.003, session="n2", host="h")],
              [BootSummary(100.0, 20, 0.003, session="n3", host="h")]]
    d = drift_tonight(anchor, nights[:-1], nights[-1], direction=Direction.HIGHER_IS_BETTER, tolerance=0.0625,
                      spreads=spreads)
    assert d is not None and d.change < -0.0625 and d.bound < 0  # the line alone would fail it ...
    assert not d.failed  # ... tonight is no worse than the anchor


def test_a_night_moved_the_bad_way_never_widens_its_own_bound_and_clears_a_drift() -> None:
    # Found by the monotone property: with the night judged inside the residual spread, moving it
    # from +0.5 to +1.0 worse (log figure, a latency) widened the bound past zero and the drift
    # that had failed passed.
    from tests.unit.test_verdict_invariants import LOWER, DriftCase

    case = DriftCase(anchor=(-0.25,), nights=((0.0, 1), (0.0, 1), (0.0, 1)), tonight=(0.25,), direction=LOWER,
                     tolerance=0.25, spreads=Spreads(boot=0.125, session=0.0, host=0.0))
    judged = [case.judge(tonight=[x + by for x in case.tonight]) for by in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert all(drift.failed for drift in judged)
    assert [d.bound for d in judged] == sorted((d.bound for d in judged), reverse=True)
