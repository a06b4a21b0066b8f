"""Advice that cannot hurt (issue 60): where a baseline of the same server differs only in what the
user states (the attached server's hardware, the host id), the run names the option that selects
it, with the value recorded, and under --kimiperf-gate never advises recording over it: on a
server that just became slower, recording takes the regression as the baseline. Where recording
is the advice, it says what recording accepts."""

from __future__ import annotations

from pathlib import Path

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge import baselines
from pytest_kimiperf.judge.stats import summarize_boot
from pytest_kimiperf.judge.gate import decide_test
from pytest_kimiperf.judge.baselines import ATTACHED_HARDWARE, NOT_STATED, Fingerprint, stated_apart
from pytest_kimiperf.judge.gate import judge_metric
from pytest_kimiperf.judge.noise import BootOrigin
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, MetricResult, TestResult
from pytest_kimiperf.reports.answers import answer_lines, failure_lines
from pytest_kimiperf.reports.answers import missing_baseline_warning, outcome_line
from pytest_kimiperf.reports.header import host_line
from pytest_kimiperf.reports.sentences import baseline_line, note_text
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.storage.baselines import load_baselines
from tests.unit.test_reports import FINGERPRINT, make_report

TEST = "tests/test_perf.py::test_decode"
SERVER = {"deployment.name": "my-server", "server.vllm": "0.32.0", "server.models": "m"}


def _attached(hardware: str, **more: str) -> Fingerprint:
    return Fingerprint(hard={**SERVER, ATTACHED_HARDWARE: hardware, **more}, soft={})


RECORDED = _attached("1x test box")
UNITS = (("decode_tok_s", "tok/s", "higher_is_better"), ("ttft_ms", "ms", "lower_is_better"))


def _record(tmp_path: Path, fingerprint: Fingerprint = RECORDED) -> None:
    boots = [[200.0 * (1 + 0.001 * i) for i in range(10)] for _ in range(2)]
    for metric, unit, direction in UNITS:
        entry = baselines.make_entry(test=TEST, profile="default", metric=metric, unit=unit,
                                     direction=Direction(direction), samples=boots[-1], git_commit=None,
                                     profile_env={}, boot_samples=boots)
        storage.update_baseline(storage.baseline_path(tmp_path, "my-server", fingerprint.key), "my-server",
                                fingerprint, [entry])


def _judged(tmp_path: Path, run: Fingerprint) -> TestResult:
    result = TestResult(test=TEST, nodeid=f"{TEST}[default]", profile="default", deployment="my-server",
                        scenario="single-stream")
    for metric, unit, direction in UNITS:
        samples = [160.0 * (1 + 0.001 * i) for i in range(10)]  # 20% off what was recorded
        mres = MetricResult(metric, unit, direction, 0.1, samples, boot_label="default boot 1")
        comparison, line = judge_metric(mres, test=TEST, profile="default",
                                        baselines=load_baselines(tmp_path, "my-server", run), profile_env={},
                                        current=[summarize_boot(samples, "b1")] * 2, prior_spread=0.02)
        mres.baseline, mres.baseline_line = comparison, line
        result.metrics[metric] = mres
    return result


def test_the_same_server_stated_otherwise_is_told_apart_from_other_hardware() -> None:
    assert stated_apart(RECORDED, _attached(NOT_STATED)) == "1x test box"
    assert stated_apart(RECORDED, _attached("2x other box")) == "1x test box"
    # versions are judged across: stating the hardware is still all it takes
    assert stated_apart(RECORDED, _attached(NOT_STATED, **{"server.vllm": "0.33.0"})) == "1x test box"
    # another model is another server: no option selects its baseline
    assert stated_apart(RECORDED, _attached(NOT_STATED, **{"server.models": "other"})) is None
    booted = Fingerprint(hard={"gpu.count": "8", "gpu.name": "H100"}, soft={})
    assert stated_apart(booted, Fingerprint(hard={"gpu.count": "8", "gpu.name": "H200"}, soft={})) is None


