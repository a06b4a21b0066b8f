"""Whether this run's host is the history's: the host canary of each side compared.

Hosts differ by more than a spread: two machines of one family ran the tiny-cpu server 2x apart
under one fingerprint. The host canary (measure/canary.py) is stored with every boot; when this
run's canary moved beyond its noise from the history's (:func:`canary_shift`), the comparison is
"not comparable: host differs", never a verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


# The canary moved when every probe is this much off the history's, all the same way (log
# scale). Measured on the noise corpus (benchmarks/noise_study.py --analyze), on one host shared
# with other engineers' test runs: the interpreter probe drifted up to 16% from a session's
# start to its end, the copy probe up to 30% (another process's memory traffic), and both
# varied 5% (SD) between sessions; so one probe alone cannot say "another host", and both must
# move 25%. A host 2x slower moves both by about 50%; one 1.2x slower is left to host_spread.
CANARY_MOVED_LOG = math.log(1.25)


@dataclass(frozen=True)
class CanaryCheck:
    """This session's canary against the history's: the change of each probe (fraction), and
    whether they all moved beyond :data:`CANARY_MOVED_LOG` the same way."""

    shifts: Mapping[str, float]
    moved: bool

    def to_dict(self) -> dict[str, object]:
        return {"shifts": dict(self.shifts), "moved": self.moved}


def canary_shift(current: Mapping[str, float] | None,
                 reference: Sequence[Mapping[str, float]]) -> CanaryCheck | None:
    """Each probe this session shares with the history: its change against the history's median
    score. None when either side has no canary (a history recorded before canaries)."""
    if not current:
        return None
    shifts = {}
    for probe, score in current.items():
        history = [c[probe] for c in reference if c.get(probe)]
        if history and score > 0:
            shifts[probe] = score / statistics.median(history) - 1.0
    if not shifts:
        return None
    logs = [math.log1p(s) for s in shifts.values()]
    moved = all(x > CANARY_MOVED_LOG for x in logs) or all(x < -CANARY_MOVED_LOG for x in logs)
    return CanaryCheck(shifts, moved)
