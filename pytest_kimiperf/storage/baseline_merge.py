"""Three-way merge of a baseline file, so a fleet of runners can share one history through git.

Two runners that appended boots to the same entry conflict as text, not as histories: the merged
history is the union of the boots. :func:`main` is git's merge driver for baseline files
(``.gitattributes``: ``baselines/**/*.json merge=kimiperf-baselines``; ``make merge-driver``),
run as ``python -m pytest_kimiperf merge-driver %O %A %B %P``; where a human must decide it
leaves git's own conflict markers (``git merge-file``). Entry by entry (a missing entry is an
empty history):

- one side unchanged from the base, or both changed alike: the other side's version whole;
- otherwise the union of the sides' boots (a boot identified by everything recorded for it, kept
  once); a base boot missing from either side was removed on purpose (the trim to
  :data:`HISTORY_BOOTS`, a deleted entry) and stays removed; the sides interleave by
  ``recorded_at`` (then session, then the boot's JSON), so either merge order gives the same file;
- the anchor merges alike; the nights since it are the union where both sides share the anchor,
  none where a side recorded anew;
- the latest samples, median and IQR come from the side that recorded last.

Another deployment, hard fingerprint, schema version, or an entry's unit, direction, profile
environment or arguments is a :class:`BaselineConflict` left to a human. Soft fingerprint facts
(host name, kernel) differ between runners by design; the side that recorded last keeps them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.judge.baselines import HISTORY_BOOTS, BaselineBoot, BaselineEntry, BaselineFile, AppendedNight
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.storage.baselines import dumps_baseline, entry_json, parse_baseline, record_json

_DRIVER_NAME = "kimiperf-baselines"

# A boot's identity on one side: its JSON text, and which repeat of that text it is (a history
# holding the same boot twice keeps both through a merge).
_BootKey = tuple[str, int]
_H = TypeVar("_H", BaselineBoot, AppendedNight)


class BaselineConflict(BaselineError):
    """The two sides of a merge disagree on something that is not history: a human decides."""


def merge_baselines(
    base: BaselineFile | None, ours: BaselineFile, theirs: BaselineFile, *, keep: int = HISTORY_BOOTS
) -> BaselineFile:
    """The three-way merge of one baseline file (``base`` None when both sides added it): the
    union of the boot histories, BaselineConflict when the sides disagree on anything else."""
    where = f"baseline {ours.path}"
    _same(where, "deployment", ours.deployment, theirs.deployment)
    if ours.fingerprint.key != theirs.fingerprint.key:
        hard, _ = ours.fingerprint.diff(theirs.fingerprint)
        raise BaselineConflict(
            f"{where}: fingerprint differs between the two sides (ours {ours.fingerprint.key!r}, "
            f"theirs {theirs.fingerprint.key!r}: {'; '.join(hard)}): numbers of other hardware are "
            "not one history, so the file was not merged; resolve the conflict by hand")
    base_entries: Mapping[str, BaselineEntry] = base.entries if base is not None else {}
    entries: dict[str, BaselineEntry] = {}
    for key in sorted({*ours.entries, *theirs.entries}):
        merged = _merge_entry(f"{where}: entry {key!r}", base_entries.get(key), ours.entries.get(key),
                              theirs.entries.get(key), keep=keep)
        if merged is not None:
            entries[key] = merged
    return replace(ours, entries=entries,
                   fingerprint=_merge_fingerprint(base.fingerprint if base is not None else None, ours, theirs))


def merge_baseline_texts(base: str, ours: str, theirs: str, *, path: str | Path) -> str:
    """The merged text of three versions of the baseline file at ``path`` (``base`` empty when
    both sides added the file); BaselineError when one cannot be read, BaselineConflict when
    they cannot be merged."""
    path = Path(path)
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    _same(f"baseline {path}", "schema_version", _raw_schema_version(ours), _raw_schema_version(theirs))
    merged = merge_baselines(
        parse_baseline(path, base) if base.strip() else None,
        parse_baseline(path, ours),
        parse_baseline(path, theirs),
    )
    return dumps_baseline(merged)


def _merge_entry(
    where: str, base: BaselineEntry | None, ours: BaselineEntry | None, theirs: BaselineEntry | None, *, keep: int
) -> BaselineEntry | None:
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    if ours is not None and theirs is not None:
        for field in ("unit", "direction", "profile_env", "profile_args"):
            _same(where, field, _plain(getattr(ours, field)), _plain(getattr(theirs, field)))
    sides = [side for side in (ours, theirs) if side is not None]
    boots = _merge_histories(base.boots if base is not None else (), ours.boots if ours is not None else (),
                            theirs.boots if theirs is not None else ())[-keep:]
    if not boots:
        raise BaselineConflict(
            f"{where}: each side removed every boot the other kept, so no history is left; "
            "resolve the conflict by hand")
    latest = max(sides, key=lambda e: (e.recorded_at, _canonical(entry_json(e))))
    anchor = _merge_histories(base.anchor if base is not None else (), ours.anchor if ours is not None else (),
                             theirs.anchor if theirs is not None else ())[-keep:]
    nights = _merge_histories(base.nights if base is not None else (), ours.nights, theirs.nights) \
        if ours is not None and theirs is not None and ours.anchor == theirs.anchor else []
    return replace(latest, boots=tuple(boots), anchor=tuple(anchor), nights=tuple(nights))


def _merge_histories(base: Sequence[_H], ours: Sequence[_H], theirs: Sequence[_H]) -> list[_H]:
    """The union of two boot histories since ``base``, oldest first, untrimmed: a boot on both
    sides once, a boot of the base removed on either side left out (nights alike)."""
    in_base = {key for key, _ in _keyed(base)}
    ours_keyed, theirs_keyed = _keyed(ours), _keyed(theirs)
    on_both = {key for key, _ in ours_keyed} & {key for key, _ in theirs_keyed}
    mine = [(key, boot) for key, boot in ours_keyed if key not in in_base or key in on_both]
    other = [(key, boot) for key, boot in theirs_keyed if key not in in_base or key in on_both]
    merged: list[_H] = []
    taken: set[_BootKey] = set()
    i = j = 0
    while i < len(mine) or j < len(other):
        if i < len(mine) and mine[i][0] in taken:
            i += 1
        elif j < len(other) and other[j][0] in taken:
            j += 1
        else:
            if j >= len(other) or (i < len(mine) and _order(*mine[i]) <= _order(*other[j])):
                key, boot = mine[i]
                i += 1
            else:
                key, boot = other[j]
                j += 1
            taken.add(key)
            merged.append(boot)
    return merged


def _keyed(boots: Sequence[_H]) -> list[tuple[_BootKey, _H]]:
    seen: dict[str, int] = {}
    out = []
    for boot in boots:
        text = _canonical(record_json(boot))
        out.append(((text, seen.get(text, 0)), boot))
        seen[text] = seen.get(text, 0) + 1
    return out


def _order(key: _BootKey, boot: BaselineBoot | AppendedNight) -> tuple[str, str, str, int]:
    # recorded_at is "%Y-%m-%dT%H:%M:%SZ" (baselines.make_entry), so text order is time order;
    # one session's boots share it, and the rest only makes the order the same either way round.
    origin = boot.origin if isinstance(boot, BaselineBoot) else None
    return (boot.recorded_at, origin.session if origin else "", *key)


def _merge_fingerprint(base: Fingerprint | None, ours: BaselineFile, theirs: BaselineFile) -> Fingerprint:
    if ours.fingerprint == theirs.fingerprint or theirs.fingerprint == base:
        return ours.fingerprint
    if ours.fingerprint == base:
        return theirs.fingerprint
    return max((ours, theirs), key=lambda f: (_last_recorded(f), _canonical(f.fingerprint.to_json()))).fingerprint


def _last_recorded(baseline: BaselineFile) -> str:
    return max((e.recorded_at for e in baseline.entries.values()), default="")


def _same(where: str, field: str, ours: object, theirs: object) -> None:
    if ours != theirs:
        raise BaselineConflict(
            f"{where}: {field} differs between the two sides (ours {ours!r}, theirs {theirs!r}): "
            "that is not history, so the file was not merged; resolve the conflict by hand")


def _plain(value: object) -> object:
    # Mappings compare as dicts and show as dicts in the message; enums by their value.
    if isinstance(value, Mapping):
        return dict(value)
    return getattr(value, "value", value)


def _canonical(data: object) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False)


def _raw_schema_version(text: str) -> object:
    # parse_baseline reads a schema 1 file as schema 2; a merge must see what the side wrote.
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None  # parse_baseline says what is wrong with it
    return data.get("schema_version") if isinstance(data, dict) else None


_USAGE = "usage: python -m pytest_kimiperf merge-driver BASE OURS THEIRS PATH  (git's %O %A %B %P)"


def _leave_text_conflict(base: str, ours: str, theirs: str, path: str) -> None:
    # git leaves the driver's %A in the work tree, marked unmerged: give the human git's own
    # conflict markers rather than "ours" looking resolved.
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["git", "merge-file", "-L", f"ours:{path}", "-L", f"base:{path}", "-L",
                        f"theirs:{path}", ours, base, theirs], capture_output=True, timeout=60, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    """git's merge driver: merge ``%O %A %B`` of the baseline at ``%P`` into ``%A``; 0 when merged,
    1 (with git's text conflict left in ``%A``) when a human must decide, 2 on bad arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4:
        print(_USAGE, file=sys.stderr)
        return 2
    base_file, ours_file, theirs_file, path = args
    try:
        texts = [Path(name).read_text(encoding="utf-8") for name in (base_file, ours_file, theirs_file)]
        merged = merge_baseline_texts(*texts, path=path)
        with open(ours_file, "w", encoding="utf-8", newline="\n") as out:
            out.write(merged)
    except (BaselineError, OSError, UnicodeDecodeError) as exc:
        print(f"{_DRIVER_NAME} merge driver: {exc}", file=sys.stderr)
        _leave_text_conflict(base_file, ours_file, theirs_file, path)
        return 1
    return 0
