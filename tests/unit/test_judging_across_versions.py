"""An engine upgrade is what the gate judges: the same hardware's baseline, recorded under other
vLLM / torch / NCCL versions, still judges a run (naming the versions); other hardware never does."""

from __future__ import annotations

from pathlib import Path

from pytest_kimiperf.judge import baselines
from pytest_kimiperf.judge.baselines import Fingerprint, version_changes
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.storage.baselines import load_baselines
from pytest_kimiperf.judge.verdicts import MetricResult, ResultWarning, TestResult
from pytest_kimiperf.judge.gate import (
    WarningKind, judge_metric, missing_baselines, warning_kinds,
)
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import summarize_boot
from pytest_kimiperf.reports.sentences import note_text

TEST = "t.py::test"
HARDWARE = {"gpu.count": "8", "gpu.name": "NVIDIA RTX PRO 6000", "gpu.interconnect": "PCIe"}
OLD = Fingerprint(hard={**HARDWARE, "software.vllm": "vllm 0.32.0", "software.torch": "2.12.0",
                        "software.nccl": "2.27.0"}, soft={})
NEW = Fingerprint(hard={**HARDWARE, "software.vllm": "vllm 0.33.0", "software.torch": "2.13.0",
                        "software.nccl": "2.27.0"}, soft={})
OTHER_GPU = Fingerprint(hard={**OLD.hard, "gpu.name": "NVIDIA H100"}, soft={})


def _record(tmp_path: Path, fingerprint: Fingerprint, median: float) -> None:
    boots = [[median * (1 + 0.001 * i) for i in range(10)] for _ in range(3)]
    entry = baselines.make_entry(test=TEST, profile="default", metric="decode_tok_s", unit="tok/s",
                                 direction=Direction.HIGHER_IS_BETTER, samples=boots[-1], git_commit=None,
                                 profile_env={}, boot_samples=boots)
    storage.update_baseline(storage.baseline_path(tmp_path, "kimi", fingerprint.key), "kimi", fingerprint,
                              [entry])


def _judge(tmp_path: Path, median: float) -> tuple[MetricResult, object]:
    samples = [median * (1 + 0.001 * i) for i in range(10)]
    metric = MetricResult("decode_tok_s", "tok/s", "higher_is_better", 0.03, samples, boot_label="default boot 1")
    comparison, line = judge_metric(
        metric, test=TEST, profile="default", baselines=load_baselines(tmp_path, "kimi", NEW), profile_env={},
        current=[summarize_boot(samples, "b1")] * 3, prior_spread=0.01,
    )
    metric.baseline = comparison.to_dict() if comparison else None
    metric.baseline_line = line
    return metric, comparison


def test_only_version_facts_may_differ_for_a_comparison_across_versions() -> None:
    assert version_changes(OLD, NEW) == ["software.torch: 2.12.0 -> 2.13.0",
                                         "software.vllm: vllm 0.32.0 -> vllm 0.33.0"]
    assert version_changes(OTHER_GPU, NEW) is None


def test_an_upgrade_is_judged_against_the_same_hardwares_baseline_naming_the_versions(tmp_path: Path) -> None:
    _record(tmp_path, OLD, 80.0)
    metric, comparison = _judge(tmp_path, 60.0)  # 25% slower after the upgrade
    assert comparison is not None and comparison.verdict.value == "regression"
    assert "judged against the baseline of other software versions on the same hardware" in note_text(metric.baseline_line)
    assert "software.vllm: vllm 0.32.0 -> vllm 0.33.0" in note_text(metric.baseline_line)
    result = TestResult(test=TEST, nodeid=TEST, profile="default", deployment="kimi", scenario="s",
                        metrics={"decode_tok_s": metric})
    assert missing_baselines(result) == []
    assert [w.kind for w in warning_kinds(result, missing_baseline_fails=False)] == [WarningKind.OTHER_VERSIONS]


def test_other_hardware_is_never_judged_and_counts_as_missing(tmp_path: Path) -> None:
    _record(tmp_path, OTHER_GPU, 80.0)
    metric, comparison = _judge(tmp_path, 60.0)
    assert comparison is not None and comparison.verdict.value == "not comparable"
    result = TestResult(test=TEST, nodeid=TEST, profile="default", deployment="kimi", scenario="s",
                        metrics={"decode_tok_s": metric})
    assert len(missing_baselines(result)) == 1
    kinds = warning_kinds(result, missing_baseline_fails=False)
    assert ResultWarning(WarningKind.MISSING_BASELINE, metric.baseline_line) in kinds
    assert WarningKind.MISSING_BASELINE not in [w.kind for w in warning_kinds(result, missing_baseline_fails=True)]
