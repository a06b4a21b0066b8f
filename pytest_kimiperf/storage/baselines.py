"""Baseline files on disk: ``baselines/<deployment>/<fingerprint key>.json``, end to end.

The values and how a history grows are the judge's (judge/baselines.py); the file is here, and
the judge receives only typed histories. :func:`parse_baseline` checks a file before anything
trusts it (a schema 1 file loads as a history of one boot, rewritten in the current schema on
its next update). Writers merge under a file lock and replace the file atomically, so parallel
xdist controllers or CI jobs never lose each other's entries; merging two runners' versions
through git is ``baseline_merge.py``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import filelock

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.judge.baselines import BaselineBoot, BaselineEntry, BaselineFile, LoadedBaselines, AppendedNight
from pytest_kimiperf.judge.baselines import append_history, round_figure
from pytest_kimiperf.judge.stats import EngineBoot, summarize_boot
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.noise import BootOrigin
from pytest_kimiperf.numbers import is_real

# The file's text: its JSON form, written and checked.
SCHEMA_VERSION = 3
_T = TypeVar("_T")

_RESTORE_HINT = (
    "restore it from version control (git checkout -- {path}) or delete it to record a new "
    "baseline; it was left unchanged"
)


def record_json(record: BaselineBoot | AppendedNight) -> dict[str, Any]:
    """A boot or a night as stored in the file (a boot's ``origin`` only where known: older
    files stay as they were)."""
    if isinstance(record, AppendedNight):
        return {"median": record.median, "boots": record.boots, "recorded_at": record.recorded_at,
                "git_commit": record.git_commit}
    out: dict[str, Any] = {"median": record.median, "n": record.n, "se_log": record.se_log,
                           "recorded_at": record.recorded_at, "git_commit": record.git_commit,
                           "versions": dict(record.versions)}
    if record.origin is not None:
        out["origin"] = record.origin.to_json()
    if record.engine is not None:
        out["engine"] = record.engine.to_json()
    return out


def entry_json(entry: BaselineEntry) -> dict[str, Any]:
    """The entry as stored in the file."""
    return {
        "test": entry.test,
        "profile": entry.profile,
        "metric": entry.metric,
        "unit": entry.unit,
        "direction": entry.direction.value,
        "samples": list(entry.samples),
        "median": entry.median,
        "iqr": list(entry.iqr),
        "n": entry.n,
        "recorded_at": entry.recorded_at,
        "git_commit": entry.git_commit,
        "profile_env": dict(entry.profile_env),
        **({"profile_args": list(entry.profile_args)} if entry.profile_args else {}),
        "boots": [record_json(b) for b in entry.boots],
        **({"anchor": [record_json(b) for b in entry.anchor]} if entry.anchor else {}),
        **({"nights": [record_json(n) for n in entry.nights]} if entry.nights else {}),
    }


def dumps_baseline(baseline: BaselineFile) -> str:
    """The exact text written for a baseline: sorted keys, indent 2, trailing newline."""
    data = {
        "schema_version": SCHEMA_VERSION,
        "deployment": baseline.deployment,
        "fingerprint": baseline.fingerprint.to_json(),
        "entries": {key: entry_json(e) for key, e in baseline.entries.items()},
    }
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def parse_baseline(path: Path, text: str) -> BaselineFile:
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
    return BaselineFile(path=path, deployment=deployment, fingerprint=fingerprint, entries=entries)


def _parse_entry(raw: object) -> BaselineEntry:
    if not isinstance(raw, dict):
        raise TypeError("not an object")
    missing = [name for name in ("test", "profile", "metric", "unit", "direction", "samples", "median", "iqr",
                                 "n", "recorded_at", "git_commit", "profile_env") if name not in raw]
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


def _parse_night(raw: object, index: int, where: str = "nights") -> AppendedNight:
    raw = _record_with_median(raw, index, where)
    boots = raw.get("boots")
    if not isinstance(boots, int) or isinstance(boots, bool) or boots < 1:
        raise ValueError(f"{where}[{index}].boots must be an integer >= 1")
    commit = raw.get("git_commit")
    if commit is not None and not isinstance(commit, str):
        raise TypeError(f"{where}[{index}].git_commit must be a string or null")
    return AppendedNight(median=float(raw["median"]), boots=boots, recorded_at=str(raw.get("recorded_at") or ""),
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
    engine = raw.get("engine")
    if engine is not None and not isinstance(engine, dict):
        raise TypeError(f"{where}[{index}].engine must be an object")
    try:
        # Optional: boots recorded before the engine's figures were kept have none.
        engine_boot = EngineBoot.from_json(engine) if engine is not None else None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}[{index}].engine: {exc}") from None
    return BaselineBoot(median=float(raw["median"]), n=n, se_log=None if se is None else float(se),
                        recorded_at=str(raw.get("recorded_at") or ""), git_commit=raw.get("git_commit"),
                        versions={str(k): str(v) for k, v in versions.items()}, origin=origin, engine=engine_boot)


# Where the files are, read and written.
_LOCK_TIMEOUT_S = 120.0


def baseline_path(baselines_dir: str | os.PathLike[str], deployment: str, fingerprint_key: str) -> Path:
    """Where the baseline of this deployment on hardware with this fingerprint lives."""
    check_safe_name("deployment", deployment)
    check_safe_name("fingerprint key", fingerprint_key)
    return Path(baselines_dir) / deployment / f"{fingerprint_key}.json"


def load_baseline(path: str | os.PathLike[str]) -> BaselineFile | None:
    """Read a baseline file; None if it does not exist, BaselineError if it cannot be trusted."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    return parse_baseline(path, text)


