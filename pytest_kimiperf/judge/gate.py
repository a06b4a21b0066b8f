"""Where a verdict is decided: floors, baselines and profile-vs-reference comparisons.

One measured test on one server boot produces a :class:`TestResult` (plain data, JSON-able so
it can travel from an xdist worker to the controller). The gate compares the per-boot summaries
of all boots of the same test and profile with the stored boot history of the baseline (only
when the hardware fingerprint matches), and with the deployment's decode floor; the reports
compare profiles with each other, boot against boot, at session end (stats.py says why).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_kimiperf.judge import baselines as baseline_store
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.stats import (
    BootSummary, Comparison, FloorResult, FloorStatus, VerdictKind, compare_boots, floor_check,
    summarize_boot, summarize_boot_quantile,
)

FLOOR_METRIC = "decode_tok_s"


@dataclass
class MetricResult:
    """Samples and verdicts of one metric of one test under one profile."""

    metric: str
    unit: str
    direction: str
    tolerance: float
    samples: list[float]
    baseline: dict[str, Any] | None = None  # Comparison.to_dict() against the baseline
    baseline_message: str | None = None
    boot_label: str = ""

    def boot_summary(self) -> BootSummary:
        """This boot's summary of the metric (the unit of replication): its median, or its
        quantile for a tail metric (p99_itl_ms)."""
        spec = metric_spec(self.metric)
        if spec.quantile is not None:
            return summarize_boot_quantile(self.samples, spec.quantile, self.boot_label)
        return summarize_boot(self.samples, self.boot_label)

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
            "boot_label": self.boot_label, "boot_summary": self.boot_summary().to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "MetricResult":
        """Inverse of :meth:`to_json`."""
        return cls(
            metric=data["metric"], unit=data["unit"], direction=data["direction"],
            tolerance=data["tolerance"], samples=[float(s) for s in data["samples"]],
            baseline=data.get("baseline"), baseline_message=data.get("baseline_message"),
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
    run: dict[str, Any] = field(default_factory=dict)  # bench-serve style summary of the run
    floor: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    interval_ns: tuple[int, int] | None = None  # CLOCK_MONOTONIC span of the measurement
    server_env: dict[str, str] = field(default_factory=dict)
    profile_env: dict[str, str] = field(default_factory=dict)
    invalid: str | None = None
    itl_timeline_ms: list[float] = field(default_factory=list)
    boot: int = 1
    # Why --update-baselines must not record this boot (a failure that is not a verdict).
    unrecordable: str | None = None
    host: dict[str, Any] | None = None  # hostwatch readings of the measured rounds
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "test": self.test, "nodeid": self.nodeid, "profile": self.profile,
            "deployment": self.deployment, "scenario": self.scenario,
            "metrics": {k: v.to_json() for k, v in self.metrics.items()},
            "run": self.run, "floor": self.floor, "messages": self.messages,
            "failures": self.failures, "warnings": self.warnings,
            "interval_ns": list(self.interval_ns) if self.interval_ns else None,
            "server_env": self.server_env, "profile_env": self.profile_env,
            "invalid": self.invalid,
            "itl_timeline_ms": self.itl_timeline_ms,
            "boot": self.boot, "unrecordable": self.unrecordable, "host": self.host,
            "versions": self.versions,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TestResult":
        """Inverse of :meth:`to_json`."""
        interval = data.get("interval_ns")
        return cls(
            test=data["test"], nodeid=data["nodeid"], profile=data["profile"],
            deployment=data["deployment"], scenario=data["scenario"],
            metrics={k: MetricResult.from_json(v) for k, v in data["metrics"].items()},
            run=dict(data.get("run") or {}), floor=data.get("floor"),
            messages=list(data.get("messages") or []), failures=list(data.get("failures") or []),
            warnings=list(data.get("warnings") or []),
            interval_ns=(int(interval[0]), int(interval[1])) if interval else None,
            server_env=dict(data.get("server_env") or {}),
            profile_env=dict(data.get("profile_env") or {}), invalid=data.get("invalid"),
            itl_timeline_ms=[float(x) for x in data.get("itl_timeline_ms") or []],
            boot=int(data.get("boot") or 1), unrecordable=data.get("unrecordable"),
            host=data.get("host"), versions=dict(data.get("versions") or {}),
        )


def strip_profile(nodeid: str, profile: str) -> str:
    """The node id without the profile's (or boot slot's) part of the parameter id."""
    from pytest_kimiperf.judge.boots import strip_slot

    return strip_slot(nodeid, profile)


class BaselineView:
    """This process's read-only view of the baseline file for the current fingerprint."""

    def __init__(self, baselines_dir: Path, deployment: str, fingerprint: baseline_store.Fingerprint) -> None:
        self.fingerprint = fingerprint
        self.path = baseline_store.baseline_path(baselines_dir, deployment, fingerprint.key)
        self._loaded = False
        self._file: baseline_store.BaselineFile | None = None
        self._others: list[baseline_store.BaselineFile] | None = None

    def file(self) -> baseline_store.BaselineFile | None:
        """The baseline file (None when missing); BaselineError when it cannot be trusted."""
        if not self._loaded:
            self._file = baseline_store.load_baseline(self.path)
            self._loaded = True
        return self._file

    def soft_changes(self) -> list[str]:
        """Soft facts (host name, full driver build, kernel) that differ from the baseline
        file's, as ``name: old -> new``: they only warn, the hard facts decide comparability."""
        baseline = self.file()
        return [] if baseline is None else baseline.fingerprint.diff(self.fingerprint)[1]

    def other_files(self) -> list[baseline_store.BaselineFile]:
        """This deployment's baseline files from other hardware; unreadable ones are skipped
        (they judge nothing here, and their own hardware reports them)."""
        if self._others is None:
            self._others = []
            for path in self.other_fingerprints():
                try:
                    other = baseline_store.load_baseline(path)
                except BaselineError:
                    continue
                if other is not None:
                    self._others.append(other)
        return self._others

    def across_versions(
        self, test: str, profile: str, metric: str
    ) -> tuple[baseline_store.BaselineFile, baseline_store.BaselineEntry, list[str]] | None:
        """The entry recorded on this same hardware under other vLLM / torch / NCCL versions
        (fingerprint.VERSION_KEYS), with the versions that differ; the fewest differences win,
        then the newest recording. None when no such baseline exists."""
        from pytest_kimiperf.judge.fingerprint import version_changes

        found = []
        for other in self.other_files():
            versions = version_changes(other.fingerprint, self.fingerprint)
            entry = other.entry(test, profile, metric)
            if versions is not None and entry is not None:
                found.append((len(versions), _newest_boot(entry), other, entry, versions))
        if not found:
            return None
        found.sort(key=lambda f: (f[0], _reverse(f[1])))
        _, _, other, entry, versions = found[0]
        return other, entry, versions

    def other_fingerprints(self) -> list[Path]:
        """Baseline files of the same deployment recorded on other hardware."""
        directory = self.path.parent
        if not directory.is_dir():
            return []
        return sorted(p for p in directory.glob("*.json") if p != self.path)


