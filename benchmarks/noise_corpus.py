"""The noise corpus, as the benchmarks read it: JSON lines of boots, and the levels they vary at.

benchmarks/noise_study.py and the gate's power studies (gate_power.py, profile_power.py) read the
corpus one boot per line as :class:`CorpusBoot` values (:func:`load_corpus`) and estimate each
metric's levels with the gate's own estimator (:func:`estimate_levels`, over
``judge.levels.nested_levels``), so the study and the gate agree on what a level is. Only the
benchmarks and their tests use this: it is not shipped in the package.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing

from pytest_kimiperf.judge.stats import BootSummary  # noqa: E402
from pytest_kimiperf.judge.noise import Level, Levels, nested_levels  # noqa: E402
from pytest_kimiperf.numbers import fmt_spread  # noqa: E402
from pytest_kimiperf.reports.sentences import note_text  # noqa: E402


@dataclass(frozen=True)
class CorpusBoot:
    """One boot of the noise corpus: its session and host, and per ``test|metric`` its summary."""

    session: str
    host: str
    variant: str
    metrics: Mapping[str, BootSummary]
    cv: Mapping[str, float] = field(default_factory=dict)
    canary: Mapping[str, float] = field(default_factory=dict)
    foreign_cpu_max: float = 0.0


def load_corpus(paths: Iterable[Path], *, variant: str | None = None,
                max_foreign_cpu: float = 1.0) -> list[CorpusBoot]:
    """The corpus's valid boots (of ``variant``, measured beside at most ``max_foreign_cpu``
    foreign CPU); a line that is not a boot (the session's closing canary) is skipped."""
    boots = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if "metrics" not in data:
                continue
            if variant is not None and data.get("variant") != variant:
                continue
            foreign = max(data.get("foreign_cpu") or [0.0])
            if data.get("invalid") or foreign > max_foreign_cpu:
                continue
            metrics = {k: BootSummary.from_json(v) for k, v in data["metrics"].items()}
            boots.append(CorpusBoot(
                session=str(data["session"]), host=str(data["host"]), variant=str(data.get("variant") or ""),
                metrics={k: v for k, v in metrics.items() if v.usable},
                cv={k: float(v["cv"]) for k, v in data["metrics"].items() if v.get("cv") is not None},
                canary={k: float(v) for k, v in ((data.get("canary") or {}).get("scores") or {}).items()},
                foreign_cpu_max=float(foreign)))
    return boots


def estimate_levels(boots: Sequence[CorpusBoot], key: str) -> Levels:
    """The levels of one corpus metric (``test|metric``) over the boots that measured it."""
    groups: dict[str, dict[str, list[float]]] = {}
    cvs = []
    for b in boots:
        summary = b.metrics.get(key)
        if summary is None:
            continue
        groups.setdefault(b.host, {}).setdefault(b.session, []).append(math.log(summary.median))
        if key in b.cv:
            cvs.append(b.cv[key])
    return nested_levels(groups, key, statistics.median(cvs) if cvs else math.nan)


def level_text(level: Level) -> str:
    """A corpus level: ``1.1% (0.7-2.0%, 3 df)``, or ``n/a (one session per host)``."""
    if not math.isfinite(level.sd_log):
        return f"n/a ({note_text(level.source)})"
    if math.isfinite(level.low) and math.isfinite(level.high):
        return (f"{fmt_spread(math.expm1(level.sd_log))} ({math.expm1(level.low) * 100:.1f}-"
                f"{math.expm1(level.high) * 100:.1f}%, {level.df:g} df)")
    return f"{fmt_spread(math.expm1(level.sd_log))} ({note_text(level.source)})"


def request_cv_text(levels: Levels) -> str:
    """The median per-request CV inside a boot, as a percentage."""
    return f"{levels.request_cv * 100:.1f}%" if math.isfinite(levels.request_cv) else "n/a"
