"""pytest wiring of pytest-kimiperf: options, configure/unconfigure and hooks.

The logic lives in modules that do not import pytest; this file only connects them to pytest.
The public fixtures are in ``fixtures.py`` and registered with this module (it imports them).
Settings are validated once in ``pytest_configure`` (bad values are usage errors before anything
is collected or booted); per-run state lives in ``config.stash``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kimiperf import hookspec, xdist_scheduling
from pytest_kimiperf.config.options import (
    OPTIONS, SpelledAction, deprecated_spellings_used, perf_run_requested, read_raw_options,
)
from pytest_kimiperf.config.settings import Settings, build_settings
from pytest_kimiperf.errors import ConfigError, KimiperfError
from pytest_kimiperf.reports.outcome import INVALID_ONLY_EXIT, UNRESOLVED_EXIT, FailureTally, failure_outcome
from pytest_kimiperf.fixtures import (  # noqa: F401 - the fixtures are registered with this module
    PROFILE_FIXTURE,
    RESULT_KEY,
    RUN_KEY,
    SERVER_FIXTURE,
    TOLERANCES_KEY,
    is_worker,
    kimiperf_boot,
    kimiperf_profile,
    kimiperf_server,
    kimiperf_settings,
    perf,
    slot_of,
)
from pytest_kimiperf.session import FAILURE_LOG_LINES, VERBOSE_FAILURE_LOG_LINES, PerfSession, with_gate_plan
from pytest_kimiperf.warning_types import KimiperfDeprecationWarning, OneSessionHistoryWarning

if TYPE_CHECKING:
    from pytest_kimiperf.reports.reporter import SessionReporter

COLLECTOR_NAME = "kimiperf-result-collector"
BENCHMARK_INFO_NAME = "kimiperf-benchmark-machine-info"
XDIST_NAME = "kimiperf-xdist-coordinator"

REPORTER_KEY = pytest.StashKey["SessionReporter"]()


def _reporter(config: pytest.Config) -> SessionReporter:
    """The controller's session reporter, made on first use (a run without perf tests never
    imports the reports)."""
    reporter = config.stash.get(REPORTER_KEY, None)
    if reporter is None:
        from pytest_kimiperf.reports.reporter import SessionReporter

        reporter = config.stash[REPORTER_KEY] = SessionReporter(
            run=config.stash[RUN_KEY], rootpath=Path(config.rootpath),
            update_json=lambda report: config.hook.pytest_kimiperf_update_json(config=config, report=report),
            invocation=tuple(config.invocation_params.args))
    return reporter


# -- options and configuration -------------------------------------------------------------


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register the plugin's own hooks."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Command-line options and their ini twins, in one group."""
    group = parser.getgroup("kimiperf", "LLM-serving performance tests (pytest-kimiperf)")
    for opt in OPTIONS:
        for flag, text in opt.flags(bare=False):
            _add_flag(group, opt, flag, text)
        for name, text in opt.ini_names():
            parser.addini(name, help=text, type=("bool" if opt.kind == "bool" else "string"),
                          default=opt.default if opt.kind == "bool" else None)


def _add_flag(group: pytest.OptionGroup, opt: Any, flag: str, text: str | None) -> None:
    shape = dict(nargs=0, const=True) if opt.kind == "bool" else dict(metavar=opt.metavar)
    group.addoption(flag, action=SpelledAction, dest=opt.dest, default=None,
                    help=argparse.SUPPRESS if text is None else text, **shape)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> Iterator[None]:
    """The short aliases (``--deployment``, ``--nccl-profile``, ``--update-baselines``) and old
    bare spellings, each unless a conftest of the user's added that name first: their option
    wins, ours stays reachable under the prefix."""
    result = yield
    group = parser.getgroup("kimiperf")
    for opt in OPTIONS:
        for flag, text in opt.flags(bare=True):
            if not _flag_taken(parser, flag):
                _add_flag(group, opt, flag, text)
    return result


def _flag_taken(parser: pytest.Parser, flag: str) -> bool:
    # Asked through parsing (pytest's parser has no public list of names): a name nobody
    # registered comes back unknown; a taken one is parsed, or rejected for its value.
    try:
        return flag not in parser.parse_known_and_unknown_args([flag, "kimiperf-probe"])[1]
    except (pytest.UsageError, SystemExit):
        return True


