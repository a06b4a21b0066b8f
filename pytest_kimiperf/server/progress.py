"""What a booting server is doing, live, from vLLM's start-up log: its phase and how far along.

vLLM writes tqdm bars separated by carriage returns and INFO lines for the other phases; a
36-minute load is only bearable when the user sees which phase it is in and how far along. Where
the lines go (pytest's terminal, or an xdist worker's relay) is here too, at the end; where the
seconds went, once ready, ``boot_account.py``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

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


# Where the progress lines go. Boot progress is written during fixture setup, where pytest
# captures output, and on xdist workers, whose output xdist does not show: TerminalOutput steps
# around the capture; RelayOutput appends a worker's lines to a file that the controller's
# RelayTail passes on to its terminal as the file grows.


class TerminalOutput:
    """Lines through pytest's terminal reporter, stepping around output capture.

    Boot progress is written during fixture setup, where pytest captures output; the capture
    manager's ``global_and_fixture_disabled`` lets a 36-minute load be seen as it happens.
    Both objects are duck-typed (TerminalReporter, CaptureManager) so this module does not
    import pytest; with ``-p no:terminal`` there is nowhere to write and lines are dropped.
    """

    def __init__(self, reporter: object | None, capture: object | None) -> None:
        self._reporter: Any = reporter
        self._capture: Any = capture

    @property
    def isatty(self) -> bool:
        """Whether the output is a terminal (progress is then one line rewritten in place)."""
        return bool(self._reporter is not None and self._reporter.isatty)

    def _uncaptured(self) -> Any:
        return self._capture.global_and_fixture_disabled() if self._capture else contextlib.nullcontext()

    def write_line(self, line: str) -> None:
        """Write one line on a line of its own."""
        if self._reporter is None:
            return
        with self._uncaptured():
            self._reporter.ensure_newline()
            self._reporter.write_line(line)

    def rewrite(self, line: str) -> None:
        """Replace the current terminal line with ``line``."""
        if self._reporter is None:
            return
        with self._uncaptured():
            self._reporter.rewrite(line, erase=True)


class RelayOutput:
    """An xdist worker's boot progress, appended to a file the controller shows as it grows.

    xdist does not show what a worker writes, so a 36-minute load on a worker would pass in
    silence. Each line is one ``O_APPEND`` write (whole lines from several workers never
    interleave); the progress display treats this output as a log, not a terminal.
    """

    isatty = False

    def __init__(self, path: str | os.PathLike[str], prefix: str) -> None:
        self._path = os.fspath(path)
        self._prefix = prefix

    def write_line(self, line: str) -> None:
        """Append one line (an empty one, which ends an in-place line on a tty, is dropped)."""
        if not line:
            return
        data = f"{self._prefix}{line}\n".encode()
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            return  # the controller has gone (its temp folder with it): nobody to show it to
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def rewrite(self, line: str) -> None:
        """Lines are never rewritten in a relay."""
        self.write_line(line)


class RelayTail:
    """The controller's side of :class:`RelayOutput`: a thread that passes on each new line."""

    def __init__(self, path: Path, emit: Callable[[str], None], *, poll_s: float = 0.5) -> None:
        path.touch()
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._emit = emit
        self._poll_s = poll_s
        self._partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kimiperf-progress-relay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self._drain()

    def _drain(self) -> None:
        data = self._file.read()
        if not data:
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            self._emit(line.decode("utf-8", "replace"))

    def close(self) -> None:
        """Stop the thread and pass on whatever came in since its last look."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._drain()
        self._file.close()