# Markers in the messages judge_metric writes; warning_kinds reads them back.
NO_BASELINE = "no baseline for this hardware"
ACROSS_VERSIONS = "judged against the baseline of other software versions"


def judge_metric(
    result: MetricResult,
    *,
    test: str,
    profile: str,
    view: BaselineView | None,
    profile_env: Mapping[str, str],
    current: Sequence[BootSummary],
    prior_spread: float,
) -> tuple[Comparison | None, str]:
    """Compare one metric's boots so far with the baseline's boot history; returns the
    comparison (if any) and a message."""
    spec = metric_spec(result.metric)
    if view is None:
        return None, f"{spec.label}: baselines not in use"
    base_file = view.file()
    entry = base_file.entry(test, profile, result.metric) if base_file else None
    if entry is None:
        upgrade = view.across_versions(test, profile, result.metric)
        if upgrade is not None:
            other, entry, versions = upgrade
            comparable = dict(entry.profile_env) == dict(profile_env)
            comparison = compare_boots(
                current, entry.summaries(), direction=Direction(result.direction), tolerance=result.tolerance,
                prior_spread=prior_spread, metric=spec.label, unit=result.unit, comparable=comparable,
            )
            return comparison, (f"{comparison.message()} — {ACROSS_VERSIONS} on the same hardware "
                                f"({other.fingerprint.key}): {'; '.join(versions)}")
        missing = f"{NO_BASELINE} ({view.fingerprint.key}): run --update-baselines"
        elsewhere = [(f, e) for f in view.other_files() if (e := f.entry(test, profile, result.metric))]
        if not elsewhere:
            others = view.other_fingerprints()
            hint = (
                f" (baselines exist for other hardware: {', '.join(p.stem for p in others)}; "
                "not comparable)" if others else ""
            )
            return None, f"{spec.label}: {missing}{hint}"
        # Shown, never judged: the closest other hardware's baseline, with what differs.
        other, other_entry = min(
            elsewhere, key=lambda fe: (len(fe[0].fingerprint.diff(view.fingerprint)[0]), str(fe[0].path)))
        hard = other.fingerprint.diff(view.fingerprint)[0]
        shown = "; ".join(hard[:3]) + (f"; and {len(hard) - 3} more" if len(hard) > 3 else "")
        comparison = compare_boots(
            current, other_entry.summaries(), direction=Direction(result.direction),
            tolerance=result.tolerance, prior_spread=prior_spread, metric=spec.label, unit=result.unit,
            comparable=False,
        )
        return comparison, (
            f"{comparison.message()} — the baseline was recorded on other hardware "
            f"({other.fingerprint.key}: {shown}); {missing}"
        )
    comparable = dict(entry.profile_env) == dict(profile_env)
    comparison = compare_boots(
        current, entry.summaries(), direction=Direction(result.direction), tolerance=result.tolerance,
        prior_spread=prior_spread, metric=spec.label, unit=result.unit, comparable=comparable,
    )
    message = comparison.message()
    if not comparable:
        message += (
            f" — the baseline was recorded with profile environment {dict(entry.profile_env)}, "
            f"this run used {dict(profile_env)}"
        )
    return comparison, message


