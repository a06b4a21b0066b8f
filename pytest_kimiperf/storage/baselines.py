"""Baseline files on disk: ``baselines/<deployment>/<fingerprint key>.json``, read and written.

What a file holds and how a history grows is the judge's (judge/baselines.py, the text;
judge/baselines.py, the entries and :class:`~pytest_kimiperf.judge.baselines.LoadedBaselines`).
This module finds, reads and writes the files: :func:`load_baselines` reads this fingerprint's
file and the deployment's others once, for the gate. Writers merge under a file lock and replace
the file atomically, so parallel pytest-xdist controllers or CI jobs never lose each other's
entries and a reader never sees half a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import filelock

from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.judge.baselines import RESTORE_HINT, BaselineEntry, BaselineFile, dumps_baseline, parse_baseline
from pytest_kimiperf.judge.baselines import LoadedBaselines, append_history
from pytest_kimiperf.judge.fingerprint import Fingerprint

LOCK_TIMEOUT_S = 120.0


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
    """Merge ``entries`` (the tests that ran) into the baseline file at ``path`` and return the result.

    Entries with the same key have the new boots appended to their history (``on_pass``: by a
    passing run, :func:`append_history`), all others kept. The read-merge-write happens under a
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
            f"could not lock {lock_path} within {LOCK_TIMEOUT_S:g} s: another pytest run is writing "
            "this baseline; if none is running, delete the lock file"
        ) from None


def _check_same_owner(path: Path, existing: BaselineFile, deployment: str, fingerprint: Fingerprint) -> None:
    # Merging entries measured on other hardware into this file would make its numbers lie.
    if existing.deployment != deployment or existing.fingerprint.key != fingerprint.key:
        raise BaselineError(
            f"baseline {path} belongs to deployment {existing.deployment!r} with fingerprint "
            f"{existing.fingerprint.key!r}, not {deployment!r} with {fingerprint.key!r}: "
            "it was moved or renamed by hand; " + RESTORE_HINT.format(path=path)
        )


def _write_atomically(path: Path, text: str) -> None:
    try:
        write_atomically(path, text, durable=True, keep_mode=True)
    except OSError as exc:
        raise BaselineError(f"cannot write baseline {path}: {exc.strerror or exc}") from None


def load_baselines(baselines_dir: Path, deployment: str, fingerprint: Fingerprint) -> LoadedBaselines:
    """This fingerprint's baseline file and the deployment's files from other hardware, read once.

    A file of this fingerprint that cannot be trusted is kept as its error, raised when the gate
    asks for it (the perf tests say why); unreadable files of other hardware are skipped (they
    judge nothing here, and their own hardware reports them).
    """
    path = baseline_path(baselines_dir, deployment, fingerprint.key)
    try:
        loaded, error = load_baseline(path), None
    except BaselineError as exc:
        loaded, error = None, str(exc)
    others = other_fingerprints(path)
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


def other_fingerprints(path: Path) -> list[Path]:
    """Baseline files of the same deployment as ``path``, recorded on other hardware."""
    directory = path.parent
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.json") if p != path)
