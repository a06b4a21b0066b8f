"""The one way the plugin replaces a file: write beside it, then rename over it.

A reader (another xdist worker, a later session, a user's editor) sees the old file or the new
one, never half of one: the temporary file sits in the same directory, so ``os.replace`` is a
rename within one file system (atomic on POSIX). ``durable`` adds the fsyncs that make the
rename survive a crash (the baselines, which a run appends to and nothing regenerates).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, *, durable: bool = False, keep_mode: bool = False) -> None:
    """Replace ``path`` with ``text`` (UTF-8, ``\\n`` line ends) in one step; its directory must
    exist. ``keep_mode`` keeps an existing file's permissions (else 0600 from mkstemp becomes
    0644). An OSError leaves the old file as it was and no temporary file behind."""
    mode = path.stat().st_mode & 0o777 if keep_mode and path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform can open a directory)."""
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
