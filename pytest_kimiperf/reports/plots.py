"""PNG plots: the samples of each test, each comparison's change, and a metric's boot history.

``--kimiperf-plots DIR``, per perf test: each metric's samples per boot as a box with the points
on top (a bimodal or long-tailed profile a median hides), and each profile's inter-token latency
in run order (stalls and drift); against a baseline, this run's samples beside the baseline's and,
where the history stepped, the history with its steps (:func:`plot_history`, also drawn by
``python -m pytest_kimiperf.history_steps --plot DIR``); over concurrency, throughput against
latency, every boot a point.

A plot of medians invites a by-eye verdict, so every plot that compares profiles carries the
verdict panel (:func:`draw_changes`): each change with its interval, zero and the tolerance band;
only a worse or better verdict takes a colour, the rest are grey.

matplotlib is optional (``pip install 'pytest-kimiperf[plots]'``); figures are drawn on the Agg
canvas, never through pyplot, so a test process's own pyplot backend is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
import hashlib
import math
from pathlib import Path
import re
import textwrap
from typing import Any, assert_never

import numpy as np

from pytest_kimiperf.config.metric_specs import Direction, METRICS, SampleKind
from pytest_kimiperf.errors import ConfigError, KimiperfError
from pytest_kimiperf.judge.baselines import BaselineEntry, BaselineFile
from pytest_kimiperf.judge.notes import HistoryStep, HistorySteps
from pytest_kimiperf.judge.stats import Comparison, VerdictLeaning, leaning
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.numbers import finite_only, fmt_change, fmt_ci, fmt_value
from pytest_kimiperf.reports.answers import interval_level
from pytest_kimiperf.reports.model import MetricBlock, PerfTestBlock, SessionReport, boot_figure, profile_verdict
from pytest_kimiperf.reports.sentences import comparison_line, note_text


DPI = 100


def plot_history(entry: BaselineEntry, steps: Sequence[HistoryStep], *, current: Sequence[float] = (),
                 current_label: str = "this run") -> Any:
    """The entry's boots oldest first (one point each, the x axis their recording dates), a line
    at each segment's geometric mean, a dashed line at each step with its change, and
    ``current`` (this run's boot figures) to the right."""
    from matplotlib.figure import Figure

    # The boots the step search saw: those with enough samples to count.
    boots = [b for b, s in zip(entry.boots, entry.summaries()) if s.usable]
    fig = Figure(figsize=(8, 4.6), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(boots)))
    sessions: dict[str, int] = {}
    for b in boots:
        sessions.setdefault(b.origin.session if b.origin else b.recorded_at, len(sessions))
    colors = [sessions[b.origin.session if b.origin else b.recorded_at] % 10 for b in boots]
    ax.scatter(xs, [b.median for b in boots], c=colors, cmap="tab10", vmin=0, vmax=9, s=26, zorder=3,
               label="stored boots (colour: session)")
    # Each step's boots_before reaches back to the step before it (or the start).
    cuts = [sum(s.boots_before for s in steps[:i + 1]) for i in range(len(steps))]
    edges = [0, *cuts, len(boots)]
    for lo, hi in zip(edges, edges[1:]):
        if hi <= lo:
            continue
        level = math.exp(sum(math.log(b.median) for b in boots[lo:hi]) / (hi - lo))
        ax.hlines(level, lo - 0.3, hi - 0.7, colors="black", linewidth=2, zorder=4)
    for cut, step in zip(cuts, steps):
        ax.axvline(cut - 0.5, color="tab:red", linestyle="--", linewidth=1)
        ax.annotate(f"{step.change * 100:+.1f}%", (cut - 0.5, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", color="tab:red", fontsize=9)
    if current:
        x0 = len(boots) + 0.5
        ax.scatter([x0 + i for i in range(len(current))], list(current), color="tab:orange", marker="D", s=30,
                   zorder=5, label=current_label)
    ticks = xs[:: max(1, len(xs) // 8)]
    ax.set_xticks(ticks, [boots[i].recorded_at[:10] for i in ticks], fontsize=8, rotation=30)
    spec = METRICS.get(entry.metric)
    label = spec.label if spec else entry.metric
    ax.set_ylabel(f"{label} ({entry.unit})" if entry.unit else label)
    if steps:
        said = (f"{len(steps)} step{'s' * (len(steps) != 1)} (red: the change between segment means); "
                f"judged against the {steps[-1].boots_after} boots since the last")
    else:
        said = "no step found: judged against every boot"
    ax.set_title(f"{entry.test} [{entry.profile}]\n{label}: boot history\n{said}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return fig


# Only a verdict that says which way takes a colour; everything else is the grey of "no finding".
_WORSE_COLOUR = "tab:red"
_BETTER_COLOUR = "tab:green"
NO_FINDING_COLOUR = "0.55"
_NOTE_WIDTH = 40


@dataclass(frozen=True)
class ChangeRow:
    """One comparison to draw: its label (``ring-ll c64``), and the comparison or why there is none."""

    label: str
    comparison: Comparison | None
    note: str = ""


def verdict_colour(comparison: Comparison) -> str:
    """Red for worse, green for better, grey for every verdict that found no direction."""
    match lean := leaning(comparison.verdict):  # stats.leaning names every kind
        case VerdictLeaning.WORSE:
            return _WORSE_COLOUR
        case VerdictLeaning.BETTER:
            return _BETTER_COLOUR
        case VerdictLeaning.NEITHER:
            return NO_FINDING_COLOUR
        case _:
            assert_never(lean)


def draw_changes(ax: Any, rows: Sequence[ChangeRow], *, reference: str, in_session: bool = True) -> None:
    """Each row's change in percent with its interval, zero, the tolerance band and the verdict."""
    from matplotlib.transforms import blended_transform_factory

    ax.axvline(0.0, color="black", linewidth=0.8)
    positions = list(range(len(rows)))[::-1]  # the first row on top
    tolerances = {row.comparison.tolerance for row in rows if row.comparison is not None}
    for tol in tolerances:
        ax.axvspan(-tol * 100, tol * 100, color="0.9", zorder=0)
    for y, row in zip(positions, rows):
        c = row.comparison
        if c is None or not _drawable(c):
            # The note's head only (an INVALID reason runs to 300 characters, which would squeeze
            # the axes to nothing): the test's failure and the summary carry it whole. A comparison
            # without a figure (insufficient samples: a side with no usable boot) says its verdict.
            said = row.note or (profile_verdict(c) if c is not None else "") or "not compared"
            note = textwrap.shorten(said, width=_NOTE_WIDTH, placeholder="...")
            ax.text(0.0, y, note, ha="center", va="center", fontsize=7, color="0.4", in_layout=False)
            continue
        colour = verdict_colour(c)
        low, high, mid = c.ci_low * 100, c.ci_high * 100, c.change * 100
        ax.plot([low, high], [y, y], color=colour, linewidth=2.5, solid_capstyle="butt", zorder=3)
        ax.plot([mid], [y], marker="o", color=colour, markersize=6, zorder=4)
        level = interval_level(c, in_session=in_session) * 100
        # In the margin right of the axes, so the words never sit on another row's bar.
        ax.text(1.02, y, f"{fmt_change(c.change)} {profile_verdict(c)}\n{fmt_ci(c.ci_low, c.ci_high)} ({level:.0f}% interval)",
                transform=blended_transform_factory(ax.transAxes, ax.transData), fontsize=7, color=colour,
                va="center", ha="left")
    ax.set_yticks(positions, [row.label for row in rows], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    spans = [abs(v) for row in rows if row.comparison is not None and _drawable(row.comparison)
             for v in (row.comparison.ci_low, row.comparison.ci_high, row.comparison.tolerance)]
    edge = max(spans, default=0.05) * 100 * 1.15
    ax.set_xlim(-edge, edge)
    ax.set_xlabel(f"change vs {reference} (%), shaded: the tolerance")
    ax.grid(axis="x", alpha=0.3)


def _drawable(comparison: Comparison) -> bool:
    """Whether the comparison has a change and an interval to draw (not NaN: a side had no boot)."""
    return all(math.isfinite(v) for v in (comparison.change, comparison.ci_low, comparison.ci_high))


_INSTALL_HINT = "pip install 'pytest-kimiperf[plots]'"
_MAX_SLUG = 80
_ROLLING_POINTS = 50  # the rolling median spans about 1/50 of the run


def matplotlib_problem() -> str | None:
    """Why plots cannot be drawn here (matplotlib missing or broken), or None when they can."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        return (
            f"--kimiperf-plots needs matplotlib, which cannot be imported ({exc}): {_INSTALL_HINT}"
        )
    return None


def render_plots(report: SessionReport, out_dir: Path, *, baseline: BaselineFile | None = None) -> list[Path]:
    """Draw every plot of the session into ``out_dir`` and return the files written
    (``baseline``: the file this run was judged against, for the current-vs-baseline plots)."""
    problem = matplotlib_problem()
    if problem:
        raise ConfigError(problem)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KimiperfError(
            f"cannot create the plot directory {out_dir} (from --kimiperf-plots): {exc.strerror or exc}"
        ) from None
    written: list[Path] = []
    slugs = unique_slugs([block.test for block in report.test_blocks()])
    by_test: dict[str, list[TestResult]] = {}
    for res in report.results:
        by_test.setdefault(res.test, []).append(res)
    order = {name: i for i, name in enumerate(report.profile_names())}
    for block in report.test_blocks():
        slug = slugs[block.test]
        for metric in block.metrics:
            if not any(finite_only(cell.samples) for cell in metric.cells):
                continue
            path = out_dir / f"{slug}--{metric.metric}.png"
            save_figure(plot_distribution(block, metric, report.reference_profile), path)
            written.append(path)
        timelines = [
            (res.profile, res.itl_timeline_ms)
            for res in sorted(by_test[block.test], key=lambda r: order.get(r.profile, len(order)))
            if res.itl_timeline_ms
        ]
        if timelines:
            path = out_dir / f"{slug}--itl-timeline.png"
            save_figure(_plot_itl_timeline(block.test, block.scenario, timelines), path)
            written.append(path)
        if baseline is not None:
            for res in sorted(by_test[block.test], key=lambda r: (order.get(r.profile, len(order)), r.boot)):
                for mres in res.metrics.values():
                    entry = baseline.entry(res.test, res.profile, mres.metric)
                    if mres.baseline is None or entry is None or not finite_only(mres.samples):
                        continue
                    path = out_dir / f"{slug}--{res.profile}--boot{res.boot}--{mres.metric}--vs-baseline.png"
                    save_figure(_plot_against_baseline(res, mres, entry.samples, entry.recorded_at), path)
                    written.append(path)
                    steps = [st for note in mres.baseline.notes if isinstance(note, HistorySteps) for st in note.steps]
                    path = out_dir / f"{slug}--{res.profile}--{mres.metric}--history.png"
                    if steps:
                        # Once per metric and profile: the latest boot's comparison holds every boot so far.
                        c = mres.baseline
                        save_figure(plot_history(entry, steps, current=[c.median_current],
                                           current_label=f"this run ({c.boots_current} boots)"), path)
                        if path not in written:
                            written.append(path)
    curves = throughput_curves(report.results)
    curve_slugs = unique_slugs(list(curves))
    for group, points in curves.items():
        path = out_dir / f"{curve_slugs[group]}--throughput-vs-latency.png"
        save_figure(plot_throughput_latency(group, points, throughput_changes(report, points),
                                            report.reference_profile), path)
        written.append(path)
    return written


def _plot_against_baseline(res: TestResult, mres: MetricResult, baseline_samples: Sequence[float],
                          recorded_at: str) -> Any:
    """One gated metric of one boot: the baseline's latest samples beside this run's, and the verdict."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.8), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    groups = [(f"baseline\n{recorded_at[:10]}", finite_only(baseline_samples), "tab:blue"),
              (f"this run\n{res.profile} boot {res.boot}", finite_only(mres.samples), "tab:orange")]
    rng = np.random.default_rng(0)
    drawn = [(pos, vals) for pos, (_, vals, _) in enumerate(groups, start=1) if vals]
    ax.boxplot([v for _, v in drawn], positions=[p for p, _ in drawn], widths=0.5, showfliers=False,
               medianprops={"color": "black", "linewidth": 2})
    for pos, (_, vals, color) in enumerate(groups, start=1):
        ax.scatter(np.full(len(vals), pos) + rng.uniform(-0.15, 0.15, size=len(vals)), vals,
                   s=14, alpha=0.55, zorder=3, color=color, edgecolors="none")
    spec = METRICS.get(mres.metric)
    quantile = spec.quantile if spec is not None else None
    name = "median" if quantile is None else f"p{quantile * 100:g}"
    ax.set_xticks([1, 2], [f"{label}\n{name} {fmt_value(float(np.quantile(vals, quantile or 0.5))) if vals else '-'}, "
                           f"n={len(vals)}" for label, vals, _ in groups], fontsize=8)
    ax.set_xlim(0.4, 2.6)
    label = spec.label if spec else mres.metric
    ax.set_ylabel(f"{label} ({mres.unit})" if mres.unit else label)
    verdict = (comparison_line(mres.baseline) if mres.baseline is not None else
               note_text(mres.baseline_line) if mres.baseline_line is not None else "")
    ax.set_title(f"{_shorten(res.test, 70)}\n{label}: this run against the baseline\n"
                 f"{_head(verdict, 80, lines=2)}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return fig


@dataclass(frozen=True)
class CurvePoint:
    """One boot of one profile at one concurrency: its output throughput and median latencies."""

    test: str
    profile: str
    concurrency: int
    boot: int
    output_tok_s: float
    ttft_ms: float | None
    tpot_ms: float | None


def throughput_curves(results: Sequence[TestResult]) -> dict[str, list[CurvePoint]]:
    """The tests parametrized over concurrency: per test function and request shape, one point
    per boot, profile and concurrency, where at least two concurrencies ran."""
    curves: dict[str, list[CurvePoint]] = {}
    for res in results:
        load = res.run.load if res.run is not None else {}
        if load.get("kind") != "concurrency" or res.invalid or res.run is None:
            continue
        base = re.sub(r"\[.*\]$", "", res.test)
        group = f"{base} {load.get('prompt_tokens')}in-{load.get('output_tokens')}out"
        # The boot's figure the gate compares (its median round), where the test checked it.
        judged = res.metrics.get("output_throughput")
        tok_s = boot_figure(judged).value if judged is not None else None
        curves.setdefault(group, []).append(CurvePoint(
            res.test, res.profile, int(load["max_concurrency"]), res.boot,
            float(tok_s if tok_s is not None else res.run.output_throughput or 0.0),
            _finite(res.run.stat("ttft_ms", "median")), _finite(res.run.stat("tpot_ms", "median"))))
    return {g: sorted(pts, key=lambda p: (p.concurrency, p.profile, p.boot))
            for g, pts in curves.items() if len({p.concurrency for p in pts}) >= 2}


def throughput_changes(report: SessionReport, points: Sequence[CurvePoint]) -> list[ChangeRow]:
    """Each profile's output throughput against the reference at each concurrency, as judged."""
    tests = {p.test: p.concurrency for p in points}
    rows = []
    for c in report.profile_comparisons:
        if c.metric == "output_throughput" and c.test in tests:
            rows.append((tests[c.test], c.profile,
                         ChangeRow(f"{c.profile} c{tests[c.test]}", c.comparison, c.error or "")))
    return [row for _, _, row in sorted(rows, key=lambda r: (r[0], r[1]))]


def plot_throughput_latency(group: str, points: Sequence[CurvePoint], changes: Sequence[ChangeRow] = (),
                            reference: str = "") -> Any:
    """Output throughput against median TTFT and median TPOT, every boot a point (no line through
    medians: a gap between two profiles' medians is no verdict), and beside them each profile's
    change against the reference at each concurrency with its interval and verdict."""
    from matplotlib.figure import Figure

    panels = 3 if changes else 2
    fig = Figure(figsize=(12 if changes else 10, 4.8), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, panels, width_ratios=[1, 1, 1.3][:panels])
    profiles = list(dict.fromkeys(p.profile for p in points))
    colours = {name: f"C{i}" for i, name in enumerate(profiles)}
    for ax, attr, xlabel in ((axes[0], "ttft_ms", "median TTFT (ms)"), (axes[1], "tpot_ms", "median TPOT (ms)")):
        for profile in profiles:
            mine = [p for p in points if p.profile == profile and getattr(p, attr) is not None]
            if not mine:
                continue
            ax.scatter([getattr(p, attr) for p in mine], [p.output_tok_s for p in mine], s=22, alpha=0.75,
                       color=colours[profile], edgecolors="none", label=f"{profile} (each boot)")
            for concurrency in dict.fromkeys(p.concurrency for p in mine):
                first = next(p for p in mine if p.concurrency == concurrency)
                ax.annotate(f"c{concurrency}", (getattr(first, attr), first.output_tok_s), textcoords="offset points",
                            xytext=(4, 4), fontsize=7, color="0.3")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output throughput (tok/s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if changes:
        draw_changes(axes[2], changes, reference=reference)
        axes[2].set_title("output throughput: the verdict", fontsize=9)
    fig.suptitle(f"{_shorten(group, 90)}\nthroughput against latency, every boot, by concurrency", fontsize=10)
    return fig


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def plot_distribution(block: PerfTestBlock, metric: MetricBlock, reference_profile: str) -> Any:
    """One metric of one test: per boot of each profile a box (quartiles) and every sample as a
    point; beside them, each profile's change against the reference with its interval and verdict."""
    from matplotlib.figure import Figure

    changes = [ChangeRow(cell.name or cell.profile, cell.comparison, cell.note or "")
               for cell in metric.cells if not cell.is_reference and (cell.comparison is not None or cell.note)]
    fig = Figure(figsize=(12 if changes else 8, 4.8), dpi=DPI, layout="constrained")
    if changes:
        ax, verdicts = fig.subplots(1, 2, width_ratios=[2, 1.2])
        draw_changes(verdicts, changes, reference=reference_profile)
        verdicts.set_title("the verdict, on all boots", fontsize=9)
    else:
        ax = fig.add_subplot()
    rng = np.random.default_rng(0)  # fixed jitter: the same data draws the same picture
    values = [finite_only(cell.samples) for cell in metric.cells]
    positions = list(range(1, len(values) + 1))
    drawn = [(pos, v) for pos, v in zip(positions, values) if v]
    ax.boxplot(
        [v for _, v in drawn], positions=[p for p, _ in drawn], widths=0.5, showfliers=False,
        medianprops={"color": "black", "linewidth": 2}, boxprops={"color": "0.35"},
        whiskerprops={"color": "0.35"}, capprops={"color": "0.35"},
    )
    for pos, vals, cell in zip(positions, values, metric.cells):
        jitter = rng.uniform(-0.15, 0.15, size=len(vals))
        ax.scatter(np.full(len(vals), pos) + jitter, vals, s=14, alpha=0.55, zorder=3,
                   color="tab:blue" if cell.is_reference else "tab:orange", edgecolors="none")
    labels = []
    for cell, vals in zip(metric.cells, values):
        failed = len(cell.samples) - len(vals)
        label = f"{cell.profile}\n{cell.figure.name} {fmt_value(cell.figure.value)}\nn={len(vals)}"
        if failed:
            label += f" ({failed} failed)"
        if cell.note:
            label += "\n" + _head(cell.note, 26, lines=2)
        elif cell.is_reference:
            label += "\n(reference)"
        labels.append(label)
    ax.set_xticks(positions, labels, fontsize=8)
    ax.set_xlim(0.4, len(positions) + 0.6)
    spec = METRICS.get(metric.metric)
    unit = spec.unit if spec else ""
    label = spec.label if spec else metric.metric
    ax.set_ylabel(f"{label} ({unit})" if unit else label)
    better = ""
    if spec is not None:
        better = "higher is better" if spec.direction is Direction.HIGHER_IS_BETTER else "lower is better"
    # What one sample is, as the metric's spec says (metric_specs.SampleKind).
    kind = spec.sample if spec is not None else SampleKind.REQUEST
    per = ("round" if kind in (SampleKind.ROUND, SampleKind.GOODPUT) else "boot" if kind is SampleKind.BOOT
           else "token gap (every gap of the boot, pooled)" if spec is not None and spec.base == "itl_ms"
           else "request")
    ax.set_title(f"{_shorten(block.test, 70)}\n{label} per {per}, by profile"
                 f"{f' — {block.scenario}' if block.scenario else ''}", fontsize=10)
    if better:
        ax.text(0.99, 0.98, better, transform=ax.transAxes, ha="right", va="top", fontsize=8, color="0.4")
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_itl_timeline(test: str, scenario: str, timelines: Sequence[tuple[str, Sequence[float]]]) -> Any:
    """Each profile's inter-token latencies in run order, with a rolling median over them."""
    from matplotlib.figure import Figure

    rows = len(timelines)
    fig = Figure(figsize=(9, 1.0 + 2.2 * rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for ax, (profile, timeline) in zip(axes, timelines):
        values = np.asarray([v if math.isfinite(v) else np.nan for v in timeline], dtype=float)
        index = np.arange(values.size)
        ax.scatter(index, values, s=3, alpha=0.35, color="tab:blue", edgecolors="none",
                   label="token gap")
        window = max(5, values.size // _ROLLING_POINTS)
        if values.size >= window:
            ax.plot(index, _rolling_median(values, window), color="tab:red", linewidth=1.2,
                    label=f"rolling median ({window} gaps)")
        median = float(np.nanmedian(values)) if np.isfinite(values).any() else math.nan
        ax.set_title(f"{profile}: {values.size} gaps, median {fmt_value(median)} ms", fontsize=9,
                     loc="left")
        ax.set_ylabel("ITL (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("token gap, in the order the run produced them")
    fig.suptitle(f"{_shorten(test, 80)}\ninter-token latency over the run"
                 f"{f' — {scenario}' if scenario else ''}", fontsize=10)
    return fig


def _rolling_median(values: np.ndarray, window: int) -> np.ndarray:
    # Centered window, shrinking at the ends; nanmedian so a missing gap does not blank a stretch.
    half = window // 2
    out = np.empty(values.size)
    for i in range(values.size):
        chunk = values[max(0, i - half): i + half + 1]
        out[i] = np.nanmedian(chunk) if np.isfinite(chunk).any() else np.nan
    return out


def save_figure(fig: Any, path: Path) -> None:
    """Write ``fig`` to ``path`` as PNG on the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise KimiperfError(f"cannot write plot {path} (from --kimiperf-plots): {exc.strerror or exc}") from None


def unique_slugs(tests: Sequence[str]) -> dict[str, str]:
    """File-name-safe names for test ids; a hash keeps long or colliding ones apart."""
    slugs: dict[str, str] = {}
    seen: set[str] = set()
    for test in tests:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", test.replace("::", "--")).strip("._-") or "test"
        if len(slug) > _MAX_SLUG or slug in seen:
            digest = hashlib.sha1(test.encode()).hexdigest()[:8]
            slug = f"{slug[: _MAX_SLUG - 9]}-{digest}"
        seen.add(slug)
        slugs[test] = slug
    return slugs


def _shorten(text: str, width: int) -> str:
    # A test id: its end (the test's name) is what tells it apart.
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _head(text: str, width: int, *, lines: int = 1) -> str:
    # A verdict or a note: its start (the verdict word, "INVALID measurement") is what it says.
    wrapped = textwrap.wrap(text, width)
    if len(wrapped) <= lines:
        return "\n".join(wrapped)
    kept = wrapped[:lines]
    kept[-1] = kept[-1][: width - 1] + "…"
    return "\n".join(kept)
