"""What one perf test measured and decided: plain data, JSON-able.

One measured test on one server boot produces a :class:`TestResult` holding a
:class:`MetricResult` per metric. Both travel from an xdist worker to the controller as JSON;
the gate (``gate.judge``) fills their verdicts and the reports only read them.

Verdicts travel as data: each warning carries its :class:`WarningKind` (what pytest warning class
it becomes), and each metric's line about its baseline is a :class:`BaselineLine` whose
:class:`BaselineState` says whether a baseline was there. Nothing downstream reads a sentence to
learn what happened; the sentences are only shown.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from pytest_kimiperf.judge.boot_summary import BootSummary, summarize_metric
from pytest_kimiperf.judge.levels import BootOrigin
from pytest_kimiperf.measure.results import RunSummary


class WarningKind(str, enum.Enum):
    """What a perf test's warning is about (each has its pytest warning class, warning_types.py)."""

    INCONCLUSIVE = "inconclusive"
    MISSING_BASELINE = "missing-baseline"
    BELOW_TARGET = "below-target"
    SOFT_FINGERPRINT = "soft-fingerprint"
    OTHER_VERSIONS = "other-versions"
    OTHER = "other"


@dataclass(frozen=True)
class ResultWarning:
    """One warning of a perf test: its kind and the line shown."""

    kind: WarningKind
    text: str

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "text": self.text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> "ResultWarning":
        if isinstance(data, str):  # a line of a JSON report: shown, of no known kind
            return cls(WarningKind.OTHER, data)
        return cls(WarningKind(data["kind"]), str(data["text"]))


class BaselineState(str, enum.Enum):
    """Whether a metric had a baseline to be judged against, and which."""

    OFF = "off"  # baselines not in use
    JUDGED = "judged"  # this hardware's and software's history
    OTHER_VERSIONS = "other-versions"  # this hardware's history under other software versions
    MISSING = "missing"  # no history for this hardware
    OTHER_HARDWARE = "other-hardware"  # none here; the closest other hardware's shown, not judged

    @property
    def missing(self) -> bool:
        """No baseline of this hardware: what --kimiperf-missing-baseline warns or fails on."""
        return self in (BaselineState.MISSING, BaselineState.OTHER_HARDWARE)


RECORD_ADVICE: Final = "run --update-baselines"


