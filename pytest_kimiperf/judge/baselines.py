"""Baselines as values: the boot histories a run is judged against, and how a run's boots join them.

A baseline file (``baselines/<deployment>/<fingerprint key>.json``, storage/baselines.py reads and
writes it) holds, for each ``<test id>|<profile>|<metric>``, a *history*: one summary per server
boot (median, samples, within-boot error of the median, when, which commit and software) for the
last :data:`HISTORY_BOOTS` boots, because the boot is the unit the gate judges on (``boots``,
``stats``); plus the per-request samples of the latest boot for plots. The module holds, in order:

* the types a file loads into (:class:`BaselineFile` of :class:`BaselineEntry`, each a history of
  :class:`BaselineBoot`); the judge receives these and never the file's text;
* a session's boots made into entries and appended to their histories (:func:`make_entry`,
  :func:`append_history`, :func:`baseline_entries`): ``--update-baselines`` appends the session's
  boots;
* :class:`LoadedBaselines`: what the gate judges against, the files as storage/baselines.py read
  them once.
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
from pytest_kimiperf.judge.boots import BootSummary, EngineBoot, min_samples, summarize_boot, summarize_metric
from pytest_kimiperf.judge.engine_clock import engine_boot_of
from pytest_kimiperf.judge.fingerprint import Fingerprint, version_changes
from pytest_kimiperf.judge.levels import BootOrigin
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult

# What a baseline file holds: its entries and their boot histories.
_SIGNIFICANT_DIGITS = 6
_KEY_SEPARATOR = "|"


@dataclass(frozen=True)
class BaselineBoot:
    """One recorded server boot of one metric: the unit the gate compares."""

    median: float
    n: int
    se_log: float | None
    recorded_at: str
    git_commit: str | None
    versions: Mapping[str, str]
    # Session, host and host canary (judge/levels.py); None for boots recorded before they were
    # stored (those count as one unknown session on one unknown host).
    origin: BootOrigin | None = None
    # The boot's two clocks (judge/engine_clock.py); None for a server that exported no engine
    # figure, and for boots recorded before they were stored (judged on the client's clock alone).
    engine: EngineBoot | None = None

    def summary(self) -> BootSummary:
        """As stats sees a boot."""
        return BootSummary(median=self.median, n=self.n,
                           se_log=math.nan if self.se_log is None else self.se_log, label=self.recorded_at,
                           session=self.origin.session if self.origin else "",
                           host=self.origin.host if self.origin else "", commit=self.git_commit or "")



@dataclass(frozen=True)
class Night:
    """One passing run appended by ``--kimiperf-append-on-pass`` since the anchor, as the drift
    test needs it (judge/history.py): the geometric mean of its boots' medians and how many boots."""

    median: float
    boots: int
    recorded_at: str
    git_commit: str | None


@dataclass(frozen=True)
class BaselineEntry:
    """The boot history of one metric of one test under one NCCL profile."""

    test: str
    profile: str
    metric: str
    unit: str
    direction: Direction
    samples: tuple[float, ...]  # the latest boot's per-request samples (plots, tails)
    median: float  # of the latest boot's samples, for readers of the diff
    iqr: tuple[float, float]
    n: int
    recorded_at: str
    git_commit: str | None
    profile_env: Mapping[str, str]
    boots: tuple[BaselineBoot, ...] = ()
    # The profile's server arguments (written only when it has some: older files have none).
    profile_args: tuple[str, ...] = ()
    # The boots of the last deliberate recording (--kimiperf-update-baselines), kept whole
    # whatever the window keeps, and each passing run appended since (oldest first): what a slow
    # drift is judged against (judge/history.py). Empty in files written before schema 3.
    anchor: tuple[BaselineBoot, ...] = ()
    nights: tuple[Night, ...] = ()
    # Not stored: a deliberate recording whose own run judged it a REGRESSION or an improvement
    # against the history (baseline_entries). It is a new level, so it starts the history anew
    # (append_history): appended, the next run would be judged against a mix of both levels.
    new_level: bool = False

    def summaries(self) -> list[BootSummary]:
        """The history as BootSummary, oldest first (a tail metric's boots need as many
        samples as tail_min_samples says; a boot metric's, one)."""
        return self._as_summaries(self.boots)

    def anchor_summaries(self) -> list[BootSummary]:
        """The anchor's boots as BootSummary (see :meth:`summaries`)."""
        return self._as_summaries(self.anchor)

    def _as_summaries(self, boots: Sequence[BaselineBoot]) -> list[BootSummary]:
        min_n = min_samples(self.metric) if self.metric in METRICS else 0
        return [replace(b.summary(), min_n=min_n) for b in boots]

    @property
    def key(self) -> str:
        """The entry's key in the file: ``<test id>|<profile>|<metric>``."""
        return entry_key(self.test, self.profile, self.metric)


@dataclass(frozen=True)
class HistorySpan:
    """The boots of a history, and the sessions and hosts they came from (a boot recorded
    before origins were stored counts as one unknown session on one unknown host)."""

    boots: int
    sessions: int
    hosts: int

    @classmethod
    def of(cls, boots: Sequence[BaselineBoot]) -> HistorySpan:
        origins = [(b.origin.host, b.origin.session) if b.origin else ("", "") for b in boots]
        return cls(len(boots), len(set(origins)), len({host for host, _ in origins}))


