"""Absolute checks: a median against a hard floor (the test fails) and a target (it warns).

The deployment's single-stream decode floor and target are checked here; relative verdicts
against a baseline are ``stats``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from pytest_kimiperf.numbers import is_real


class FloorStatus(str, Enum):
    """Where an absolute figure sits against its hard floor and its target."""

    BELOW_FLOOR = "below floor"
    BELOW_TARGET = "below target"
    OK = "ok"


@dataclass(frozen=True)
class FloorResult:
    """An absolute check of a higher-is-better median (e.g. decode tok/s) against floor/target."""

    label: str
    unit: str
    median: float
    floor: float | None
    target: float | None
    status: FloorStatus

    @property
    def failed(self) -> bool:
        """True below the floor: the test fails."""
        return self.status is FloorStatus.BELOW_FLOOR

    @property
    def warned(self) -> bool:
        """True above the floor but below the target: the test passes with a warning."""
        return self.status is FloorStatus.BELOW_TARGET


def floor_check(
    median: float, floor: float | None, target: float | None, unit: str, label: str
) -> FloorResult:
    """Check a higher-is-better median against an absolute floor (fail) and target (warn)."""
    if not is_real(median) or not math.isfinite(median):
        raise ValueError(f"{label} median {median!r} is not a finite number; nothing to check")
    for name, value in (("floor", floor), ("target", target)):
        if value is not None and (not is_real(value) or not math.isfinite(value) or value < 0):
            raise ValueError(f"{label} {name} {value!r}: use a finite number >= 0, or no {name}")
    if floor is not None and target is not None and floor > target:
        raise ValueError(
            f"{label} floor {floor!r} {unit} is above its target {target!r} {unit}: the floor is "
            "the hard minimum, the target what we aim for, so floor <= target"
        )
    if floor is not None and median < floor:
        status = FloorStatus.BELOW_FLOOR
    elif target is not None and median < target:
        status = FloorStatus.BELOW_TARGET
    else:
        status = FloorStatus.OK
    return FloorResult(
        label=label,
        unit=unit,
        median=float(median),
        floor=None if floor is None else float(floor),
        target=None if target is None else float(target),
        status=status,
    )
