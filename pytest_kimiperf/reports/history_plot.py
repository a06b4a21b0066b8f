"""A metric's boot history as a picture: every stored boot, the level of each segment, and its steps.

Drawn by ``--kimiperf-plots`` for each gated metric whose history stepped (the run was judged
against its last segment), and by ``python -m pytest_kimiperf.history_steps --plot DIR`` for
every entry of a baseline file. matplotlib is optional, as for every plot (plots.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.judge.baselines import BaselineEntry
from pytest_kimiperf.judge.notes import HistoryStep

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
