"""The benchmarks that back the README's gate figures still run on the plugin's own code."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.helpers import BENCHMARKS


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _corpus(path: Path, *, sessions: int, boots: int, rng: np.random.Generator, session_sd: float = 0.03,
            boot_sd: float = 0.05) -> None:
    lines = []
    for s in range(sessions):
        effect = rng.normal(0, session_sd)
        for b in range(boots):
            medians = {"decode|decode_tok_s": 500.0, "ttft|ttft_ms": 40.0}
            metrics = {k: {"median": float(v * np.exp(effect + rng.normal(0, boot_sd))), "n": 20, "se_log": 0.001,
                           "cv": 0.05} for k, v in medians.items()}
            lines.append({"session": f"s{s}", "host": "h", "variant": "default", "boot": b + 1, "foreign_cpu": [0.01],
                          "invalid": [], "metrics": metrics, "canary": {"scores": {"python_mops": 22.0}}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_replay_judges_real_shaped_sessions_and_an_aa_pair_never_alarms(tmp_path: Path) -> None:
    gate_power = _load("gate_power")
    # Noise as the GPU deployment declares it (boot 1%, session 1%), judged by its rules: a shift of
    # twice its 3% tolerance is within reach of 3 sessions, as tiny-cpu's 25% would not be (its
    # 18% boot and 20% session spreads need about a 60% drop across sessions).
    _corpus(tmp_path / "c.jsonl", sessions=3, boots=4, rng=np.random.default_rng(0), session_sd=0.01, boot_sd=0.01)
    args = argparse.Namespace(corpus=tmp_path, max_foreign_cpu=0.1, replay_trials=20, history=8,
                              deployment="kimi-k25-int4-tp8")
    out = gate_power.replay(args)
    assert out["sessions"] == 3 and out["metrics"] == 2
    aa = [r for r in out["rows"] if r["shift_x_tolerance"] == 0.0]
    assert aa and all(r["sessions_alarmed"]["hits"] == 0 for r in aa)
    shifted = [r for r in out["rows"] if r["shift_x_tolerance"] == 2.0]
    assert all(r["regression_per_metric"]["hits"] > 0 for r in shifted)


def test_a_host_twice_as_slow_never_gets_a_directional_verdict_in_the_simulation() -> None:
    gate_power = _load("gate_power")
    noise = gate_power.Noise(0.01, 0.02, 0.005, history_sessions=10, host_factor=0.5)
    rules = gate_power.GateRules(0.03, gate_power.Spreads(0.01, 0.01, 0.02), 3)
    cell = gate_power.run_cell(noise, trials=5, history_boots=10, rules=rules, seed=1)
    assert cell.false_alarm_per_session.hits == 0 and cell.detect_2x.hits == 0


def test_the_profile_replay_splits_every_hosts_sessions_and_an_inert_split_gets_no_direction() -> None:
    # The committed corpus, as benchmarks/profile_power.py replays it: every host with a session
    # of 4+ accepted boots gets its A/A rows, judged by the summary's own function. 20 splits a
    # row: host 2380f952's boots of one quiet session spread 1.8x, so a doubling gets its
    # direction in about a quarter of its splits (4 of 20 here, 0 of the 4 that sufficed before).
    profile_power = _load("profile_power")
    rows = profile_power.replay_rows(20, "tiny-cpu", 0.10)
    hosts = {row.label.split(":")[0] for row in rows}
    assert {"host 4600bad4", "host 6ef3c830"} <= hosts
    aa = [row for row in rows if ", A/A, " in row.label]
    assert aa and all(row.directional == 0 for row in aa), [row.text() for row in aa]
    doubled = [row for row in rows if ", x2, 3 v 3" in row.label]
    assert doubled and all(row.directional > 0 for row in doubled), [row.text() for row in doubled]


def test_a_stepped_history_hides_a_regression_as_one_pool_and_not_as_its_last_segment() -> None:
    # The older half of the history 5% slower: pooled, its centre sits below the current level
    # and a regression of twice the tolerance reads as half of one.
    gate_power = _load("gate_power")
    rules = gate_power.GateRules(0.03, gate_power.Spreads(0.01, 0.01, 0.02), 3, boots=2)
    cells = [gate_power.run_cell(gate_power.Noise(0.01, 0.02, 0.005, session_sd=0.01, history_sessions=10,
                                                  history_boots=10, history_step=-0.05, segment=segment),
                                 trials=8, history_boots=10, rules=rules, seed=5)
             for segment in (True, False)]
    segmented, pooled = cells
    assert pooled.detect_2x.hits == 0
    assert segmented.detect_2x.value > 0.2


def test_nightly_appends_stop_at_a_failing_night(capsys: pytest.CaptureFixture[str]) -> None:
    gate_power = _load("gate_power")
    args = argparse.Namespace(tolerance=0.03, prior=0.01, session_prior=0.01, host_prior=0.02, max_boots=3,
                              drift=0.005, trials=1)
    rows = gate_power.append_nights(args)
    assert [(r["threat"], r["guard"]) for r in rows][:2] == [("none", "anchor"), ("none", "window")]
    step = next(r for r in rows if r["threat"].startswith("step") and r["guard"] == "anchor")
    assert step["first_failing_night_median"] == 5 and step["nights_failing"] > 0.8
    assert "history that grows itself" in capsys.readouterr().out


def test_the_calibration_runs_the_declared_shapes_under_each_critical_value_and_restores_the_gates() -> None:
    from pytest_kimiperf.judge import stats

    gate_power = _load("gate_power")
    args = argparse.Namespace(drift=0.005, trials=2, history=10, max_boots=3, tolerance=0.03, critical=[3.0, 9.0])
    cells = gate_power.calibration_cells(args)
    assert [c.label for c in cells] == [f"{truth}; history {k} x {n}" for truth in ("boot 1%", "boot 1%, session 1%")
                                        for k, n in ((1, 5), (3, 2), (10, 1), (20, 1))]
    kept = stats.GATE_CRITICAL
    rules = gate_power.GateRules(0.03, gate_power.Spreads(0.01, 0.01, 0.02), 3)
    out = gate_power.calibrate(args, rules)
    assert stats.GATE_CRITICAL == kept and set(out) == {"3", "9"}
    # Nine standard errors convict nothing a doubling of the tolerance gives with these spreads.
    assert all(row["detect_2x"]["hits"] == 0 for row in out["9"])


def test_the_mode_cells_judge_jointly_and_alone_and_a_run_always_in_the_slow_mode_is_convicted() -> None:
    gate_power = _load("gate_power")
    args = argparse.Namespace(drift=0.005)
    cells = gate_power.mode_cells(args)
    assert [(c.first_only, c.joint) for c in cells[:4]] == [(False, True), (False, False), (True, True), (True, False)]
    rules = gate_power.GateRules(0.03, gate_power.Spreads(0.01, 0.01, 0.02), 3, boots=2)
    always_slow = cells[-1]
    assert always_slow.current_slow_share == 1.0
    cell = gate_power.run_cell(always_slow, trials=3, history_boots=20, rules=rules, seed=1)
    # Every boot slow: convicted by the mode frequency where the history holds few slow boots, and
    # as a plain regression where it holds too few to split (seeded: the same sessions every run).
    assert cell.false_regression_per_session.hits >= 1
    # A change to decode alone counts only the decode metrics as the ones to detect.
    assert gate_power.first_metrics() == [0, 3, 4, 6, 8]


def test_the_suite_aa_run_counts_both_profiles_against_their_histories_and_against_each_other() -> None:
    suite_aa = _load("suite_aa")
    gate_power = sys.modules["gate_power"]
    from pytest_kimiperf.judge.profiles import InSessionRules

    world = gate_power.World(gate_power.Noise(0.01, 0.02, 0.005, session_sd=0.01, history_sessions=3,
                                              history_boots=6), np.random.default_rng(2))
    rules = gate_power.GateRules(0.03, gate_power.Spreads(0.01, 0.01, 0.02), 3, boots=2)
    runs = [suite_aa.suite_run(world, rules, 6, InSessionRules(boot_spread=0.01)) for _ in range(3)]
    # 2 profiles x the 10 gated metrics of gate_power's suite against their histories; seeded:
    # these three runs, unchanged and declared as they are, get no direction.
    assert all(comparisons == 2 * sum(gate_power.TESTS) == 20 for _, _, _, comparisons in runs)
    assert not any(gate or profile for gate, profile, _, _ in runs)


def test_the_declared_spread_cells_cover_every_truth_and_shape() -> None:
    declared_spreads = _load("declared_spreads")
    labels = [c.label for c in declared_spreads.cells()]
    assert len(labels) == 9 and labels[4] == "session 2% (declared 1%); 3 x 2"


def test_the_tools_paired_comparison_pairs_rounds_within_a_boot_and_swapping_sides_negates_it() -> None:
    compare_tools = _load("compare_tools")
    plugin = {(1, 1): 400.0, (1, 2): 440.0, (2, 1): 300.0, (2, 2): 330.0, (3, 1): 500.0}
    bench = {(1, 1): 500.0, (1, 2): 550.0, (2, 1): 375.0, (2, 2): 412.5, (4, 1): 600.0}
    pair = compare_tools.paired(plugin, bench)
    # Boots 1 and 2 (boot 3 and 4 have no pair): the same ratio on every round, whatever the boot's
    # level, so the boots agree exactly and the interval is the point.
    assert pair.per_boot == pytest.approx((np.log(0.8), np.log(0.8)))
    assert pair.sd == pytest.approx(0.0, abs=1e-12)
    assert pair.interval() == pytest.approx((np.log(0.8), np.log(0.8)))
    swapped = compare_tools.paired(bench, plugin)
    assert swapped.per_boot == pytest.approx(tuple(-d for d in pair.per_boot))
    assert np.isnan(compare_tools.paired({(1, 1): 1.0}, {(1, 1): 2.0}).interval()[0])


def test_the_tools_table_is_what_the_script_makes_from_the_committed_runs(capsys: pytest.CaptureFixture[str]) -> None:
    compare_tools = _load("compare_tools")
    assert compare_tools.main() == 0
    assert capsys.readouterr().out == (BENCHMARKS / "compare_tools.md").read_text()


def test_the_tools_targets_pass_a_small_steady_difference_and_fail_a_large_one() -> None:
    compare_tools = _load("compare_tools")
    bench = {(boot, r): 400.0 + 10 * boot + r for boot in (1, 2, 3) for r in (1, 2, 3)}

    def rows(ratio: float) -> list[str]:
        plugin = {key: value * ratio * (1 + 0.002 * key[0]) for key, value in bench.items()}
        figures = {1: {compare_tools.PLUGIN: {"decode_tok_s": plugin}, compare_tools.REFERENCE: {"decode_tok_s": bench}}}
        return [line for line in compare_tools._targets(figures) if line.startswith("| 1 |")]

    (close,) = rows(0.99)
    assert close.startswith("| 1 | decode tok/s | pytest-kimiperf | -0.6% | -1.1% to -0.1% | 3 |") and close.endswith("| met |")
    (far,) = rows(0.95)
    assert far.endswith("| not met |")


def test_the_truth_ttft_is_the_first_write_less_the_arrival_and_a_call_reads_back_as_its_command(tmp_path: Path) -> None:
    compare_tools = _load("compare_tools")
    truth = {"streams": [{"request_id": "a", "t_arrival_ns": 1_000_000, "write_ns": [21_500_000]},
                         {"request_id": "b", "t_arrival_ns": 0, "write_ns": []}]}
    assert compare_tools.truth_ttft_ms(truth) == {"a": 20.5}  # a stream that wrote nothing has no TTFT
    (tmp_path / "calls.txt").write_text('BOOTS=3 FIRST_BOOT=1 ROUNDS=3 STREAMS="1 4 32" TOOLS="kimiperf vllm" '
                                        'UNIQUE_PROMPTS= TRUTH=1 CPUS=2\n')
    (call,) = compare_tools.read_calls(tmp_path)
    assert call["STREAMS"] == "1 4 32" and call["UNIQUE_PROMPTS"] == ""
    assert compare_tools._command(call) == ("FIRST_BOOT=1 ROUNDS=3 STREAMS='1 4 32' TOOLS='kimiperf vllm' TRUTH=1 "
                                            "flock /tmp/kimiperf-engine.lock bash scripts/compare_data.sh 3")
