"""The gate's verdict from plain data: ``gate.judge`` with samples, rules and a baseline view, no server."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge import baselines
from pytest_kimiperf.judge.baselines import LoadedBaselines
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.storage.baselines import load_baselines
from pytest_kimiperf.judge import stats as boots
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.gate import missing_baselines
from pytest_kimiperf.judge.gate import BootRun, Judgement, GateRules, judge
from pytest_kimiperf.reports.sentences import comparison_line, note_text, note_texts, unresolved_text
from pytest_kimiperf.judge.verdicts import TestResult, VerdictNote
from pytest_kimiperf.judge.stats import VerdictKind

FP = Fingerprint(hard={"gpu.count": "0", "cpu.model": "test", "cpu.cores": "2"}, soft={})
TEST = "t.py::test"
RULES = GateRules(tolerances={"decode_tok_s": 0.05}, decode_floor_tok_s=40.0, decode_target_tok_s=45.0,
              spreads=Spreads(0.01), boots=1, max_boots=3)


def _shell(boot: int = 1) -> TestResult:
    return TestResult(test=TEST, nodeid=f"{TEST}[default]", profile="default", deployment="tiny-cpu",
                      scenario="single_stream", boot=boot)


def _decode(median: float, seed: int, n: int = 20) -> BootRun:
    """One boot's decode rates, 1% around ``median``."""
    rng = np.random.default_rng(seed)
    return BootRun(samples={"decode_tok_s": list(median * rng.lognormal(0, 0.01, n))}, requests=n)


def _baseline(tmp_path: Path, medians: list[float]) -> LoadedBaselines:
    """A baseline of one boot per median, 20 requests each."""
    rng = np.random.default_rng(7)
    boot_samples = [list(m * rng.lognormal(0, 0.01, 20)) for m in medians]
    entry = baselines.make_entry(test=TEST, profile="default", metric="decode_tok_s", unit="tok/s",
                                 direction=Direction.HIGHER_IS_BETTER,
                                 samples=[x for boot in boot_samples for x in boot], git_commit=None,
                                 profile_env={}, boot_samples=boot_samples)
    storage.update_baseline(storage.baseline_path(tmp_path, "tiny-cpu", FP.key), "tiny-cpu", FP, [entry])
    return load_baselines(tmp_path, "tiny-cpu", FP)


def _judge(run: BootRun, *, view: LoadedBaselines | None = None, earlier: boots.TestBoots | None = None,
           boot: int = 1, floor: bool = False) -> Judgement:
    return judge(_shell(boot), ["decode_tok_s"], run, RULES, baselines=view, earlier=earlier or boots.TestBoots(),
                 floor=floor)


def test_decode_above_the_target_passes_the_floor() -> None:
    judged = _judge(_decode(50.0, seed=1), floor=True)
    assert judged.result.failures == [] and judged.result.warnings == []
    assert judged.result.floor is not None and judged.result.floor.status.value == "ok"
    assert note_texts(judged.result.messages) == ["single-stream decode 50.08 tok/s meets the target of 45 tok/s",
                                      "decode: baselines not in use"]


def test_decode_below_the_floor_fails_and_is_not_recorded() -> None:
    judged = _judge(_decode(30.0, seed=2), floor=True)
    [failure] = judged.result.failures
    assert note_text(failure) == "single-stream decode 29.94 tok/s is below the floor of 40 tok/s"
    assert judged.result.unrecordable == (failure,)
    assert judged.recorded is None, "a failed boot is no sample of this build"