@dataclass(frozen=True)
class BaselineLine:
    """The gate's line about one metric against its baseline, in parts.

    Shown as ``"{label}: {body}: {advice}{tail}"``; the advice (what records the missing
    baseline) is there only for a missing one, and a report puts its own command in its place.
    """

    state: BaselineState
    label: str  # the metric's label (and unit) the line opens with
    body: str
    tail: str = ""

    def render(self, *, label: bool = True, advice: str = RECORD_ADVICE) -> str:
        head = f"{self.label}: " if label and self.label else ""
        return f"{head}{self.body}{f': {advice}' if self.state.missing else ''}{self.tail}"

    def with_tail(self, more: str) -> "BaselineLine":
        return BaselineLine(self.state, self.label, self.body, self.tail + more)

    def to_json(self) -> dict[str, str]:
        return {"state": self.state.value, "label": self.label, "body": self.body, "tail": self.tail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "BaselineLine | None":
        if not data:
            return None
        return cls(BaselineState(data["state"]), str(data["label"]), str(data["body"]), str(data.get("tail") or ""))


@dataclass
class MetricResult:
    """Samples and verdicts of one metric of one test under one profile."""

    metric: str
    unit: str
    direction: str
    tolerance: float
    samples: list[float]
    baseline: dict[str, Any] | None = None  # Comparison.to_dict() against the baseline
    baseline_line: BaselineLine | None = None
    boot_label: str = ""

    @property
    def baseline_message(self) -> str | None:
        """The baseline line as the JSON report and a failure show it."""
        return self.baseline_line.render() if self.baseline_line is not None else None

    def boot_summary(self) -> BootSummary:
        """This boot's summary of the metric (the unit of replication): its median, or its
        quantile for a tail metric (p99_itl_ms)."""
        return summarize_metric(self.metric, self.samples, self.boot_label)

    @property
    def finite(self) -> list[float]:
        """The samples that are numbers (failed requests are NaN)."""
        return [s for s in self.samples if math.isfinite(s)]

    def summary(self) -> dict[str, float | int | None]:
        """Median, quartiles and n of the finite samples."""
        values = np.asarray(self.finite, dtype=float)
        if values.size == 0:
            return {"median": None, "q1": None, "q3": None, "n": 0}
        q1, med, q3 = np.percentile(values, [25, 50, 75])
        return {"median": float(med), "q1": float(q1), "q3": float(q3), "n": int(values.size)}

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (travels in xdist reports and into the JSON report)."""
        return {
            "metric": self.metric, "unit": self.unit, "direction": self.direction,
            "tolerance": self.tolerance, "samples": self.samples, "summary": self.summary(),
            "baseline": self.baseline, "baseline_message": self.baseline_message,
            "baseline_line": self.baseline_line.to_json() if self.baseline_line else None,
            "boot_label": self.boot_label, "boot_summary": self.boot_summary().to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "MetricResult":
        """Inverse of :meth:`to_json`."""
        return cls(
            metric=data["metric"], unit=data["unit"], direction=data["direction"],
            tolerance=data["tolerance"], samples=[float(s) for s in data["samples"]],
            baseline=data.get("baseline"), baseline_line=BaselineLine.from_json(data.get("baseline_line")),
            boot_label=str(data.get("boot_label") or ""),
        )


@dataclass
class TestResult:
    """Everything one perf test measured and decided; JSON-able."""

    __test__ = False  # imported into a test module (it is public API), it is no test class

    test: str  # node id without the profile parameter
    nodeid: str
    profile: str
    deployment: str
    scenario: str
    metrics: dict[str, MetricResult] = field(default_factory=dict)
    run: RunSummary | None = None  # what the run produced: figures, request records, load
    floor: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[ResultWarning] = field(default_factory=list)
    interval_ns: tuple[int, int] | None = None  # CLOCK_MONOTONIC span of the measurement
    server_env: dict[str, str] = field(default_factory=dict)
    profile_env: dict[str, str] = field(default_factory=dict)
    # The profile's server arguments: with profile_env, what the profile is (baselines key on both).
    profile_args: list[str] = field(default_factory=list)
    invalid: str | None = None
    # Why a change beyond the tolerance stays unresolved for good (one boot of an attached server
    # this run cannot restart): the test fails as UNRESOLVED, an outcome of its own.
    unresolved: str | None = None
    itl_timeline_ms: list[float] = field(default_factory=list)
    boot: int = 1
    # Why --update-baselines must not record this boot (a failure that is not a verdict).
    unrecordable: str | None = None
    host: dict[str, Any] | None = None  # hostwatch readings of the measured rounds
    versions: dict[str, str] = field(default_factory=dict)
    origin: BootOrigin | None = None  # session, host and canary of this boot (judge/levels.py)

    def warn(self, kind: WarningKind, text: str) -> None:
        """Add a warning of ``kind``."""
        self.warnings.append(ResultWarning(kind, text))

    def warning_lines(self) -> list[str]:
        """The warnings as shown."""
        return [w.text for w in self.warnings]

    def medians(self) -> dict[str, float]:
        """Each metric's median (those with one), rounded for a junitxml property."""
        medians = {metric: m.summary()["median"] for metric, m in self.metrics.items()}
        return {metric: round(float(v), 4) for metric, v in medians.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "test": self.test, "nodeid": self.nodeid, "profile": self.profile,
            "deployment": self.deployment, "scenario": self.scenario,
            "metrics": {k: v.to_json() for k, v in self.metrics.items()},
            "run": self.run.to_json() if self.run is not None else {}, "floor": self.floor, "messages": self.messages,
            "failures": self.failures, "warnings": [w.to_json() for w in self.warnings],
            "interval_ns": list(self.interval_ns) if self.interval_ns else None,
            "server_env": self.server_env, "profile_env": self.profile_env,
            "profile_args": list(self.profile_args), "invalid": self.invalid, "unresolved": self.unresolved,
            "itl_timeline_ms": self.itl_timeline_ms,
            "boot": self.boot, "unrecordable": self.unrecordable, "host": self.host,
            "versions": self.versions, "origin": self.origin.to_json() if self.origin else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TestResult":
        """Inverse of :meth:`to_json`."""
        interval = data.get("interval_ns")
        return cls(
            test=data["test"], nodeid=data["nodeid"], profile=data["profile"],
            deployment=data["deployment"], scenario=data["scenario"],
            metrics={k: MetricResult.from_json(v) for k, v in data["metrics"].items()},
            run=RunSummary.from_json(run) if (run := data.get("run")) else None, floor=data.get("floor"),
            messages=list(data.get("messages") or []), failures=list(data.get("failures") or []),
            warnings=[ResultWarning.from_json(w) for w in data.get("warnings") or []],
            interval_ns=(int(interval[0]), int(interval[1])) if interval else None,
            server_env=dict(data.get("server_env") or {}),
            profile_env=dict(data.get("profile_env") or {}),
            profile_args=[str(a) for a in data.get("profile_args") or []], invalid=data.get("invalid"),
            unresolved=data.get("unresolved"),
            itl_timeline_ms=[float(x) for x in data.get("itl_timeline_ms") or []],
            boot=int(data.get("boot") or 1), unrecordable=data.get("unrecordable"),
            host=data.get("host"), versions=dict(data.get("versions") or {}),
            origin=BootOrigin.from_json(data.get("origin")),
        )