@dataclass(frozen=True)
class BaselineFile:
    """A loaded (or just written) baseline file."""

    path: Path
    deployment: str
    fingerprint: Fingerprint
    entries: Mapping[str, BaselineEntry]

    def entry(self, test: str, profile: str, metric: str) -> BaselineEntry | None:
        """The stored entry for this test, profile and metric, or None if never recorded."""
        return self.entries.get(entry_key(test, profile, metric))

    def hosts(self) -> tuple[str, ...]:
        """The host ids the file's boots were measured on, the most recent first."""
        boots = sorted((b for entry in self.entries.values() for b in entry.boots if b.origin and b.origin.host),
                       key=lambda b: b.recorded_at, reverse=True)
        return tuple(dict.fromkeys(b.origin.host for b in boots if b.origin))

    def span(self) -> HistorySpan:
        """How many boots, sessions and hosts the file's history spans (its fullest entry's)."""
        spans = [HistorySpan.of(entry.boots) for entry in self.entries.values()]
        return max(spans, key=lambda s: (s.sessions, s.hosts, s.boots), default=HistorySpan(0, 0, 0))


def entry_key(test: str, profile: str, metric: str) -> str:
    """Join test id, profile and metric into the entry key; none of them may contain ``|``."""
    for kind, value in (("test id", test), ("profile", profile), ("metric", metric)):
        if not isinstance(value, str) or not value or _KEY_SEPARATOR in value:
            raise BaselineError(
                f"{kind} {value!r} cannot be part of a baseline key: it must be a non-empty string "
                f"without {_KEY_SEPARATOR!r} (the key separator)"
            )
    return _KEY_SEPARATOR.join((test, profile, metric))


def round_figure(value: float) -> float:
    """A figure as the file keeps it: :data:`_SIGNIFICANT_DIGITS` significant digits."""
    return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")


# A session's boots as baseline entries, and the baselines the gate judges against.
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
    boot_engines: Sequence[EngineBoot | None] | None = None,
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
    engines = list(boot_engines) if boot_engines is not None else [None] * len(per_boot)
    if len(origins) != len(per_boot) or len(engines) != len(per_boot):
        raise BaselineError(f"{len(origins)} boot origins and {len(engines)} engine figures for {len(per_boot)} "
                            f"boots of {entry_key(test, profile, metric)}")
    for boot, origin, engine in zip(per_boot, origins, engines):
        finite_boot = [v for v in boot if math.isfinite(v)]
        summary = summarize_metric(metric, finite_boot) if spec is not None else summarize_boot(finite_boot)
        if summary.n == 0:
            continue
        boots.append(BaselineBoot(
            median=round_figure(summary.median), n=summary.n,
            se_log=None if not math.isfinite(summary.se_log) else round_figure(summary.se_log),
            recorded_at=stamp, git_commit=git_commit,
            versions={str(k): str(v) for k, v in (versions or {}).items()}, origin=origin,
            engine=_rounded(engine)))
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


def _rounded(engine: EngineBoot | None) -> EngineBoot | None:
    """The engine's figures as the file keeps them (:func:`round_figure`)."""
    if engine is None:
        return None

    def kept(value: float | None) -> float | None:
        return round_figure(value) if value is not None and math.isfinite(value) else value

    return replace(engine, engine_tpot_ms=kept(engine.engine_tpot_ms), engine_ttft_ms=kept(engine.engine_ttft_ms),
                   client_tpot_ms=kept(engine.client_tpot_ms), client_ttft_ms=kept(engine.client_ttft_ms),
                   requests=kept(engine.requests), tokens=kept(engine.tokens))


def append_history(old: BaselineEntry | None, new: BaselineEntry, keep: int = HISTORY_BOOTS, *,
                   on_pass: bool = False) -> BaselineEntry:
    """``new``'s boots appended to ``old``'s history (last ``keep`` boots kept).

    A deliberate recording (``--kimiperf-update-baselines``) also sets the anchor the drift test
    judges against (judge/history.py): its boots, joined to the anchor before it when no passing
    run was appended in between (several sessions of one recording are one anchor), and no
    nights. A passing run (``on_pass``, ``--kimiperf-append-on-pass``) keeps the anchor and adds
    one night; a history written before anchors were kept takes its window as the anchor.

    A history recorded with another profile environment or other profile arguments, unit or
    direction is another thing: it is replaced, not extended; and so is one that a deliberate
    recording found changed beyond the tolerance (``new.new_level``: a REGRESSION or an
    improvement its run judged), which is how a change is accepted.
    """
    if old is None or dict(old.profile_env) != dict(new.profile_env) or (
            old.unit, old.direction, old.profile_args) != (new.unit, new.direction, new.profile_args) or (
            new.new_level and not on_pass):
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
    results: Sequence[TestResult], *, git_commit: str | None, vllm: str = "",
) -> tuple[list[BaselineEntry], list[TestResult]]:
    """Baseline entries for every metric of the tests that ran, every boot of this session
    appended in order with its two clocks (the engine's figures named by ``vllm``); and the boots
    not recorded (INVALID, or failed for another reason than a verdict: their ``invalid`` and
    ``unrecordable`` say why). An entry whose last boot was judged a REGRESSION or an improvement
    against its history is a ``new_level``."""
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
        entry = make_entry(
            test=test, profile=profile, metric=metric, unit=last.unit,
            direction=Direction(last.direction), samples=last.samples, git_commit=git_commit,
            profile_env=last_res.profile_env, profile_args=last_res.profile_args, boot_samples=[m.samples for _, m in boots],
            versions=last_res.versions, boot_origins=[r.origin for r, _ in boots],
            boot_engines=[engine_boot_of(r.run, vllm) for r, _ in boots],
        )
        decided = last.baseline is not None and last.baseline.verdict in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
        entries.append(replace(entry, new_level=True) if decided else entry)
    return entries, skipped