def test_a_boot_below_the_floor_is_not_judged_against_the_baseline_and_says_why(tmp_path: Path) -> None:
    # The issue's slower host: decode 61.65 beside a baseline of 347.2 read "insufficient samples
    # (0 current ... boots with enough valid samples)" while 20 samples stood behind the median.
    view = _baseline(tmp_path, [50, 49, 51])
    judged = _judge(_decode(30.0, seed=2), view=view, floor=True)
    [comparison] = judged.comparisons
    assert comparison.verdict is VerdictKind.NOT_JUDGED and comparison.boots_current == 0
    message = note_text(judged.result.metrics["decode_tok_s"].baseline_line)
    assert message == ("decode tok/s: not judged (boot 1 failed and is no sample of this build: single-stream "
                       "decode 29.94 tok/s is below the floor of 40 tok/s)")
    assert "insufficient samples" not in message
    # a later boot that fails leaves the comparison to the earlier boots, and says it was left out
    first = _judge(_decode(50.0, seed=3), view=view)
    earlier = boots.TestBoots()
    assert first.recorded is not None
    earlier.add(1, first.recorded)
    second = _judge(_decode(30.0, seed=4), view=view, earlier=earlier, boot=2, floor=True)
    [comparison] = second.comparisons
    assert comparison.boots_current == 1
    assert note_text(second.result.metrics["decode_tok_s"].baseline_line).endswith(
        " — boot 2 failed and is no sample of this build: single-stream decode 30.02 tok/s is below the floor "
        "of 40 tok/s")


def test_one_boot_that_looks_worse_screens_and_asks_for_another(tmp_path: Path) -> None:
    view = _baseline(tmp_path, [100, 99, 101, 100, 100])
    judged = _judge(_decode(80.0, seed=3), view=view)
    assert judged.result.failures == [], "one boot can screen, never convict"
    assert judged.wants_boot == 2
    assert judged.recorded is not None and set(judged.recorded) == {"decode_tok_s"}
    assert note_text(judged.result.messages[-1]) == (
        "boot 2 of default asked for: decode looks -20.1% on 1 boot(s) (one boot can screen, never convict)")
    [comparison] = judged.comparisons
    # -20% on one boot against a tight history: changed, but one boot cannot say by how much
    assert comparison.verdict is VerdictKind.CHANGED_SIZE_UNRESOLVED


def test_one_boot_of_a_server_that_cannot_be_restarted_fails_unresolved_and_says_what_would_resolve_it(
        tmp_path: Path) -> None:
    # An attached server without a restart_command: a 20% slower server passed with a warning.
    view = _baseline(tmp_path, [100, 99, 101, 100, 100])
    attached = dataclasses.replace(RULES, max_boots=1, no_more_boots="remote")
    judged = judge(_shell(), ["decode_tok_s"], _decode(80.0, seed=3), attached, baselines=view, earlier=boots.TestBoots())
    assert judged.wants_boot is None
    assert judged.result.unresolved is not None and unresolved_text(judged.result.unresolved) == (
        "decode looks -20.1% on 1 boot(s), beyond the 5% tolerance (one boot can screen, never convict); "
        "this run cannot boot the attached server again: give deployment remote a restart_command (such as "
        "['systemctl', 'restart', 'vllm']) and the plugin restarts it for the 2 or more boots a verdict needs")
    assert note_texts(judged.result.failures) == [f"UNRESOLVED: {unresolved_text(judged.result.unresolved)}"]
    # within the tolerance it passes, as any boot does
    calm = judge(_shell(), ["decode_tok_s"], _decode(99.0, seed=3), attached, baselines=view, earlier=boots.TestBoots())
    assert calm.result.failures == [] and calm.result.unresolved is None
    # a server the run can restart asks for another boot instead
    assert _judge(_decode(80.0, seed=3), view=view).wants_boot == 2


def test_the_deployment_says_why_an_attached_run_cannot_boot_again() -> None:
    from pytest_kimiperf.config.deployments import TINY_CPU

    rules = GateRules.for_deployment(TINY_CPU, tolerances={}, canary=None, boots=1, max_boots=1, strict=False,
                                 attached=True)
    assert rules.no_more_boots == "tiny-cpu"  # the deployment the UNRESOLVED line tells to give a restart_command
    restartable = dataclasses.replace(TINY_CPU, restart_command=("systemctl", "restart", "vllm"))
    assert GateRules.for_deployment(restartable, tolerances={}, canary=None, boots=1, max_boots=2, strict=False,
                                attached=True).no_more_boots is None
    assert GateRules.for_deployment(TINY_CPU, tolerances={}, canary=None, boots=1, max_boots=2,
                                strict=False).no_more_boots is None  # booted here: more boots on demand


