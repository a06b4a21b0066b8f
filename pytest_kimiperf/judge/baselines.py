"""JSON baselines: one human-diffable file per deployment and hardware fingerprint.

``baselines/<deployment>/<fingerprint key>.json`` holds, for each ``<test id>|<profile>|<metric>``,
a *history*: one summary per server boot (median, samples, within-boot error of the median, when,
which commit and software) for the last :data:`HISTORY_BOOTS` boots, because the boot is the unit
the gate judges on (stats.py); plus the per-request samples of the latest boot for plots.
``--update-baselines`` appends the session's boots. Schema 1 files (one run's samples) load as a
history of one boot and are rewritten as schema 2 on the next update.
Files are reviewed like code, so the output is stable: sorted keys, two-space indent, floats at
six significant digits, a trailing newline. Writers merge under a file lock and replace the file
atomically, so parallel pytest-xdist controllers or CI jobs never lose each other's entries and a
reader never sees half a file.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import filelock
import numpy as np

from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.judge.fingerprint import Fingerprint
from pytest_kimiperf.config.metric_specs import METRICS, Direction
from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.judge.stats import BootSummary, summarize_boot, summarize_boot_quantile, tail_min_samples

# Fingerprint is re-exported: it is the type baseline files are keyed by.
__all__ = [
    "SCHEMA_VERSION",
    "BaselineBoot",
    "BaselineEntry",
    "HISTORY_BOOTS",
    "append_history",
    "BaselineFile",
    "Fingerprint",
    "baseline_path",
    "current_git_commit",
    "dumps_baseline",
    "entry_key",
    "load_baseline",
    "make_entry",
    "update_baseline",
]

SCHEMA_VERSION = 2
HISTORY_BOOTS = 20
SIGNIFICANT_DIGITS = 6
LOCK_TIMEOUT_S = 120.0
KEY_SEPARATOR = "|"

_RESTORE_HINT = (
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

    def summary(self) -> BootSummary:
        """As stats sees a boot."""
        return BootSummary(median=self.median, n=self.n,
                           se_log=math.nan if self.se_log is None else self.se_log, label=self.recorded_at)

    def to_json(self) -> dict[str, Any]:
        """The boot as stored in the file."""
        return {"median": self.median, "n": self.n, "se_log": self.se_log, "recorded_at": self.recorded_at,
                "git_commit": self.git_commit, "versions": dict(self.versions)}


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

    def summaries(self) -> list[BootSummary]:
        """The history as stats.BootSummary, oldest first (a tail metric's boots need as many
        samples as stats.tail_min_samples says)."""
        spec = METRICS.get(self.metric)
        min_n = tail_min_samples(spec.quantile) if spec is not None and spec.quantile else 0
        return [replace(b.summary(), min_n=min_n) for b in self.boots]

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
            "boots": [b.to_json() for b in self.boots],
        }


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


def baseline_path(baselines_dir: str | os.PathLike[str], deployment: str, fingerprint_key: str) -> Path:
    """Where the baseline of this deployment on hardware with this fingerprint lives."""
    check_safe_name("deployment", deployment)
    check_safe_name("fingerprint key", fingerprint_key)
    return Path(baselines_dir) / deployment / f"{fingerprint_key}.json"


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
    boot_samples: Sequence[Sequence[float]] | None = None,
    versions: Mapping[str, str] | None = None,
) -> BaselineEntry:
    """Build an entry from raw samples: rounds them and derives median, IQR and n from the rounded ones.

    Non-finite samples (failed requests) are not stored; at least one finite sample is required.
    ``recorded_at`` defaults to now; it must be timezone-aware and is stored in UTC.
    """
    entry_key(test, profile, metric)
    values = [float(s) for s in samples]
    finite = [_round(v) for v in values if math.isfinite(v)]
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
    for boot in (boot_samples if boot_samples is not None else [values]):
        finite_boot = [v for v in boot if math.isfinite(v)]
        summary = (summarize_boot_quantile(finite_boot, spec.quantile) if spec is not None and spec.quantile
                   else summarize_boot(finite_boot))
        if summary.n == 0:
            continue
        boots.append(BaselineBoot(
            median=_round(summary.median), n=summary.n,
            se_log=None if not math.isfinite(summary.se_log) else _round(summary.se_log),
            recorded_at=stamp, git_commit=git_commit,
            versions={str(k): str(v) for k, v in (versions or {}).items()}))
    return BaselineEntry(
        test=test,
        profile=profile,
        metric=metric,
        unit=unit,
        direction=Direction(direction),
        samples=tuple(finite),
        median=_round(float(np.median(arr))),
        iqr=(_round(float(q1)), _round(float(q3))),
        n=len(finite),
        recorded_at=stamp,
        git_commit=git_commit,
        profile_env={str(k): str(v) for k, v in profile_env.items()},
        boots=tuple(boots),
    )


def append_history(old: BaselineEntry | None, new: BaselineEntry, keep: int = HISTORY_BOOTS) -> BaselineEntry:
    """``new``'s boots appended to ``old``'s history (last ``keep`` boots kept).

    A history recorded with another profile environment, unit or direction is another thing:
    it is replaced, not extended.
    """
    if old is None or dict(old.profile_env) != dict(new.profile_env) or (old.unit, old.direction) != (
            new.unit, new.direction):
        return new
    return replace(new, boots=(old.boots + new.boots)[-keep:])


def load_baseline(path: str | os.PathLike[str]) -> BaselineFile | None:
    """Read a baseline file; None if it does not exist, BaselineError if it cannot be trusted."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    return _parse(path, text)


