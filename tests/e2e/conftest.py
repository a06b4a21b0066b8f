"""End-to-end tests: each boots real vLLM servers on the CPU engine (tiny-cpu), minutes each.

Every test here is marked ``e2e`` (deselect with ``-m "not e2e"``) and runs with a private
launch-record directory, so its sweeps never touch another test's servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: the mark is in place before `-m` deselects by it.
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _private_launch_records(isolated_state: Path) -> Path:
    return isolated_state
