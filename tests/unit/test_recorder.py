"""The perf fixture's object: verdicts from floors and baselines, boots on demand while a
first boot looks worse."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pytest_kimiperf.judge import baselines

from pytest_kimiperf.measure import runner, workload
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.judge.stats import BootLedger, BootSlot
from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.baselines import baseline_entries
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.storage.baselines import load_baselines
from pytest_kimiperf.judge.stats import strip_slot as strip_profile
from pytest_kimiperf.judge.verdicts import WarningKind
from pytest_kimiperf.reports.outputs import comparison_json
from pytest_kimiperf.reports.sentences import note_text, note_texts, warning_lines
from pytest_kimiperf.measure.runner import gpu_watch
from pytest_kimiperf.server.boot_account import BootAccount, PhaseTime
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.measure.results import RoundResult, RunResult
from pytest_kimiperf.recorder import PerfCase, PerfRecorder, RecorderHooks
from pytest_kimiperf.server.process import ServerHandle
from pytest_kimiperf.judge.stats import MIN_SAMPLES_PER_BOOT

SCENARIO = workload.SingleStream(prompt_tokens=8, output_tokens=65, requests=8)
FP = Fingerprint(hard={"gpu.count": "0", "cpu.model": "test", "cpu.cores": "2"}, soft={})
TEST = "t.py::test"
# This host is shared with other tests: the host watch must not judge it here.
_NO_HOST_BOUNDS = MappingProxyType({"max_foreign_cpu_share": "none", "max_steal_share": "none"})
# tiny-cpu as shipped: 25% tolerance, 18% declared boot spread, at most 2 boots a profile.
NOISY = dataclasses.replace(TINY_CPU, host_bounds=_NO_HOST_BOUNDS)
# The same tolerance on a quiet deployment (a GPU's 1% boot spread, 3 boots): two boots can convict.
QUIET = dataclasses.replace(TINY_CPU, host_bounds=_NO_HOST_BOUNDS, boot_spread=0.01, boot_spreads={}, max_boots=3)


def _run(tok_s: list[float], name: str = SCENARIO.scenario_name) -> RunResult:
    """A run whose requests decode at exactly the given rates (64 gaps each)."""
    records = []
    t = 0
    for rate in tok_s:
        gap_ns = int(1e9 / rate)
        chunks = tuple(t + 10_000_000 + i * gap_ns for i in range(65))
        records.append(RequestRecord(ok=True, error="", prompt_tokens=8, output_tokens=65, t_send_ns=t,
                                     chunk_ns=chunks, t_done_ns=chunks[-1]))
        t = chunks[-1] + 1_000_000
    return RunResult(scenario_name=name, rounds=(RoundResult(records=tuple(records), wall_s=t / 1e9),))


def _boot(median: float, rng: np.random.Generator, n: int = 8) -> RunResult:
    """One boot's run: ``n`` requests 1% around ``median``."""
    return _run(list(median * rng.lognormal(0, 0.01, n)))


def _recorder(tmp_path: Path, failures: list[str], published: list[Any], *, boot: int = 1,
              ledger: BootLedger | None = None, deployment: Any = NOISY, boots: int = 1,
              account: BootAccount | None = None) -> PerfRecorder:
    view = load_baselines(tmp_path, "tiny-cpu", FP)
    settings = SimpleNamespace(deployment=deployment, perf_strict=False, boots=boots, missing_baseline_fails=False,
                               max_boots=max(deployment.max_boots, boots), control=False,
                               profiles=(SimpleNamespace(name="default"),))
    server = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="default",
                          log_path=None, boot_account=account)

    def fail(message: str) -> None:
        failures.append(message)
        raise AssertionError(message)

    slot = BootSlot(SimpleNamespace(name="default"), boot)
    run = SimpleNamespace(settings=settings, ledger=lambda: ledger if ledger is not None else BootLedger(),
                          origin=lambda: None, baselines=lambda: view, family=lambda: None)
    return PerfRecorder(run, PerfCase(nodeid=f"t.py::test[{slot.id}]", test=TEST, server=server, boot=boot),
                        RecorderHooks(ensure_alive=lambda: None, publish=published.append, fail=fail))


