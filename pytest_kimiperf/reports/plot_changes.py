"""The verdict beside a picture: each comparison's change with its interval, against zero and the
tolerance.

A plot of medians invites a by-eye verdict: two profiles' points apart read as a difference
whatever the boots' spread. Every plot that compares profiles therefore carries this panel: one
row per comparison, the estimate as a dot, the interval the verdict rests on as a bar at its
level, zero and the tolerance band drawn, and the verdict in words. A row the statistics call
"no detectable change" (or within tolerance, inconclusive) is grey, its bar across zero: it
cannot look like a finding. Only a worse or better verdict takes a colour.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, assert_never

from pytest_kimiperf.judge.stats import Comparison, Leaning, leaning
from pytest_kimiperf.numbers import fmt_change, fmt_ci
from pytest_kimiperf.reports.compact_rows import interval_level
from pytest_kimiperf.reports.model import profile_verdict

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
        case Leaning.WORSE:
            return _WORSE_COLOUR
        case Leaning.BETTER:
            return _BETTER_COLOUR
        case Leaning.NEITHER:
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
