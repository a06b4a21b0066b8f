"""JSON baselines as values: one human-diffable file per deployment and hardware fingerprint.

``baselines/<deployment>/<fingerprint key>.json`` holds, for each ``<test id>|<profile>|<metric>``,
a *history*: one summary per server boot (median, samples, within-boot error of the median, when,
which commit and software) for the last :data:`HISTORY_BOOTS` boots, because the boot is the unit
the gate judges on (``boots``, ``stats``); plus the per-request samples of the latest boot for
plots. The module holds, in order:

* what a baseline file is: the types it loads into (:class:`BaselineFile` of
  :class:`BaselineEntry`, each a history of :class:`BaselineBoot`), the exact text written for one
  (:func:`dumps_baseline`) and the checks a file's JSON passes before anything trusts it
  (:func:`parse_baseline`);
* a session's boots made into entries and appended to their histories (:func:`make_entry`,
  :func:`append_history`, :func:`baseline_entries`): ``--update-baselines`` appends the session's
  boots. Schema 1 files (one run's samples) load as a history of one boot and are rewritten as
  schema 2 on the next update;
* :class:`LoadedBaselines`: what the gate judges against, the files as storage/baselines.py read
  them once; that module also writes them, under a file lock and atomically.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from pytest_kimiperf.config.metric_specs import METRICS, Direction
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.judge.boots import BootSummary, min_samples, summarize_boot, summarize_metric
from pytest_kimiperf.judge.fingerprint import Fingerprint, version_changes
from pytest_kimiperf.judge.levels import BootOrigin
from pytest_kimiperf.judge.stats import VerdictKind
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.numbers import is_real

# What a baseline file is: its entries, their boot histories, and its JSON form.
SCHEMA_VERSION = 3
_T = TypeVar("_T")
SIGNIFICANT_DIGITS = 6
KEY_SEPARATOR = "|"

RESTORE_HINT = (
    "restore it from version control (git checkout -- {path}) or delete it to record a new "
    "baseline; it was left unchanged"
)


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

    def summary(self) -> BootSummary:
        """As stats sees a boot."""
        return BootSummary(median=self.median, n=self.n,
                           se_log=math.nan if self.se_log is None else self.se_log, label=self.recorded_at,
                           session=self.origin.session if self.origin else "",
                           host=self.origin.host if self.origin else "", commit=self.git_commit or "")

    def to_json(self) -> dict[str, Any]:
        """The boot as stored in the file (``origin`` only where known: older files stay as they were)."""
        out: dict[str, Any] = {"median": self.median, "n": self.n, "se_log": self.se_log, "recorded_at": self.recorded_at,
               "git_commit": self.git_commit, "versions": dict(self.versions)}
        if self.origin is not None:
            out["origin"] = self.origin.to_json()
        return out


@dataclass(frozen=True)
class Night:
    """One passing run appended by ``--kimiperf-append-on-pass`` since the anchor, as the drift
    test needs it (judge/history.py): the geometric mean of its boots' medians and how many boots."""

    median: float
    boots: int
    recorded_at: str
    git_commit: str | None

    def to_json(self) -> dict[str, Any]:
        """The night as stored in the file."""
        return {"median": self.median, "boots": self.boots, "recorded_at": self.recorded_at,
                "git_commit": self.git_commit}


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

    def to_json(self) -> dict[str, Any]:
        """The entry as stored in the file."""
        return {
            "test": self.test,
            "profile": self.profile,
            "metric": self.metric,
            "unit": self.unit,
            "direction": self.direction.value,
            "samples": list(self.samples),
            "median": self.median,
            "iqr": list(self.iqr),
            "n": self.n,
            "recorded_at": self.recorded_at,
            "git_commit": self.git_commit,
            "profile_env": dict(self.profile_env),
            **({"profile_args": list(self.profile_args)} if self.profile_args else {}),
            "boots": [b.to_json() for b in self.boots],
            **({"anchor": [b.to_json() for b in self.anchor]} if self.anchor else {}),
            **({"nights": [n.to_json() for n in self.nights]} if self.nights else {}),
        }


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
    schema_version: int = SCHEMA_VERSION

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

    def to_json(self) -> dict[str, Any]:
        """The whole file's JSON object."""
        return {
            "schema_version": self.schema_version,
            "deployment": self.deployment,
            "fingerprint": self.fingerprint.to_json(),
            "entries": {key: e.to_json() for key, e in self.entries.items()},
        }


