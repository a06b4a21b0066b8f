"""Boot progress lines on their way to the user: pytest's terminal, or an xdist worker's relay.

Boot progress (``server/progress.py``) is written during fixture setup, where pytest captures
output, and on xdist workers, whose output xdist does not show. :class:`TerminalOutput` steps
around the capture; :class:`RelayOutput` appends a worker's lines to a file that the controller's
:class:`RelayTail` passes on to its terminal as the file grows.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