def test_a_regression_on_two_boots_fails(tmp_path: Path) -> None:
    view = _baseline(tmp_path, [100, 99, 101, 100, 100])
    first = _judge(_decode(80.0, seed=3), view=view)
    earlier = boots.TestBoots()
    assert first.recorded is not None
    earlier.add(1, first.recorded)
    second = _judge(_decode(80.0, seed=4), view=view, earlier=earlier, boot=2)
    assert second.wants_boot is None
    [comparison] = second.comparisons
    assert comparison.verdict is VerdictKind.REGRESSION and comparison.boots_current == 2
    assert second.result.failures == [VerdictNote(comparison)]
    assert note_text(second.result.failures[0]) == comparison_line(comparison)
    assert note_text(second.result.failures[0]).startswith(
        "decode tok/s: REGRESSION -19.9% (beyond the 5% tolerance, and its 99.94% bound -16.5% excludes zero; ")
    assert second.result.metrics["decode_tok_s"].baseline == comparison


def test_a_missing_baseline_is_said_and_judges_nothing(tmp_path: Path) -> None:
    judged = _judge(_decode(50.0, seed=5), view=load_baselines(tmp_path, "tiny-cpu", FP))
    assert judged.comparisons == [] and judged.result.failures == []
    line = judged.result.metrics["decode_tok_s"].baseline_line
    assert line is not None and note_text(line) == f"decode: no baseline for this hardware ({FP.key}): run --kimiperf-update-baselines (it records this " \
                                                  "run's figures as the new baseline: review the diff)"
    assert missing_baselines(judged.result) == [line]
    assert judged.wants_boot is None


def test_an_invalid_run_fails_without_a_verdict() -> None:
    run = BootRun(samples={"decode_tok_s": []}, invalid="no valid request (8 invalid; first reason: timeout)")
    judged = _judge(run, floor=True)
    assert note_texts(judged.result.failures) == ["INVALID measurement: no valid request (8 invalid; first reason: timeout)"]
    assert judged.result.invalid == run.invalid and judged.result.floor is None
    assert judged.recorded is None and judged.comparisons == []


def test_too_many_failed_requests_fail_the_boot() -> None:
    run = BootRun(samples={"decode_tok_s": [50.0] * 8}, requests=10, failed_requests=2,
                  failed_reasons={"HTTP 500": 2})
    judged = _judge(run)
    assert note_texts(judged.result.failures) == [
        "2 of 10 measured requests failed and are not counted (2x HTTP 500): more than 10% failed, "
        "the server did not serve this load"]


def test_judge_leaves_its_input_result_alone() -> None:
    shell = _shell()
    judge(shell, ["decode_tok_s"], _decode(30.0, seed=6), RULES, baselines=None, earlier=boots.TestBoots(), floor=True)
    assert shell.failures == [] and shell.messages == [] and shell.metrics == {}


def _recorded_on(tmp_path: Path, medians: list[float], canary: dict[str, float]) -> LoadedBaselines:
    """A baseline whose boots were recorded in session 'then' on host 'h' with ``canary``."""
    from pytest_kimiperf.judge.noise import BootOrigin

    rng = np.random.default_rng(7)
    boot_samples = [list(m * rng.lognormal(0, 0.01, 20)) for m in medians]
    origin = BootOrigin("then", "h", canary)
    entry = baselines.make_entry(test=TEST, profile="default", metric="decode_tok_s", unit="tok/s",
                                 direction=Direction.HIGHER_IS_BETTER,
                                 samples=[x for boot in boot_samples for x in boot], git_commit=None,
                                 profile_env={}, boot_samples=boot_samples, boot_origins=[origin] * len(medians))
    storage.update_baseline(storage.baseline_path(tmp_path, "tiny-cpu", FP.key), "tiny-cpu", FP, [entry])
    return load_baselines(tmp_path, "tiny-cpu", FP)


def _two_boots_in_session(view: LoadedBaselines, median: float, canary: dict[str, float]) -> Judgement:
    import dataclasses

    from pytest_kimiperf.judge.noise import BootOrigin

    origin = BootOrigin("now", "h", canary)
    first = judge(dataclasses.replace(_shell(1), origin=origin), ["decode_tok_s"], _decode(median, seed=3), RULES,
                  baselines=view, earlier=boots.TestBoots())
    earlier = boots.TestBoots()
    assert first.recorded is not None and first.recorded["decode_tok_s"].session == "now"
    earlier.add(1, first.recorded)
    return judge(dataclasses.replace(_shell(2), origin=origin), ["decode_tok_s"], _decode(median, seed=4), RULES,
                 baselines=view, earlier=earlier)


