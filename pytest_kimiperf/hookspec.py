"""Hooks other plugins and conftest files implement to extend pytest-kimiperf."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_kimiperf_add_deployments(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """Return deployment tables ``{name: {...}}`` shaped like ``[tool.kimiperf.deployments.NAME]``.

    Called once at configure time from every plugin and conftest; results are merged in order.
    """
    raise NotImplementedError


@pytest.hookspec
def pytest_kimiperf_add_profiles(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """Return NCCL profile tables ``{name: {...}}`` shaped like ``[tool.kimiperf.profiles.NAME]``."""
    raise NotImplementedError


@pytest.hookspec
def pytest_kimiperf_update_json(config: pytest.Config, report: dict[str, Any]) -> None:
    """Edit the JSON report in place before it is written (``--kimiperf-json``)."""