def _newest_boot(entry: baseline_store.BaselineEntry) -> str:
    return max((boot.recorded_at for boot in entry.boots), default="")


def _reverse(text: str) -> tuple[int, ...]:
    # Sort key putting the newest ISO timestamp first.
    return tuple(-ord(ch) for ch in text)


def missing_baselines(result: TestResult) -> list[str]:
    """The baseline messages of the metrics that have no baseline on this hardware (under any
    software versions): what ``--kimiperf-missing-baseline`` warns or fails on."""
    return [m.baseline_message for m in result.metrics.values()
            if m.baseline_message and NO_BASELINE in m.baseline_message]


class WarningKind(str, enum.Enum):
    """What a perf test's warning is about (each has its pytest warning class)."""

    INCONCLUSIVE = "inconclusive"
    MISSING_BASELINE = "missing-baseline"
    BELOW_TARGET = "below-target"
    SOFT_FINGERPRINT = "soft-fingerprint"
    OTHER_VERSIONS = "other-versions"
    OTHER = "other"


SOFT_FACTS = "the baseline was recorded with other soft facts"


def warning_kinds(result: TestResult, *, missing_baseline_fails: bool) -> list[tuple[WarningKind, str]]:
    """Each warning of ``result`` with its kind, plus one per metric without a baseline (unless
    that fails the test) and one per metric judged across software versions."""
    inconclusive = {m.baseline_message for m in result.metrics.values()
                    if m.baseline and m.baseline.get("verdict") == VerdictKind.INCONCLUSIVE.value}
    below_target = result.floor["message"] if result.floor and result.floor.get("status") == FloorStatus.BELOW_TARGET.value else None
    kinds: list[tuple[WarningKind, str]] = []
    for line in result.warnings:
        if line == below_target:
            kinds.append((WarningKind.BELOW_TARGET, line))
        elif line.startswith(SOFT_FACTS):
            kinds.append((WarningKind.SOFT_FINGERPRINT, line))
        elif any(m and line.startswith(m.split(" — ")[0]) for m in inconclusive):
            kinds.append((WarningKind.INCONCLUSIVE, line))
        else:
            kinds.append((WarningKind.OTHER, line))
    if not missing_baseline_fails:
        kinds.extend((WarningKind.MISSING_BASELINE, line) for line in missing_baselines(result))
    kinds.extend((WarningKind.OTHER_VERSIONS, m.baseline_message) for m in result.metrics.values()
                 if m.baseline_message and ACROSS_VERSIONS in m.baseline_message)
    return kinds


