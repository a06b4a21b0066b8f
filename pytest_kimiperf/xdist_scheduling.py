"""pytest-xdist: every test that needs the server goes to one worker, the rest spread out.

One worker must own the servers: each profile boots once, and measurements never overlap,
while functional tests still run on every worker. xdist's ``xdist_group`` + ``--dist
loadgroup`` was made for this, but it marks groups by rewriting the private ``Item._nodeid``,
which pytest 9's ``nodeid`` no longer reads, so the group is lost. Instead each worker writes
the node ids of its server tests into a directory the controller named, and this scheduler
(a LoadScopeScheduling whose scope is "the server" for those ids and the test itself for the
rest) reads them when it forms work units, after every worker has finished collecting.
Imported only when xdist is installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

SERVER_SCOPE = "kimiperf-server"


def write_server_test_ids(directory: Path, worker_id: str, nodeids: Iterable[str]) -> None:
    """Worker side: record which collected tests need the server."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{worker_id}.json.tmp"
    tmp.write_text(json.dumps(sorted(nodeids)))
    os.replace(tmp, directory / f"{worker_id}.json")


def read_server_test_ids(directory: Path) -> frozenset[str]:
    """Controller side: the union of what the workers recorded."""
    ids: set[str] = set()
    for path in directory.glob("*.json"):
        ids.update(json.loads(path.read_text()))
    return frozenset(ids)


class ServerGroupScheduling(LoadScopeScheduling):
    """Load scheduling, except that all server tests form one work unit on one worker."""

    def __init__(self, config: pytest.Config, log: object, ids_dir: Path) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self._ids_dir = ids_dir
        self._server_ids: frozenset[str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._server_ids is None:
            self._server_ids = read_server_test_ids(self._ids_dir)
        return SERVER_SCOPE if nodeid in self._server_ids else nodeid