def _settings(config: pytest.Config) -> Settings:
    """The run's settings, validated (a bad value is a usage error naming it)."""
    def merged(answers: list[dict[str, Any] | None]) -> dict[str, Any]:
        return {name: table for tables in answers for name, table in (tables or {}).items()}

    try:
        return with_gate_plan(build_settings(
            read_raw_options(config.getoption, config.getini), rootpath=config.rootpath,
            extra_deployments=merged(config.hook.pytest_kimiperf_add_deployments(config=config)),
            extra_profiles=merged(config.hook.pytest_kimiperf_add_profiles(config=config)),
        ))
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-kimiperf: {exc}") from None


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """``--kimiperf-list`` / ``--kimiperf-plan``: print, and exit before any boot (as ``--markers``)."""
    if not (config.getoption("kimiperf_list") or config.getoption("kimiperf_plan")):
        return None
    run = PerfSession(settings=_settings(config))
    try:
        print("\n".join(run.listing() if config.getoption("kimiperf_list") else run.plan()))
    except KimiperfError as exc:
        raise pytest.UsageError(f"pytest-kimiperf: {exc}") from None
    return 0


def pytest_configure(config: pytest.Config) -> None:
    """Validate settings once; register markers."""
    config.addinivalue_line(
        "markers",
        "kimiperf(tolerances={metric: fraction}): per-test tolerance overrides for the perf gate",
    )
    settings = _settings(config)
    run = config.stash[RUN_KEY] = PerfSession(settings=settings)
    if not is_worker(config) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(xdist_scheduling.XdistCoordinator(
            lambda records: _reporter(config).add_worker_records(records)), XDIST_NAME)
    if settings.perf_plots is not None and not is_worker(config):
        from pytest_kimiperf.reports.plots import matplotlib_problem

        problem = matplotlib_problem()
        if problem:
            raise pytest.UsageError(f"pytest-kimiperf: {problem}")
    if not is_worker(config):
        config.pluginmanager.register(_ResultCollector(config), COLLECTOR_NAME)
        if config.pluginmanager.hasplugin("benchmark"):
            config.pluginmanager.register(_BenchmarkMachineInfo(run), BENCHMARK_INFO_NAME)
    for warning in settings.profile_warnings:
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"kimiperf: {warning}"), stacklevel=2)
    for old in [] if is_worker(config) else deprecated_spellings_used(config.getoption, config.getini):
        config.issue_config_time_warning(KimiperfDeprecationWarning(f"kimiperf: {old}"), stacklevel=2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Last line of defence: no server outlives the pytest process."""
    run = config.stash.get(RUN_KEY, None)
    if run is not None:
        run.close()
    for name in (COLLECTOR_NAME, BENCHMARK_INFO_NAME, XDIST_NAME):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The settings in effect: deployment, profiles with their environment, server mode."""
    from pytest_kimiperf.reports.header import settings_lines

    lines = settings_lines(config.stash[RUN_KEY].settings, os.environ)
    if perf_run_requested(read_raw_options(config.getoption, config.getini)) and not is_worker(config):
        # The fingerprint probes the GPUs; a run that did not ask for perf settings stays
        # quiet (if it collects perf tests, the lines come after collection instead).
        lines.extend(_fingerprint_lines(config))
    return lines


def _fingerprint_lines(config: pytest.Config) -> list[str]:
    from pytest_kimiperf.reports.header import fingerprint_lines

    run = config.stash[RUN_KEY]
    run.fingerprint_shown = True
    view = run.baseline_view()
    return fingerprint_lines(run.fingerprint(), view.path, deployment=run.settings.deployment,
                             span=view.span(), host=run.host())


# -- collection --------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that needs the server runs once per selected NCCL profile and boot slot
    (planned boots always, boots on demand only when an earlier boot asked for them)."""
    if SERVER_FIXTURE not in metafunc.fixturenames:
        return
    slots = metafunc.config.stash[RUN_KEY].schedule()
    metafunc.parametrize(
        PROFILE_FIXTURE, slots, indirect=True, scope="session", ids=[slot.id for slot in slots]
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """After every plugin's reordering (--ff and --lf reorder in a hook wrapper registered
    after this plugin, so even a wrapper here runs too early), run each profile's tests
    together: pytest boots a session fixture again whenever its parameter changes back, and
    for Kimi each boot is a 36-minute load. First, so an xdist worker reports this order."""
    run = session.config.stash[RUN_KEY]
    if any(slot_of(item) is not None for item in session.items):
        from pytest_kimiperf.judge.boots import group_by_slot, strip_slot

        group_by_slot(session.items, slot_of, run.schedule())
        run.collected = frozenset((strip_slot(i.nodeid, s.id), s.name) for i in session.items if (s := slot_of(i)))
    if (not run.fingerprint_shown and not is_worker(session.config)
            and any(SERVER_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items)):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = _fingerprint_lines(session.config)
        if reporter is not None:
            for line in lines:
                reporter.write_line(line)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Perf tests (those that use the server) carry the ``kimiperf`` marker, so ``-m "not
    kimiperf"`` runs the rest; with pytest-timeout their timeout covers the test's own call,
    never the boot in their setup (a Kimi load takes 36 minutes)."""
    if SERVER_FIXTURE not in getattr(item, "fixturenames", ()):
        return
    if item.get_closest_marker("kimiperf") is None:
        item.add_marker(pytest.mark.kimiperf)
    if item.config.pluginmanager.hasplugin("timeout") and item.get_closest_marker("timeout") is None:
        item.add_marker(pytest.mark.timeout(func_only=True))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, list the server tests. The hardware is checked by the first selected perf
    test's setup, so a run that deselects them, or only collects, never depends on it."""
    run = config.stash[RUN_KEY]
    perf_items = [item for item in items if SERVER_FIXTURE in getattr(item, "fixturenames", ())]
    run.remote_worker = not xdist_scheduling.note_server_tests(config, (item.nodeid for item in perf_items))
    if perf_items and not is_worker(config):
        for warning in run.topology_warnings():
            config.issue_config_time_warning(pytest.PytestConfigWarning(f"kimiperf: {warning}"), stacklevel=2)
        if (history := run.history_warning()) is not None:
            config.issue_config_time_warning(OneSessionHistoryWarning(f"kimiperf: {history}"), stacklevel=2)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check the test's kimiperf marker before its fixtures run (a typo must not cost a boot)."""
    if "perf" in getattr(item, "fixturenames", ()):
        item.stash[TOLERANCES_KEY] = _marker_tolerances(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A boot on demand that no earlier boot asked for does not run at all: no boot, no
    report (it is not a skipped check, it is a confirmation nobody needed)."""
    slot = slot_of(item)
    if slot is None or slot.boot == 1:
        return None
    from pytest_kimiperf.judge.boots import strip_slot

    run = item.config.stash[RUN_KEY]
    needed, _why = run.ledger().needed(strip_slot(item.nodeid, slot.id), slot, run.settings.boots)
    if needed:
        return None
    _tear_down_to(item, nextitem)
    return True


def _tear_down_to(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Finish what the item before this unrun one left set up for it (it tore down only to this
    one's module), or a next item in another module finds it "not torn down properly". As
    pytest's own runner does, through the SetupState, which has no public handle: the teardown
    hook would run every plugin's teardown for an item never set up."""
    call = pytest.CallInfo.from_call(
        lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown")  # noqa: SLF001
    if call.excinfo is not None:  # a module or session fixture's teardown failed: report it here
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        item.ihook.pytest_runtest_logreport(report=item.ihook.pytest_runtest_makereport(item=item, call=call))
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """After a perf test measured: its warnings become pytest warnings of the plugin's classes
    (so ``filterwarnings = error::...`` escalates them), and a missing baseline fails the test
    under ``--kimiperf-missing-baseline=fail``."""
    __tracebackhide__ = True  # an escalated warning reads as its message, not as this hook's code
    outcome = yield
    result = item.stash.get(RESULT_KEY, None) if "perf" in getattr(item, "fixturenames", ()) else None
    if result is None:
        return outcome
    import warnings

    from pytest_kimiperf.judge import gate, verdicts
    from pytest_kimiperf.reports.sentences import say
    from pytest_kimiperf.warning_types import CLASS_OF

    settings = item.config.stash[RUN_KEY].settings
    fails = settings.missing_baseline == "fail" and not settings.update_baselines
    if (failure := gate.missing_baseline_failure(result, fails=fails)) is not None:
        pytest.fail(say(failure), pytrace=False)
    for warning in gate.warning_kinds(result, missing_baseline_fails=fails):
        if warning.kind is not verdicts.WarningKind.MISSING_BASELINE:  # said once, at session end
            warnings.warn(CLASS_OF[warning.kind.value](f"kimiperf: {say(warning.note)}"), stacklevel=1)
    return outcome


def _marker_tolerances(item: pytest.Item) -> dict[str, float]:
    """The test's ``@pytest.mark.kimiperf(tolerances=...)``, checked; a bad one fails the test."""
    from pytest_kimiperf.config.deployment_tables import marker_tolerances

    marker = item.get_closest_marker("kimiperf")
    try:
        return marker_tolerances(marker.args, marker.kwargs, f"@pytest.mark.kimiperf on {item.nodeid}") if marker else {}
    except ConfigError as exc:
        raise pytest.fail.Exception(str(exc), pytrace=False) from None


# -- reports ----------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Attach the test's perf result and, on failure, the server log tail to its report."""
    report = yield
    if report.when == "call" and RESULT_KEY in item.stash:
        report.kimiperf = item.stash[RESULT_KEY].to_json()
    slot = slot_of(item) if report.failed else None
    lines = VERBOSE_FAILURE_LOG_LINES if item.config.get_verbosity() > 0 else FAILURE_LOG_LINES
    section = item.config.stash[RUN_KEY].server_log_tail(slot.name, lines=lines, failure=str(report.longrepr)) \
        if slot else None
    report.sections.extend([section] if section is not None else [])
    return report


@pytest.hookimpl(trylast=True)
def pytest_kimiperf_update_json(config: pytest.Config, report: dict[str, Any]) -> None:
    """The JSON report's deployment carries the resolved command its servers ran (booted
    servers only: an attached server's command is not known here)."""
    settings = config.stash[RUN_KEY].settings
    if not settings.external and isinstance(report.get("deployment"), dict):
        from pytest_kimiperf.config.deployments import describe_command

        report["deployment"].setdefault("server_command", describe_command(settings.deployment))


class _ResultCollector:
    """Hands each test's perf result to the session reporter, on the process that writes files.

    Registered only on the xdist controller (or the single process without xdist), as pytest's
    junitxml registers its LogXML: workers' reports reach it serialized, ``kimiperf`` included.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.failures = FailureTally()
        self.exit_status: int | None = None  # what session finish decided, for the summary

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the perf result of each test's call phase, and which failures were INVALID or UNRESOLVED."""
        result = getattr(report, "kimiperf", None)
        if result is not None and report.when == "call":
            _reporter(self.config).add_result(result)
        if report.failed:
            self.failures.add(report.nodeid, outcome=failure_outcome(report.when, report.user_properties))


def _collector(config: pytest.Config) -> _ResultCollector | None:
    collector = config.pluginmanager.get_plugin(COLLECTOR_NAME)
    return collector if isinstance(collector, _ResultCollector) else None


class _BenchmarkMachineInfo:
    """pytest-benchmark's machine_info gets the kimiperf fingerprint, and its table leaves out
    the perf scenarios' one-round rows (registered only with it; benchmark_bridge says why)."""

    def __init__(self, run: PerfSession) -> None:
        self.run = run

    @pytest.hookimpl(wrapper=True, optionalhook=True)
    def pytest_benchmark_group_stats(self, config: pytest.Config, benchmarks: list[dict[str, Any]],
                                     group_by: str) -> Generator[None, list[Any], list[Any]]:
        """The groups pytest-benchmark's table prints, without the kimiperf scenarios."""
        from pytest_kimiperf.reports.benchmark_bridge import without_scenario_rows

        groups, hidden = without_scenario_rows(list((yield)))
        if hidden:
            _reporter(config).benchmark_rows_hidden += hidden
        return groups

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: dict[str, Any]) -> None:
        """Add ``machine_info["kimiperf"]``: the fingerprint the perf tests ran on."""
        from pytest_kimiperf.reports.benchmark_bridge import add_fingerprint

        add_fingerprint(machine_info, self.run.known_fingerprint())


def _has_perf_work(config: pytest.Config) -> bool:
    # A run without perf tests stays quiet: it writes and imports nothing more.
    return REPORTER_KEY in config.stash or config.stash[RUN_KEY].server_records() is not None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop servers; on the controller write baselines and reports."""
    config = session.config
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return
    run.close()
    if is_worker(config):
        records = run.server_records()
        if records is not None:
            config.workeroutput[xdist_scheduling.WORKEROUTPUT_KEY] = [  # type: ignore[attr-defined]
                rec.to_json() for rec in records.values()
            ]
        return
    if not _has_perf_work(config):
        return
    reporter = _reporter(config)
    failed_here = not reporter.finish(passed=exitstatus == 0)
    missing = reporter.missing_baseline_warning()
    if missing is not None:
        import warnings

        from pytest_kimiperf.warning_types import MissingBaselineWarning

        # One warning for the session, in pytest's warnings summary, located at the baseline file it
        # did not find; escalated by filterwarnings, it fails the run, not a test.
        where = reporter.report.baselines_path if reporter.report is not None else None
        try:
            warnings.warn_explicit(MissingBaselineWarning(f"kimiperf: {missing}"), MissingBaselineWarning,
                                   filename=where or "baselines", lineno=1)
        except MissingBaselineWarning as exc:
            failed_here = True
            reporter.add_output_error(f"MissingBaselineWarning (an error by -W or filterwarnings): {exc}")
    collector = _collector(config)
    if failed_here:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif collector is not None:
        session.exitstatus = collector.exit_status = collector.failures.exit_status(int(session.exitstatus))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """The answer on one screen: profile comparison, baseline verdicts, floors, where files went."""
    if RUN_KEY not in config.stash or is_worker(config) or not _has_perf_work(config):
        return
    _reporter(config).write_summary(terminalreporter)
    collector = _collector(config)
    if collector is not None and collector.exit_status in (INVALID_ONLY_EXIT, UNRESOLVED_EXIT):
        terminalreporter.write_line(collector.failures.summary_line())
