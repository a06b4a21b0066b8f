"""What one pytest process holds for its perf tests: servers, fingerprint, baselines, boots.

Each part is built on first use, so a run that collects no perf test probes no GPU and starts
nothing. What the session reports at its end is kept in reports/reporter.py's SessionReporter.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pytest_kimiperf.config.settings import MaxBootsSource, Settings

if TYPE_CHECKING:
    from pytest_kimiperf.config.deployments import Deployment
    from pytest_kimiperf.judge.baselines import Fingerprint, LoadedBaselines
    from pytest_kimiperf.judge.stats import BootLedger, BootSlot
    from pytest_kimiperf.judge.noise import BootOrigin
    from pytest_kimiperf.measure.time_account import SessionClock
    from pytest_kimiperf.server.manager import ServerManager, ServerRecord
    from pytest_kimiperf.server.progress import RelayOutput, TerminalOutput
    from pytest_kimiperf.server.weight_cache import WeightCacheFacts

# SIGTERM: a cancelled CI job; SIGHUP: a dropped ssh session during a 36-minute load.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A failed test's report carries this many of its server log's last lines: the engine's last words.
FAILURE_LOG_LINES = 10
VERBOSE_FAILURE_LOG_LINES = 50


@dataclass
class PerfSession:
    """The perf side of one pytest process (the controller, a worker, or the only process)."""

    settings: Settings
    log_dir: Path | None = None  # set from pytest's basetemp by the first server fixture
    remote_worker: bool = False  # an xdist worker on another host (cannot be scheduled)
    fingerprint_shown: bool = False
    manager: ServerManager | None = None
    _fingerprint: Fingerprint | None = None
    _baselines: LoadedBaselines | None = None
    _ledger: BootLedger | None = None
    _hardware_problem: str | None = None
    _hardware_checked: bool = False
    _origin: BootOrigin | None = None
    _host: dict[str, str] | None = None
    _previous_handlers: dict[int, Any] = field(default_factory=dict)
    _clock: SessionClock | None = None
    # The (test, profile) pairs this process collected: the run's family of comparisons (judge/gate.py).
    collected: frozenset[tuple[str, str]] = frozenset()

    def fingerprint(self) -> Fingerprint:
        """The hardware and software this session measures on (probed once)."""
        if self._fingerprint is None:
            fp = _session_fingerprint(self.settings.deployment)
            if self.settings.external:
                # This host is only the client: the server's own facts, and its stated hardware.
                from pytest_kimiperf.judge.baselines import attached_fingerprint
                from pytest_kimiperf.measure.host_facts import probe_attached_server

                assert self.settings.server_url is not None  # what makes it external
                fp = attached_fingerprint(
                    fp, probe_attached_server(self.settings.server_url, self.settings.api_key),
                    stated_hardware=self.settings.server_hardware)
            self._fingerprint = fp
        return self._fingerprint

    def known_fingerprint(self) -> Fingerprint | None:
        """The fingerprint if something asked for it already (never probes)."""
        return self._fingerprint

    def baselines(self) -> LoadedBaselines:
        """The baseline files of this deployment, for this fingerprint (read once)."""
        if self._baselines is None:
            from pytest_kimiperf.storage.baselines import load_baselines

            self._baselines = load_baselines(self.settings.baselines_dir, self.settings.deployment.name,
                                             self.fingerprint())
        return self._baselines

    def family(self) -> int | None:
        """How many baseline comparisons this run makes (None: none); every worker collects the
        same tests, so each counts the same family."""
        from pytest_kimiperf.errors import BaselineError
        from pytest_kimiperf.judge.gate import family_size

        try:
            file = self.baselines().file()
        except BaselineError:  # the judge names the file and why when it reads it
            return None
        if file is None:
            return None
        # An entry grown by passing runs is judged twice: against its window and, for drift,
        # against its anchor (judge/history.py).
        tests = [(e.test, e.profile, e.metric) for e in file.entries.values() for _ in range(1 + bool(e.nights))]
        return family_size(tests, self.collected)

    def baselines_path(self) -> Path | None:
        """Where this session's baseline file is, if the baselines were loaded."""
        return self._baselines.path if self._baselines is not None else None

    def schedule(self) -> list[BootSlot]:
        """Every boot slot of the session, in the order the boots happen."""
        from pytest_kimiperf.judge.stats import schedule

        s = self.settings
        return schedule(s.profiles, s.max_boots, order=s.boot_order, seed=s.boot_seed)

    def ledger(self) -> BootLedger:
        """What each perf test measured on each boot; says whether another boot is needed."""
        if self._ledger is None:
            from pytest_kimiperf.judge.stats import BootLedger

            self._ledger = BootLedger()
        return self._ledger

    def clock(self) -> SessionClock:
        """The notes of where this session's wall clock went, from the pytest process's start (under
        xdist the workers' boots and tests reach the controller's with their records and reports)."""
        if self._clock is None:
            from pytest_kimiperf.measure.time_account import SessionClock

            self._clock = SessionClock(started_at=_process_started_at())
        return self._clock

    def hardware_problem(self) -> str | None:
        """Why this host cannot run the deployment (GPUs missing), or None; probed once a run."""
        if not self._hardware_checked:
            self._hardware_checked = True
            from pytest_kimiperf.server.hardware_check import hardware_problem

            self._hardware_problem = hardware_problem(self.settings.deployment, external=self.settings.external,
                                                     control=self.settings.control)
        return self._hardware_problem

    def host(self) -> dict[str, str]:
        """Which host this is, and on what basis (measure/canary.host_identity), read once."""
        if self._host is None:
            from pytest_kimiperf.measure.canary import host_identity

            self._host = host_identity(self.settings.host_id)
        return self._host

    def origin(self) -> BootOrigin:
        """This session's id, this host's id and its canary, taken before the first boot while the
        host is quiet. xdist's workers share its test-run uid: one session. An attached server's
        host is not this one: no canary then."""
        if self._origin is None:
            import os
            import uuid

            from pytest_kimiperf.judge.noise import BootOrigin
            from pytest_kimiperf.measure.canary import host_canary

            session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
            canary = {} if self.settings.external else dict(
                host_canary(gpus=self.settings.deployment.needs_gpus).scores)
            self._origin = BootOrigin(session=session[:12], host=self.host()["host"], canary=canary)
        return self._origin

    def listing(self) -> list[str]:
        """``--kimiperf-list``'s lines: deployments, profiles and metrics, where each is defined."""
        from pytest_kimiperf.reports.header import listing_lines

        return listing_lines(self.settings)

    def plan(self) -> list[str]:
        """``--kimiperf-plan``'s lines: boots, loading time, the smallest change resolved (no boot)."""
        from pytest_kimiperf.reports.header import plan_lines

        return plan_lines(self.settings, self.baselines().file())

    def history_warning(self) -> str | None:
        """Said before the first boot when the baseline history spans one session (not while
        recording, which adds a session)."""
        from pytest_kimiperf.reports.header import one_session_warning

        if self.settings.update_baselines:
            return None
        return one_session_warning(self.settings.deployment, self.baselines().span())

    def topology_warnings(self) -> list[str]:
        """The profile warnings that depend on the hardware (LL128 on a PCIe-only host)."""
        from pytest_kimiperf.server.hardware_check import topology_warnings

        return topology_warnings(self.settings.deployment, self.settings.profiles, external=self.settings.external)

    def server_manager(self, output: Callable[[], TerminalOutput | RelayOutput]) -> ServerManager:
        """The manager of this process's servers, made on first use; ``output`` makes where
        its progress goes. From then on SIGTERM and SIGHUP take Ctrl-C's path."""
        if self.manager is None:
            from pytest_kimiperf.paths import launch_state_dir
            from pytest_kimiperf.server.manager import ServerManager
            from pytest_kimiperf.server.progress import ProgressDisplay

            out = output()
            display = ProgressDisplay.for_output(out, interval_s=self.settings.progress_interval_s)
            self.manager = ServerManager(
                self.settings, log_dir=self.log_dir or Path.cwd() / "kimiperf-logs",
                state_dir=launch_state_dir(), announce=out.write_line, on_progress=display.update,
            )
            self._install_signal_handlers()
        return self.manager

    def server_records(self) -> dict[str, ServerRecord] | None:
        """This process's server records, by profile; None if it never managed servers."""
        return dict(self.manager.records) if self.manager is not None else None

    def server_log_tail(self, profile: str, *, lines: int = FAILURE_LOG_LINES,
                        failure: str = "") -> tuple[str, str] | None:
        """The title and tail of ``profile``'s server log, for a failed test's report; None where
        ``failure``, the test's failure text, already quotes as many lines (a ServerError does)."""
        rec = self.manager.records.get(profile) if self.manager is not None else None
        if rec is None or rec.log_path is None:
            return None
        from pytest_kimiperf.server.process import LOG_TAIL_LINES, tail_lines

        if lines <= LOG_TAIL_LINES and f"log: {rec.log_path}\n" in failure:
            return None
        return f"kimiperf server log, last {lines} lines ({rec.log_path})", tail_lines(rec.log_path, lines)

    def weight_cache_facts(self) -> WeightCacheFacts | None:
        """What the weight-cache daemons did this session, if this process managed servers."""
        return self.manager.weight_cache_facts() if self.manager is not None else None

    def close(self) -> None:
        """Stop every server (idempotent) and give the signals back their earlier handlers."""
        if self.manager is not None:
            self.manager.close()
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    def _install_signal_handlers(self) -> None:
        """A second signal during teardown (GitHub Actions' cancel sends SIGINT, then SIGTERM)
        escalates the stop to SIGKILL instead of abandoning it (ServerManager.on_signal)."""
        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self.manager is not None and self.manager.on_signal():
                return
            raise KeyboardInterrupt(f"received signal {signum}")

        try:
            for signum in _STOP_SIGNALS:
                self._previous_handlers[signum] = signal.signal(signum, on_signal)
        except ValueError:  # not the main thread
            pass


