"""What a table cell shows for one metric of one boot: the boot's figure and a range around it.

The gate compares one figure per boot (``judge.boot_summary``): the boot's median, or for a tail
metric (``p90_ttft_ms``) its quantile. The tables, the quiet lines and the plots show that same
figure, so a p90 row never shows the median of the row above it; the range beside it is the
interquartile range of the boot's samples for a median, and the boot's own bootstrap interval for
a quantile (an IQR says nothing about a p90).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.judge.verdicts import MetricResult
from pytest_kimiperf.numbers import fmt_value


@dataclass(frozen=True)
class BootFigure:
    """What a table shows for one metric of one boot: the figure the gate compares (the boot's
    median, or its quantile for a tail metric) and a range around it (the interquartile range of
    the boot's samples for a median; the boot's bootstrap interval for a quantile, which the
    IQR would not describe)."""

    value: float | None
    low: float | None
    high: float | None
    quantile: float | None = None  # 0.9 for a p90 row; None for a median

    @property
    def name(self) -> str:
        """``median``, or ``p90`` for a tail metric."""
        return "median" if self.quantile is None else f"p{self.quantile * 100:g}"


# The standard normal's 95% quantile: the tail's range is its two-sided 90% interval, from the
# bootstrap standard error of the boot's log-quantile (boot_summary.summarize_boot_quantile).
_NORMAL_95 = 1.6449


def boot_figure(mres: MetricResult) -> BootFigure:
    """The boot's figure of ``mres`` and its range, as the tables and plots show them."""
    spec = METRICS.get(mres.metric)
    if spec is None or spec.quantile is None:
        summary = mres.summary()
        return BootFigure(*(None if (v := summary[k]) is None else float(v) for k in ("median", "q1", "q3")))
    boot = mres.boot_summary()
    if not (boot.n and math.isfinite(boot.median)):
        return BootFigure(None, None, None, spec.quantile)
    if not (math.isfinite(boot.se_log) and boot.median > 0):
        return BootFigure(boot.median, None, None, spec.quantile)
    half = _NORMAL_95 * boot.se_log  # the two-sided 90% interval, on the log scale
    return BootFigure(boot.median, boot.median * math.exp(-half), boot.median * math.exp(half), spec.quantile)


def range_names(has_tails: bool) -> tuple[str, str]:
    """The headers of the figure and range columns: ``median``/``IQR``, or, in a table with
    tail rows, ``median or pNN``/``IQR or 90% CI``."""
    return ("median or pNN", "IQR or 90% CI") if has_tails else ("median", "IQR")


def figure_legend(has_tails: bool) -> str:
    """What the figure and range columns hold, in one sentence above a table."""
    text = "each boot's median (IQR of its samples)"
    return text + (", or for a pNN metric its pNN (90% bootstrap interval)" if has_tails else "")


def fmt_range(figure: BootFigure) -> str:
    """The figure's range as ``80.9-82.0`` (the IQR, or a tail's bootstrap interval)."""
    if figure.value is None:
        return "n/a (no valid sample)"
    if figure.low is None or figure.high is None:
        return "n/a (fewer than 2 samples)"
    return f"{fmt_value(figure.low)}-{fmt_value(figure.high)}"
