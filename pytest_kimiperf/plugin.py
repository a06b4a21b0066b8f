"""pytest wiring of pytest-kimiperf: options, configure/unconfigure, fixtures and hooks.

The logic lives in modules that do not import pytest; this file only connects them to pytest.
Settings are validated once in ``pytest_configure`` (bad values are usage errors before anything
is collected or booted); per-run state lives in ``config.stash``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_kimiperf import hookspec, xdist_scheduling
from pytest_kimiperf.errors import ConfigError, HardwareMissingError, KimiperfError
from pytest_kimiperf.config.options import OPTIONS, read_raw_options
from pytest_kimiperf.config.settings import Settings, build_settings

SERVER_FIXTURE = "kimiperf_server"
PROFILE_FIXTURE = "kimiperf_profile"
COLLECTOR_NAME = "kimiperf-result-collector"
BENCHMARK_INFO_NAME = "kimiperf-benchmark-machine-info"
XDIST_NAME = "kimiperf-xdist-coordinator"


@dataclass
class _RunState:
    """Per-process state of one pytest run (kept in the stash)."""

    settings: Settings
    manager: Any = None  # ServerManager, created on first use
    view: Any = None  # BaselineView, created on first use
    fingerprint: Any = None
    results: list[Any] = field(default_factory=list)  # TestResult, controller only
    previous_sigterm: Any = None
    output_error: str | None = None
    log_dir: Path | None = None
    report: Any = None  # reports.model.SessionReport, built once at session finish
    worker_records: list[Any] = field(default_factory=list)  # ServerRecord from xdist workers
    remote_worker: bool = False  # an xdist worker on another host (cannot be scheduled)
    fingerprint_shown: bool = False
    ledger: Any = None  # boots.BootLedger: what each test measured, boot by boot (runs them)
    hardware_problem: str | None = None  # set by the first perf test's hardware check
    hardware_checked: bool = False


RUN_STATE = pytest.StashKey[_RunState]()
RESULT_KEY = pytest.StashKey[Any]()
TOLERANCES_KEY = pytest.StashKey[dict[str, float]]()


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# -- options and configuration -------------------------------------------------------------


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register the plugin's own hooks."""
    pluginmanager.add_hookspecs(hookspec)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Command-line options and their ini twins, in one group."""
    group = parser.getgroup("kimiperf", "LLM-serving performance tests (pytest-kimiperf)")
    for opt in OPTIONS:
        _add_flag(group, opt, opt.own_flag)
        if opt.ini:
            parser.addini(opt.ini, help=opt.help, type="bool" if opt.kind == "bool" else "string",
                          default=opt.default if opt.kind == "bool" else None)


def _add_flag(group: pytest.OptionGroup, opt: Any, flag: str) -> None:
    if opt.kind == "bool":
        group.addoption(flag, action="store_true", dest=opt.dest, default=None, help=opt.help)
    else:
        group.addoption(flag, action="store", dest=opt.dest, default=None, help=opt.help,
                        metavar=opt.name.upper())


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> Iterator[None]:
    """The documented short flags (``--deployment``, ``--server-url``, ...) as aliases of the
    ``--kimiperf-`` ones, each unless a conftest of the user's added that name first: their
    option wins, ours stays reachable under the prefix."""
    result = yield
    group = parser.getgroup("kimiperf")
    for opt in OPTIONS:
        if opt.short_flag is not None and not _flag_taken(parser, opt.short_flag):
            _add_flag(group, opt, opt.short_flag)
    return result


def _flag_taken(parser: pytest.Parser, flag: str) -> bool:
    # Asked through parsing (pytest's parser has no public list of names): a name nobody
    # registered comes back unknown; a taken one is parsed, or rejected for its value.
    try:
        return flag not in parser.parse_known_and_unknown_args([flag, "kimiperf-probe"])[1]
    except (pytest.UsageError, SystemExit):
        return True


def pytest_configure(config: pytest.Config) -> None:
    """Validate settings once; register markers."""
    config.addinivalue_line(
        "markers",
        "kimiperf(tolerances={metric: fraction}): per-test tolerance overrides for the perf gate",
    )
    extra_deployments: dict[str, Any] = {}
    for tables in config.hook.pytest_kimiperf_add_deployments(config=config):
        extra_deployments.update(tables or {})
    extra_profiles: dict[str, Any] = {}
    for tables in config.hook.pytest_kimiperf_add_profiles(config=config):
        extra_profiles.update(tables or {})
    try:
        settings = build_settings(
            read_raw_options(config.getoption, config.getini), rootpath=config.rootpath,
            extra_deployments=extra_deployments, extra_profiles=extra_profiles,
        )
    except ConfigError as exc:
        raise pytest.UsageError(f"pytest-kimiperf: {exc}") from None
    state = _RunState(settings=settings)
    config.stash[RUN_STATE] = state
    if not _is_worker(config) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(xdist_scheduling.XdistCoordinator(state), XDIST_NAME)
    if settings.perf_plots is not None and not _is_worker(config):
        from pytest_kimiperf.reports.plots import matplotlib_problem

        problem = matplotlib_problem()
        if problem:
            raise pytest.UsageError(f"pytest-kimiperf: {problem}")
    if not _is_worker(config):
        config.pluginmanager.register(_ResultCollector(state), COLLECTOR_NAME)
        if config.pluginmanager.hasplugin("benchmark"):
            config.pluginmanager.register(_BenchmarkMachineInfo(state), BENCHMARK_INFO_NAME)
    for warning in settings.profile_warnings:
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"kimiperf: {warning}"), stacklevel=2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Last line of defence: no server outlives the pytest process."""
    state = config.stash.get(RUN_STATE, None)
    if state is not None:
        _close_servers(state)
    for name in (COLLECTOR_NAME, BENCHMARK_INFO_NAME, XDIST_NAME):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The settings in effect: deployment, profiles with their environment, server mode."""
    from pytest_kimiperf.config.nccl.profiles import describe_env, inherited_nccl_env

    s = config.stash[RUN_STATE].settings
    lines = [f"kimiperf: deployment {s.deployment.name} ({s.deployment.description})"]
    mode = f"attached to {s.server_url}" if s.external else f"booted per profile, TP={s.deployment.tensor_parallel_size}"
    if s.server_url and s.server_url.startswith("https://"):
        mode += " (HTTPS: timed in the event loop, not by the kernel)"
    lines.append(f"kimiperf: server {mode}; baselines in {s.baselines_dir}"
                 + ("; --update-baselines" if s.update_baselines else ""))
    for profile in s.profiles:
        line = f"kimiperf: NCCL profile {profile.name}: {describe_env(profile)}"
        if s.external:
            line = (f"kimiperf: NCCL profile {profile.name}: only a label for the attached server, whose "
                    "NCCL environment is whatever it was started with (not known here)")
        else:
            inherited = inherited_nccl_env(profile, {**os.environ, **s.deployment.env})
            if inherited:
                line += f"; from the shell and deployment: {describe_env(inherited)}"
        lines.append(line)
    if not s.external:
        from pytest_kimiperf.config.deployments import describe_command

        lines.append(f"kimiperf: server command: {describe_command(s.deployment)}")
        from pytest_kimiperf.server.weight_cache import header_lines

        dep = s.deployment
        lines.extend(f"kimiperf: {line}" for line in header_lines(
            setting=dep.weight_cache, gpu_count=dep.gpu_count, command=list(dep.command), model=dep.model,
            tensor_parallel_size=dep.tensor_parallel_size))
    if _perf_run_requested(config) and not _is_worker(config):
        # The fingerprint probes the GPUs; a run that did not ask for perf settings stays
        # quiet (if it collects perf tests, the lines come after collection instead).
        lines.extend(_fingerprint_lines(config))
    return lines


def _fingerprint_lines(config: pytest.Config) -> list[str]:
    from pytest_kimiperf.judge.fingerprint import describe

    state = config.stash[RUN_STATE]
    state.fingerprint_shown = True
    return [*describe(_fingerprint(state)), f"kimiperf: baseline file {_baseline_view(config, state).path}"]


def _perf_run_requested(config: pytest.Config) -> bool:
    """Whether this run set a kimiperf option: on the command line, in the ini file, or in a
    KIMIPERF_* variable (VLLM_API_KEY alone is common in vLLM environments and asks for nothing)."""
    return any(
        raw.source != "default" and not (raw.source.startswith("environment variable")
                                         and "KIMIPERF_" not in raw.source)
        for raw in read_raw_options(config.getoption, config.getini).values()
    )


# -- collection --------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test that needs the server runs once per selected NCCL profile and boot slot
    (planned boots always, boots on demand only when an earlier boot asked for them)."""
    if SERVER_FIXTURE not in metafunc.fixturenames:
        return
    from pytest_kimiperf.judge.boots import schedule

    s = metafunc.config.stash[RUN_STATE].settings
    slots = schedule(s.profiles, s.max_boots, order=s.boot_order, seed=s.boot_seed)
    metafunc.parametrize(
        PROFILE_FIXTURE, slots, indirect=True, scope="session", ids=[slot.id for slot in slots]
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """After every plugin's reordering (--ff and --lf reorder in a hook wrapper registered
    after this plugin, so even a wrapper here runs too early), run each profile's tests
    together: pytest boots a session fixture again whenever its parameter changes back, and
    for Kimi each boot is a 36-minute load. First, so an xdist worker reports this order."""
    _group_by_profile(session.items)
    state = session.config.stash[RUN_STATE]
    if (not state.fingerprint_shown and not _is_worker(session.config)
            and any(SERVER_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items)):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = _fingerprint_lines(session.config)
        if reporter is not None:
            for line in lines:
                reporter.write_line(line)


def _group_by_profile(items: list[pytest.Item]) -> None:
    """Reorder the server tests in place so each boot slot's tests run together, slots in the
    schedule's order (A B B A ..., boots.schedule); within a slot, and for every other test,
    the order stays as it was."""
    rank: dict[str, int] = {}
    for item in items:
        slot = _slot_of(item)
        if slot is not None and not rank:
            s = item.config.stash[RUN_STATE].settings
            from pytest_kimiperf.judge.boots import schedule

            rank = {sl.id: i for i, sl in enumerate(schedule(s.profiles, s.max_boots, order=s.boot_order,
                                                              seed=s.boot_seed))}
    slots = [i for i, item in enumerate(items) if _slot_of(item) is not None]
    grouped = sorted((items[i] for i in slots), key=lambda item: rank.get(_slot_of(item).id, 0))  # stable
    for i, item in zip(slots, grouped):
        items[i] = item


def _slot_of(item: pytest.Item) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(PROFILE_FIXTURE) if callspec is not None else None


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
    state = config.stash[RUN_STATE]
    perf_items = [item for item in items if SERVER_FIXTURE in getattr(item, "fixturenames", ())]
    ids_dir = getattr(config, "workerinput", {}).get(xdist_scheduling.WORKERINPUT_IDS_DIR)
    if ids_dir and not Path(ids_dir).is_dir():
        # The controller made it before starting workers: this worker runs on another host
        # (--tx ssh=...), and the scheduler cannot learn which of its tests need the server.
        state.remote_worker = True
    elif ids_dir:
        worker_id = config.workerinput["workerid"]  # type: ignore[attr-defined]
        xdist_scheduling.write_server_test_ids(Path(ids_dir), worker_id, (item.nodeid for item in perf_items))
    if perf_items and not _is_worker(config):
        for warning in _topology_warnings(state):
            config.issue_config_time_warning(pytest.PytestConfigWarning(f"kimiperf: {warning}"), stacklevel=2)


def _hardware_problem(state: _RunState) -> str | None:
    """Why this host cannot run the deployment (GPUs missing), or None; probed once a run."""
    if not state.hardware_checked:
        state.hardware_checked = True
        dep = state.settings.deployment
        if not state.settings.external and dep.needs_gpus:
            from pytest_kimiperf.server.gpu import HardwareRequirement, check_hardware, probe_gpus

            probe = probe_gpus(timeout_s=10.0)
            try:
                check_hardware(
                    HardwareRequirement(dep.gpu_count, dep.gpu_name_contains), probe.gpus,
                    deployment=dep.name, unavailable_reason=probe.absence_reason(),
                )
                _check_weight_cache_fit(dep, probe.gpus)
            except HardwareMissingError as exc:
                state.hardware_problem = str(exc)
    return state.hardware_problem


def _check_weight_cache_fit(dep: Any, gpus: Any) -> None:
    """HardwareMissingError before any boot when the weight-cache daemons and an engine
    cannot share the smallest GPU (weight_cache.py)."""
    from pytest_kimiperf.server.weight_cache import check_fit, memory_fit, why_not_used

    if not gpus or why_not_used(setting=dep.weight_cache, gpu_count=dep.gpu_count, command=list(dep.command)):
        return
    fit = memory_fit(dep.model, dep.tensor_parallel_size, list(dep.command),
                     min(g.memory_total_mib for g in gpus))
    if fit is not None:
        check_fit(fit)


def _topology_warnings(state: _RunState) -> list[str]:
    """The profile warnings that depend on the hardware (an explicit LL128 on a host whose
    GPUs talk over PCIe only), which configure-time validation could not know."""
    dep = state.settings.deployment
    if state.settings.external or not dep.needs_gpus:
        return []
    from pytest_kimiperf.server.gpu import query_topology
    from pytest_kimiperf.config.nccl.values import validate_profile

    try:
        topology = query_topology(timeout_s=10.0)
    except KimiperfError:
        return []  # no GPUs to ask: the perf tests' own hardware check says so, at setup
    if topology is None:
        return []
    pcie_only = not topology.nvlink
    return [w for profile in state.settings.profiles for w in validate_profile(profile, pcie_only=pcie_only)
            if "LL128" in w]


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kimiperf_settings(pytestconfig: pytest.Config) -> Settings:
    """The validated settings of this run."""
    return pytestconfig.stash[RUN_STATE].settings


@pytest.fixture(scope="session")
def kimiperf_profile(request: pytest.FixtureRequest) -> Any:
    """The NCCL profile of the current parametrization."""
    return request.param.profile


@pytest.fixture
def kimiperf_boot(request: pytest.FixtureRequest, kimiperf_profile: Any) -> int:
    """Which boot of the current profile the test's server is (1 for the first)."""
    slot = _slot_of(request.node)
    return 1 if slot is None else int(slot.boot)


@pytest.fixture(scope="session")
def kimiperf_server(
    request: pytest.FixtureRequest, kimiperf_profile: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A ready server for the current NCCL profile, booted once per profile and always stopped."""
    state = request.config.stash[RUN_STATE]
    if _is_worker(request.config) and not request.config.workerinput.get(xdist_scheduling.WORKERINPUT_IDS_DIR):  # type: ignore[attr-defined]
        pytest.fail(
            "pytest-kimiperf under xdist needs --dist load (the default of -n) or loadgroup, which it "
            "schedules itself; other modes would split the perf tests over workers, booting "
            "servers twice and overlapping measurements", pytrace=False,
        )
    if state.remote_worker:
        pytest.fail(
            "pytest-kimiperf's perf tests need xdist workers on this machine (-n N, or --tx "
            "popen): this worker runs on another host, so they could not be kept on one worker "
            "(one boot per profile, no overlapping measurements). Run the perf suite on the "
            "server's machine; remote workers can still run the functional tests", pytrace=False,
        )
    problem = _hardware_problem(state)
    if problem is not None:
        pytest.fail(problem, pytrace=False)  # an error of each selected perf test, before any boot
    if state.log_dir is None:
        state.log_dir = tmp_path_factory.getbasetemp() / "kimiperf"
    manager = _manager(request.config, state)
    try:
        handle = manager.acquire(kimiperf_profile)
    except KimiperfError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield handle
    finally:
        manager.release()


@pytest.fixture
def perf(request: pytest.FixtureRequest, kimiperf_server: Any, kimiperf_profile: Any) -> Any:
    """Measure scenarios against the session's server and judge them (floors, baselines)."""
    from pytest_kimiperf.judge.boots import strip_slot
    from pytest_kimiperf.recorder import PerfRecorder

    state = request.config.stash[RUN_STATE]
    manager = _manager(request.config, state)
    try:
        manager.ensure_alive()
    except KimiperfError as exc:
        pytest.fail(str(exc), pytrace=False)
    item = request.node
    tolerances = item.stash.get(TOLERANCES_KEY, {})

    def publish(result: Any) -> None:
        item.stash[RESULT_KEY] = result
        for metric, mres in result.metrics.items():
            median = mres.summary()["median"]
            if median is not None:
                item.user_properties.append((f"median_{metric}", round(median, 4)))

    def ensure_alive() -> None:
        try:
            manager.ensure_alive()
        except KimiperfError as exc:
            pytest.fail(str(exc), pytrace=False)

    def benchmark() -> Any:
        from pytest_kimiperf.reports.benchmark_bridge import active_benchmark

        return active_benchmark(request.config, request.getfixturevalue, is_worker=_is_worker(request.config))

    slot = _slot_of(item)
    return PerfRecorder(
        nodeid=item.nodeid,
        test=strip_slot(item.nodeid, slot.id),
        boot=slot.boot,
        ledger=_ledger(state),
        server=kimiperf_server,
        settings=state.settings,
        profile_env=dict(kimiperf_profile.env),
        view=_baseline_view(request.config, state),
        ensure_alive=ensure_alive,
        publish=publish,
        fail=lambda message: pytest.fail(message, pytrace=False),
        tolerances=tolerances,
        benchmark=benchmark,
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check the test's kimiperf marker before its fixtures run (a typo must not cost a boot)."""
    if "perf" in getattr(item, "fixturenames", ()):
        item.stash[TOLERANCES_KEY] = _marker_tolerances(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A boot on demand that no earlier boot asked for does not run at all: no boot, no
    report (it is not a skipped check, it is a confirmation nobody needed)."""
    slot = _slot_of(item)
    if slot is None or slot.boot == 1:
        return None
    from pytest_kimiperf.judge.boots import strip_slot

    state = item.config.stash[RUN_STATE]
    needed, _why = _ledger(state).needed(strip_slot(item.nodeid, slot.id), slot, state.settings.boots)
    return None if needed else True


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

    from pytest_kimiperf.judge.gate import missing_baselines, warning_kinds
    from pytest_kimiperf.warning_types import CLASS_OF

    settings = item.config.stash[RUN_STATE].settings
    fails = settings.missing_baseline == "fail" and not settings.update_baselines
    missing = missing_baselines(result) if fails else []
    if missing:
        line = ("missing baseline (--kimiperf-missing-baseline=fail): " + "; ".join(missing))
        result.failures.append(line)
        pytest.fail(line, pytrace=False)
    for kind, message in warning_kinds(result, missing_baseline_fails=fails):
        warnings.warn(CLASS_OF[kind.value](f"kimiperf: {message}"), stacklevel=1)
    return outcome


def _ledger(state: _RunState) -> Any:
    if state.ledger is None:
        from pytest_kimiperf.judge.boots import BootLedger

        state.ledger = BootLedger()
    return state.ledger


def _marker_tolerances(item: pytest.Item) -> dict[str, float]:
    """The test's ``@pytest.mark.kimiperf(tolerances=...)``, checked; a bad one fails the test."""
    from pytest_kimiperf.config.deployment_tables import check_tolerances

    marker = item.get_closest_marker("kimiperf")
    if marker is None:
        return {}
    where = f"@pytest.mark.kimiperf on {item.nodeid}"
    try:
        if marker.args or set(marker.kwargs) - {"tolerances"}:
            raise ConfigError(f"{where}: takes only tolerances={{metric: fraction}}, got "
                              f"{', '.join([repr(a) for a in marker.args] + sorted(marker.kwargs))}")
        return check_tolerances(marker.kwargs.get("tolerances", {}), where)
    except ConfigError as exc:
        pytest.fail(str(exc), pytrace=False)


def _manager(config: pytest.Config, state: _RunState) -> Any:
    if state.manager is None:
        from pytest_kimiperf.paths import launch_state_dir
        from pytest_kimiperf.server.progress import ProgressDisplay, RelayOutput, TerminalOutput
        from pytest_kimiperf.server.manager import ServerManager

        relay = getattr(config, "workerinput", {}).get(xdist_scheduling.WORKERINPUT_PROGRESS_FILE)
        if relay:
            out: Any = RelayOutput(relay, prefix=f"[{config.workerinput['workerid']}] ")  # type: ignore[attr-defined]
        else:
            out = TerminalOutput(config.pluginmanager.get_plugin("terminalreporter"),
                                 config.pluginmanager.get_plugin("capturemanager"))
        display = ProgressDisplay.for_output(out, interval_s=state.settings.progress_interval_s)
        state.manager = ServerManager(
            state.settings, log_dir=state.log_dir or Path.cwd() / "kimiperf-logs",
            state_dir=launch_state_dir(), say=out.write_line, on_progress=display.update,
        )
        _install_sigterm(state)
    return state.manager


def _baseline_view(config: pytest.Config, state: _RunState) -> Any:
    if state.view is None:
        from pytest_kimiperf.judge.baselines import BaselineView

        state.view = BaselineView(state.settings.baselines_dir, state.settings.deployment.name,
                                  _fingerprint(state))
    return state.view


def _fingerprint(state: _RunState) -> Any:
    if state.fingerprint is None:
        from pytest_kimiperf.judge.fingerprint import session_fingerprint

        state.fingerprint = session_fingerprint(state.settings.deployment)
        if state.settings.external:
            # This host is only the client: the server's own facts, and its stated hardware.
            from pytest_kimiperf.judge.fingerprint import attached_fingerprint, probe_attached_server

            state.fingerprint = attached_fingerprint(
                state.fingerprint, probe_attached_server(state.settings.server_url, state.settings.api_key),
                stated_hardware=state.settings.server_hardware)
    return state.fingerprint


# SIGTERM: a cancelled CI job; SIGHUP: a dropped ssh session during a 36-minute load.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _install_sigterm(state: _RunState) -> None:
    """SIGTERM and SIGHUP take Ctrl-C's path: the servers are stopped. A second signal during
    teardown (GitHub Actions' cancel sends SIGINT, then SIGTERM) escalates the stop to SIGKILL
    instead of abandoning it (ServerManager.on_signal)."""
    def on_signal(signum: int, frame: Any) -> None:
        if state.manager is not None and state.manager.on_signal():
            return
        raise KeyboardInterrupt(f"received signal {signum}")

    previous: dict[int, Any] = {}
    try:
        for signum in _STOP_SIGNALS:
            previous[signum] = signal.signal(signum, on_signal)
    except ValueError:  # not the main thread
        pass
    state.previous_sigterm = previous or None


def _close_servers(state: _RunState) -> None:
    if state.manager is not None:
        state.manager.close()
    for signum, handler in (state.previous_sigterm or {}).items():
        signal.signal(signum, handler)
    state.previous_sigterm = None


# -- reports ----------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Attach the test's perf result and, on failure, the server log tail to its report."""
    report = yield
    if report.when == "call" and RESULT_KEY in item.stash:
        report.kimiperf = item.stash[RESULT_KEY].to_json()
    if report.failed and SERVER_FIXTURE in getattr(item, "fixturenames", ()):
        state = item.config.stash[RUN_STATE]
        manager = state.manager
        profile = getattr(getattr(item, "callspec", None), "params", {}).get(PROFILE_FIXTURE)
        if manager is not None and profile is not None:
            rec = manager.records.get(profile.name)
            if rec is not None and rec.log_path is not None:
                from pytest_kimiperf.server.process import tail_lines

                report.sections.append(
                    (f"kimiperf server log, last 50 lines ({rec.log_path})", tail_lines(rec.log_path))
                )
    return report


@pytest.hookimpl(trylast=True)
def pytest_kimiperf_update_json(config: pytest.Config, report: dict[str, Any]) -> None:
    """The JSON report's deployment carries the resolved command its servers ran (booted
    servers only: an attached server's command is not known here)."""
    settings = config.stash[RUN_STATE].settings
    if not settings.external and isinstance(report.get("deployment"), dict):
        from pytest_kimiperf.config.deployments import describe_command

        report["deployment"].setdefault("server_command", describe_command(settings.deployment))


class _ResultCollector:
    """Collects perf results from test reports on the process that writes files.

    Registered only on the xdist controller (or the single process without xdist), as pytest's
    junitxml registers its LogXML: workers' reports reach it serialized, ``kimiperf`` included.
    """

    def __init__(self, state: _RunState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the perf result of each test's call phase."""
        result = getattr(report, "kimiperf", None)
        if result is not None and report.when == "call":
            from pytest_kimiperf.judge.results import TestResult

            self.state.results.append(TestResult.from_json(result))


class _BenchmarkMachineInfo:
    """pytest-benchmark's machine_info gets the kimiperf fingerprint (registered only with it)."""

    def __init__(self, state: _RunState) -> None:
        self.state = state

    @pytest.hookimpl(optionalhook=True)
    def pytest_benchmark_update_machine_info(self, config: pytest.Config, machine_info: dict[str, Any]) -> None:
        """Add ``machine_info["kimiperf"]``: the fingerprint the perf tests ran on."""
        from pytest_kimiperf.reports.benchmark_bridge import add_fingerprint

        add_fingerprint(machine_info, self.state.fingerprint)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop servers; on the controller write baselines and reports."""
    config = session.config
    state = config.stash.get(RUN_STATE, None)
    if state is None:
        return
    _close_servers(state)
    if _is_worker(config):
        if state.manager is not None:
            config.workeroutput[xdist_scheduling.WORKEROUTPUT_KEY] = [  # type: ignore[attr-defined]
                rec.to_json() for rec in state.manager.records.values()
            ]
        return
    if not (state.results or state.manager or state.worker_records):
        return  # quiet when unused: a run without perf tests writes and imports nothing more
    from pytest_kimiperf.reports.session import write_outputs

    try:
        write_outputs(config, state)
    except KimiperfError as exc:
        state.output_error = str(exc)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The answer on one screen: profile comparison, baseline verdicts, floors, where files went."""
    state = config.stash.get(RUN_STATE, None)
    if state is None or _is_worker(config) or not (state.results or state.manager or state.worker_records):
        return
    from pytest_kimiperf.reports.session import terminal_summary

    terminal_summary(terminalreporter, state)
