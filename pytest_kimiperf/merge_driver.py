"""The merge driver's old command, for a clone configured before it became ``python -m
pytest_kimiperf merge-driver``: it fails the merge and names the line to configure instead.

git runs the driver a clone was configured with; this path must not exit 0 with ``%A`` untouched
(git would take "ours" as merged and drop the other runner's boots).
"""

import sys

if __name__ == "__main__":
    sys.exit("kimiperf-baselines merge driver: `python -m pytest_kimiperf.merge_driver` is not the driver; run "
             "`make merge-driver` once in this clone, or `git config merge.kimiperf-baselines.driver "
             f"\"{sys.executable} -m pytest_kimiperf merge-driver %O %A %B %P\"`, then merge again (this merge is "
             "left conflicted)")
