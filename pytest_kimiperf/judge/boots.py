"""Boots as the unit of replication: the schedule of boots and what each test measured on them.

Each NCCL profile is booted up to ``max_boots`` times in one session. The first ``boots`` are
planned (``--kimiperf-boots``); the rest happen on demand, only for the tests whose comparison
asked for another boot (power.wants_another_boot). Boots of several profiles run interleaved,
A B B A ... (each round reverses the last, so a linear drift over the session falls equally on
every profile; Abedi & Brecht, ICPE 2017, randomized multiple interleaved trials), or in a
seeded random order per round; never A A B B.
"""

from __future__ import annotations

import random
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pytest_kimiperf.judge.boot_summary import BootSummary

BOOT_ID_SEPARATOR = "-boot"
T = TypeVar("T")


@dataclass(frozen=True)
class BootSlot:
    """One boot of one profile: the value the server tests are parametrized with."""

    profile: Any  # NcclProfile
    boot: int

    @property
    def name(self) -> str:
        """The profile's name (what reports and baselines are keyed by)."""
        return str(self.profile.name)

    @property
    def id(self) -> str:
        """The parameter id: ``ring-ll`` for the first boot, ``ring-ll-boot2`` for the second."""
        return self.name if self.boot == 1 else f"{self.name}{BOOT_ID_SEPARATOR}{self.boot}"

    def __repr__(self) -> str:
        return f"BootSlot({self.id})"


def schedule(profiles: Sequence[Any], max_boots: int, *, order: str = "interleaved", seed: int = 0) -> list[BootSlot]:
    """Every slot of the session in the order the boots happen."""
    rng = random.Random(f"kimiperf-boot-order:{seed}")
    slots: list[BootSlot] = []
    names = list(profiles)
    for boot in range(1, max_boots + 1):
        if order == "random":
            round_order = names[:]
            rng.shuffle(round_order)
        else:
            round_order = names if boot % 2 == 1 else names[::-1]
        slots += [BootSlot(p, boot) for p in round_order]
    return slots


def group_by_slot(items: MutableSequence[T], slot_of: Callable[[T], BootSlot | None],
                  order: Sequence[BootSlot]) -> None:
    """Reorder ``items`` in place so each boot slot's items run together, slots in ``order``
    (the schedule's A B B A ...); within a slot, and for every item without one, the order
    stays as it was (pytest boots a session fixture again whenever its parameter changes back,
    and for Kimi each boot is a 36-minute load)."""
    rank = {slot.id: i for i, slot in enumerate(order)}
    placed = [(i, slot) for i, slot in ((i, slot_of(item)) for i, item in enumerate(items)) if slot is not None]
    grouped = [items[i] for i, slot in sorted(placed, key=lambda p: rank.get(p[1].id, 0))]  # stable
    for (i, _), item in zip(placed, grouped):
        items[i] = item


@dataclass
class TestBoots:
    """What one test measured under one profile, boot by boot, and whether it wants another."""

    summaries: dict[str, list[BootSummary]] = field(default_factory=dict)  # metric -> per boot
    boots: list[int] = field(default_factory=list)
    wants_boot: int | None = None  # the next boot this test asked for

    def add(self, boot: int, per_metric: dict[str, BootSummary]) -> None:
        """Record one boot's summaries (a boot measured twice keeps the last)."""
        if boot in self.boots:
            index = self.boots.index(boot)
            for metric, summary in per_metric.items():
                self.summaries.setdefault(metric, [])[index:index + 1] = [summary]
            return
        self.boots.append(boot)
        for metric, summary in per_metric.items():
            self.summaries.setdefault(metric, []).append(summary)


class BootLedger:
    """Per (test, profile): the boots measured so far; lives in the process that runs them."""

    def __init__(self) -> None:
        self._tests: dict[tuple[str, str], TestBoots] = {}

    def of(self, test: str, profile: str) -> TestBoots:
        """The (possibly new) record of ``test`` under ``profile``."""
        return self._tests.setdefault((test, profile), TestBoots())

    def needed(self, test: str, slot: BootSlot, planned: int) -> tuple[bool, str]:
        """Whether ``test`` runs in ``slot``, and why not when it does not."""
        if slot.boot <= planned:
            return True, ""
        record = self._tests.get((test, slot.name))
        if record is not None and record.wants_boot is not None and record.wants_boot >= slot.boot:
            return True, ""
        last = max(record.boots) if record is not None and record.boots else None
        why = ("boot {b} of {p} not needed: boot {last} settled this test" if last is not None else
               "boot {b} of {p} not needed: no earlier boot of this test was measured")
        return False, why.format(b=slot.boot, p=slot.name, last=last)


def strip_slot(nodeid: str, slot_id: str) -> str:
    """The node id without the slot's part of the parameter id, other parameters kept.

    ``test_tp.py::test_out[ring-ll-boot2-8]`` -> ``test_tp.py::test_out[8]``: baselines,
    boot records and profile comparisons are keyed by it, so each concurrency keeps its own.
    """
    base, _, params = nodeid.partition("[")
    params = params.removesuffix("]")
    if params in ("", slot_id):
        return base
    if params.startswith(f"{slot_id}-"):
        rest = params[len(slot_id) + 1:]
    elif params.endswith(f"-{slot_id}"):
        rest = params[: -len(slot_id) - 1]
    else:
        rest = params.replace(f"-{slot_id}-", "-", 1)
    return f"{base}[{rest}]"