def test_unstated_hardware_under_the_gate_names_the_option_and_never_advises_recording(tmp_path: Path) -> None:
    _record(tmp_path)
    result = _judged(tmp_path, _attached(NOT_STATED))
    line = result.metrics["decode_tok_s"].baseline_line
    assert line is not None and line.state is BaselineState.OTHER_HARDWARE
    assert line.recorded_hardware == "1x test box"
    gated = baseline_line(line, advice="record it with python -m pytest --kimiperf-update-baselines", record=False)
    assert gated.endswith(": if this is the server it was recorded on, state its hardware as recorded: "
                          "--kimiperf-server-hardware '1x test box' (or KIMIPERF_SERVER_HARDWARE, the "
                          "kimiperf_server_hardware ini option, the deployment's server_hardware)")
    assert "update-baselines" not in gated
    # Outside a gate, recording is offered only for new hardware, with what it accepts.
    assert baseline_line(line).endswith("; if the hardware is new, run --kimiperf-update-baselines (it records "
                                        "this run's figures as the new baseline: review the diff)")
    # The failure under --kimiperf-missing-baseline=fail: the reason once for both metrics, no recording.
    decide_test(result, missing_baseline_fails=True)
    failure = note_text(result.failures[0])
    assert failure.startswith("missing baseline (--kimiperf-missing-baseline=fail): decode tok/s, time to first "
                              "token ms: "
                              "the baseline was recorded on other hardware (")
    assert failure.count("server.hardware: 1x test box -> ") == 1
    assert "update-baselines" not in failure and "--kimiperf-server-hardware '1x test box'" in failure


def test_the_runs_answers_under_the_gate_say_the_option_once_and_never_record(tmp_path: Path) -> None:
    _record(tmp_path)
    report = make_report([_judged(tmp_path, _attached("2x other box"))])
    report.record_command = "python -m pytest --kimiperf-gate --kimiperf-update-baselines"
    report.gate = True
    outcome = outcome_line(report, report.record_command)
    assert outcome is not None and "update-baselines" not in outcome
    assert outcome.endswith("2 metrics had no baseline: if this is the server it was recorded on, state its "
                            "hardware as recorded: --kimiperf-server-hardware '1x test box' (or "
                            "KIMIPERF_SERVER_HARDWARE, the kimiperf_server_hardware ini option, the deployment's "
                            "server_hardware)")
    assert all("update-baselines" not in row.message for row in report.baseline_rows())
    # One reason, once: the answers say other hardware's reason in one line for both metrics.
    said = [a.text for a in answer_lines(report) if "recorded on other hardware" in a.text]
    assert said == [f"against the baseline (2 metrics): not comparable, shown only: the baseline was recorded on "
                    f"other hardware ({RECORDED.key}: server.hardware: 1x test box -> 2x other box); no baseline for "
                    f"this hardware ({_attached('2x other box').key})"]
    # ... and a test's failed boots with that one reason are one row, pointing to the advice.
    for res in report.results:
        decide_test(res, missing_baseline_fails=True)
    assert failure_lines(report) == ["FAILED decode [default boot 1]: missing baseline (--kimiperf-missing-baseline="
                                     "fail) for decode tok/s, time to first token ms: the run line says what to do"]
    report.gate = False
    outcome = outcome_line(report, report.record_command)
    assert outcome is not None and "; if the hardware is new, python -m pytest --kimiperf-gate " \
                                   "--kimiperf-update-baselines (it records this run's figures" in outcome


def test_the_missing_baseline_warning_is_a_few_lines_the_tests_and_the_command(tmp_path: Path) -> None:
    results = []
    for i in range(6):  # six tests miss their baseline: the warning names three, and how many more
        res = TestResult(test=f"t.py::test_{i}", nodeid=f"t.py::test_{i}[default]", profile="default",
                         deployment="d", scenario="s")
        mres = MetricResult("decode_tok_s", "tok/s", "higher_is_better", 0.03, [1.0])
        mres.baseline_line = BaselineLine(BaselineState.MISSING, "decode", fingerprint="cpu-x-1")
        res.metrics["decode_tok_s"] = mres
        results.append(res)
    report = make_report(results)
    warning = missing_baseline_warning(report, "make baseline")
    assert warning is not None
    assert warning.splitlines() == [
        f"no baseline for this hardware ({FINGERPRINT.key}) for 6 metrics of 6 tests, judged against no history:",
        "  t.py::test_0 [default]: decode", "  t.py::test_1 [default]: decode", "  t.py::test_2 [default]: decode",
        "  and 3 more tests (the summary's tables list them)",
        "  next: make baseline (1 boot per profile, as this run) (it records this run's figures as the new "
        "baseline: review the diff)"]
    assert len(warning) < 500


