"""``--kimiperf-plan``: boots, the time of loading them and the smallest change resolved, before any boot."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from pytest_kimiperf.config.options import OPTIONS
from pytest_kimiperf.config.settings import RawOption, build_settings
from pytest_kimiperf.judge import baselines
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.noise import boots_needed, smallest_change
from pytest_kimiperf.judge.stats import GATE_CRITICAL
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.reports.header import fmt_duration, plan_lines

FP = Fingerprint(hard={"gpu.count": "8", "gpu.name": "RTX PRO 6000"}, soft={})


def _settings(tmp_path: Path, **given: str) -> object:
    raw = {opt.name: RawOption(opt.default, "default") for opt in OPTIONS}
    raw.update({name: RawOption(value, f"command line --{name}") for name, value in given.items()})
    return build_settings(raw, rootpath=tmp_path)


def test_the_smallest_change_is_the_inverse_of_the_boots_needed() -> None:
    for boots in (2, 3, 5):
        change = smallest_change(0.01, boots, reference_boots=10, tolerance=0.03)
        assert boots_needed(change * 1.001, 0.01, tolerance=0.03, reference_boots=10) == boots
    assert smallest_change(0.01, 2) > smallest_change(0.01, 4) > 0  # more boots resolve less
    with pytest.raises(ValueError, match="boots=0"):
        smallest_change(0.01, 0)


def test_all_kimi_profiles_say_their_hours_of_loading_before_the_first_boot(tmp_path: Path) -> None:
    # The README's `--nccl-profile all` is 7 profiles; nothing said so before the first 28-minute load.
    s = _settings(tmp_path, deployment="kimi-k25-int4-tp8", nccl_profiles="all")
    lines = plan_lines(s, None)  # type: ignore[arg-type]
    assert lines[0] == "kimiperf plan for deployment kimi-k25-int4-tp8 (nothing boots):"
    assert lines[1].startswith("  boots: 7 profiles (default, ") and lines[1].endswith(
        "x 2 = 14 boots, up to 42 with boots on demand (6 per profile)")
    assert lines[2] == ("  loading: 28 min a boot (declared by deployment kimi-k25-int4-tp8 (load_s)): 6 h 32 min of "
                        "loading, up to 19 h 36 min")
    apart = smallest_change(0.01, 2)
    assert lines[3] == (f"  profiles against each other (2 boots each, boot spread 1% declared): decode changes of "
                        f"{apart:.1%} or more are told apart (90% power)")
    assert lines[4] == "  against the baseline: none recorded for this hardware yet (--kimiperf-update-baselines records one)"


def test_a_profile_comparison_plans_two_boots_each_unless_told(tmp_path: Path) -> None:
    assert _settings(tmp_path, nccl_profiles="default,ring-ll").boots == 2  # type: ignore[attr-defined]
    assert _settings(tmp_path, nccl_profiles="default").boots == 1  # type: ignore[attr-defined]
    one = _settings(tmp_path, nccl_profiles="default,ring-ll", boots="1")
    assert one.boots == 1  # type: ignore[attr-defined]
    assert plan_lines(one, None)[3].endswith(  # type: ignore[arg-type]
        "; one boot each can never give a direction: use --kimiperf-boots 2 or more")


def test_against_a_history_the_plan_says_what_regression_it_convicts_and_the_recorded_load_time(
        tmp_path: Path) -> None:
    entries = []
    for metric, unit, medians in (("decode_tok_s", "tok/s", [81.4, 81.9, 81.2]), ("boot_ready_s", "s", [1500.0, 1800.0])):
        spec_dir = Direction.HIGHER_IS_BETTER if metric == "decode_tok_s" else Direction.LOWER_IS_BETTER
        entries.append(baselines.make_entry(
            test="perf_tests/test_decode.py::test_single_stream_decode", profile="default", metric=metric, unit=unit,
            direction=spec_dir, samples=medians, git_commit=None, profile_env={},
            boot_samples=[[m] * (20 if metric == "decode_tok_s" else 1) for m in medians]))
    path = storage.baseline_path(tmp_path / "b", "kimi-k25-int4-tp8", FP.key)
    storage.update_baseline(path, "kimi-k25-int4-tp8", FP, entries)
    s = _settings(tmp_path, deployment="kimi-k25-int4-tp8")
    lines = plan_lines(s, storage.load_baseline(path))  # type: ignore[arg-type]
    assert lines[1] == "  boots: 1 profile (default) x 1 = 1 boot, up to 6 with boots on demand (6 per profile)"
    assert lines[2] == ("  loading: 28 min a boot (the median of 2 recorded boots (boot_ready_s)): 28 min of loading, "
                        "up to 2 h 45 min")
    # By hand: the gate convicts an estimate beyond the tolerance and its critical value in
    # standard errors from zero, the run's tail (its 1% over 2 stored entries of the profile
    # times 6 looks: 1 planned boot, up to 6; and each comparison's two signs, any of which
    # spends the budget) at the design's Satterthwaite df (the boot
    # declaration's 3 df, the current 2 boots' 1 and the history's 3 boots in one session's 2;
    # the session declaration's 10, one session of history measuring none); 90% power puts the
    # true change 1.2816 standard errors beyond that.
    boot_var, session_var = math.log1p(0.01) ** 2 * (1 / 2 + 1 / 3), math.log1p(0.01) ** 2 * 2
    df = (boot_var + session_var) ** 2 / (boot_var ** 2 / 6 + session_var ** 2 / 10)
    critical = float(scipy_stats.t.isf(0.01 / (2 * 6 * 2), df))
    se = math.sqrt(boot_var + session_var)
    beyond = smallest_change(0.01, 2, reference_boots=3, tolerance=0.03, fixed_var=session_var, critical=critical)
    assert beyond == pytest.approx(math.expm1(max(math.log1p(0.03), critical * se) + 1.2816 * se), rel=1e-4)
    assert lines[3] == (f"  against the baseline (3 boots over 1 session): a decode regression of {beyond:.1%} "
                        "or more is convicted beyond the 3% tolerance (90% power, the session spread 1% as declared; "
                        "another host adds its own)")


@pytest.mark.parametrize("seconds, text", [(45, "45 s"), (90, "2 min"), (1680, "28 min"), (6720, "1 h 52 min")])
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


def test_the_plan_says_what_history_would_convict_twice_the_tolerance_or_that_none_can() -> None:
    from pytest_kimiperf.judge.baselines import HistorySpan
    from pytest_kimiperf.reports.header import history_advice

    one = HistorySpan(5, 1, 1)
    advice = history_advice(0.01, 0.01, 2, one, 0.03, "decode")
    sessions = int(advice.split("over about ")[1].split()[0])
    # Checked against the power formula: that many sessions convict 6%, one fewer does not.
    def convicts(k: int) -> bool:
        return smallest_change(0.01, 2, reference_boots=5 + k - 1, tolerance=0.03,
                               fixed_var=math.log1p(0.01) ** 2 * (1 + 1 / k), critical=GATE_CRITICAL) <= 0.06
    assert convicts(sessions) and not convicts(sessions - 1)
    assert advice.startswith("to convict a decode regression of twice the tolerance (6%) with 90% power")
    # A session effect of 2% on a 3% tolerance: no history can, and the plan says why.
    assert history_advice(0.01, 0.02, 2, one, 0.03, "decode") == (
        "no history convicts a decode regression of twice the tolerance with 90% power here: this run's own "
        "session effect (2% declared) is too wide for 2 boots")


def test_sessions_of_history_counts_from_the_recorded_history_and_none_where_the_session_fills_the_room() -> None:
    from pytest_kimiperf.judge.noise import sessions_of_history

    # A history that already convicts needs no more sessions than it has.
    assert sessions_of_history(0.01, 0.0, 2, reference_boots=20, sessions=20, tolerance=0.03, goal=0.06) == 20
    grown = sessions_of_history(0.01, 0.01, 2, reference_boots=5, sessions=1, tolerance=0.03, goal=0.06)
    assert grown is not None and grown > 1
    assert sessions_of_history(0.01, 0.02, 2, reference_boots=5, sessions=1, tolerance=0.03, goal=0.06) is None
