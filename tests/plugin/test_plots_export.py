"""The plots issue 16 adds: this run beside its baseline per gated metric, and the
throughput-vs-latency curve of a test parametrized over concurrency."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from pytest_kimiperf.judge import baselines
from pytest_kimiperf.storage import baselines as storage

from pytest_kimiperf.judge.baselines import baseline_entries
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.stats import compare_boots
from pytest_kimiperf.reports.model import SessionReport, build_session_report
from tests.plugin.test_export import result

FINGERPRINT = Fingerprint(hard={"gpu.count": "0", "cpu.model": "Test CPU", "cpu.cores": "2"}, soft={})


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def assert_sensible_png(path: Path) -> None:
    width, height = png_size(path)
    assert 500 <= width <= 1200 and 300 <= height <= 1200, (path.name, width, height)
    assert path.stat().st_size > 10_000  # an empty canvas compresses to a few kB


def ttft_result(center: float, boot: int = 1) -> TestResult:
    res = result("default", boot=boot)
    spec = metric_spec("ttft_ms")
    res.metrics["ttft_ms"] = MetricResult(
        "ttft_ms", spec.unit, spec.direction.value, spec.default_tolerance,
        [center + 0.1 * i for i in range(20)], boot_label=f"default boot {boot}")
    return res


def report_of(results: list[TestResult]) -> SessionReport:
    return build_session_report(results=results, reference_profile="default", profiles=[],
                                deployment={"name": "tiny-cpu"}, fingerprint=None,
                                created_at="2026-01-02T03:04:05Z", generator="test")


def test_a_judged_metric_gets_a_plot_beside_its_baseline_with_the_verdict(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pytest_kimiperf.reports.plots import render_plots

    entries, _ = baseline_entries([ttft_result(18.0)], git_commit=None)
    path = storage.baseline_path(tmp_path, "tiny-cpu", FINGERPRINT.key)
    storage.update_baseline(path, "tiny-cpu", FINGERPRINT, entries)
    stored = storage.load_baseline(path)
    assert stored is not None
    current = ttft_result(20.0)
    entry = stored.entry(current.test, current.profile, "ttft_ms")
    assert entry is not None
    current.metrics["ttft_ms"].baseline = compare_boots(
        [current.metrics["ttft_ms"].boot_summary()], entry.summaries(), direction=Direction.LOWER_IS_BETTER,
        tolerance=0.05, prior_spread=0.01, metric="time to first token", unit="ms")
    files = render_plots(report_of([current]), tmp_path / "plots", baseline=stored)
    against = [p for p in files if p.name.endswith("--vs-baseline.png")]
    assert [p.name for p in against] == [
        "test_perf.py--test_throughput_4--default--boot1--ttft_ms--vs-baseline.png"]
    assert_sensible_png(against[0])


def test_without_a_baseline_comparison_there_is_no_baseline_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pytest_kimiperf.reports.plots import render_plots

    files = render_plots(report_of([ttft_result(20.0)]), tmp_path / "plots", baseline=None)
    assert not [p for p in files if "vs-baseline" in p.name]


def test_a_test_parametrized_over_concurrency_gets_a_throughput_latency_curve(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from pytest_kimiperf.reports.plots import render_plots, throughput_curves

    results = [result(profile, concurrency) for profile in ("default", "ring-ll") for concurrency in (4, 8, 16)]
    curves = throughput_curves(results)
    assert list(curves) == ["test_perf.py::test_throughput 32in-5out"]
    assert sorted({(p.profile, p.concurrency) for p in curves["test_perf.py::test_throughput 32in-5out"]}) == [
        (profile, c) for profile in ("default", "ring-ll") for c in (4, 8, 16)]
    files = render_plots(report_of(results), tmp_path / "plots")
    curve = [p for p in files if p.name.endswith("--throughput-vs-latency.png")]
    assert len(curve) == 1
    assert_sensible_png(curve[0])


def test_a_single_concurrency_draws_no_curve() -> None:
    from pytest_kimiperf.reports.plots import throughput_curves

    assert throughput_curves([result("default", 4), result("ring-ll", 4)]) == {}


SWEPT = """
import pytest
from pytest_kimiperf.measure.workload import Concurrency

@pytest.mark.parametrize("streams", [1, 2])
def test_streams(perf, streams):
    perf.check(perf.measure(Concurrency(concurrency=streams, prompt_tokens=4, output_tokens=8,
                                        requests=6 * streams)), ["ttft_ms"])
"""


@pytest.mark.usefixtures("isolated_state")
def test_the_plugin_draws_baseline_and_throughput_plots_at_session_end(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from tests.helpers import stub_deployment_toml

    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_swept=SWEPT)
    pytester.runpytest_subprocess("--deployment", "stub", "--update-baselines", timeout=180).assert_outcomes(passed=2)
    plots = tmp_path / "plots"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-plots", str(plots), timeout=180)
    result.assert_outcomes(passed=2)
    names = sorted(p.name for p in plots.iterdir())
    assert "test_swept.py--test_streams_1--default--boot1--ttft_ms--vs-baseline.png" in names, names
    assert [n for n in names if n.endswith("--throughput-vs-latency.png")] == [
        "test_swept.py--test_streams_4in-8out--throughput-vs-latency.png"]
    for name in names:
        assert_sensible_png(plots / name)


def test_a_metric_judged_after_a_step_gets_its_history_plotted(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from datetime import UTC, datetime, timedelta

    from pytest_kimiperf.config.deployments import Spreads
    from pytest_kimiperf.judge.baselines import BaselineFile
    from pytest_kimiperf.storage.baselines import dumps_baseline
    from pytest_kimiperf.judge.history import compare_with_history
    from pytest_kimiperf.judge.noise import BootOrigin
    from pytest_kimiperf.reports.plots import render_plots

    current = ttft_result(20.0)
    entry = None
    for night, center in enumerate([18.0, 18.1, 17.9, 18.0, 20.0, 20.1, 19.9, 20.0]):
        boot = baselines.make_entry(
            test=current.test, profile="default", metric="ttft_ms", unit="ms", direction=Direction.LOWER_IS_BETTER,
            samples=[center + 0.01 * i for i in range(20)], git_commit=f"{night}" * 40, profile_env={},
            recorded_at=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(days=night),
            boot_origins=[BootOrigin(session=f"night-{night}", host="runner")])
        entry = boot if entry is None else baselines.append_history(entry, boot)
    assert entry is not None
    path = storage.baseline_path(tmp_path, "tiny-cpu", FINGERPRINT.key)
    path.parent.mkdir(parents=True)
    path.write_text(dumps_baseline(BaselineFile(path=path, deployment="tiny-cpu", fingerprint=FINGERPRINT,
                                                entries={entry.key: entry})))
    stored = storage.load_baseline(path)
    assert stored is not None
    comparison = compare_with_history(
        [current.metrics["ttft_ms"].boot_summary()], stored.entries[entry.key].summaries(),
        direction=Direction.LOWER_IS_BETTER, tolerance=0.05, spreads=Spreads(0.01, 0.01, 0.02))
    assert comparison.boots_reference == 4  # judged against the 4 nights since the step
    current.metrics["ttft_ms"].baseline = comparison
    files = render_plots(report_of([current]), tmp_path / "plots", baseline=stored)
    history = [p for p in files if p.name.endswith("--history.png")]
    assert [p.name for p in history] == ["test_perf.py--test_throughput_4--default--ttft_ms--history.png"]
    assert_sensible_png(history[0])
