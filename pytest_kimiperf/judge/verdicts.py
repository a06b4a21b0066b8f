"""What one perf test measured and decided: plain data, JSON-able.

One measured test on one server boot produces a :class:`TestResult` holding a
:class:`MetricResult` per metric. Both travel from an xdist worker to the controller as JSON;
the gate (``gate.judge``) fills their verdicts and the reports only read them.

Verdicts travel as data: failures, warnings and notes are typed values (judge/notes.py and the
notes here that hold a comparison); each warning carries its :class:`WarningKind` (what pytest
warning class it becomes), and each metric's line about its baseline is a :class:`BaselineLine`
whose :class:`BaselineState` says whether a baseline was there. Nothing reads a sentence to learn
what happened: reports/sentences.py writes every sentence, and only to show it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pytest_kimiperf.judge.noise import BootOrigin, CanaryCheck
from pytest_kimiperf.judge.notes import (
    FloorNote, FloorResult, LeftOut, Note, ResolvePlan, Unresolved, note_from_json, note_kind, notes_from_json,
)
from pytest_kimiperf.judge.stats import BootSummary, Comparison, summarize_metric
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
    """One warning of a perf test: its kind and what it is about."""

    kind: WarningKind
    note: Note

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "note": self.note.to_json()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResultWarning:
        return cls(WarningKind(data["kind"]), note_from_json(data["note"]))


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


@dataclass(frozen=True)
class EnvDiff:
    """The profile environment and server arguments the baseline was recorded with, and this run's."""

    baseline_env: Mapping[str, str]
    baseline_args: tuple[str, ...]
    run_env: Mapping[str, str]
    run_args: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"baseline_env": dict(self.baseline_env), "baseline_args": list(self.baseline_args),
                "run_env": dict(self.run_env), "run_args": list(self.run_args)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EnvDiff:
        return cls(dict(data["baseline_env"]), tuple(data["baseline_args"]), dict(data["run_env"]),
                   tuple(data["run_args"]))


def _canary_from_json(data: Mapping[str, Any]) -> CanaryCheck:
    return CanaryCheck({str(k): float(v) for k, v in data["shifts"].items()}, bool(data["moved"]))


@note_kind("baseline")
@dataclass(frozen=True)
class BaselineLine(Note):
    """The gate's line about one metric against its baseline, as facts: whether there was one,
    the verdict (None where nothing was compared) and what the line adds (the other hardware or
    versions, a moved canary or another environment, why a failed boot was left out)."""

    state: BaselineState
    label: str  # the metric's label (and unit) the line opens with
    comparison: Comparison | None = None
    fingerprint: str = ""
    others: tuple[str, ...] = ()
    other: str = ""
    versions: tuple[str, ...] = ()
    hard: tuple[str, ...] = ()
    canary: CanaryCheck | None = None
    env: EnvDiff | None = None
    left_out: LeftOut | None = None
    # Other hardware: the hardware stated when that baseline was recorded, where it is all that
    # differs besides versions (fingerprint.stated_apart): stating it selects that baseline.
    recorded_hardware: str = ""
    # This run's boots carry the engine's figures and the judged history's keep none (recorded
    # before they were stored): judged on the client's clock alone.
    client_clock_only: bool = False

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "state": BaselineState, "comparison": Comparison.from_dict, "canary": _canary_from_json,
        "env": EnvDiff.from_dict, "left_out": LeftOut.from_fields,
    }


@note_kind("verdict")
@dataclass(frozen=True)
class VerdictNote(Note):
    """A final verdict against the baseline, with what would resolve it (``plan``) and whether
    an improvement is there to adopt."""

    comparison: Comparison
    plan: ResolvePlan | None = None
    adopt: bool = False

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"comparison": Comparison.from_dict}


@note_kind("missing-baselines")
@dataclass(frozen=True)
class MissingBaselines(Note):
    """Under --kimiperf-missing-baseline=fail: the metrics without a baseline here."""

    lines: tuple[BaselineLine, ...]