def dumps_baseline(baseline: BaselineFile) -> str:
    """The exact text written for a baseline: sorted keys, indent 2, trailing newline."""
    return json.dumps(baseline.to_json(), sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def update_baseline(
    path: str | os.PathLike[str],
    deployment: str,
    fingerprint: Fingerprint,
    entries: Iterable[BaselineEntry],
) -> BaselineFile:
    """Merge ``entries`` (the tests that ran) into the baseline file at ``path`` and return the result.

    Entries with the same key are replaced, all others kept. The read-merge-write happens under a
    lock on ``<path>.lock`` and the new file replaces the old one atomically, so concurrent
    writers lose nothing. A corrupt or newer-schema file, or one that belongs to another
    deployment or fingerprint, is a BaselineError and is left untouched.
    """
    path = Path(path)
    check_safe_name("deployment", deployment)
    check_safe_name("fingerprint key", fingerprint.key)
    if path.name != f"{fingerprint.key}.json" or path.parent.name != deployment:
        raise BaselineError(
            f"baseline {path} does not match deployment {deployment!r} and fingerprint "
            f"{fingerprint.key!r}: use baseline_path() so every file is <deployment>/<key>.json"
        )
    new_entries: dict[str, BaselineEntry] = {}
    for entry in entries:
        new_entries[entry.key] = append_history(new_entries.get(entry.key), entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = f"{path}.lock"
    try:
        with filelock.FileLock(lock_path, timeout=LOCK_TIMEOUT_S):
            existing = load_baseline(path)
            merged: dict[str, BaselineEntry] = {}
            if existing is not None:
                _check_same_owner(path, existing, deployment, fingerprint)
                merged.update(existing.entries)
            for key, entry in new_entries.items():
                merged[key] = append_history(merged.get(key), entry)
            result = BaselineFile(
                path=path,
                deployment=deployment,
                fingerprint=fingerprint,
                entries=dict(sorted(merged.items())),
            )
            try:
                text = dumps_baseline(result)
            except (TypeError, ValueError) as exc:
                raise BaselineError(f"cannot write baseline {path}: {exc} (fingerprint values must be JSON)") from None
            _write_atomically(path, text)
            return result
    except filelock.Timeout:
        raise BaselineError(
            f"could not lock {lock_path} within {LOCK_TIMEOUT_S:g} s: another pytest run is writing "
            "this baseline; if none is running, delete the lock file"
        ) from None


def current_git_commit(repo_dir: str | os.PathLike[str]) -> str | None:
    """The HEAD commit of the git checkout at ``repo_dir``, or None (no git, not a checkout)."""
    try:
        proc = subprocess.run(
            ["git", "-C", os.fspath(repo_dir), "rev-parse", "--verify", "-q", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    commit = proc.stdout.strip()
    if proc.returncode != 0 or len(commit) not in (40, 64):
        return None
    return commit


def _check_same_owner(path: Path, existing: BaselineFile, deployment: str, fingerprint: Fingerprint) -> None:
    # Merging entries measured on other hardware into this file would make its numbers lie.
    if existing.deployment != deployment or existing.fingerprint.key != fingerprint.key:
        raise BaselineError(
            f"baseline {path} belongs to deployment {existing.deployment!r} with fingerprint "
            f"{existing.fingerprint.key!r}, not {deployment!r} with {fingerprint.key!r}: "
            "it was moved or renamed by hand; " + _RESTORE_HINT.format(path=path)
        )


def _write_atomically(path: Path, text: str) -> None:
    # Same directory, so os.replace is a rename on one file system (atomic on POSIX); fsync of
    # the data before and of the directory after makes the rename survive a crash.
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except OSError as exc:
        try:
            os.unlink(tmp_name)
        except OSError:
            pass
        raise BaselineError(f"cannot write baseline {path}: {exc.strerror or exc}") from None
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open directories; its replace is already durable enough.
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")


def _parse(path: Path, text: str) -> BaselineFile:
    hint = _RESTORE_HINT.format(path=path)
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
    if not isinstance(samples, list) or not samples or not all(_is_number(s) for s in samples):
        raise ValueError("samples must be a non-empty list of numbers")
    iqr = raw["iqr"]
    if not isinstance(iqr, list) or len(iqr) != 2 or not all(_is_number(q) for q in iqr):
        raise ValueError("iqr must be [q1, q3]")
    if not _is_number(raw["median"]):
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
        boots = (BaselineBoot(median=_round(summary.median), n=summary.n,
                              se_log=None if not math.isfinite(summary.se_log) else _round(summary.se_log),
                              recorded_at=raw["recorded_at"], git_commit=raw["git_commit"], versions={}),)
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
    )


def _parse_boot(raw: object, index: int) -> BaselineBoot:
    if not isinstance(raw, dict):
        raise TypeError(f"boots[{index}] is not an object")
    if not _is_number(raw.get("median")) or raw["median"] <= 0:
        raise ValueError(f"boots[{index}].median must be a number > 0")
    n = raw.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"boots[{index}].n must be an integer >= 1")
    se = raw.get("se_log")
    if se is not None and not _is_number(se):
        raise ValueError(f"boots[{index}].se_log must be a number or null")
    versions = raw.get("versions") or {}
    if not isinstance(versions, dict):
        raise TypeError(f"boots[{index}].versions must be an object")
    return BaselineBoot(median=float(raw["median"]), n=n, se_log=None if se is None else float(se),
                        recorded_at=str(raw.get("recorded_at") or ""), git_commit=raw.get("git_commit"),
                        versions={str(k): str(v) for k, v in versions.items()})


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
