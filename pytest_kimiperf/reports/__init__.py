"""The session's reports: terminal summary, JSON, Markdown and plots.

All of them show the same facts, gathered once into a :class:`~.model.SessionReport` (plain data,
no pytest): ``model`` gathers and compares, ``terminal`` and ``markdown`` lay the same table cells
out for a terminal or for GitHub, ``json_report`` builds the machine-readable report and ``plots``
draws PNGs. ``pytest_kimiperf.reports.session`` connects them to the plugin's run state.
"""

from __future__ import annotations

from pytest_kimiperf.reports.model import (
    BaselineUpdate,
    MetricBlock,
    PerfTestBlock,
    ProfileCell,
    ProfileFacts,
    SessionReport,
    build_session_report,
)

__all__ = [
    "BaselineUpdate",
    "MetricBlock",
    "PerfTestBlock",
    "ProfileCell",
    "ProfileFacts",
    "SessionReport",
    "build_session_report",
]