@dataclass
class MetricResult:
    """Samples and verdicts of one metric of one test under one profile."""

    metric: str
    unit: str
    direction: str
    tolerance: float
    samples: list[float]
    baseline: Comparison | None = None  # against the baseline
    baseline_line: BaselineLine | None = None
    boot_label: str = ""

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
            "baseline": self.baseline.to_dict() if self.baseline is not None else None,
            "baseline_line": self.baseline_line.to_json() if self.baseline_line else None,
            "boot_label": self.boot_label, "boot_summary": self.boot_summary().to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricResult:
        """Inverse of :meth:`to_json`."""
        return cls(
            metric=data["metric"], unit=data["unit"], direction=data["direction"],
            tolerance=data["tolerance"], samples=[float(s) for s in data["samples"]],
            baseline=Comparison.from_dict(b) if (b := data.get("baseline")) else None,
            baseline_line=BaselineLine.from_fields(line) if (line := data.get("baseline_line")) else None,
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
    floor: FloorResult | None = None
    messages: list[Note] = field(default_factory=list)
    failures: list[Note] = field(default_factory=list)
    warnings: list[ResultWarning] = field(default_factory=list)
    interval_ns: tuple[int, int] | None = None  # CLOCK_MONOTONIC span of the measurement
    server_env: dict[str, str] = field(default_factory=dict)
    profile_env: dict[str, str] = field(default_factory=dict)
    # The profile's server arguments: with profile_env, what the profile is (baselines key on both).
    profile_args: list[str] = field(default_factory=list)
    invalid: str | None = None
    invalid_cause: str | None = None  # measure.invalid_causes.InvalidCause's value: what to do about it
    # Why a change beyond the tolerance stays unresolved for good (one boot of an attached server
    # this run cannot restart): the test fails as UNRESOLVED, an outcome of its own.
    unresolved: Unresolved | None = None
    itl_timeline_ms: list[float] = field(default_factory=list)
    boot: int = 1
    # Why --update-baselines must not record this boot (failures that are not a verdict).
    unrecordable: tuple[Note, ...] = ()
    host: dict[str, Any] | None = None  # hostwatch readings of the measured rounds
    versions: dict[str, str] = field(default_factory=dict)
    origin: BootOrigin | None = None  # session, host and canary of this boot (judge/noise.py)
    # The metric the test is about (metric_specs.primary_metric, or the test's own choice): its
    # verdict answers the test's question; the test's other metrics are secondary.
    primary: str | None = None

    def warn(self, kind: WarningKind, note: Note) -> None:
        """Add a warning of ``kind``."""
        self.warnings.append(ResultWarning(kind, note))

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
            "run": self.run.to_json() if self.run is not None else {},
            "floor": FloorNote(self.floor).to_json() if self.floor is not None else None,
            "messages": [n.to_json() for n in self.messages],
            "failures": [n.to_json() for n in self.failures], "warnings": [w.to_json() for w in self.warnings],
            "interval_ns": list(self.interval_ns) if self.interval_ns else None,
            "server_env": self.server_env, "profile_env": self.profile_env,
            "profile_args": list(self.profile_args), "invalid": self.invalid, "invalid_cause": self.invalid_cause,
            "unresolved": self.unresolved.to_json() if self.unresolved is not None else None,
            "itl_timeline_ms": self.itl_timeline_ms,
            "boot": self.boot, "unrecordable": [n.to_json() for n in self.unrecordable], "host": self.host,
            "versions": self.versions, "origin": self.origin.to_json() if self.origin else None,
            "primary_metric": self.primary,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TestResult:
        """Inverse of :meth:`to_json`."""
        interval = data.get("interval_ns")
        return cls(
            test=data["test"], nodeid=data["nodeid"], profile=data["profile"],
            deployment=data["deployment"], scenario=data["scenario"],
            metrics={k: MetricResult.from_json(v) for k, v in data["metrics"].items()},
            run=RunSummary.from_json(run) if (run := data.get("run")) else None,
            floor=FloorNote.from_fields(floor).floor if (floor := data.get("floor")) else None,
            messages=notes_from_json(data.get("messages")), failures=notes_from_json(data.get("failures")),
            warnings=[ResultWarning.from_json(w) for w in data.get("warnings") or []],
            interval_ns=(int(interval[0]), int(interval[1])) if interval else None,
            server_env=dict(data.get("server_env") or {}),
            profile_env=dict(data.get("profile_env") or {}),
            profile_args=[str(a) for a in data.get("profile_args") or []], invalid=data.get("invalid"),
            invalid_cause=data.get("invalid_cause"),
            unresolved=Unresolved.from_fields(u) if (u := data.get("unresolved")) else None,
            itl_timeline_ms=[float(x) for x in data.get("itl_timeline_ms") or []],
            boot=int(data.get("boot") or 1), unrecordable=tuple(notes_from_json(data.get("unrecordable"))),
            host=data.get("host"), versions=dict(data.get("versions") or {}),
            origin=BootOrigin.from_json(data.get("origin")), primary=data.get("primary_metric"),
        )