def update_baseline(
    path: str | os.PathLike[str],
    deployment: str,
    fingerprint: Fingerprint,
    entries: Iterable[BaselineEntry],
    *,
    on_pass: bool = False,
) -> BaselineFile:
    """Append ``entries``' boots to their histories in the baseline file at ``path`` (``on_pass``: by
    a passing run, :func:`append_history`), under a lock on ``<path>.lock``, and return the result.
    A corrupt or newer-schema file, or another deployment's or fingerprint's, is a BaselineError
    and is left untouched.
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
        with filelock.FileLock(lock_path, timeout=_LOCK_TIMEOUT_S):
            existing = load_baseline(path)
            merged: dict[str, BaselineEntry] = {}
            if existing is not None:
                _check_same_owner(path, existing, deployment, fingerprint)
                merged.update(existing.entries)
            for key, entry in new_entries.items():
                merged[key] = append_history(merged.get(key), entry, on_pass=on_pass)
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
            f"could not lock {lock_path} within {_LOCK_TIMEOUT_S:g} s: another pytest run is writing "
            "this baseline; if none is running, delete the lock file"
        ) from None


def _check_same_owner(path: Path, existing: BaselineFile, deployment: str, fingerprint: Fingerprint) -> None:
    # Merging entries measured on other hardware into this file would make its numbers lie.
    if existing.deployment != deployment or existing.fingerprint.key != fingerprint.key:
        raise BaselineError(
            f"baseline {path} belongs to deployment {existing.deployment!r} with fingerprint "
            f"{existing.fingerprint.key!r}, not {deployment!r} with {fingerprint.key!r}: "
            "it was moved or renamed by hand; " + _RESTORE_HINT.format(path=path)
        )


def _write_atomically(path: Path, text: str) -> None:
    try:
        write_atomically(path, text, durable=True, keep_mode=True)
    except OSError as exc:
        raise BaselineError(f"cannot write baseline {path}: {exc.strerror or exc}") from None


def load_baselines(baselines_dir: Path, deployment: str, fingerprint: Fingerprint) -> LoadedBaselines:
    """This fingerprint's baseline file and the deployment's files from other hardware, read once:
    an untrusted file of this fingerprint is kept as its error, raised when the gate asks for it;
    unreadable files of other hardware are skipped (they judge nothing here)."""
    path = baseline_path(baselines_dir, deployment, fingerprint.key)
    try:
        loaded, error = load_baseline(path), None
    except BaselineError as exc:
        loaded, error = None, str(exc)
    others = _other_fingerprints(path)
    readable = []
    for other_path in others:
        try:
            other = load_baseline(other_path)
        except BaselineError:
            continue
        if other is not None:
            readable.append(other)
    return LoadedBaselines(fingerprint=fingerprint, path=path, loaded=loaded, error=error,
                           others=tuple(readable), other_keys=tuple(p.stem for p in others))


def _other_fingerprints(path: Path) -> list[Path]:
    """Baseline files of the same deployment as ``path``, recorded on other hardware."""
    directory = path.parent
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.json") if p != path)