def verdict_fails(comparison: Comparison, *, strict: bool) -> bool:
    """Whether a baseline verdict fails the test."""
    if comparison.verdict is VerdictKind.REGRESSION:
        return True
    return strict and comparison.verdict is VerdictKind.INCONCLUSIVE


def check_floor(median: float, *, floor: float, target: float) -> FloorResult:
    """Decode median against the deployment's floor (fail) and target (warn)."""
    return floor_check(median, floor, target, "tok/s", "single-stream decode")


def compare_profiles(
    results: Sequence[TestResult], reference_profile: str, *, prior_spread: float = 0.01
) -> list[tuple[str, str, str, Comparison]]:
    """Each profile against the reference, per test and metric, boot against boot:
    (test, metric, profile, comparison). Boots measured on a disturbed host (INVALID) are
    not samples of either profile and are left out."""
    boots: dict[tuple[str, str], dict[str, list[BootSummary]]] = {}
    meta: dict[tuple[str, str], MetricResult] = {}
    for res in results:
        if res.invalid:
            continue
        for metric, mres in res.metrics.items():
            boots.setdefault((res.test, metric), {}).setdefault(res.profile, []).append(mres.boot_summary())
            meta.setdefault((res.test, metric), mres)
    rows: list[tuple[str, str, str, Comparison]] = []
    for (test, metric), per_profile in boots.items():
        ref = per_profile.get(reference_profile)
        if ref is None:
            continue
        spec = metric_spec(metric)
        mres = meta[(test, metric)]
        for profile, current in per_profile.items():
            if profile == reference_profile:
                continue
            rows.append((test, metric, profile, compare_boots(
                current, ref, direction=Direction(mres.direction), tolerance=mres.tolerance,
                prior_spread=prior_spread, metric=spec.label, unit=mres.unit,
            )))
    return rows


def baseline_entries(
    results: Sequence[TestResult], *, git_commit: str | None
) -> tuple[list[baseline_store.BaselineEntry], list[str]]:
    """Baseline entries for every metric of the tests that ran, every boot of this session
    appended in order; and, for each boot not recorded, the test and why."""
    grouped: dict[tuple[str, str, str], list[tuple[TestResult, MetricResult]]] = {}
    skipped: list[str] = []
    for res in sorted(results, key=lambda r: r.boot):
        why = res.invalid and f"INVALID: {res.invalid}" or res.unrecordable
        if why:
            skipped.append(f"{res.test} [{res.profile}, boot {res.boot}]: {why}")
            continue
        for mres in res.metrics.values():
            if mres.finite:
                grouped.setdefault((res.test, res.profile, mres.metric), []).append((res, mres))
    entries = []
    for (test, profile, metric), boots in grouped.items():
        last_res, last = boots[-1]
        entries.append(baseline_store.make_entry(
            test=test, profile=profile, metric=metric, unit=last.unit,
            direction=Direction(last.direction), samples=last.samples, git_commit=git_commit,
            profile_env=last_res.profile_env, boot_samples=[m.samples for _, m in boots],
            versions=last_res.versions,
        ))
    return entries, skipped


__all__ = [
    "BaselineError", "BaselineView", "MetricResult", "TestResult", "baseline_entries",
    "check_floor", "compare_profiles", "judge_metric", "missing_baselines", "verdict_fails",
    "WarningKind", "warning_kinds",
]


def session_fingerprint(deployment: Any) -> Any:
    """Fingerprint of this host, its software and ``deployment`` (hardware is probed once)."""
    from pytest_kimiperf.judge.fingerprint import collect_fingerprint
    from pytest_kimiperf.server.gpu import probe_gpus, query_topology

    probe = probe_gpus(timeout_s=10.0)
    topology = query_topology(timeout_s=10.0) if probe.gpus else None
    revision = deployment.revision
    if revision is None and deployment.model.startswith("kimiperf:"):
        from pytest_kimiperf.server.tiny_model import TinyModelSpec

        revision = f"built-{TinyModelSpec().cache_key()}"
    facts = {
        "name": deployment.name,
        "model": deployment.model,
        "revision": revision or "unpinned",
        "quantization": deployment.quantization or "none",
        "tensor_parallel_size": str(deployment.tensor_parallel_size),
    }
    return collect_fingerprint(gpus=probe.gpus, topology=topology, deployment_facts=facts)