def entry_key(test: str, profile: str, metric: str) -> str:
    """Join test id, profile and metric into the entry key; none of them may contain ``|``."""
    for kind, value in (("test id", test), ("profile", profile), ("metric", metric)):
        if not isinstance(value, str) or not value or KEY_SEPARATOR in value:
            raise BaselineError(
                f"{kind} {value!r} cannot be part of a baseline key: it must be a non-empty string "
                f"without {KEY_SEPARATOR!r} (the key separator)"
            )
    return KEY_SEPARATOR.join((test, profile, metric))


def dumps_baseline(baseline: BaselineFile) -> str:
    """The exact text written for a baseline: sorted keys, indent 2, trailing newline."""
    return json.dumps(baseline.to_json(), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def round_figure(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def parse_baseline(path: Path, text: str) -> BaselineFile:
    hint = RESTORE_HINT.format(path=path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"baseline {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); {hint}"
        ) from None

    def bad(what: str) -> BaselineError:
        return BaselineError(f"baseline {path} is malformed: {what}; {hint}")

    if not isinstance(data, dict):
        raise bad(f"the top level is a {type(data).__name__}, not an object")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise bad(f"schema_version is {version!r}, expected {SCHEMA_VERSION}")
    if version > SCHEMA_VERSION:
        raise BaselineError(
            f"baseline {path} has schema_version {version}, newer than the {SCHEMA_VERSION} this "
            "pytest-kimiperf supports: upgrade pytest-kimiperf to use it; it was left unchanged"
        )
    deployment = data.get("deployment")
    if not isinstance(deployment, str):
        raise bad(f"deployment is {deployment!r}, expected a name")
    try:
        fingerprint = Fingerprint.from_json(data.get("fingerprint"), source=f"baseline {path}")
    except BaselineError as exc:
        raise BaselineError(f"{exc}; {hint}") from None
    raw_entries = data.get("entries")
    if not isinstance(raw_entries, dict):
        raise bad("entries must be an object")
    entries: dict[str, BaselineEntry] = {}
    for key, raw in raw_entries.items():
        try:
            entry = _parse_entry(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(f"entry {key!r}: {exc}") from None
        if entry.key != key:
            raise bad(f"entry {key!r} holds test/profile/metric {entry.key!r}")
        entries[key] = entry
    return BaselineFile(
        path=path,
        deployment=deployment,
        fingerprint=fingerprint,
        entries=entries,
        schema_version=SCHEMA_VERSION,
    )


def _parse_entry(raw: object) -> BaselineEntry:
    if not isinstance(raw, dict):
        raise TypeError("not an object")
    missing = [
        name
        for name in ("test", "profile", "metric", "unit", "direction", "samples", "median", "iqr",
                     "n", "recorded_at", "git_commit", "profile_env")
        if name not in raw
    ]
    if missing:
        raise KeyError(f"missing {', '.join(missing)}")
    samples = raw["samples"]
    if not isinstance(samples, list) or not samples or not all(is_real(s, finite=True) for s in samples):
        raise ValueError("samples must be a non-empty list of numbers")
    iqr = raw["iqr"]
    if not isinstance(iqr, list) or len(iqr) != 2 or not all(is_real(q, finite=True) for q in iqr):
        raise ValueError("iqr must be [q1, q3]")
    if not is_real(raw["median"], finite=True):
        raise ValueError("median must be a number")
    if raw["n"] != len(samples):
        raise ValueError(f"n is {raw['n']!r} but there are {len(samples)} samples")
    for name in ("test", "profile", "metric", "unit", "recorded_at"):
        if not isinstance(raw[name], str):
            raise TypeError(f"{name} must be a string")
    if raw["git_commit"] is not None and not isinstance(raw["git_commit"], str):
        raise TypeError("git_commit must be a string or null")
    env = raw["profile_env"]
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TypeError("profile_env must be an object of strings")
    args = raw.get("profile_args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise TypeError("profile_args must be a list of strings")
    try:
        direction = Direction(raw["direction"])
    except ValueError:
        raise ValueError(
            f"direction {raw['direction']!r} is not one of {', '.join(d.value for d in Direction)}"
        ) from None
    if "boots" in raw:
        boots = tuple(_parse_boot(b, i) for i, b in enumerate(raw["boots"] if isinstance(raw["boots"], list) else [None]))
        if not boots:
            raise ValueError("boots must be a non-empty list")
    else:
        # Schema 1: the samples of one run, which was one boot.
        summary = summarize_boot([float(s) for s in samples])
        boots = (BaselineBoot(median=round_figure(summary.median), n=summary.n,
                              se_log=None if not math.isfinite(summary.se_log) else round_figure(summary.se_log),
                              recorded_at=raw["recorded_at"], git_commit=raw["git_commit"], versions={}),)
    anchor = _parse_list(raw, "anchor", _parse_boot)
    nights = _parse_list(raw, "nights", _parse_night)
    if nights and not anchor:
        raise ValueError("nights without an anchor: the passing runs appended since a recording need it")
    return BaselineEntry(
        test=raw["test"],
        profile=raw["profile"],
        metric=raw["metric"],
        unit=raw["unit"],
        direction=direction,
        samples=tuple(float(s) for s in samples),
        median=float(raw["median"]),
        iqr=(float(iqr[0]), float(iqr[1])),
        n=len(samples),
        recorded_at=raw["recorded_at"],
        git_commit=raw["git_commit"],
        profile_env=dict(env),
        boots=boots,
        profile_args=tuple(args),
        anchor=anchor,
        nights=nights,
    )


def _parse_list(raw: dict[str, Any], name: str, parse: Callable[[object, int, str], _T]) -> tuple[_T, ...]:
    items = raw.get(name, [])
    if not isinstance(items, list):
        raise TypeError(f"{name} must be a list")
    return tuple(parse(item, i, name) for i, item in enumerate(items))


def _record_with_median(raw: object, index: int, where: str) -> dict[str, Any]:
    """A stored night or boot: an object whose median is a number > 0."""
    if not isinstance(raw, dict):
        raise TypeError(f"{where}[{index}] is not an object")
    if not is_real(raw.get("median"), finite=True) or raw["median"] <= 0:
        raise ValueError(f"{where}[{index}].median must be a number > 0")
    return raw


def _parse_night(raw: object, index: int, where: str = "nights") -> Night:
    raw = _record_with_median(raw, index, where)
    boots = raw.get("boots")
    if not isinstance(boots, int) or isinstance(boots, bool) or boots < 1:
        raise ValueError(f"{where}[{index}].boots must be an integer >= 1")
    commit = raw.get("git_commit")
    if commit is not None and not isinstance(commit, str):
        raise TypeError(f"{where}[{index}].git_commit must be a string or null")
    return Night(median=float(raw["median"]), boots=boots, recorded_at=str(raw.get("recorded_at") or ""),
                 git_commit=commit)


def _parse_boot(raw: object, index: int, where: str = "boots") -> BaselineBoot:
    raw = _record_with_median(raw, index, where)
    n = raw.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{where}[{index}].n must be an integer >= 1")
    se = raw.get("se_log")
    if se is not None and not is_real(se, finite=True):
        raise ValueError(f"{where}[{index}].se_log must be a number or null")
    versions = raw.get("versions") or {}
    if not isinstance(versions, dict):
        raise TypeError(f"{where}[{index}].versions must be an object")
    try:
        origin = BootOrigin.from_json(raw.get("origin"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}[{index}].origin: {exc}") from None
    return BaselineBoot(median=float(raw["median"]), n=n, se_log=None if se is None else float(se),
                        recorded_at=str(raw.get("recorded_at") or ""), git_commit=raw.get("git_commit"),
                        versions={str(k): str(v) for k, v in versions.items()}, origin=origin)


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
    results: Sequence[TestResult], *, git_commit: str | None
) -> tuple[list[BaselineEntry], list[TestResult]]:
    """Baseline entries for every metric of the tests that ran, every boot of this session
    appended in order; and the boots not recorded (INVALID, or failed for another reason than
    a verdict: their ``invalid`` and ``unrecordable`` say why). An entry whose last boot was
    judged a REGRESSION or an improvement against its history is a ``new_level``."""
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
        )
        decided = last.baseline is not None and last.baseline.verdict in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
        entries.append(replace(entry, new_level=True) if decided else entry)
    return entries, skipped
