"""What pytest calls: the plugin's public fixtures, and the session object whose methods are its hooks.

Both only connect pytest to the modules that do the work. Errors a test should show become
``pytest.fail`` without a traceback, raised ``from None``: the error they replace would print its
message (and log tail) a second time. The session object, as pytest-xdist's ``DSession`` and
junitxml's ``LogXML``, holds everything the run holds; on an xdist worker its controller hooks
(results, files, the summary) do nothing.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_kimiperf import xdist_scheduling
from pytest_kimiperf.config.options import perf_run_requested, read_raw_options
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import ConfigError, KimiperfError
from pytest_kimiperf.session import FAILURE_LOG_LINES, VERBOSE_FAILURE_LOG_LINES, PerfSession
from pytest_kimiperf.warning_types import OneSessionHistoryWarning

if TYPE_CHECKING:
    from pytest_kimiperf.config.nccl.profiles import NcclProfile
    from pytest_kimiperf.judge.stats import BootSlot
    from pytest_kimiperf.judge.gate import FailedTests, RunDecision
    from pytest_kimiperf.judge.verdicts import TestResult
    from pytest_kimiperf.measure.time_account import Window
    from pytest_kimiperf.recorder import PerfRecorder
    from pytest_kimiperf.reports.reporter import SessionReporter
    from pytest_kimiperf.server.manager import ServerManager
    from pytest_kimiperf.server.process import ServerHandle


_SERVER_FIXTURE = "kimiperf_server"
_PROFILE_FIXTURE = "kimiperf_profile"


class SessionObject(Protocol):
    """What the fixtures use of the session object (:class:`KimiperfSession`)."""

    run: PerfSession

    def close(self) -> None: ...


SESSION_KEY = pytest.StashKey[SessionObject]()
RESULT_KEY = pytest.StashKey["TestResult"]()
_TOLERANCES_KEY = pytest.StashKey[dict[str, float]]()
_WINDOWS_KEY = pytest.StashKey[list["Window"]]()


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def slot_of(item: pytest.Item) -> BootSlot | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(_PROFILE_FIXTURE) if callspec is not None else None


def _perf_session(config: pytest.Config) -> PerfSession:
    return config.stash[SESSION_KEY].run


def server_manager(config: pytest.Config) -> ServerManager:
    """This process's server manager (its progress on the terminal, or relayed by xdist)."""
    return _perf_session(config).server_manager(lambda: xdist_scheduling.progress_output(config))


@pytest.fixture(scope="session")
def kimiperf_settings(pytestconfig: pytest.Config) -> Settings:
    """The validated settings of this run."""
    return _perf_session(pytestconfig).settings


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
    run = _perf_session(request.config)
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
    from pytest_kimiperf.judge.stats import strip_slot
    from pytest_kimiperf.recorder import PerfCase, PerfRecorder, RecorderHooks

    run = _perf_session(request.config)
    manager = server_manager(request.config)
    item = request.node
    tolerances = item.stash.get(_TOLERANCES_KEY, {})

    def publish(result: TestResult) -> None:
        from pytest_kimiperf.judge.gate import CAUSE_PROPERTY, OUTCOME_PROPERTY, PerfOutcome, outcome_of

        item.stash[RESULT_KEY] = result
        item.user_properties.extend((f"median_{metric}", median) for metric, median in result.medians().items())
        outcome = outcome_of(result)  # the recorder decided it (judge/gate.py)
        if outcome in (PerfOutcome.INVALID, PerfOutcome.UNRESOLVED):  # what the exit status counts (judge/gate.py)
            item.user_properties.append((OUTCOME_PROPERTY, outcome.value))
        if outcome is PerfOutcome.INVALID and result.invalid_cause:
            item.user_properties.append((CAUSE_PROPERTY, result.invalid_cause))

    def ensure_alive() -> None:
        try:
            manager.ensure_alive()
        except KimiperfError as exc:
            raise pytest.fail.Exception(str(exc), pytrace=False) from None

    ensure_alive()

    def benchmark() -> Any:
        from pytest_kimiperf.reports.reporter import active_benchmark

        return active_benchmark(request.config, request.getfixturevalue, is_worker=is_worker(request.config))

    slot = slot_of(item)
    assert slot is not None  # the perf fixture needs kimiperf_server, which is parametrized by slot
    return PerfRecorder(run, PerfCase(
        nodeid=item.nodeid, test=strip_slot(item.nodeid, slot.id), server=kimiperf_server, boot=slot.boot,
        profile_env=dict(kimiperf_profile.env), profile_args=kimiperf_profile.args, tolerances=tolerances,
        control=bool(kimiperf_profile.control_of),
    ), RecorderHooks(ensure_alive=ensure_alive, publish=publish,
                     fail=lambda message: pytest.fail(message, pytrace=False), benchmark=benchmark,
                     window=item.stash.setdefault(_WINDOWS_KEY, []).append))


