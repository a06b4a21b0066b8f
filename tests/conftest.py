"""Fixtures of the plugin's own tests (shared plain helpers are in tests/helpers.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# pytester's in-process runs restore sys.modules afterwards: numpy (and scipy, built on it)
# imported for the first time inside one would be imported again by the next, which numpy
# refuses with a warning. The plugin loads them lazily, so the test process loads them first.
# httpx too: a test's own httpx call after an in-process run that imported httpcore afresh
# would see httpcore's errors unmapped (httpx maps them by class), raw ConnectError escaping;
# httpx 0.28 imports httpcore only on its first request, so both are loaded here. Where one is
# not installed (the bare GPU check's machine: torch and nvidia-ml-py, ci/gpu-bare-check.sh),
# the tests that need it are not among those run there.
import importlib
import pytest

from pytest_kimiperf.config.serve_args import read_serve_parser
from pytest_kimiperf.paths import default_cache_dir, launch_state_dir

for _name in ("httpcore", "httpx", "numpy", "scipy.stats"):
    try:
        importlib.import_module(_name)
    except ImportError:
        pass

# The tests that run longest, started first. Under `make test`'s -n 4 --dist worksteal each
# worker takes a quarter of the collection from its front, and an idle worker steals from the
# back of another's: a test of four minutes that starts halfway through the tier (the shipped
# perf suite, run twice on the stub) sets when the tier ends. Order only: every test runs.
LONGEST_FIRST = ("tests/plugin/test_perf_suite.py::", "tests/plugin/test_second_day.py::")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = [item for item in items if item.nodeid.startswith(LONGEST_FIRST)]
    if first:
        items[:] = first + [item for item in items if not item.nodeid.startswith(LONGEST_FIRST)]


@pytest.fixture
def stub_project(pytester: pytest.Pytester):
    """Write a pyproject.toml with stub deployments into the pytester directory."""

    def make(*tables: str, ini: str = "") -> Path:
        text = "\n".join(tables)
        if ini:
            text += "\n[tool.pytest.ini_options]\n" + ini + "\n"
        return pytester.makepyprojecttoml(text)

    return make


# What the plugin (or the servers it starts) reads from the environment: a developer's shell
# or CI job that sets these must not change what the tests see. KIMIPERF_CACHE_DIR stays (the
# built tiny model is shared); KIMIPERF_STATE_DIR is set per test by isolated_state.
_KEEP = frozenset({"KIMIPERF_CACHE_DIR", "KIMIPERF_STATE_DIR"})
_ISOLATED_PREFIXES = ("KIMIPERF_", "NCCL_")
# PYTEST_XDIST_*: when this suite itself runs under -n, a pytester subprocess must not look
# like an xdist worker (pytest-benchmark disables itself there).
# The CI system's branch (storage/git_facts.current_git_branch) must not decide whether a test's
# run may append its boots.
_ISOLATED_NAMES = ("GITHUB_STEP_SUMMARY", "VLLM_API_KEY", "CUDA_DEVICE_MAX_CONNECTIONS",
                   "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
                   "GITHUB_ACTIONS", "GITHUB_REF_NAME", "GITLAB_CI", "CI_COMMIT_BRANCH", "BUILDKITE",
                   "BUILDKITE_BRANCH")


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in _ISOLATED_NAMES or (name.startswith(_ISOLATED_PREFIXES) and name not in _KEEP):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def _users_cache_dir() -> Path:
    """The plugin's cache folder as a user's run finds it, read before any pytester sets HOME."""
    return default_cache_dir()


@pytest.fixture(autouse=True)
def _one_cache_for_pytester_runs(request: pytest.FixtureRequest, _users_cache_dir: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytester run keeps the built tiny model, the compile caches and vLLM's serve parser in
    the one cache folder, as a user's sessions do; its launch records stay its test's own.

    pytester points HOME at each test's folder, which gave every test a cache of its own: each
    run that checks a profile's args imported vLLM again (15-35 s on 2 cores) and each real
    boot built the tiny model and compiled it cold (20-35 s a boot). The cache's entries are
    keyed by what they were made from (vLLM's version and parser sources, the model's recipe),
    so sharing them changes what a run reads, never what it concludes. The launch records (the
    zombie sweep's input) stay where the test's HOME puts them, or where isolated_state does.
    """
    if "pytester" not in request.fixturenames:
        return
    request.getfixturevalue("pytester")  # HOME is the test's own from here on
    if "KIMIPERF_STATE_DIR" not in os.environ:
        monkeypatch.setenv("KIMIPERF_STATE_DIR", str(launch_state_dir()))
    monkeypatch.setenv("KIMIPERF_CACHE_DIR", str(_users_cache_dir))


@pytest.fixture
def vllm_serve_parser(_users_cache_dir: Path) -> None:
    """vLLM's serve parser read into the shared cache before the test's runs, so that a run which
    checks a profile's args under a short timeout does not spend it importing vLLM."""
    read_serve_parser(sys.executable, _users_cache_dir)


@pytest.fixture
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private launch-record dir so tests never sweep each other's servers."""
    state = tmp_path / "kimiperf-launches"
    monkeypatch.setenv("KIMIPERF_STATE_DIR", str(state))
    return state


@pytest.fixture
def simulated_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A simulated GPU host (tests/fakes/simgpu: 8x RTX PRO 6000 by default) that every process
    this test starts sees: NVML and nvidia-smi answer from its state."""
    from tests.fakes.simgpu import SimulatedGpus

    gpus = SimulatedGpus(tmp_path / "simulated-gpus")
    for name, value in gpus.env().items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    yield gpus
    gpus.close()