def test_a_baseline_of_other_host_ids_names_the_option_with_the_id_recorded(tmp_path: Path) -> None:
    boots = [[100.0] * 10 for _ in range(2)]
    entry = baselines.make_entry(test=TEST, profile="default", metric="decode_tok_s", unit="tok/s",
                                 direction=Direction.HIGHER_IS_BETTER, samples=boots[-1], git_commit=None,
                                 profile_env={}, boot_samples=boots,
                                 boot_origins=[BootOrigin("s1", "gpu-runner-1"), BootOrigin("s1", "gpu-runner-1")])
    storage.update_baseline(storage.baseline_path(tmp_path, "d", RECORDED.key), "d", RECORDED, [entry])
    loaded = load_baselines(tmp_path, "d", RECORDED).loaded
    assert loaded is not None and loaded.hosts() == ("gpu-runner-1",)
    here = {"host": "be9b2608e8370209", "basis": "machine-id+boot-id"}
    assert host_line(here, loaded.hosts()) == (
        "kimiperf: host id be9b2608e8370209 (machine-id+boot-id); the baseline's boots were measured on host id "
        "gpu-runner-1, each run here is judged as another host (adding the host spread): if this is that machine, "
        "--kimiperf-host-id gpu-runner-1 (or KIMIPERF_HOST_ID) names it so")
    assert host_line({"host": "gpu-runner-1", "basis": "declared"}, loaded.hosts()) == \
        "kimiperf: host id gpu-runner-1 (declared)"


def test_every_advice_to_record_says_what_recording_accepts() -> None:
    from pytest_kimiperf.judge.notes import Drifted
    from pytest_kimiperf.reports.sentences import RECORD_ADVICE, RECORDING_ACCEPTS

    assert RECORDING_ACCEPTS == "records this run's figures as the new baseline: review the diff"
    assert RECORDING_ACCEPTS in RECORD_ADVICE
    drift = note_text(Drifted("decode_tok_s", "decode tok/s", -0.05, -0.04, 5, 0.03, "2026-01-02"))
    assert drift.endswith(f"or if it is meant, record the baseline again (--kimiperf-update-baselines: it "
                          f"{RECORDING_ACCEPTS})")
    line = BaselineLine(BaselineState.MISSING, "decode", fingerprint="cpu-x-1")
    assert baseline_line(line, record=False) == f"decode: no baseline for this hardware (cpu-x-1): {RECORD_ADVICE}"


def test_recording_a_judged_change_starts_its_history_anew_so_the_next_run_is_judged_against_it(
        tmp_path: Path) -> None:
    """What recording accepts is this run's figures: recording a REGRESSION that is meant makes
    it the baseline. Appended to the old level instead, the next unchanged run read about half the
    change against the mix ("changed, size unresolved"), or worse."""
    _record(tmp_path)  # 200 on two boots
    slower = _judged(tmp_path, RECORDED)  # 160: 20% slower, judged against them
    assert slower.metrics["decode_tok_s"].baseline.verdict.value == "regression"
    entries, _ = baselines.baseline_entries([slower], git_commit=None)
    assert [e.new_level for e in entries] == [True, True]
    path = storage.baseline_path(tmp_path, "my-server", RECORDED.key)
    written = storage.update_baseline(path, "my-server", RECORDED, entries)
    history = written.entries[baselines.entry_key(TEST, "default", "decode_tok_s")]
    assert [160 <= b.median < 162 for b in history.boots] == [True] and history.anchor == history.boots
    # The next run on the accepted level is judged against it alone: no change.
    again = _judged(tmp_path, RECORDED)
    assert abs(again.metrics["decode_tok_s"].baseline.change) < 1e-9
    # An unchanged recording appends (a history of sessions is what judges session effects).
    entries, _ = baselines.baseline_entries([again], git_commit=None)
    assert not any(e.new_level for e in entries)
    written = storage.update_baseline(path, "my-server", RECORDED, entries)
    assert len(written.entries[baselines.entry_key(TEST, "default", "decode_tok_s")].boots) == 2


def test_the_recording_run_says_which_entries_it_started_anew(tmp_path: Path) -> None:
    from pytest_kimiperf.reports.model import BaselineUpdate

    _record(tmp_path)
    report = make_report([_judged(tmp_path, RECORDED)])
    report.baselines_update = BaselineUpdate(path="baselines/my-server/x.json", entries=2, restarted=2)
    assert outcome_line(report, report.record_command) == (
        "recorded 2 baseline entries in baselines/my-server/x.json; 2 of them judged changed against their history "
        "(a REGRESSION or an improvement above) start it anew at this run's level, their older boots dropped: "
        "review the diff; the same run without --kimiperf-update-baselines now judges against them")
