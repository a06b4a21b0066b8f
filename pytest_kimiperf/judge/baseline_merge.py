"""The merge driver's first command, for a clone configured before it moved: it says what to run.

git runs the driver a clone was configured with; this path must not exit 0 with ``%A`` untouched
(git would take "ours" as merged and drop the other runner's boots), so it fails the merge and
names the command ``make merge-driver`` configures now (storage/baseline_merge.py merges).
"""

import sys

if __name__ == "__main__":
    sys.exit("kimiperf-baselines merge driver: it runs as `python -m pytest_kimiperf.merge_driver` now; run "
             "`make merge-driver` once in this clone, then merge again (this merge is left conflicted)")