class KimiperfSession:
    """The run's state (settings, servers, results, failures, the decision) and its hooks."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.run = PerfSession(settings=settings)
        self.worker = is_worker(config)
        self.failed: FailedTests | None = None  # made at the first failure (judge/ imports numpy)
        self.decision: RunDecision | None = None
        self._reporter: SessionReporter | None = None
        # Boots on demand that no earlier boot asked for: collected, never run nor reported.
        self.unneeded_boots = 0

    @property
    def settings(self) -> Settings:
        return self.run.settings

    @property
    def reporter(self) -> SessionReporter:
        """The controller's session reporter, made on first use."""
        if self._reporter is None:
            from pytest_kimiperf.reports.reporter import SessionReporter

            config = self.config
            self._reporter = SessionReporter(
                run=self.run, rootpath=Path(config.rootpath),
                update_json=lambda report: config.hook.pytest_kimiperf_update_json(config=config, report=report),
                invocation=tuple(config.invocation_params.args))
        return self._reporter

    def close(self) -> None:
        """Stop every server (idempotent)."""
        self.run.close()

    # -- the header and collection -----------------------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """The settings in effect. Last called, so first shown (pytest prints the answers in
        reverse), before a conftest's lines."""
        from pytest_kimiperf.reports.header import settings_lines

        lines = settings_lines(self.settings, os.environ)
        if perf_run_requested(read_raw_options(config.getoption, config.getini)) and not self.worker:
            # The fingerprint probes the GPUs: otherwise its lines wait for perf tests to be collected.
            lines.extend(self._fingerprint_lines())
        return lines

    def _fingerprint_lines(self) -> list[str]:
        from pytest_kimiperf.measure.cgroup_quota import read_quota_in_force
        from pytest_kimiperf.reports.header import client_line, fingerprint_lines

        run = self.run
        run.fingerprint_shown = True
        loaded = run.baselines()
        client = client_line(read_quota_in_force(), os.sched_getaffinity(0), attached=run.settings.external)
        return fingerprint_lines(run.fingerprint(), loaded.path, deployment=run.settings.deployment,
                                 span=loaded.span(), host=run.host(), client=client,
                                 recorded_hosts=loaded.loaded.hosts() if loaded.loaded is not None else ())

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Every test that needs the server runs once per selected NCCL profile and boot slot."""
        if _SERVER_FIXTURE not in metafunc.fixturenames:
            return
        slots = self.run.schedule()
        metafunc.parametrize(_PROFILE_FIXTURE, slots, indirect=True, scope="session", ids=[slot.id for slot in slots])

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Run each profile's tests together: pytest boots a session fixture again whenever its
        parameter changes back, a 36-minute load for Kimi. Here, not in a wrapper, because --ff and
        --lf reorder in a wrapper registered after this plugin; first, so a worker reports this order."""
        run = self.run
        if any(slot_of(item) is not None for item in session.items):
            from pytest_kimiperf.judge.stats import group_by_slot, strip_slot

            group_by_slot(session.items, slot_of, run.schedule())
            run.collected = frozenset((strip_slot(i.nodeid, s.id), s.name) for i in session.items if (s := slot_of(i)))
        if (not run.fingerprint_shown and not self.worker
                and any(_SERVER_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items)):
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            lines = self._fingerprint_lines()
            if reporter is not None:
                for line in lines:
                    reporter.write_line(line)

    def pytest_report_collectionfinish(self, config: pytest.Config, items: list[pytest.Item]) -> list[str]:
        """Under "collected N items": how many are boots on demand, so the counts at the end add up."""
        on_demand = [slot for item in items if (slot := slot_of(item)) is not None and slot.boot > self.settings.boots]
        if not on_demand or self.worker:
            return []
        first, last = min(s.boot for s in on_demand), max(s.boot for s in on_demand)
        boots = f"boot {first}" if first == last else f"boots {first}-{last}"
        return [f"kimiperf: {len(on_demand)} of these {len(items)} items are boots on demand ({boots} of each perf "
                "test and profile): each runs only when an earlier boot of its test asks for it; one nobody asks "
                "for is neither run nor reported, and the end says how many"]

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        """Perf tests carry the ``kimiperf`` marker (``-m "not kimiperf"`` runs the rest); a
        pytest-timeout covers their own call, never the boot in their setup."""
        if _SERVER_FIXTURE not in getattr(item, "fixturenames", ()):
            return
        if item.get_closest_marker("kimiperf") is None:
            item.add_marker(pytest.mark.kimiperf)
        if item.config.pluginmanager.hasplugin("timeout") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(func_only=True))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Under xdist, list the server tests. The hardware is checked in the first perf test's
        setup, so a run that only collects never depends on it."""
        run = self.run
        perf_items = [item for item in items if _SERVER_FIXTURE in getattr(item, "fixturenames", ())]
        run.remote_worker = not xdist_scheduling.note_server_tests(config, (item.nodeid for item in perf_items))
        if perf_items and not self.worker:
            for warning in run.topology_warnings():
                config.issue_config_time_warning(pytest.PytestConfigWarning(f"kimiperf: {warning}"), stacklevel=2)
            if (history := run.history_warning()) is not None:
                config.issue_config_time_warning(OneSessionHistoryWarning(f"kimiperf: {history}"), stacklevel=2)

    # -- running a perf test -------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Check the test's kimiperf marker before its fixtures run (a typo must not cost a boot)."""
        if "perf" in getattr(item, "fixturenames", ()):
            item.stash[_TOLERANCES_KEY] = _marker_tolerances(item)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """A boot on demand that no earlier boot asked for does not run at all: no boot, no report."""
        slot = slot_of(item)
        if slot is None or slot.boot == 1:
            return None
        from pytest_kimiperf.judge.stats import strip_slot

        needed, _why = self.run.ledger().needed(strip_slot(item.nodeid, slot.id), slot, self.settings.boots)
        if needed:
            return None
        _tear_down_to(item, nextitem)
        self.unneeded_boots += 1
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        """A passed perf test's warnings, as the plugin's warning classes ``filterwarnings`` escalates."""
        __tracebackhide__ = True  # an escalated warning reads as its message, not as this hook's code
        outcome = yield
        result = item.stash.get(RESULT_KEY, None) if "perf" in getattr(item, "fixturenames", ()) else None
        if result is None:
            return outcome
        from pytest_kimiperf.judge import gate, verdicts
        from pytest_kimiperf.reports.sentences import note_text
        from pytest_kimiperf.warning_types import CLASS_OF

        fails = self.settings.missing_baseline_fails
        for warning in gate.warning_kinds(result, missing_baseline_fails=fails):
            if warning.kind is not verdicts.WarningKind.MISSING_BASELINE:  # said once, at session end
                warnings.warn(CLASS_OF[warning.kind.value](f"kimiperf: {note_text(warning.note)}"), stacklevel=1)
        return outcome

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """Attach the test's perf result, its clock facts and, on failure, the server log tail."""
        report = yield
        if report.when == "call" and RESULT_KEY in item.stash:
            report.kimiperf = item.stash[RESULT_KEY].to_json()
        if (clock := _clock_facts(item, report.when)) is not None:
            report.kimiperf_clock = clock
        slot = slot_of(item) if report.failed else None
        lines = VERBOSE_FAILURE_LOG_LINES if item.config.get_verbosity() > 0 else FAILURE_LOG_LINES
        section = self.run.server_log_tail(slot.name, lines=lines, failure=str(report.longrepr)) if slot else None
        report.sections.extend([section] if section is not None else [])
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_kimiperf_update_json(self, config: pytest.Config, report: dict[str, Any]) -> None:
        """The JSON report's deployment carries the resolved command its booted servers ran."""
        if not self.settings.external and isinstance(report.get("deployment"), dict):
            from pytest_kimiperf.config.deployments import describe_command

            report["deployment"].setdefault("server_command", describe_command(self.settings.deployment))

    # -- the controller: results, files and the answer -----------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep each call's perf result and each failure's outcome, on the process that writes files."""
        if self.worker:
            return
        from pytest_kimiperf.measure.time_account import Window

        clock = getattr(report, "kimiperf_clock", None)
        # Where a pytest stamps no start and stop, the report's duration up to its arrival.
        stop = getattr(report, "stop", None) or time.time()
        start = getattr(report, "start", None) or stop - report.duration
        self.run.clock().note_report(
            report.nodeid, start=start, stop=stop, test=clock["test"] if clock else None,
            windows=[Window.from_json(w) for w in clock["windows"]] if clock else ())
        result = getattr(report, "kimiperf", None)
        if result is not None and report.when == "call":
            self.reporter.add_result(result)
        if report.failed:
            from pytest_kimiperf.judge.gate import FailedTests, failed_outcome, invalid_cause

            self.failed = self.failed or FailedTests()
            self.failed.add(report.nodeid, failed_outcome(report.when, report.user_properties),
                            invalid_cause(report.when, report.user_properties))

    @pytest.hookimpl(wrapper=True, optionalhook=True)
    def pytest_benchmark_group_stats(self, config: pytest.Config, benchmarks: list[dict[str, Any]],
                                     group_by: str) -> Generator[None, list[Any], list[Any]]:
        """pytest-benchmark's table without the scenarios' one-round rows (reports/reporter.py says why)."""
        groups = list((yield))
        if self.worker:
            return groups
        from pytest_kimiperf.reports.reporter import without_scenario_rows

        groups, hidden = without_scenario_rows(groups)
        if hidden:
            self.reporter.benchmark_rows_hidden += hidden
        return groups

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: dict[str, Any]) -> None:
        """Add ``machine_info["kimiperf"]``: the fingerprint the perf tests ran on."""
        if self.worker:
            return
        from pytest_kimiperf.reports.reporter import add_fingerprint

        add_fingerprint(machine_info, self.run.known_fingerprint())

    def _has_perf_work(self) -> bool:
        # A run without perf tests stays quiet: it writes and imports nothing more.
        return self._reporter is not None or self.run.server_records() is not None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """Stop servers; on the controller decide how the run ends, then write baselines and reports."""
        self.close()
        if self.worker:
            records = self.run.server_records()
            if records is not None:
                self.config.workeroutput[xdist_scheduling.WORKEROUTPUT_KEY] = [  # type: ignore[attr-defined]
                    rec.to_json() for rec in records.values()]
            return
        if not self._has_perf_work():
            return
        from pytest_kimiperf.judge.gate import FailedTests, decide_run

        reporter = self.reporter
        report = reporter.prepare()
        failed = self.failed or FailedTests()
        comparisons = report.profile_comparisons if report is not None else []

        def decide(errors: list[str]) -> RunDecision:
            return decide_run(int(exitstatus), failed, comparisons=comparisons, control=self.settings.control,
                              errors=errors)

        # Decided before the files for --kimiperf-append-on-pass, then again with what writing them found.
        reporter.write(passed=decide([]).passed)
        errors = reporter.errors()
        if (missing := reporter.missing_baseline_warning()) is not None:
            from pytest_kimiperf.warning_types import MissingBaselineWarning

            # One warning for the session, at the baseline file; escalated, it fails the run, not a test.
            where = report.baselines_path if report is not None else None
            try:
                warnings.warn_explicit(MissingBaselineWarning(f"kimiperf: {missing}"), MissingBaselineWarning,
                                       filename=where or "baselines", lineno=1)
            except MissingBaselineWarning as exc:
                error = f"MissingBaselineWarning (an error by -W or filterwarnings): {exc}"
                reporter.add_output_error(error)
                errors.append(error)
        self.decision = decide(errors)
        if reporter.report is not None:
            reporter.report.decision = self.decision
        session.exitstatus = self.decision.exit_status

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter, exitstatus: int,
                                config: pytest.Config) -> None:
        """The answer on one screen; last, after every other plugin's part, where the eye lands."""
        if self.worker or not self._has_perf_work():
            return
        self.reporter.write_summary(terminalreporter, decision=self.decision)
        if self.unneeded_boots:
            n = self.unneeded_boots
            terminalreporter.write_line(
                f"kimiperf: {n} boot{'s' * (n != 1)} on demand not needed: collected, neither run nor counted below")


