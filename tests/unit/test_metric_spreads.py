"""A metric that declares its own boot spread (a deployment's ``boot_spreads``) is judged by it
against its baseline, and every other metric by the deployment's: the tail of the CPU engine
spreads wider than its medians, and one spread for both let the tail's boots read as a change."""

from __future__ import annotations

from pathlib import Path

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge import baselines
from pytest_kimiperf.judge.stats import summarize_boot
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.gate import judge_metric
from pytest_kimiperf.judge.verdicts import MetricResult
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.storage.baselines import load_baselines

TEST = "tests/test_perf.py::test_decode"
FINGERPRINT = Fingerprint(hard={"gpu.count": "0", "cpu.model": "Test CPU", "cpu.cores": "2", "cpu.isa": "avx2"}, soft={})
UNITS = {"decode_tok_s": ("tok/s", "higher_is_better"), "p99_itl_ms": ("ms", "lower_is_better")}
SPREADS = Spreads(0.18, 0.2, 0.15, boot_by_metric=(("p99_itl_ms", 0.33),))


def _record(tmp_path: Path) -> None:
    for metric, (unit, direction) in UNITS.items():
        boots = [[100.0 * (1 + 0.00002 * i) * (1 + 0.05 * b) for i in range(400)] for b in range(3)]
        entry = baselines.make_entry(test=TEST, profile="default", metric=metric, unit=unit,
                                     direction=Direction(direction), samples=boots[-1], git_commit=None,
                                     profile_env={}, boot_samples=boots)
        storage.update_baseline(storage.baseline_path(tmp_path, "my-server", FINGERPRINT.key), "my-server",
                                FINGERPRINT, [entry])


def test_each_metric_is_judged_against_its_baseline_by_its_own_declared_boot_spread(tmp_path: Path) -> None:
    _record(tmp_path)
    declared = {}
    for metric, (unit, direction) in UNITS.items():
        samples = [100.0 * (1 + 0.00002 * i) for i in range(400)]
        mres = MetricResult(metric, unit, direction, 0.25, samples, boot_label="default boot 1")
        comparison, _ = judge_metric(mres, test=TEST, profile="default",
                                     baselines=load_baselines(tmp_path, "my-server", FINGERPRINT), profile_env={},
                                     current=[summarize_boot(samples, "b1")] * 2, prior_spread=SPREADS)
        assert comparison is not None and comparison.spread_source is not None
        declared[metric] = comparison.spread_source.declared
    assert declared == {"decode_tok_s": 0.18, "p99_itl_ms": 0.33}
