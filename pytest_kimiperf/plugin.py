"""pytest-kimiperf's entry point: options, settings and the session object.

Settings are validated once in ``pytest_configure``, before anything is collected or booted; the
session object and the fixtures it registers live in ``hooks.py``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_kimiperf import hookspec, xdist_scheduling
from pytest_kimiperf.config.options import (
    OPTIONS, SpelledAction, arg_sources, deprecated_spellings_used, read_raw_options,
)
from pytest_kimiperf.config.settings import Settings, build_settings
from pytest_kimiperf.errors import ConfigError, KimiperfError
from pytest_kimiperf.hooks import (  # noqa: F401 - the fixtures are registered with this module
    SESSION_KEY,
    is_worker,
    kimiperf_boot,
    kimiperf_profile,
    kimiperf_server,
    kimiperf_settings,
    perf,
)
from pytest_kimiperf.hooks import JunitVerdicts, KimiperfSession
from pytest_kimiperf.session import PerfSession, with_gate_plan
from pytest_kimiperf.warning_types import KimiperfDeprecationWarning

_SESSION_NAME = "kimiperf-session"
_XDIST_NAME = "kimiperf-xdist-coordinator"
_JUNIT_NAME = "kimiperf-junit-verdicts"


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
            read_raw_options(config.getoption, config.getini, sources=arg_sources(
                config.getini("addopts"), os.environ, config.invocation_params.args)), rootpath=config.rootpath,
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
    """Validate settings once; register markers and the session object."""
    config.addinivalue_line(
        "markers",
        "kimiperf(tolerances={metric: fraction}): per-test tolerance overrides for the perf gate",
    )
    settings = _settings(config)
    session = config.stash[SESSION_KEY] = KimiperfSession(config, settings)
    config.pluginmanager.register(session, _SESSION_NAME)
    if not is_worker(config) and getattr(config.option, "xmlpath", None):
        # pytest's junitxml writes its file in its own session finish: the verdicts must be there first.
        config.pluginmanager.register(JunitVerdicts(session), _JUNIT_NAME)
    if not is_worker(config) and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(xdist_scheduling.XdistCoordinator(
            lambda records: session.reporter.add_worker_records(records)), _XDIST_NAME)
    if settings.perf_plots is not None and not is_worker(config):
        from pytest_kimiperf.reports.plots import matplotlib_problem

        problem = matplotlib_problem()
        if problem:
            raise pytest.UsageError(f"pytest-kimiperf: {problem}")
    for warning in settings.profile_warnings:
        config.issue_config_time_warning(pytest.PytestConfigWarning(f"kimiperf: {warning}"), stacklevel=2)
    for old in [] if is_worker(config) else deprecated_spellings_used(config.getoption, config.getini):
        config.issue_config_time_warning(KimiperfDeprecationWarning(f"kimiperf: {old}"), stacklevel=2)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Last line of defence: no server outlives the pytest process."""
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()
    for name in (_SESSION_NAME, _XDIST_NAME, _JUNIT_NAME):
        plugin = config.pluginmanager.get_plugin(name)
        if plugin is not None:
            config.pluginmanager.unregister(plugin)
