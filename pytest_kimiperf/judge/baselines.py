"""JSON baselines as values: one human-diffable file per deployment and hardware fingerprint.

``baselines/<deployment>/<fingerprint key>.json`` holds, for each ``<test id>|<profile>|<metric>``,
a *history*: one summary per server boot (median, samples, within-boot error of the median, when,
which commit and software) for the last :data:`HISTORY_BOOTS` boots, because the boot is the unit
the gate judges on (boot_summary.py, stats.py); plus the per-request samples of the latest boot for plots.
``--update-baselines`` appends the session's boots (:func:`baseline_entries`). Schema 1 files (one
run's samples) load as a history of one boot and are rewritten as schema 2 on the next update
(the format itself is ``baseline_schema``). The gate judges against a :class:`LoadedBaselines`,
the files as storage/baselines.py read them once; that module also writes them, under a file
lock and atomically.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from pytest_kimiperf.config.metric_specs import METRICS, Direction
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.judge.baseline_schema import (
    BaselineBoot, BaselineEntry, BaselineFile, HistorySpan, Night, entry_key, round_figure,
)
from pytest_kimiperf.judge.fingerprint import Fingerprint, version_changes
from pytest_kimiperf.judge.levels import BootOrigin
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.judge.boot_summary import summarize_boot, summarize_metric

HISTORY_BOOTS = 20


def make_entry(
    *,
    test: str,
    profile: str,
    metric: str,
    unit: str,
    direction: Direction,
    samples: Sequence[float],
    git_commit: str | None,
    profile_env: Mapping[str, str],
    recorded_at: datetime | None = None,
    profile_args: Sequence[str] = (),
    boot_samples: Sequence[Sequence[float]] | None = None,
    versions: Mapping[str, str] | None = None,
    boot_origins: Sequence[BootOrigin | None] | None = None,
) -> BaselineEntry:
    """Build an entry from raw samples: rounds them and derives median, IQR and n from the rounded ones.

    Non-finite samples (failed requests) are not stored; at least one finite sample is required.
    ``recorded_at`` defaults to now; it must be timezone-aware and is stored in UTC.
    """
    entry_key(test, profile, metric)
    values = [float(s) for s in samples]
    finite = [round_figure(v) for v in values if math.isfinite(v)]
    if not finite:
        raise BaselineError(
            f"no finite samples to record for {entry_key(test, profile, metric)} "
            f"(got {len(values)} samples)"
        )
    when = recorded_at or datetime.now(UTC)
    if when.tzinfo is None:
        raise BaselineError(f"recorded_at {when.isoformat()} has no time zone; pass an aware UTC time")
    arr = np.asarray(finite)
    q1, q3 = np.percentile(arr, [25.0, 75.0])
    stamp = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    boots = []
    spec = METRICS.get(metric)
    per_boot = list(boot_samples if boot_samples is not None else [values])
    origins = list(boot_origins) if boot_origins is not None else [None] * len(per_boot)
    if len(origins) != len(per_boot):
        raise BaselineError(f"{len(origins)} boot origins for {len(per_boot)} boots of "
                            f"{entry_key(test, profile, metric)}")
    for boot, origin in zip(per_boot, origins):
        finite_boot = [v for v in boot if math.isfinite(v)]
        summary = summarize_metric(metric, finite_boot) if spec is not None else summarize_boot(finite_boot)
        if summary.n == 0:
            continue
        boots.append(BaselineBoot(
            median=round_figure(summary.median), n=summary.n,
            se_log=None if not math.isfinite(summary.se_log) else round_figure(summary.se_log),
            recorded_at=stamp, git_commit=git_commit,
            versions={str(k): str(v) for k, v in (versions or {}).items()}, origin=origin))
    return BaselineEntry(
        test=test,
        profile=profile,
        metric=metric,
        unit=unit,
        direction=Direction(direction),
        samples=tuple(finite),
        median=round_figure(float(np.median(arr))),
        iqr=(round_figure(float(q1)), round_figure(float(q3))),
        n=len(finite),
        recorded_at=stamp,
        git_commit=git_commit,
        profile_env={str(k): str(v) for k, v in profile_env.items()},
        boots=tuple(boots),
        profile_args=tuple(str(a) for a in profile_args),
    )


def append_history(old: BaselineEntry | None, new: BaselineEntry, keep: int = HISTORY_BOOTS, *,
                   on_pass: bool = False) -> BaselineEntry:
    """``new``'s boots appended to ``old``'s history (last ``keep`` boots kept).

    A deliberate recording (``--kimiperf-update-baselines``) also sets the anchor the drift test
    judges against (judge/drift.py): its boots, joined to the anchor before it when no passing
    run was appended in between (several sessions of one recording are one anchor), and no
    nights. A passing run (``on_pass``, ``--kimiperf-append-on-pass``) keeps the anchor and adds
    one night; a history written before anchors were kept takes its window as the anchor.

    A history recorded with another profile environment or other profile arguments, unit or
    direction is another thing: it is replaced, not extended.
    """
    if old is None or dict(old.profile_env) != dict(new.profile_env) or (
            old.unit, old.direction, old.profile_args) != (new.unit, new.direction, new.profile_args):
        return replace(new, boots=new.boots[-keep:], anchor=new.boots[-keep:], nights=())
    boots = (old.boots + new.boots)[-keep:]
    if on_pass:
        return replace(new, boots=boots, anchor=old.anchor or old.boots, nights=(*old.nights, night_of(new)))
    joined = old.anchor if old.anchor and not old.nights else ()
    return replace(new, boots=boots, anchor=(joined + new.boots)[-keep:], nights=())


def night_of(entry: BaselineEntry) -> Night:
    """A passing run's boots of one entry as one night: the geometric mean of their medians."""
    logs = [math.log(b.median) for b in entry.boots]
    return Night(median=round_figure(math.exp(sum(logs) / len(logs))), boots=len(logs),
                 recorded_at=entry.recorded_at, git_commit=entry.git_commit)