def _record_baseline(tmp_path: Path, samples: list[float], fingerprint: Fingerprint = FP,
                     boot_samples: list[list[float]] | None = None) -> None:
    entry = baselines.make_entry(test=TEST, profile="default", metric="decode_tok_s", unit="tok/s",
                                 direction=Direction.HIGHER_IS_BETTER, samples=samples, git_commit=None,
                                 profile_env={}, boot_samples=boot_samples)
    path = storage.baseline_path(tmp_path, "tiny-cpu", fingerprint.key)
    storage.update_baseline(path, "tiny-cpu", fingerprint, [entry])


def _record_boot_history(tmp_path: Path, medians: list[float], rng: np.random.Generator) -> None:
    """A baseline of several boots, 20 requests each, 1% around each of ``medians``."""
    boot_samples = [list(m * rng.lognormal(0, 0.01, 20)) for m in medians]
    _record_baseline(tmp_path, [x for boot in boot_samples for x in boot], boot_samples=boot_samples)


def _needs(ledger: BootLedger, boot: int, planned: int = 1) -> bool:
    return ledger.needed(TEST, BootSlot(SimpleNamespace(name="default"), boot), planned)[0]


def test_a_first_boot_that_looks_worse_asks_for_another_boot_and_the_second_decides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    _record_boot_history(tmp_path, [700, 690, 710, 705, 695], rng)
    boot_runs = {1: _boot(500, rng), 2: _boot(700, rng)}  # an unlucky first boot, then a normal one
    played: list[tuple[int, dict[str, Any]]] = []
    ledger = BootLedger()

    def fake_run_scenario(target: Target, scenario: Any) -> RunResult:
        played.append((scenario.seed, {"api_key": target.api_key, "endpoint": target.endpoint,
                                       "server_metrics": target.server_metrics, "extra_body": target.extra_body}))
        return boot_runs[len(played)]

    monkeypatch.setattr(runner, "run_scenario", fake_run_scenario)
    failures: list[str] = []
    first = _recorder(tmp_path, failures, [], ledger=ledger)
    result = first.check(first.measure(SCENARIO, endpoint="chat", server_metrics=False), ["decode_tok_s"])
    assert played[0][1] == {"api_key": None, "endpoint": "chat", "server_metrics": False, "extra_body": None}
    assert not failures, "one boot convicted"
    assert result.metrics["decode_tok_s"].baseline.boots_current == 1
    assert any(m.startswith("boot 2 of default asked for: decode looks -28") and
               "one boot can screen, never convict" in m for m in note_texts(result.messages)), result.messages
    assert _needs(ledger, 2) and not _needs(ledger, 3)

    second = _recorder(tmp_path, failures, [], boot=2, ledger=ledger)
    result = second.check(second.measure(SCENARIO, endpoint="chat", server_metrics=False), ["decode_tok_s"])
    # the second boot is measured the way the test asked for the first, with the same prompts:
    # a booted server is a fresh process a boot, its prefix cache empty (test_prompt_isolation.py)
    assert played[1][1] == played[0][1] and played[1][0] == played[0][0]
    verdict = comparison_json(result.metrics["decode_tok_s"].baseline)
    assert verdict["boots_current"] == 2 and verdict["n_current"] == 16 and verdict["boots_reference"] == 5
    assert verdict["verdict"] in ("no detectable change", "within tolerance")
    assert not any("asked for" in m for m in note_texts(result.messages))
    assert not failures
    assert not _needs(ledger, 3), "a settled test asked for a third boot"


