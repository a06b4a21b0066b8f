"""Absolute checks: a median against a hard floor (the test fails) and a target (it warns).

The deployment's single-stream decode floor and target are checked here; relative verdicts
against a baseline are ``stats``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from pytest_kimiperf.numbers import is_real
from pytest_kimiperf.numbers import fmt_value


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

    def message(self) -> str:
        """One line, e.g. "decode 38.2 tok/s is below the floor of 40 tok/s"."""
        unit = f" {self.unit}" if self.unit else ""
        head = f"{self.label} {fmt_value(self.median)}{unit}".strip()
        if self.status is FloorStatus.BELOW_FLOOR:
            return f"{head} is below the floor of {fmt_value(self.floor)}{unit}"
        if self.status is FloorStatus.BELOW_TARGET:
            floor = "" if self.floor is None else f"above the floor of {fmt_value(self.floor)}{unit} but "
            return f"{head} is {floor}below the target of {fmt_value(self.target)}{unit}"
        if self.target is not None:
            return f"{head} meets the target of {fmt_value(self.target)}{unit}"
        if self.floor is not None:
            return f"{head} meets the floor of {fmt_value(self.floor)}{unit} (no target set)"
        return f"{head} (no floor or target set)"


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
