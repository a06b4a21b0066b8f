"""pytest-xdist: every test that needs the server goes to one worker, the rest spread out.

One worker must own the servers: each profile boots once, and measurements never overlap.
xdist's ``xdist_group`` marks groups by rewriting the private ``Item._nodeid``, which pytest 9's
``nodeid`` does not read, so each worker writes the node ids of its server tests into a directory
the controller named, and a LoadScopeScheduling whose scope is "the server" for those ids reads
them once every worker has collected.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.server.progress import RelayOutput, RelayTail, TerminalOutput

_SERVER_SCOPE = "kimiperf-server"
_WORKERINPUT_IDS_DIR = "kimiperf_server_ids_dir"
WORKEROUTPUT_KEY = "kimiperf_servers"
_WORKERINPUT_PROGRESS_FILE = "kimiperf_progress_file"
# Modes under which the plugin's scheduler takes over (load is what a bare -n N means).
_GROUPED_DIST_MODES = ("load", "loadgroup")


def note_server_tests(config: pytest.Config, nodeids: Iterable[str]) -> bool:
    """Worker side, after collection: record the server tests for the controller's scheduler.
    False on another host (--tx ssh=...), which cannot see the directory the controller made."""
    ids_dir = getattr(config, "workerinput", {}).get(_WORKERINPUT_IDS_DIR)
    if ids_dir and not Path(ids_dir).is_dir():
        return False
    if ids_dir:
        worker_id = config.workerinput["workerid"]  # type: ignore[attr-defined]
        write_atomically(Path(ids_dir) / f"{worker_id}.json", json.dumps(sorted(nodeids)))
    return True


def placement_problem(config: pytest.Config, *, remote_worker: bool) -> str | None:
    """Why this process may not boot servers under xdist, or None."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and not workerinput.get(_WORKERINPUT_IDS_DIR):
        return ("pytest-kimiperf under xdist needs --dist load (the default of -n) or loadgroup, which it "
                "schedules itself; other modes would split the perf tests over workers, booting "
                "servers twice and overlapping measurements")
    if remote_worker:
        return ("pytest-kimiperf's perf tests need xdist workers on this machine (-n N, or --tx "
                "popen): this worker runs on another host, so they could not be kept on one worker "
                "(one boot per profile, no overlapping measurements). Run the perf suite on the "
                "server's machine; remote workers can still run the functional tests")
    return None


def progress_output(config: pytest.Config) -> TerminalOutput | RelayOutput:
    """Where boot progress goes: pytest's terminal (around the capture) or, on an xdist worker,
    the file the controller relays."""
    relay = getattr(config, "workerinput", {}).get(_WORKERINPUT_PROGRESS_FILE)
    if relay:
        return RelayOutput(relay, prefix=f"[{config.workerinput['workerid']}] ")  # type: ignore[attr-defined]
    return TerminalOutput(config.pluginmanager.get_plugin("terminalreporter"),
                          config.pluginmanager.get_plugin("capturemanager"))


def _make_scheduler(config: pytest.Config, log: Any, ids_dir: Path) -> Any:
    """Load scheduling, except that all server tests form one work unit on one worker."""
    from xdist.scheduler import LoadScopeScheduling

    class ServerGroupScheduling(LoadScopeScheduling):
        _server_ids: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._server_ids is None:  # the union of what the workers recorded
                recorded = ids_dir.glob("*.json")
                self._server_ids = frozenset(i for path in recorded for i in json.loads(path.read_text()))
            return _SERVER_SCOPE if nodeid in self._server_ids else nodeid

    return ServerGroupScheduling(config, log)


def _line_writer(config: pytest.Config) -> Any:
    """Write a line of its own on the controller's terminal (xdist's progress dots may be
    mid-line); nowhere with ``-p no:terminal``."""
    if config.pluginmanager.get_plugin("terminalreporter") is None:
        return lambda line: None
    tw = config.get_terminal_writer()

    def write(line: str) -> None:
        if tw.width_of_current_line:
            tw.line()
        tw.line(line)

    return write


class XdistCoordinator:
    """The controller's xdist hooks: name the ids directory, schedule, collect server records,
    and show the workers' boot progress (xdist shows nothing a worker writes)."""

    def __init__(self, on_worker_records: Callable[[list[Any]], None]) -> None:
        self.on_worker_records = on_worker_records  # the session reporter's
        self.ids_dir = Path(tempfile.mkdtemp(prefix="kimiperf-xdist-"))
        self._relay: RelayTail | None = None

    def _grouped(self, config: pytest.Config) -> bool:
        return config.getoption("dist", None) in _GROUPED_DIST_MODES

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Tell each worker where to record its server tests and its boot progress."""
        if self._grouped(node.config):
            node.workerinput[_WORKERINPUT_IDS_DIR] = str(self.ids_dir)
        path = self.ids_dir / "progress.log"
        if self._relay is None:
            self._relay = RelayTail(path, _line_writer(node.config))
        node.workerinput[_WORKERINPUT_PROGRESS_FILE] = str(path)

    def _close_relay(self) -> None:
        if self._relay is not None:
            self._relay.close()

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self) -> None:
        """Show the last progress lines before the terminal summary."""
        self._close_relay()

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """Our scheduler for --dist load/loadgroup; other modes keep xdist's own."""
        return _make_scheduler(config, log, self.ids_dir) if self._grouped(config) else None

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """A worker finished: keep what its servers did (boots, logs, leftovers)."""
        output = getattr(node, "workeroutput", None) or {}
        self.on_worker_records(list(output.get(WORKEROUTPUT_KEY, [])))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Remove the ids directory."""
        self._close_relay()
        shutil.rmtree(self.ids_dir, ignore_errors=True)
