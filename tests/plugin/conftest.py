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


@pytest.fixture(scope="session")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a fresh virtualenv with the plugin installed from a wheel built from
    this checkout (with its dependencies, nothing of the checkout on its path): what a user gets
    from ``pip install``. Built once per test run, shared by xdist's workers (pytest-xdist's recipe
    for a run-once fixture: a FileLock beside their base temp dirs), left for pytest to clean."""
    import shutil
    import sys
    import venv

    from filelock import FileLock

    from tests.helpers import ROOT, run_checked

    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    # Under xdist each worker's basetemp sits in the run's own directory; alone, basetemp is it.
    shared = tmp_path_factory.getbasetemp().parent if run else tmp_path_factory.getbasetemp()
    where = shared / "kimiperf-wheel"
    with FileLock(str(shared / "kimiperf-wheel.lock")):
        done = where / "python.txt"
        if not done.is_file():
            # Built from a copy of what the wheel holds, so the checkout gains no build/ or egg-info.
            source = where / "source"
            shutil.copytree(ROOT / "pytest_kimiperf", source / "pytest_kimiperf",
                            ignore=shutil.ignore_patterns("__pycache__"))
            for name in ("pyproject.toml", "README.md"):
                shutil.copy(ROOT / name, source / name)
            run_checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                         str(where / "dist"), str(source)], cwd=where)
            (wheel,) = (where / "dist").glob("pytest_kimiperf-*.whl")
            venv.create(where / "venv", with_pip=True)
            python = str(where / "venv" / "bin" / "python")
            run_checked([python, "-m", "pip", "install", "-q", str(wheel)], cwd=where)
            done.write_text(python)
    return done.read_text()
