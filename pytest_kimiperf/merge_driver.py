"""git's merge driver for baseline files: ``python -m pytest_kimiperf.merge_driver %O %A %B %P``.

The command that ``make merge-driver`` configures in each clone, so it stays at this path; the
merge and the driver are storage/baseline_merge.py's, which owns the baseline file.
"""

from __future__ import annotations

import sys

from pytest_kimiperf.storage.baseline_merge import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
