"""git's merge driver for baseline files: ``python -m pytest_kimiperf.merge_driver %O %A %B %P``.

``make merge-driver`` configures it once per clone (``.gitattributes`` names the files). The merge
itself is judge/baseline_merge.py's (pure: two runners' histories of one file as one); this
module is the command around it, and where a merge a human must decide gets git's own conflict
markers (``git merge-file``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.judge.baseline_merge import DRIVER_NAME, merge_baseline_texts

USAGE = "usage: python -m pytest_kimiperf.merge_driver BASE OURS THEIRS PATH  (git's %O %A %B %P)"


def _leave_text_conflict(base: str, ours: str, theirs: str, path: str) -> None:
    # git leaves the driver's %A in the work tree, marked unmerged: give the human git's own
    # conflict markers rather than "ours" looking resolved.
    try:
        subprocess.run(["git", "merge-file", "-L", f"ours:{path}", "-L", f"base:{path}", "-L",
                        f"theirs:{path}", ours, base, theirs], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """git's merge driver: merge ``%O %A %B`` of the baseline at ``%P`` into ``%A``; 0 when merged,
    1 (with git's text conflict left in ``%A``) when a human must decide, 2 on bad arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 4:
        print(USAGE, file=sys.stderr)
        return 2
    base_file, ours_file, theirs_file, path = args
    try:
        texts = [Path(name).read_text(encoding="utf-8") for name in (base_file, ours_file, theirs_file)]
        merged = merge_baseline_texts(*texts, path=path)
        with open(ours_file, "w", encoding="utf-8", newline="\n") as out:
            out.write(merged)
    except (BaselineError, OSError, UnicodeDecodeError) as exc:
        print(f"{DRIVER_NAME} merge driver: {exc}", file=sys.stderr)
        _leave_text_conflict(base_file, ours_file, theirs_file, path)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