def test_boots_on_demand_stop_at_the_deployments_maximum(tmp_path: Path) -> None:
    # tiny-cpu's five measured boots of one server (stats.py): against that spread, two boots
    # that both look 27% worse show neither a sign at the run's level nor a change beyond the
    # 25% tolerance (the 90% interval excludes zero: it said "changed" before a sign was a claim).
    rng = np.random.default_rng(2)
    _record_boot_history(tmp_path, [779, 677, 517, 746, 747], rng)
    ledger = BootLedger()
    failures: list[str] = []
    first = _recorder(tmp_path, failures, [], ledger=ledger).check(_boot(500, rng), ["decode_tok_s"])
    assert any("boot 2 of default asked for" in m for m in note_texts(first.messages))
    last = _recorder(tmp_path, failures, [], boot=2, ledger=ledger).check(_boot(500, rng), ["decode_tok_s"])
    assert NOISY.max_boots == 2 and not _needs(ledger, 3)
    assert not any("asked for" in m for m in note_texts(last.messages))
    verdict = comparison_json(last.metrics["decode_tok_s"].baseline)
    assert (verdict["verdict"], verdict["boots_current"]) == ("inconclusive", 2)
    assert verdict["ci_high"] < 0 < verdict["bound_high"]
    # the last boot's verdict is final: a warning with the planner's advice, never a failure
    (warning,) = [w for w in last.warnings if "inconclusive" in note_text(w.note)]
    assert "you need" in note_text(warning.note) or "too few" in note_text(warning.note)
    assert warning.kind is WarningKind.INCONCLUSIVE  # an InconclusiveWarning, for filterwarnings
    assert not failures


def test_a_clear_regression_fails_on_the_second_boot_with_the_one_line_verdict(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    _record_boot_history(tmp_path, [700, 698, 703, 701, 699], rng)
    ledger = BootLedger()
    failures: list[str] = []
    first = _recorder(tmp_path, failures, [], ledger=ledger, deployment=QUIET).check(
        _boot(500, rng), ["decode_tok_s"])
    assert not failures, "one boot convicted"
    assert "a verdict needs 2 boots" in note_text(first.metrics["decode_tok_s"].baseline_line)
    assert _needs(ledger, 2)
    with pytest.raises(AssertionError):
        _recorder(tmp_path, failures, [], boot=2, ledger=ledger, deployment=QUIET).check(
            _boot(500, rng), ["decode_tok_s"])
    assert len(failures) == 1 and "REGRESSION" in failures[0] and "\n" not in failures[0]
    assert "2 boots (16 samples) vs 5 reference boots" in failures[0]
    assert not _needs(ledger, 3)


def test_planned_boots_are_judged_after_the_last_of_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    _record_boot_history(tmp_path, [700, 698, 703, 701, 699], rng)
    ledger = BootLedger()
    failures: list[str] = []
    for boot in (1, 2):
        result = _recorder(tmp_path, failures, [], boot=boot, ledger=ledger, deployment=QUIET, boots=3).check(
            _boot(500, rng), ["decode_tok_s"])
        assert f"boot {boot} of 3 planned: the verdict comes after boot 3" in note_texts(result.messages)
        assert not failures
    with pytest.raises(AssertionError):
        _recorder(tmp_path, failures, [], boot=3, ledger=ledger, deployment=QUIET, boots=3).check(
            _boot(500, rng), ["decode_tok_s"])
    assert len(failures) == 1 and "REGRESSION" in failures[0] and "3 boots (24 samples)" in failures[0]
    assert not _needs(ledger, 4, planned=3)


def test_below_floor_fails_between_floor_and_target_warns(tmp_path: Path) -> None:
    failures: list[str] = []
    published: list[Any] = []
    recorder = _recorder(tmp_path, failures, published)
    with pytest.raises(AssertionError):
        recorder.check(_run([80.0] * 8), ["decode_tok_s"], floor=True)
    assert "below the floor of 100" in failures[0]
    result = _recorder(tmp_path, failures, published).check(_run([200.0] * 8), ["decode_tok_s"], floor=True)
    assert [w.kind for w in result.warnings if "below the target of 300" in note_text(w.note)] == [WarningKind.BELOW_TARGET]


@pytest.mark.parametrize(("nodeid", "profile", "key"), [
    ("t.py::test_x[ring-ll]", "ring-ll", "t.py::test_x"),
    ("t.py::test_x[ring-ll-8]", "ring-ll", "t.py::test_x[8]"),
    ("t.py::test_x[8-ring-ll]", "ring-ll", "t.py::test_x[8]"),
    ("t.py::test_x[a-default-b]", "default", "t.py::test_x[a-b]"),
])
def test_baseline_key_drops_only_the_profile(nodeid: str, profile: str, key: str) -> None:
    assert strip_profile(nodeid, profile) == key


def test_corrupt_baseline_fails_the_test_with_its_message_not_a_traceback(tmp_path: Path) -> None:
    path = storage.baseline_path(tmp_path, "tiny-cpu", FP.key)
    path.parent.mkdir(parents=True)
    path.write_text("{ not json")
    failures: list[str] = []
    with pytest.raises(AssertionError):
        _recorder(tmp_path, failures, []).check(_run([700.0] * 8), ["decode_tok_s"])
    assert len(failures) == 1 and str(path) in failures[0]
    assert path.read_text() == "{ not json", "the corrupt file was touched"


def test_insufficient_samples_pass_with_a_warning(tmp_path: Path) -> None:
    _record_baseline(tmp_path, [700.0, 701.0, 699.0, 702.0, 698.0][:MIN_SAMPLES_PER_BOOT - 1])
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_run([700.0] * 8), ["decode_tok_s"])
    assert not failures
    assert result.metrics["decode_tok_s"].baseline.verdict.value == "insufficient samples"
    assert any("insufficient samples" in w for w in warning_lines(result))