def _process_started_at() -> float:
    """When this process started (epoch seconds): the interpreter's and the plugins' start-up
    belong to the session's time too. Now, where the process table cannot say."""
    import time

    import psutil

    try:
        return float(psutil.Process().create_time())
    except psutil.Error:
        return time.time()


def _session_fingerprint(deployment: Deployment) -> Fingerprint:
    """Fingerprint of this host, its software and ``deployment`` (hardware probed once; on a
    deployment that spans nodes, every node's through its agent)."""
    from pytest_kimiperf.judge.baselines import collect_nodes_fingerprint, deployment_facts, host_fingerprint
    from pytest_kimiperf.measure.host_facts import agent_facts, probe_host_facts
    from pytest_kimiperf.server.tiny_model import built_revision

    here = probe_host_facts()
    facts = deployment_facts(deployment, built_revision=built_revision(deployment.model))
    if deployment.nodes:
        return collect_nodes_fingerprint(deployment.nodes, facts, local=here, remote_facts=agent_facts)
    return host_fingerprint(here, facts)


def with_gate_plan(settings: Settings) -> Settings:
    """A gate's boots on demand capped from the plan: the boots that resolve a change of twice
    the tolerance of single-stream decode at the declared boot spread, never more than the
    deployment allows nor fewer than a verdict needs. Only a deployment's own cap is replaced."""
    dep = settings.deployment
    if not settings.gate or settings.max_boots_source is not MaxBootsSource.DEPLOYMENT:
        return settings
    from dataclasses import replace

    from pytest_kimiperf.config.deployments import MIN_BOOTS_DIRECTIONAL
    from pytest_kimiperf.judge.noise import boots_needed

    tolerance = dep.tolerance("decode_tok_s")
    needed = boots_needed(2 * tolerance, dep.boot_spread, tolerance=tolerance)
    cap = max(settings.boots, MIN_BOOTS_DIRECTIONAL, min(needed or dep.max_boots, dep.max_boots))
    why = (f"the plan: {needed} boot{'s' * (needed != 1)} resolve a {2 * tolerance:.0%} change at the declared "
           f"{dep.boot_spread:.0%} boot spread" if needed is not None else
           f"deployment {dep.name}'s max_boots: no number of boots resolves a {2 * tolerance:.0%} change at its "
           f"{dep.boot_spread:.0%} boot spread")
    said = f"{why}, capped by deployment {dep.name}'s {dep.max_boots}" if needed is not None and needed > dep.max_boots else why
    return replace(settings, max_boots=cap, max_boots_source=MaxBootsSource.PLAN, max_boots_from=said)