@dataclass(frozen=True)
class LoadedBaselines:
    """The baseline files the gate judges one fingerprint against, loaded once
    (storage/baselines.py reads them): this fingerprint's file and the deployment's others."""

    fingerprint: Fingerprint
    path: Path
    loaded: BaselineFile | None
    # Why this fingerprint's file cannot be trusted (corrupt, newer schema): raised when asked for.
    error: str | None = None
    # The readable files of other hardware, and the keys of all of them (readable or not).
    others: tuple[BaselineFile, ...] = ()
    other_keys: tuple[str, ...] = ()

    def file(self) -> BaselineFile | None:
        """The baseline file (None when missing); BaselineError when it cannot be trusted."""
        if self.error is not None:
            raise BaselineError(self.error)
        return self.loaded

    def span(self) -> HistorySpan | None:
        """How many boots, sessions and hosts the file's history spans; None without a file, or
        when it cannot be trusted (the perf tests say why)."""
        return self.loaded.span() if self.loaded is not None else None

    def soft_changes(self) -> list[str]:
        """Soft facts (host name, full driver build, kernel) that differ from the baseline
        file's, as ``name: old -> new``: they only warn, the hard facts decide comparability."""
        baseline = self.file()
        return [] if baseline is None else baseline.fingerprint.diff(self.fingerprint)[1]

    def across_versions(
        self, test: str, profile: str, metric: str
    ) -> tuple[BaselineFile, BaselineEntry, list[str]] | None:
        """The entry recorded on this same hardware under other vLLM / torch / NCCL versions
        (fingerprint.VERSION_KEYS), with the versions that differ; the fewest differences win,
        then the newest recording. None when no such baseline exists."""
        found = []
        for other in self.others:
            versions = version_changes(other.fingerprint, self.fingerprint)
            entry = other.entry(test, profile, metric)
            if versions is not None and entry is not None:
                found.append((len(versions), _newest_boot(entry), other, entry, versions))
        if not found:
            return None
        found.sort(key=lambda f: (f[0], _reverse(f[1])))
        _, _, other, entry, versions = found[0]
        return other, entry, versions


def _newest_boot(entry: BaselineEntry) -> str:
    return max((boot.recorded_at for boot in entry.boots), default="")


def _reverse(text: str) -> tuple[int, ...]:
    # Sort key putting the newest ISO timestamp first.
    return tuple(-ord(ch) for ch in text)


def baseline_entries(
    results: Sequence[TestResult], *, git_commit: str | None
) -> tuple[list[BaselineEntry], list[TestResult]]:
    """Baseline entries for every metric of the tests that ran, every boot of this session
    appended in order; and the boots not recorded (INVALID, or failed for another reason than
    a verdict: their ``invalid`` and ``unrecordable`` say why)."""
    grouped: dict[tuple[str, str, str], list[tuple[TestResult, MetricResult]]] = {}
    skipped: list[TestResult] = []
    for res in sorted(results, key=lambda r: r.boot):
        if res.invalid or res.unrecordable:
            skipped.append(res)
            continue
        for mres in res.metrics.values():
            if mres.finite:
                grouped.setdefault((res.test, res.profile, mres.metric), []).append((res, mres))
    entries = []
    for (test, profile, metric), boots in grouped.items():
        last_res, last = boots[-1]
        entries.append(make_entry(
            test=test, profile=profile, metric=metric, unit=last.unit,
            direction=Direction(last.direction), samples=last.samples, git_commit=git_commit,
            profile_env=last_res.profile_env, profile_args=last_res.profile_args, boot_samples=[m.samples for _, m in boots],
            versions=last_res.versions, boot_origins=[r.origin for r, _ in boots],
        ))
    return entries, skipped
