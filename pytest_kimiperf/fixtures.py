"""The plugin's public fixtures, and the stash keys they share with the session object (hooks.py).

``plugin.py`` imports the fixtures, so pytest registers them with the plugin. Like the hooks,
they only connect pytest to the modules that do the work: the session object's
:class:`~pytest_kimiperf.session.PerfSession` (``KimiperfSession.run``; the session object is
kept in the config's stash), the server manager and the :class:`~pytest_kimiperf.recorder.
PerfRecorder`. Errors a test should show become ``pytest.fail`` without a traceback, raised
``from None``: the error they replace would print its message (and log tail) a second time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_kimiperf import xdist_scheduling
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.session import PerfSession

if TYPE_CHECKING:
    from pytest_kimiperf.config.nccl.profiles import NcclProfile
    from pytest_kimiperf.judge.boots import BootSlot
    from pytest_kimiperf.judge.verdicts import TestResult
    from pytest_kimiperf.recorder import PerfRecorder
    from pytest_kimiperf.server.manager import ServerManager
    from pytest_kimiperf.server.process import ServerHandle

SERVER_FIXTURE = "kimiperf_server"
PROFILE_FIXTURE = "kimiperf_profile"


class SessionObject(Protocol):
    """What the fixtures use of the session object (hooks.KimiperfSession, which imports them)."""

    run: PerfSession

    def close(self) -> None: ...


SESSION_KEY = pytest.StashKey[SessionObject]()
RESULT_KEY = pytest.StashKey["TestResult"]()
TOLERANCES_KEY = pytest.StashKey[dict[str, float]]()


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def slot_of(item: pytest.Item) -> BootSlot | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(PROFILE_FIXTURE) if callspec is not None else None


def perf_session(config: pytest.Config) -> PerfSession:
    """The perf tests' resources of this process: the session object's ``run``."""
    return config.stash[SESSION_KEY].run


def server_manager(config: pytest.Config) -> ServerManager:
    """This process's server manager (its progress on the terminal, or relayed by xdist)."""
    return perf_session(config).server_manager(lambda: xdist_scheduling.progress_output(config))


@pytest.fixture(scope="session")
def kimiperf_settings(pytestconfig: pytest.Config) -> Settings:
    """The validated settings of this run."""
    return perf_session(pytestconfig).settings


@pytest.fixture(scope="session")
def kimiperf_profile(request: pytest.FixtureRequest) -> NcclProfile:
    """The NCCL profile of the current parametrization."""
    profile: NcclProfile = request.param.profile
    return profile


@pytest.fixture
def kimiperf_boot(request: pytest.FixtureRequest, kimiperf_profile: NcclProfile) -> int:
    """Which boot of the current profile the test's server is (1 for the first)."""
    slot = slot_of(request.node)
    return 1 if slot is None else int(slot.boot)


@pytest.fixture(scope="session")
def kimiperf_server(
    request: pytest.FixtureRequest, kimiperf_profile: NcclProfile, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerHandle]:
    """A ready server for the current NCCL profile, booted once per profile and always stopped."""
    run = perf_session(request.config)
    problem = xdist_scheduling.placement_problem(request.config, remote_worker=run.remote_worker)
    problem = problem or run.hardware_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)  # an error of each selected perf test, before any boot
    if run.log_dir is None:
        run.log_dir = tmp_path_factory.getbasetemp() / "kimiperf"
    manager = server_manager(request.config)
    run.origin()  # the host canary, before the first boot loads the host
    try:
        handle = manager.acquire(kimiperf_profile)
    except KimiperfError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None
    try:
        yield handle
    finally:
        manager.release()


@pytest.fixture
def perf(request: pytest.FixtureRequest, kimiperf_server: ServerHandle, kimiperf_profile: NcclProfile) -> PerfRecorder:
    """Measure scenarios against the session's server and judge them (floors, baselines)."""
    from pytest_kimiperf.judge.boots import strip_slot
    from pytest_kimiperf.recorder import PerfCase, PerfRecorder, RecorderHooks

    run = perf_session(request.config)
    manager = server_manager(request.config)
    item = request.node
    tolerances = item.stash.get(TOLERANCES_KEY, {})

    def publish(result: TestResult) -> None:
        from pytest_kimiperf.judge.decide import OUTCOME_PROPERTY, Outcome, outcome_of

        item.stash[RESULT_KEY] = result
        item.user_properties.extend((f"median_{metric}", median) for metric, median in result.medians().items())
        outcome = outcome_of(result)  # the recorder decided it (judge/decide.py)
        if outcome in (Outcome.INVALID, Outcome.UNRESOLVED):  # what the exit status counts (judge/decide.py)
            item.user_properties.append((OUTCOME_PROPERTY, outcome.value))

    def ensure_alive() -> None:
        try:
            manager.ensure_alive()
        except KimiperfError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None

    ensure_alive()

    def benchmark() -> Any:
        from pytest_kimiperf.reports.benchmark_bridge import active_benchmark

        return active_benchmark(request.config, request.getfixturevalue, is_worker=is_worker(request.config))

    slot = slot_of(item)
    assert slot is not None  # the perf fixture needs kimiperf_server, which is parametrized by slot
    return PerfRecorder(run, PerfCase(
        nodeid=item.nodeid, test=strip_slot(item.nodeid, slot.id), server=kimiperf_server, boot=slot.boot,
        profile_env=dict(kimiperf_profile.env), profile_args=kimiperf_profile.args, tolerances=tolerances,
        control=bool(kimiperf_profile.control_of),
    ), RecorderHooks(ensure_alive=ensure_alive, publish=publish,
                     fail=lambda message: pytest.fail(message, pytrace=False), benchmark=benchmark))