def _clock_facts(item: pytest.Item, when: str) -> dict[str, Any] | None:
    """A perf test's name without its slot and its measuring windows, for the controller's time
    account; None for other tests."""
    slot = slot_of(item)
    if slot is None:
        return None
    from pytest_kimiperf.judge.stats import strip_slot

    windows = item.stash.get(_WINDOWS_KEY, []) if when == "call" else []
    return {"test": strip_slot(item.nodeid, slot.id), "windows": [w.to_json() for w in windows]}


def _marker_tolerances(item: pytest.Item) -> dict[str, float]:
    """The test's ``@pytest.mark.kimiperf(tolerances=...)``, checked; a bad one fails the test."""
    from pytest_kimiperf.config.deployment_tables import marker_tolerances

    marker = item.get_closest_marker("kimiperf")
    try:
        return marker_tolerances(marker.args, marker.kwargs, f"@pytest.mark.kimiperf on {item.nodeid}") if marker else {}
    except ConfigError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None


def _tear_down_to(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Finish what the item before this unrun one left set up, or a next item in another module
    finds it "not torn down properly": through the SetupState, as pytest's runner does (the teardown
    hook would run every plugin's teardown for an item never set up)."""
    call = pytest.CallInfo.from_call(
        lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown")  # noqa: SLF001
    if call.excinfo is not None:  # a module or session fixture's teardown failed: report it here
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        item.ihook.pytest_runtest_logreport(report=item.ihook.pytest_runtest_makereport(item=item, call=call))
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


class JunitVerdicts:
    """The session's profile comparisons as the JUnit XML's test-suite properties
    (``kimiperf_verdict <test>|<metric>|<profile> vs <reference>``), on the controller."""

    def __init__(self, kimiperf: KimiperfSession) -> None:
        self.kimiperf = kimiperf

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Hand each verdict to junitxml, found as ``record_testsuite_property`` finds it."""
        if not self.kimiperf._has_perf_work():
            return
        writers = [p for p in session.config.pluginmanager.get_plugins()
                   if callable(getattr(p, "add_global_property", None))]
        if not writers:
            return
        for name, value in self.kimiperf.reporter.verdict_properties():
            for writer in writers:
                writer.add_global_property(name, value)

