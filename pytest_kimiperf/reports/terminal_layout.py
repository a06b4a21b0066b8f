"""The terminal summary's building blocks: a line with its markup, fixed-width tables, wrapping.

Shared by :mod:`~pytest_kimiperf.reports.terminal` (the verdicts) and
:mod:`~pytest_kimiperf.reports.terminal_context` (what the run was: NCCL, roofline, servers, files).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pytest_kimiperf.judge.stats import VerdictKind

MAX_WIDTH = 100

RED = {"red": True}
LOUD = {"red": True, "bold": True}
YELLOW = {"yellow": True}
GREEN = {"green": True}


@dataclass(frozen=True)
class TerminalLine:
    """One line of the summary: a separator with a title when ``sep`` is set, else plain text."""

    text: str
    sep: str | None = None
    markup: Mapping[str, bool] = field(default_factory=dict)


def wrapped(text: str, *, indent: int, markup: Mapping[str, bool] | None = None) -> list[TerminalLine]:
    """``text`` wrapped to the summary's width, continuation lines indented four more."""
    parts = textwrap.wrap(text, width=MAX_WIDTH, initial_indent=" " * indent,
                          subsequent_indent=" " * (indent + 4), break_long_words=False,
                          break_on_hyphens=False)
    return [TerminalLine(part, markup=markup or {}) for part in parts]


class Table:
    """Fixed-width columns sized to their widest cell; the last column is never padded."""

    def __init__(self, header: Sequence[str], *, aligns: str, indent: int = 2) -> None:
        self.header = list(header)
        self.aligns = aligns
        self.indent = indent
        self.widths = [len(h) for h in header]

    def add(self, cells: Sequence[str]) -> None:
        self.widths = [max(w, len(c)) for w, c in zip(self.widths, cells)]

    def width(self) -> int:
        return self.indent + sum(self.widths) + 2 * (len(self.widths) - 1)

    def format(self, cells: Sequence[str]) -> str:
        parts = []
        last = len(cells) - 1
        for i, (cell, width, align) in enumerate(zip(cells, self.widths, self.aligns)):
            if i == last:
                parts.append(cell)
            else:
                parts.append(cell.rjust(width) if align == "r" else cell.ljust(width))
        return (" " * self.indent + "  ".join(parts)).rstrip()



def verdict_markup(verdict: str) -> Mapping[str, bool]:
    """A verdict's colour: a regression loud red, a pass green, anything unresolved yellow."""
    if verdict == VerdictKind.REGRESSION.value:
        return LOUD
    if verdict == VerdictKind.IMPROVEMENT.value or verdict == VerdictKind.WITHIN_TOLERANCE.value:
        return GREEN
    return YELLOW


def floor_markup(status: str) -> Mapping[str, bool]:
    """A decode floor's colour: below the floor loud red, below target yellow, ok green."""
    return {"below floor": LOUD, "below target": YELLOW, "ok": GREEN}.get(status, {})


def plural(count: int, word: str, plural: str | None = None) -> str:
    """``1 metric``, ``3 metrics``; ``plural`` for irregular words (``entries``)."""
    return f"{count} {word if count == 1 else plural or word + 's'}"
