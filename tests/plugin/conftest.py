"""The plugin tier: pytester runs on the stub server and recorded data, deterministic on any host."""

from __future__ import annotations

import os

import pytest

from tests.helpers import FAKES


@pytest.fixture(autouse=True)
def _recorded_host_canary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pytester subprocess reads the recorded host canary (tests/fakes/recorded_canary.py)
    instead of timing this host, whose load changes between two runs of one test."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAKES), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PYTEST_PLUGINS", "recorded_canary")
    monkeypatch.syspath_prepend(str(FAKES))  # in-process runs (pytester.runpytest) import it from here
