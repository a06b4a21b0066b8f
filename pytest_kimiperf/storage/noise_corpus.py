"""The noise corpus on disk: JSON lines of boots that benchmarks/noise_study.py and the gate's
power studies read, one boot per line, as :class:`~pytest_kimiperf.judge.levels.CorpusBoot` values
(judge/levels.py estimates the levels from them)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pytest_kimiperf.judge.boots import BootSummary
from pytest_kimiperf.judge.levels import CorpusBoot


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
