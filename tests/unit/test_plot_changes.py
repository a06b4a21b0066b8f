"""Plots that compare profiles carry the uncertainty: every boot is a point, never a line through
medians, and each comparison is drawn with its interval and verdict, grey unless the verdict found
a direction, so a picture cannot show a difference the statistics did not find (issue 49)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from pytest_kimiperf.config.metric_specs import metric_spec
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.reports.model import SessionReport, build_session_report
from pytest_kimiperf.reports.plots import NO_FINDING_COLOUR, ChangeRow, verdict_colour
from tests.plugin.test_export import result

pytest.importorskip("matplotlib")

CONCURRENCIES = (4, 8, 16)
ORDER = ("default", "ring-ll", "ring-ll", "default", "default", "ring-ll")  # make perf's A B B A A B


def throughput(profile: str, concurrency: int, boot: int, center: float, seed: int) -> TestResult:
    res = result(profile, concurrency, boot)
    spec = metric_spec("output_throughput")
    rounds = np.random.default_rng(seed).normal(center, center * 0.02, 3)
    res.metrics["output_throughput"] = MetricResult(
        "output_throughput", spec.unit, spec.direction.value, spec.default_tolerance,
        [round(float(x), 1) for x in rounds], boot_label=f"{profile} boot {boot}")
    return res


def session(slower_at: int) -> SessionReport:
    """Three boots a side; ring-ll is the same as default except 40% slower at ``slower_at``."""
    results = []
    for concurrency in CONCURRENCIES:
        boots = {"default": 0, "ring-ll": 0}
        for i, profile in enumerate(ORDER):
            boots[profile] += 1
            center = 1000.0 * (0.6 if profile == "ring-ll" and concurrency == slower_at else 1.0)
            results.append(throughput(profile, concurrency, boots[profile], center, seed=100 * concurrency + i))
    return build_session_report(results=results, reference_profile="default", profiles=[],
                                deployment={"name": "tiny-cpu"}, fingerprint=None,
                                created_at="2026-01-02T03:04:05Z", generator="test")


def test_the_throughput_plot_draws_every_boot_and_no_line_through_medians() -> None:
    from pytest_kimiperf.reports.plots import plot_throughput_latency, throughput_changes, throughput_curves

    report = session(slower_at=16)
    ((group, points),) = throughput_curves(report.results).items()
    assert len(points) == len(CONCURRENCIES) * len(ORDER)  # one point per boot
    changes = throughput_changes(report, points)
    assert [row.label for row in changes] == [f"ring-ll c{c}" for c in CONCURRENCIES]
    fig = plot_throughput_latency(group, points, changes, "default")
    latency_axes, verdict_axis = fig.axes[:2], fig.axes[2]
    for ax in latency_axes:
        assert not ax.get_lines(), "a line joins the points: it reads as a trend the verdict may not hold"
        assert sum(len(c.get_offsets()) for c in ax.collections) == len(points)
    assert "verdict" in verdict_axis.get_title()


def test_a_row_without_a_finding_is_grey_and_its_interval_crosses_zero() -> None:
    from pytest_kimiperf.reports.plots import plot_throughput_latency, throughput_changes, throughput_curves

    report = session(slower_at=16)
    ((group, points),) = throughput_curves(report.results).items()
    changes = throughput_changes(report, points)
    by_label = {row.label: row.comparison for row in changes}
    same, slower = by_label["ring-ll c4"], by_label["ring-ll c16"]
    assert same is not None and slower is not None
    assert same.verdict not in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
    assert verdict_colour(same) == NO_FINDING_COLOUR
    assert slower.verdict is VerdictKind.REGRESSION and verdict_colour(slower) != NO_FINDING_COLOUR
    fig = plot_throughput_latency(group, points, changes, "default")
    bars = [line for line in fig.axes[2].get_lines() if len(line.get_xdata()) == 2
            and line.get_ydata()[0] == line.get_ydata()[1]]
    drawn = {(round(min(line.get_xdata()), 6), round(max(line.get_xdata()), 6)): line.get_color() for line in bars}
    assert drawn[(round(same.ci_low * 100, 6), round(same.ci_high * 100, 6))] == NO_FINDING_COLOUR
    assert same.ci_low < 0 < same.ci_high  # the grey bar crosses zero: no difference drawn
    texts = " ".join(t.get_text() for t in fig.axes[2].texts)
    assert "worse" in texts and "interval)" in texts


def test_the_distribution_plot_carries_the_verdict_panel(tmp_path: Path) -> None:
    from pytest_kimiperf.reports.plots import plot_distribution

    report = session(slower_at=8)
    block = next(b for b in report.test_blocks() if b.test.endswith("[8]"))
    (metric,) = block.metrics
    fig = plot_distribution(block, metric, "default")
    boxes, verdicts = fig.axes
    assert len(boxes.get_xticklabels()) == len(ORDER)  # every boot its own box and points
    assert [t.get_text() for t in verdicts.get_yticklabels()] == ["ring-ll"]
    assert any(line.get_color() != NO_FINDING_COLOUR for line in verdicts.get_lines()
               if len(line.get_xdata()) == 2 and line.get_ydata()[0] == line.get_ydata()[1])


def test_a_row_with_no_comparison_says_why() -> None:
    from matplotlib.figure import Figure

    from pytest_kimiperf.reports.plots import draw_changes

    ax = Figure().add_subplot()
    draw_changes(ax, [ChangeRow("ring-ll", None, "INVALID measurement")], reference="default")
    assert [t.get_text() for t in ax.texts] == ["INVALID measurement"]


def test_a_comparison_without_a_figure_says_its_verdict_and_the_axes_stay_finite(tmp_path: Path) -> None:
    # A side whose boot kept too few samples (insufficient samples: change and interval NaN) had
    # set the axis limits to NaN, and matplotlib's ValueError lost every plot of the run.
    from matplotlib.figure import Figure

    from pytest_kimiperf.reports.plots import draw_changes

    report = session(slower_at=16)
    compared = next(c.comparison for b in report.test_blocks() for m in b.metrics for c in m.cells
                    if c.comparison is not None)
    empty = dataclasses.replace(compared, change=float("nan"), ci_low=float("nan"), ci_high=float("nan"),
                                verdict=VerdictKind.INSUFFICIENT_SAMPLES)
    ax = Figure().add_subplot()
    draw_changes(ax, [ChangeRow("ring-ll c4", empty), ChangeRow("ring-ll c8", compared)], reference="default")
    low, high = ax.get_xlim()
    assert np.isfinite([low, high]).all() and high == pytest.approx(-low)
    assert "insufficient samples" in [t.get_text() for t in ax.texts]
    ax.figure.savefig(tmp_path / "p.png")


def test_a_long_invalid_reason_does_not_squeeze_the_plot_to_nothing(tmp_path: Path) -> None:
    # make perf on a busy host: matplotlib's "axes sizes collapsed to zero", an error under
    # filterwarnings = error, lost every plot of the run.
    import warnings

    from pytest_kimiperf.reports.plots import plot_distribution, save_figure

    report = session(slower_at=8)
    block = next(b for b in report.test_blocks() if b.test.endswith("[8]"))
    (metric,) = block.metrics
    reason = ("INVALID measurement: host busy: other processes used 33% of the host's CPU (bound 10%): pid 22219 "
              "python (19%), pid 21153 python (8%), pid 21149 python (5%), pid 105 kdamond.0 (1%), pid 1 "
              "process_api (0%); measured 3 times, disturbed every time: no verdict from a busy host")
    cells = tuple(dataclasses.replace(c, comparison=None, note=reason) if not c.is_reference else c
                  for c in metric.cells)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_figure(plot_distribution(block, dataclasses.replace(metric, cells=cells), "default"), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