def test_other_hardwares_baseline_is_shown_as_not_comparable_never_judged(tmp_path: Path) -> None:
    other = Fingerprint(hard={**FP.hard, "cpu.cores": "64"}, soft={})
    _record_baseline(tmp_path, [1400.0 + i for i in range(10)], fingerprint=other)
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_run([700.0 + i for i in range(8)]), ["decode_tok_s"])
    assert not failures, "a baseline from other hardware failed the test"
    metric = result.metrics["decode_tok_s"]
    assert metric.baseline.verdict.value == "not comparable"
    assert metric.baseline.change == pytest.approx(-0.5, abs=0.01)
    assert f"recorded on other hardware ({other.key}: cpu.cores: 64 -> 2)" in note_text(metric.baseline_line)
    assert f"no baseline for this hardware ({FP.key}): run --kimiperf-update-baselines (it records this run's " \
           "figures as the new baseline: review the diff)" in note_text(metric.baseline_line)
    # The session's one missing-baseline warning says it: no warning of its own per metric.
    assert not any("not comparable" in w for w in warning_lines(result))


def test_soft_facts_that_differ_only_warn(tmp_path: Path) -> None:
    recorded = Fingerprint(hard=FP.hard, soft={"host.name": "gpu-runner-1", "kernel": "6.8.0"})
    _record_baseline(tmp_path, [700.0 + i for i in range(10)], fingerprint=recorded)
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_run([700.0 + i for i in range(8)]), ["decode_tok_s"])
    assert not failures
    assert result.metrics["decode_tok_s"].baseline.verdict.value == "no detectable change"
    assert [(w.kind, note_text(w.note)) for w in result.warnings if "soft facts" in note_text(w.note)] == [(
        WarningKind.SOFT_FINGERPRINT, "the baseline was recorded with other soft facts (they only warn; the hardware and software "
        "that set speed match): host.name: gpu-runner-1 -> <absent>; kernel: 6.8.0 -> <absent>")]


def _with_failures(run: RunResult, n: int) -> RunResult:
    bad = RequestRecord(ok=False, error="HTTP 500", prompt_tokens=8, output_tokens=0, t_send_ns=0,
                        chunk_ns=(), t_done_ns=1)
    rnd = run.rounds[0]
    return RunResult(scenario_name=run.scenario_name,
                     rounds=(RoundResult(records=rnd.records + (bad,) * n, wall_s=rnd.wall_s),))


def test_a_few_failed_requests_warn_and_many_fail_the_test(tmp_path: Path) -> None:
    failures: list[str] = []
    result = _recorder(tmp_path, failures, []).check(_with_failures(_run([700.0] * 19), 1), ["decode_tok_s"])
    assert not failures
    assert "1 of 20 measured requests failed and are not counted (1x HTTP 500)" in warning_lines(result)
    with pytest.raises(AssertionError):
        _recorder(tmp_path, failures, []).check(_with_failures(_run([700.0] * 17), 3), ["decode_tok_s"])
    assert failures == ["3 of 20 measured requests failed and are not counted (3x HTTP 500): more than 10% "
                        "failed, the server did not serve this load"]


