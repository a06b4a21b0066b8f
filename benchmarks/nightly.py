"""Nights appended on pass, as the plugin stores and judges them: the benchmarks' way to the drift test.

A benchmark (gate_power.py, verdict_soundness.py) or a test that follows a history night by night
holds each night's boots; the plugin keeps an anchor (the last deliberate recording) and one
:class:`~pytest_kimiperf.judge.baselines.AppendedNight` per passing run appended since
(``judge/baselines.night_of``), and judges tonight's boots against them with
``judge/history.drift_of_entry``. :func:`drift_tonight` builds that entry from the boots and asks
the plugin's own code, so what the benchmarks measure is what a run does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing

from pytest_kimiperf.config.deployments import Spreads  # noqa: E402
from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.baselines import BaselineBoot, BaselineEntry, night_of  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary  # noqa: E402
from pytest_kimiperf.judge.history import Drift, drift_of_entry  # noqa: E402
from pytest_kimiperf.judge.noise import BootOrigin  # noqa: E402


def _stored(boots: Sequence[BootSummary]) -> tuple[BaselineBoot, ...]:
    return tuple(BaselineBoot(b.median, b.n, b.se_log, b.label, None, {}, BootOrigin(b.session, b.host)) for b in boots)


def drift_tonight(anchor: Sequence[BootSummary], appended: Sequence[Sequence[BootSummary]],
                  tonight: Sequence[BootSummary], *, direction: Direction, tolerance: float, spreads: Spreads,
                  critical: float | None = None) -> Drift | None:
    """Tonight's boots against the ``anchor`` and the nights ``appended`` since it (oldest first,
    each one passing run's boots), as the plugin judges them; None where it runs no drift test
    (no night appended yet: the gate against the history's window is then the whole test)."""
    base = BaselineEntry("test", "profile", "metric", "", direction, (1.0,), 1.0, (1.0, 1.0), 1, "", None, {})
    nights = tuple(night_of(replace(base, boots=_stored(night))) for night in appended)
    entry = replace(base, anchor=_stored(anchor), nights=nights)
    return drift_of_entry(entry, tonight, tolerance=tolerance, spreads=spreads, critical=critical)
