"""--kimiperf-gate: one switch for a CI gate, and the header line that says what fails a run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pytest_kimiperf.config.settings import RawOption, build_settings
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.reports.header import failures_line
from tests.unit.test_serve_args import _options


def _settings(tmp_path: Path, **raw: RawOption):  # type: ignore[no-untyped-def]
    return build_settings({**_options("tiny-cpu", "default"), **raw}, rootpath=tmp_path)


def test_without_the_gate_a_missing_baseline_warns_and_the_header_says_so(tmp_path: Path) -> None:
    s = _settings(tmp_path)
    assert (s.gate, s.missing_baseline, s.perf_strict) == (False, "warn", False)
    assert failures_line(s) == ("kimiperf: not a gate (--kimiperf-gate makes one): fails on a regression, decode "
                                "below the floor; a run whose only failures are INVALID measurements exits 75")


@pytest.mark.parametrize("raw", [RawOption(True, "command line --kimiperf-gate"),
                                 RawOption(True, "ini option kimiperf_gate"),
                                 RawOption("1", "environment variable KIMIPERF_GATE")])
def test_the_gate_fails_a_missing_baseline_and_leaves_an_unresolved_change_to_warn(
        tmp_path: Path, raw: RawOption) -> None:
    s = _settings(tmp_path, gate=raw)
    # The gate fails on the calibrated REGRESSION rule only: strict would fail an unchanged build
    # in about a third of sessions (benchmarks/gate_power.py, "gate fails/session" with strict).
    assert (s.gate, s.missing_baseline, s.perf_strict) == (True, "fail", False)
    assert failures_line(s) == (
        "kimiperf: gate (--kimiperf-gate): fails on a regression, decode below the floor, no baseline for this "
        "hardware; a run whose only failures are INVALID measurements exits 75; boots per profile: 1 planned, up "
        "to 2 on demand (deployment tiny-cpu's max_boots)")
    strict = _settings(tmp_path, gate=raw, perf_strict=RawOption(True, "command line --kimiperf-strict"))
    assert strict.perf_strict and "a change beyond the tolerance without a verdict" in failures_line(strict)
    # Recording baselines is not failed for the baselines it is recording.
    assert "no baseline" not in failures_line(replace(s, update_baselines=True))


def test_a_gate_told_to_only_warn_of_a_missing_baseline_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gate mode \(from command line --kimiperf-gate\) with missing-baseline "
                                          r"policy 'warn' \(from ini option kimiperf_missing_baseline\)"):
        _settings(tmp_path, gate=RawOption(True, "command line --kimiperf-gate"),
                  missing_baseline=RawOption("warn", "ini option kimiperf_missing_baseline"))
    s = _settings(tmp_path, gate=RawOption(True, "command line --kimiperf-gate"),
                  missing_baseline=RawOption("fail", "command line --kimiperf-missing-baseline"))
    assert s.missing_baseline == "fail"


def test_a_gate_switch_that_is_not_a_yes_or_no_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gate 'sometimes' \(from environment variable KIMIPERF_GATE\); allowed: "):
        _settings(tmp_path, gate=RawOption("sometimes", "environment variable KIMIPERF_GATE"))


def test_the_gate_caps_its_boots_on_demand_from_the_plan(tmp_path: Path) -> None:
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8
    from pytest_kimiperf.judge.noise import boots_needed
    from pytest_kimiperf.session import with_gate_plan

    gate = RawOption(True, "command line --kimiperf-gate")
    # tiny-cpu: no number of boots within its 2 resolves a 50% change at an 18% spread
    tiny = with_gate_plan(_settings(tmp_path, gate=gate))
    assert tiny.max_boots == 2 and tiny.max_boots_from == (
        "the plan: 15 boots resolve a 50% change at the declared 18% boot spread, capped by deployment tiny-cpu's 2")
    # a quiet deployment: the plan's 2 boots, not the deployment's 3 (each a 36-minute load)
    quiet = replace(KIMI_K25_INT4_TP8, name="quiet", tolerances={"decode_tok_s": 0.05})
    assert boots_needed(0.10, 0.01, tolerance=0.05) == 2
    s = with_gate_plan(replace(_settings(tmp_path, gate=gate), deployment=quiet, max_boots=3,
                               max_boots_from="deployment quiet's max_boots"))
    assert (s.max_boots, s.max_boots_from) == (2, "the plan: 2 boots resolve a 10% change at the declared 1% boot spread")
    # the deployment's own cap decides, not the words the header says it in
    assert with_gate_plan(replace(_settings(tmp_path, gate=gate), deployment=quiet, max_boots=3)).max_boots == 2
    # no gate, or a cap given by hand: left alone
    assert with_gate_plan(_settings(tmp_path)).max_boots == 2
    given = _settings(tmp_path, gate=gate, max_boots=RawOption("4", "command line --kimiperf-max-boots"))
    assert with_gate_plan(given) == given and given.max_boots == 4
