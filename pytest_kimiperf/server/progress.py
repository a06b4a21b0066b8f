"""What a booting server is doing, live, from vLLM's start-up log: its phase and how far along.

vLLM writes tqdm bars separated by carriage returns and INFO lines for the other phases; a
36-minute load is only bearable when the user sees which phase it is in and how far along. Where
the lines go is ``reports/terminal.py``; where the seconds went, once ready, ``boot_account.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# Live progress: the phase and fraction a booting server is at, shown while it boots.

# (phase, pattern) in boot order; the first match of a line wins.
_PHASE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ready", re.compile(r"Application startup complete")),
    ("starting API server", re.compile(r"Starting vLLM (?:API )?server on|Available routes are")),
    ("capturing CUDA graphs", re.compile(r"Capturing CUDA graph|Graph capturing finished")),
    ("allocating KV cache", re.compile(r"KV cache size|Available KV cache memory|for KV cache")),
    ("compiling", re.compile(r"torch\.compile|Compiling a graph|AOT compiled|Dynamo bytecode")),
    ("profiling", re.compile(r"Memory profiling|profile_run|Warming up model|profiling/warmup run")),
    ("loading weights", re.compile(r"Loading (?:safetensors|pt) checkpoint shards|Starting to load model"
                                   r"|Loading weights took|Model loading took")),
    ("initializing engine", re.compile(r"Initializing a V1 LLM engine|world_size=")),
    ("resolving model", re.compile(r"Resolved architecture|non-default args")),
)

# Two bar shapes: vLLM's checkpoint loader ("56% Completed | 36/64", model_loader/weight_utils.py
# line 837 _BAR_FORMAT) and tqdm's default ("45%|████▌     | 23/51", tqdm/std.py 4.70.1 lines
# 585-589 and 628: '{l_bar}{bar}{r_bar}', the bar between '%|' and '| n/total'), which the
# CUDA-graph capture uses (v1/worker/gpu_model_runner.py line 6654).
_PERCENT = re.compile(r"(\d{1,3})%\s*(?:Completed\s*)?\|(?:[^|\r\n]*\|)?\s*(\d+)/(\d+)")


@dataclass(frozen=True)
class BootProgress:
    """Where a booting server is: its phase and, inside a progress bar, how far."""

    phase: str
    percent: int | None = None
    done: int | None = None
    total: int | None = None

    def describe(self) -> str:
        """Short text such as ``loading weights 56% (36/64)``."""
        if self.percent is None:
            return self.phase
        return f"{self.phase} {self.percent}% ({self.done}/{self.total})"


def parse_progress(line: str) -> BootProgress | None:
    """The progress a single log line reports, or None when it says nothing about the boot."""
    for phase, pattern in _PHASE_PATTERNS:
        if pattern.search(line):
            bar = _PERCENT.search(line)
            if bar:
                return BootProgress(phase, int(bar.group(1)), int(bar.group(2)), int(bar.group(3)))
            return BootProgress(phase)
    return None


def split_log_records(buffer: str) -> tuple[list[str], str]:
    """Split text read from a log into complete records (each tqdm redraw, after ``\\r``, one of
    its own) and the unfinished rest."""
    parts = re.split(r"\r\n|\r|\n", buffer)
    return [p for p in parts[:-1] if p.strip()], parts[-1]


_PHASE_ORDER = {phase: rank for rank, (phase, _) in enumerate(reversed(_PHASE_PATTERNS))}


class BootTracker:
    """Follows a server's log records and keeps the furthest phase reached: a later line with an
    earlier phase's words ("init engine (profile, ...) took") does not move the display back."""

    def __init__(self) -> None:
        self.current = BootProgress("starting process")
        self._rank = -1

    def feed(self, record: str) -> bool:
        """Take one log record; True when the progress shown should change."""
        progress = parse_progress(record)
        if progress is None:
            return False
        rank = _PHASE_ORDER[progress.phase]
        if rank < self._rank or (rank == self._rank and progress.percent is None):
            return False
        changed = progress != self.current
        self.current, self._rank = progress, rank
        return changed


class ProgressDisplay:
    """Shows boot progress: on a terminal one line rewritten in place (a few times a second at
    most); without one (CI logs) a line when the phase changes, else every ``interval_s``."""

    def __init__(
        self,
        *,
        write_line: Callable[[str], None],
        rewrite: Callable[[str], None],
        isatty: bool,
        interval_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._write_line = write_line
        self._rewrite = rewrite
        self._isatty = isatty
        self._interval_s = interval_s
        self._clock = clock
        self._last_phase: str | None = None
        self._last_write = -1e18
        self._dirty = False

    @classmethod
    def for_output(cls, out: LineOutput, *, interval_s: float) -> ProgressDisplay:
        """A display writing through ``out`` (pytest's terminal, around the capture)."""
        import time

        return cls(write_line=out.write_line, rewrite=out.rewrite, isatty=out.isatty,
                   interval_s=interval_s, clock=time.monotonic)

    def update(self, label: str, progress: BootProgress, elapsed_s: float, changed: bool) -> None:
        """Take the latest progress; decides whether and how to show it."""
        self._show(label, progress, elapsed_s, changed)
        if progress.phase == "ready":
            self.finish()

    def _show(self, label: str, progress: BootProgress, elapsed_s: float, changed: bool) -> None:
        if progress.phase == self._last_phase == "ready":
            return
        now = self._clock()
        text = f"kimiperf [{label}] {progress.describe()} — {_format_elapsed(elapsed_s)}"
        if self._isatty:
            if changed or now - self._last_write >= 0.5:
                self._rewrite(text)
                self._last_write = now
                self._dirty = True
            return
        phase_changed = progress.phase != self._last_phase
        if phase_changed or now - self._last_write >= self._interval_s:
            self._write_line(text)
            self._last_write = now
            self._last_phase = progress.phase

    def finish(self) -> None:
        """End an in-place line so the next output starts on a fresh one."""
        if self._isatty and self._dirty:
            self._write_line("")
            self._dirty = False


def _format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s elapsed" if minutes else f"{secs}s elapsed"


class LineOutput(Protocol):
    """Where progress lines go: pytest's terminal, or a worker's relay (``reports/terminal.py``)."""

    @property
    def isatty(self) -> bool:
        """Whether one line can be rewritten in place."""
        ...

    def write_line(self, line: str) -> None:
        """Write one line on a line of its own."""
        ...

    def rewrite(self, line: str) -> None:
        """Replace the current line with ``line``."""
        ...