def test_a_host_half_as_fast_by_its_canary_is_not_comparable_never_a_regression(tmp_path: Path) -> None:
    view = _recorded_on(tmp_path, [100, 99, 101, 100, 100], {"python_mops": 23.0, "copy_gbs": 40.0})
    judged = _two_boots_in_session(view, 50.0, {"python_mops": 11.5, "copy_gbs": 21.0})
    [comparison] = judged.comparisons
    assert comparison.verdict is VerdictKind.NOT_COMPARABLE and judged.result.failures == []
    assert "host differs (canary copy_gbs -48%, python_mops -50%)" in note_text(judged.result.metrics["decode_tok_s"].baseline_line)


def test_the_same_host_by_its_canary_still_convicts_a_real_regression(tmp_path: Path) -> None:
    view = _recorded_on(tmp_path, [100, 99, 101, 100, 100], {"python_mops": 23.0, "copy_gbs": 40.0})
    judged = _two_boots_in_session(view, 50.0, {"python_mops": 22.4, "copy_gbs": 41.0})
    [comparison] = judged.comparisons
    assert comparison.verdict is VerdictKind.REGRESSION
    assert "vs 5 reference boots of 1 session" in comparison_line(comparison)
    assert "session spread" in comparison_line(comparison)


def test_the_metrics_of_one_test_place_each_boot_in_one_spawn_mode(tmp_path: Path) -> None:
    """Decode and TTFT recorded together; boots 5, 6 and 8 in the slow spawn mode in both. A
    decode 10.6% slower puts a fast boot half-way between decode's modes; TTFT, left alone,
    says it is fast, so decode is judged in the fast mode and convicted."""
    fast_slow = [100, 101, 99, 100.5, 80, 80.5, 100.2, 79.8, 99.6, 100.1]
    rng = np.random.default_rng(7)
    entries = []
    for metric, direction, medians in (("decode_tok_s", Direction.HIGHER_IS_BETTER, fast_slow),
                                       ("ttft_ms", Direction.LOWER_IS_BETTER, [4000.0 / m for m in fast_slow])):
        boot_samples = [list(m * rng.lognormal(0, 0.002, 20)) for m in medians]
        entries.append(baselines.make_entry(test=TEST, profile="default", metric=metric, unit="x", direction=direction,
                                            samples=[x for b in boot_samples for x in b], git_commit=None,
                                            profile_env={}, boot_samples=boot_samples))
    storage.update_baseline(storage.baseline_path(tmp_path, "tiny-cpu", FP.key), "tiny-cpu", FP, entries)
    view = load_baselines(tmp_path, "tiny-cpu", FP)
    rules = dataclasses.replace(RULES, tolerances={"decode_tok_s": 0.03, "ttft_ms": 0.05})

    def run(seed: int) -> BootRun:
        r = np.random.default_rng(seed)
        return BootRun(samples={"decode_tok_s": list(89.4 * r.lognormal(0, 0.002, 20)),
                                "ttft_ms": list(40.0 * r.lognormal(0, 0.002, 20))}, requests=20)

    earlier = boots.TestBoots()
    first = judge(_shell(1), ["decode_tok_s", "ttft_ms"], run(3), rules, baselines=view, earlier=earlier)
    assert first.recorded is not None
    earlier.add(1, first.recorded)
    second = judge(_shell(2), ["decode_tok_s", "ttft_ms"], run(4), rules, baselines=view, earlier=earlier)
    decode, ttft = second.result.metrics["decode_tok_s"].baseline, second.result.metrics["ttft_ms"].baseline
    assert decode is not None and ttft is not None
    assert decode.verdict is VerdictKind.REGRESSION, comparison_line(decode)
    assert "the mode the test's metrics place it in together" in comparison_line(decode)
    assert ttft.verdict is not VerdictKind.REGRESSION and "the mode it clearly belongs to" in comparison_line(ttft)
