"""``--kimiperf-list``: what a run could use, and where each thing is defined.

Deployments (built in, the user's ``[tool.kimiperf.deployments]`` tables, the
``pytest_kimiperf_add_deployments`` hook), profiles (environment and server arguments) and
metrics (the names ``perf.check`` takes, with this deployment's tolerance), one line each. Nothing
is collected, probed or booted: it answers "what can I pass to --kimiperf-deployment, --kimiperf-profile and
perf.check?" from the same settings a run would be judged by.
"""

from __future__ import annotations

from pytest_kimiperf.config.metric_specs import METRICS, Direction
from pytest_kimiperf.config.nccl.profiles import describe_args, describe_env
from pytest_kimiperf.config.settings import Settings

_METRICS_SOURCE = "pytest_kimiperf/config/metric_specs.py"


def _rows(rows: list[tuple[str, ...]]) -> list[str]:
    """Aligned columns; the last one (often long) is left as it is."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]


def listing_lines(s: Settings) -> list[str]:
    """Every deployment, profile and metric, marked where this run's settings select it."""
    lines = ["kimiperf deployments (--kimiperf-deployment; * selected):"]
    lines += _rows([(("* " if name == s.deployment.name else "  ") + name, f"{dep.source}: {dep.description}")
                    for name, dep in sorted(s.deployments.items())])
    selected = {p.name for p in s.profiles}
    lines.append("kimiperf profiles (--kimiperf-profile, comma-separated, or 'all'; * selected):")
    lines += _rows([(("* " if name in selected else "  ") + name,
                     f"{p.source}: " + describe_env(p) + (f"; args {describe_args(p)}" if p.args else ""))
                    for name, p in sorted(s.known_profiles.items())])
    lines.append(f"kimiperf metrics (perf.check names; tolerance of deployment {s.deployment.name}; "
                 f"defined in {_METRICS_SOURCE}):")
    lines += _rows([(name, spec.label, spec.unit,
                     "higher is better" if spec.direction is Direction.HIGHER_IS_BETTER else "lower is better",
                     f"tolerance {s.deployment.tolerance(name):.0%}")
                    for name, spec in METRICS.items()])
    return lines