def test_a_p99_of_eight_requests_is_insufficient_never_a_verdict_while_pooled_itl_has_enough(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    runs = iter([_boot(700, rng), _boot(400, rng)])
    monkeypatch.setattr(runner, "run_scenario", lambda *a, **k: next(runs))
    record = _recorder(tmp_path, [], [], deployment=QUIET)
    first = record.check(record.measure(SCENARIO), ["p99_e2el_ms", "p99_itl_ms"])
    entries, _ = baseline_entries([first], git_commit=None)
    path = storage.baseline_path(tmp_path, "tiny-cpu", FP.key)
    storage.update_baseline(path, "tiny-cpu", FP, entries)
    failures: list[str] = []
    again = _recorder(tmp_path, failures, [], deployment=QUIET, ledger=BootLedger())
    result = again.check(again.measure(SCENARIO), ["p99_e2el_ms", "p99_itl_ms"])
    e2el = comparison_json(result.metrics["p99_e2el_ms"].baseline)
    # 8 requests cannot carry a p99 (300 per boot needed): said, never judged.
    assert e2el["verdict"] == "insufficient samples"
    assert "insufficient samples for this tail: a boot needs 300, this one has 8" in e2el["message"]
    # 8 x 64 pooled gaps can: the 43% slower boot is screened for a second boot.
    itl = comparison_json(result.metrics["p99_itl_ms"].baseline)
    assert itl["verdict"] == "changed, size unresolved" and itl["boots_current"] == 1
    assert not failures


def test_slos_fail_a_missed_limit_and_a_tail_too_thin_for_its_quantile_only_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    monkeypatch.setattr(runner, "run_scenario", lambda *a, **k: _boot(100, rng))
    failures: list[str] = []
    record = _recorder(tmp_path, failures, [], deployment=QUIET)
    # 100 tok/s: every gap is 10 ms, so a p99 ITL under 5 ms is missed.
    with pytest.raises(AssertionError):
        record.check(record.measure(SCENARIO), ["decode_tok_s"], slo={"p99_itl_ms": 5, "p99_ttft_ms": 2000})
    assert "SLO p99_itl_ms <= 5 ms: 10" in failures[0] and "SLO missed" in failures[0]
    published: list[Any] = []
    ok = _recorder(tmp_path, [], published, deployment=QUIET)
    result = ok.check(ok.measure(SCENARIO), ["decode_tok_s"], slo={"p99_itl_ms": 50, "p99_ttft_ms": 2000})
    assert any(m.startswith("SLO p99_itl_ms <= 50 ms: 10") for m in note_texts(result.messages))
    assert any("SLO p99_ttft_ms <= 2000 ms: insufficient samples" in w for w in warning_lines(result))
    typo: list[str] = []
    bad = _recorder(tmp_path, typo, [], deployment=QUIET)
    with pytest.raises(AssertionError):
        bad.check(bad.measure(SCENARIO), ["decode_tok_s"], slo={"p99_tft_ms": 5})
    assert "unknown metric 'p99_tft_ms'" in typo[0]


def test_goodput_counts_requests_meeting_every_slo_and_is_gated_like_a_metric(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    monkeypatch.setattr(runner, "run_scenario", lambda *a, **k: _rounds(3, 100, rng))
    record = _recorder(tmp_path, [], [], deployment=QUIET)
    run = record.measure(SCENARIO)
    result = record.check(run, ["decode_tok_s"], goodput={"ttft_ms": 1000, "tpot_ms": 50})
    goodput = result.metrics["request_goodput"]
    # every request met both: one sample per round
    assert goodput.samples == [pytest.approx(rnd.request_throughput) for rnd in run.rounds]
    strict = record.check(run, ["decode_tok_s"], goodput={"tpot_ms": 5})
    assert strict.metrics["request_goodput"].samples == [0.0, 0.0, 0.0]
    assert "goodput SLOs: tpot_ms <= 5" in note_texts(strict.messages)


def _rounds(n: int, median: float, rng: np.random.Generator) -> RunResult:
    """A run of ``n`` rounds of 8 requests each, 1% around ``median``."""
    return dataclasses.replace(_boot(median, rng), rounds=tuple(_boot(median, rng).rounds[0] for _ in range(n)))


@pytest.mark.parametrize("metrics,goodput", [(["output_throughput"], None), (["decode_tok_s"], {"ttft_ms": 1000})])
def test_a_per_round_metric_of_fewer_rounds_than_a_verdict_needs_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: list[str], goodput: dict[str, float] | None) -> None:
    # One round is one throughput sample: judged, it passed as "insufficient samples" and gated nothing.
    rng = np.random.default_rng(6)
    monkeypatch.setattr(runner, "run_scenario", lambda *a, **k: _rounds(MIN_SAMPLES_PER_BOOT - 1, 100, rng))
    failures: list[str] = []
    record = _recorder(tmp_path, failures, [], deployment=QUIET)
    with pytest.raises(AssertionError):
        record.check(record.measure(SCENARIO), metrics, goodput=goodput)
    name = metrics[0] if goodput is None else "request_goodput"
    assert failures == [
        f"perf.check of {TEST}: {name} is one sample per round: this run has 2 rounds and a boot needs 3 for a "
        "verdict (fewer would pass as 'insufficient samples' and gate nothing); measure it with rounds=3 or more"]


def test_the_host_watch_reads_the_gpus_cuda_visible_devices_gives_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pynvml")
    gpu_deployment = dataclasses.replace(NOISY, gpu_count=2, tensor_parallel_size=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")
    assert gpu_watch(gpu_deployment)["gpu_indices"] == (6, 7)
    pinned = dataclasses.replace(gpu_deployment, env=MappingProxyType({"CUDA_VISIBLE_DEVICES": "2,3"}))
    assert gpu_watch(pinned)["gpu_indices"] == (2, 3)


def _account(boot: int, ready_s: float, weights_s: float, *, first: bool = False) -> BootAccount:
    return BootAccount(profile="default", ordinal=boot, total_s=ready_s, first_of_deployment=first,
                       phases=(PhaseTime("loading weights", weights_s), PhaseTime("compiling", ready_s - weights_s)))


def test_a_boot_that_got_slower_to_ready_is_a_regression_against_its_history(tmp_path: Path) -> None:
    # Boot metrics are metrics like any other: one sample per boot (the boot's own seconds),
    # judged boot against boot with the history, here on the quiet deployment's spreads.
    entry = baselines.make_entry(test=TEST, profile="default", metric="boot_ready_s", unit="s",
                                 direction=Direction.LOWER_IS_BETTER, samples=[40.0], git_commit=None,
                                 profile_env={}, boot_samples=[[40.0], [40.4], [39.6], [40.2], [39.8]])
    storage.update_baseline(storage.baseline_path(tmp_path, "tiny-cpu", FP.key), "tiny-cpu", FP, [entry])
    ledger, failures, published = BootLedger(), [], []
    # A disk or driver change: +40% (the 25% tolerance is a band symmetric on the log ratio,
    # 0.75x to 1/0.75x, so a latency is within it up to +33%).
    for boot, ready_s in ((1, 56.0), (2, 55.0), (3, 57.0)):
        recorder = _recorder(tmp_path, failures, published, boot=boot, ledger=ledger, deployment=QUIET, boots=3,
                             account=_account(boot, ready_s, 10.0))
        with contextlib.suppress(AssertionError):
            recorder.check(_run([700.0] * 8), ["boot_ready_s", "boot_weights_s"])
    result = published[-1]
    assert result.metrics["boot_ready_s"].samples == [57.0] and result.metrics["boot_weights_s"].samples == [10.0]
    verdict = comparison_json(result.metrics["boot_ready_s"].baseline)
    assert (verdict["verdict"], verdict["boots_current"], verdict["boots_reference"]) == ("regression", 3, 5)
    assert failures and "seconds to ready s: REGRESSION +" in failures[-1]


def test_the_sessions_first_boot_of_the_deployment_is_no_sample_of_boot_time(tmp_path: Path) -> None:
    # It fills the page and compile caches for every boot after it: another quantity.
    recorder = _recorder(tmp_path, [], [], account=_account(1, 90.0, 30.0, first=True))
    result = recorder.check(_run([700.0] * 8), ["boot_ready_s"])
    assert result.metrics["boot_ready_s"].samples == []
    with pytest.raises(ConfigError, match="boot_ready_s is the boot's, not the run's"):
        _run([700.0] * 8).samples("boot_ready_s")
