"""The object behind the ``perf`` fixture: measure a scenario, then let the gate judge it.

A perf test is a few lines::

    def test_single_stream_decode(perf):
        run = perf.measure(SingleStream(prompt_tokens=128, output_tokens=128, requests=20))
        perf.check(run, ["decode_tok_s", "itl_ms"], floor=True)

``check`` fails the test with the one-line verdict when a floor or baseline says so; everything
it decided is published as a JSON-able :class:`~pytest_kimiperf.judge.verdicts.TestResult` for the
controller's reports and baselines.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from pytest_kimiperf.reports import reporter as benchmark_bridge
from pytest_kimiperf.errors import BaselineError, ConfigError, KimiperfError
from pytest_kimiperf.measure.runner import cause_of
from pytest_kimiperf.measure.results import RunResult, check_rounds, check_slo
from pytest_kimiperf.measure.server_view import run_cross_checks
from pytest_kimiperf.measure.time_account import Window
from pytest_kimiperf.measure.runner import WatchedRun, measure_watched
from pytest_kimiperf.judge.baselines import LoadedBaselines
from pytest_kimiperf.judge.gate import PerfOutcome, decide_test
from pytest_kimiperf.judge.gate import FLOOR_METRIC, BootRun, GateRules, judge
from pytest_kimiperf.judge.profiles import InSessionRules
from pytest_kimiperf.judge.profiles import profiles_to_book, session_plan
from pytest_kimiperf.judge.notes import BootsBooked, HostWatched, MeasuredAgain, PrefixCacheReused
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.reports.sentences import joined, say_invalid, say_measured_again
from pytest_kimiperf.config.metric_specs import SampleKind, metric_spec, primary_metric
from pytest_kimiperf.judge.stats import BootLedger, TestBoots
from pytest_kimiperf.judge.noise import BootOrigin
from pytest_kimiperf.server.process import ServerHandle
from pytest_kimiperf.config.settings import Settings

if TYPE_CHECKING:
    from pytest_kimiperf.config.deployments import Deployment
    from pytest_kimiperf.measure.workload import Scenario


@dataclass(frozen=True)
class PerfCase:
    """One perf test on one boot of one profile's server: what a recorder measures and judges."""

    nodeid: str
    test: str  # the node id without the profile and boot
    server: ServerHandle
    # Which boot of this profile's server measures: part of the prompt seed (workload.prompt_seed).
    boot: int = 1
    profile_env: Mapping[str, str] = field(default_factory=dict)
    profile_args: Sequence[str] = ()
    tolerances: Mapping[str, float] = field(default_factory=dict)  # the test's marker overrides
    control: bool = False  # a control (--kimiperf-control): this session's reference, judged against no history


@dataclass(frozen=True)
class RecorderHooks:
    """What the recorder calls back into pytest: check the server, publish the result, fail the
    test, take pytest-benchmark's fixture on the first measure (see benchmark_bridge), and note
    each measuring window for the session's time account (measure/time_account.py)."""

    ensure_alive: Callable[[], None]
    publish: Callable[[TestResult], None]
    fail: Callable[[str], NoReturn]
    benchmark: Callable[[], Any | None] | None = None
    window: Callable[[Window], None] | None = None


class RecorderRun(Protocol):
    """What the recorder reads of the run (session.PerfSession is one)."""

    settings: Settings

    def ledger(self) -> BootLedger: ...

    def origin(self) -> BootOrigin | None: ...

    def baselines(self) -> LoadedBaselines | None: ...

    def family(self) -> int | None: ...


class PerfRecorder:
    """Measures against the session's server and judges the result for one test."""

    def __init__(self, run: RecorderRun, case: PerfCase, hooks: RecorderHooks) -> None:
        self.case = case
        self.nodeid = case.nodeid
        self.test = case.test
        self.server = case.server
        self.boot = case.boot
        self.settings = run.settings
        self.ledger = run.ledger()
        self.origin = run.origin()  # session, host and canary of the boots this records (judge/noise.py)
        self.watched: WatchedRun | None = None  # the last measure's host watch
        self.profile_env = dict(case.profile_env)
        self.profile_args = list(case.profile_args)
        self.baselines = None if case.control else run.baselines()
        self.family = None if case.control else run.family()  # the run's baseline comparisons (gate.GateRules.family)
        self._ensure_alive = hooks.ensure_alive
        self._publish = hooks.publish
        self._fail = hooks.fail
        self._tolerances = dict(case.tolerances)
        self._benchmark = hooks.benchmark
        self._window = hooks.window
        self.intervals_ns: list[tuple[int, int]] = []

    @property
    def deployment(self) -> Deployment:
        """The deployment under test (floors, TP size, model)."""
        return self.settings.deployment

    def measure(
        self,
        scenario: Scenario,
        *,
        endpoint: str = "completions",
        server_metrics: bool = True,
        extra_body: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Run ``scenario`` against the server and return its RunResult.

        ``endpoint`` is ``"completions"`` or ``"chat"`` (``/v1/chat/completions``);
        ``server_metrics=False`` skips the ``/metrics`` cross-check (a server without it, or a
        test that wants no extra requests); ``extra_body`` adds fields to every request.
        The host is watched while it runs (hostwatch.py): a disturbed measurement is taken
        again with fresh prompts, and one disturbed every time makes the run INVALID.
        """
        from pytest_kimiperf.measure.runner import run_scenario
        from pytest_kimiperf.measure.target import Target
        from pytest_kimiperf.measure.workload import prompt_seed

        self._ensure_alive()
        scenario = self._with_deployment_bounds(scenario)
        # Prompts of this test only: vLLM's prefix cache must not hand this run another test's
        # prefill, and -k or test order must not change what is sent. A booted server is a fresh
        # process each boot, its prefix cache empty: every boot and profile sends the same prompts
        # (a paired comparison, and prompts built once a session). An attached server keeps its
        # cache across boots and profiles, so there the profile and the boot join the seed. A
        # repeat after a disturbed attempt gets prompts of its own too (the first attempt's
        # prefill would come from the cache and its TTFT read short).
        base = scenario
        shared = self.server.external
        options: dict[str, Any] = {"endpoint": endpoint, "server_metrics": server_metrics, "extra_body": extra_body}

        def play(attempt: int = 0) -> RunResult:
            seeded = dataclasses.replace(
                base, seed=prompt_seed(self.test, self.server.profile if shared else "", self.boot if shared else 0,
                                      base.seed + attempt))
            nonlocal scenario
            scenario = seeded
            target = Target(self.server.base_url, self.server.model, api_key=self.server.api_key, **options)
            began = time.time()
            try:
                return run_scenario(target, seeded)
            finally:
                if self._window is not None:
                    self._window(Window(began, time.time(), attempt))

        benchmark = self._take_benchmark()
        first = (lambda: benchmark_bridge.run_timed(benchmark, play)) if benchmark is not None else None
        start = time.monotonic_ns()
        try:
            self.watched = measure_watched(play, self.server, self.settings.deployment, first=first)
            run = self.watched.run
        except KimiperfError:
            # A server that died mid-run fails the request first ("cannot reach ..."); its own
            # death, with the log tail (or the node that took it down), is the message to give.
            self._ensure_alive()
            raise
        finally:
            self.intervals_ns.append((start, time.monotonic_ns()))
        if benchmark is not None:
            benchmark.extra_info.update(benchmark_bridge.extra_info(
                run, profile=self.server.profile, deployment=self.settings.deployment.name))
        self._ensure_alive()
        return run

    def _take_benchmark(self) -> Any | None:
        """pytest-benchmark's fixture for this measure, once per test (it times one call)."""
        getter, self._benchmark = self._benchmark, None
        return getter() if getter is not None else None

    def _with_deployment_bounds(self, scenario: Scenario) -> Scenario:
        """Apply the deployment's client self-check bounds unless the scenario set its own."""
        from pytest_kimiperf.config.deployments import HealthBounds

        overrides = dict(self.settings.deployment.client_bounds)
        if not overrides or scenario.bounds != HealthBounds():
            return scenario
        return dataclasses.replace(scenario, bounds=HealthBounds(**overrides))

    def tolerance(self, metric: str) -> float:
        """Marker override, else the deployment's default, else the metric's."""
        return self._tolerances.get(metric, self.settings.deployment.tolerance(metric))

    def check(
        self,
        run: RunResult,
        metrics: Sequence[str],
        *,
        floor: bool = False,
        slo: Mapping[str, float] | None = None,
        goodput: Mapping[str, float] | None = None,
        primary: str | None = None,
    ) -> TestResult:
        """Judge ``run``'s metrics (floor, baseline); fail the test with the verdict line if needed.

        The run is this test's measurement on one server boot. Its per-boot summaries join the
        test's earlier boots (``BootLedger``) and the comparison rests on all of them. A boot
        that looks worse than the tolerance without a verdict asks for another boot of this
        profile (up to the maximum): then this test passes with a note and the next boot's run
        of it decides. Planned boots (``--kimiperf-boots``) are judged after the last of them.

        ``slo`` asserts absolute limits on this boot's figures, e.g. ``{"p99_ttft_ms": 2000,
        "p99_itl_ms": 60}`` (a tail with too few samples for its quantile warns instead of
        deciding); ``goodput`` adds ``request_goodput`` (requests per second meeting every
        per-request SLO, as vLLM's ``--goodput ttft:300 tpot:50``), gated like any metric.
        ``primary`` names the metric the test is about, one of ``metrics`` (by default the metric
        table's for the scenario's load, metric_specs.PRIMARY_METRICS, where the test gates it,
        else its first): the summary's answer line speaks of it, the others are secondary.
        """
        try:
            slo_checked = check_slo(slo) if slo else {}
            if primary is not None and primary not in metrics:
                raise ConfigError(f"primary={primary!r} is not one of the metrics it checks: {', '.join(metrics)}")
            goodput_slo = check_slo(goodput, goodput=True) if goodput is not None else None
            check_rounds([*metrics, *(["request_goodput"] if goodput is not None else [])], len(run.rounds))
        except ConfigError as exc:
            self._fail(f"perf.check of {self.test}: {exc}")
        try:
            result = self._judge(run, metrics, floor=floor, slo=slo_checked, goodput=goodput_slo)
            if metrics:
                result.primary = primary or primary_metric(str(run.load.get("kind", "")), metrics)
        except BaselineError as exc:  # a corrupt or newer baseline file: its message says which
            self._fail(str(exc))
        return self._finish(result)

    def _judge(self, run: RunResult, metrics: Sequence[str], *, floor: bool, slo: Mapping[str, float] | None = None,
               goodput: Mapping[str, float] | None = None) -> TestResult:
        """Hand ``run`` to the gate as plain data and keep the test's boot record up to date."""
        watched = self.watched if self.watched is not None and self.watched.run is run else WatchedRun(run)
        result = TestResult(
            test=self.test,
            nodeid=self.nodeid,
            profile=self.server.profile,
            deployment=self.settings.deployment.name,
            scenario=run.scenario_name,
            run=run.summary(),
            interval_ns=(self.intervals_ns[0][0], self.intervals_ns[-1][1]) if self.intervals_ns else None,
            server_env=dict(self.server.env),
            profile_env=self.profile_env,
            profile_args=self.profile_args,
            itl_timeline_ms=run.itl_timeline_ms(),
            boot=self.boot,
            host=watched.readings[-1].to_json() if watched.readings else None,
            origin=self.origin,
        )
        if (watch := host_watched(watched)) is not None:
            result.messages.append(watch)
        if watched.measured_again:
            result.messages.append(MeasuredAgain(tuple(say_measured_again(r) for r in watched.measured_again)))
        named = [*metrics, *(slo or {}), *([FLOOR_METRIC] if floor else [])]
        judged = [*named, *(["request_goodput"] if goodput is not None else [])]
        # A busy host first, then the client's self-check, then the figures this test checks
        # that the window could not measure for too many of its requests (measure/coverage.py).
        per_request = [m for m in judged if metric_spec(m).sample in (SampleKind.REQUEST, SampleKind.TAIL)]
        reason = watched.busy or run.invalid or run.unmeasured(per_request)
        invalid = say_invalid(reason) if reason is not None else None  # the judge's InvalidRun takes the words
        surprises = [] if invalid is not None else [PrefixCacheReused(r.hit_tokens, r.queried_tokens)
                                                    for r in run_cross_checks(run)]
        measured = BootRun(
            samples={name: self._boot_samples(name) if metric_spec(name).sample is SampleKind.BOOT else run.samples(name)
                     for name in dict.fromkeys(named)},
            requests=len(run.records), failed_requests=run.invalid_count, failed_reasons=run.invalid_reasons,
            invalid=invalid, invalid_cause=cause_of(reason) if reason is not None else None, cross_checks=surprises,
            goodput_samples=[rnd.request_goodput(goodput) for rnd in run.rounds] if goodput is not None else [],
            decode_withheld=dict(run.coverage.of("decode_tok_s").withheld),
        )
        rules = GateRules.for_deployment(
            self.settings.deployment, tolerances={name: self.tolerance(name) for name in judged},
            canary=self.origin.canary if self.origin else None,
            boots=self.settings.boots, max_boots=self.settings.max_boots, strict=self.settings.perf_strict,
            attached=self.server.external, family=self.family)
        record = self.ledger.of(self.test, self.server.profile) if invalid is None else None
        judgement = judge(result, metrics, measured, rules, baselines=self.baselines,
                          earlier=record if record is not None else TestBoots(),
                          floor=floor, slo=slo, goodput=goodput)
        if record is not None:
            if judgement.recorded is not None:
                record.add(self.boot, judgement.recorded)
            if judgement.engine is not None:
                record.engine[self.boot] = judgement.engine
            record.wants_boot = judgement.wants_boot
            self._book_for_profiles(metrics, run, judgement.result)
        return judgement.result

    def _book_for_profiles(self, metrics: Sequence[str], run: RunResult, result: TestResult) -> None:
        """Boots on demand for the profile comparison (judge/profiles.py): once every profile
        has measured this test on this boot, one more boot of each profile whose comparison of
        the test's primary metric is undecided at this look, and of the reference."""
        s = self.settings
        plan = session_plan(profiles=len(s.profiles), boots=s.boots, max_boots=s.max_boots, control=s.control)
        if plan is None or not metrics or self.boot >= plan.cap:
            return
        metric = primary_metric(str(run.load.get("kind", "")), list(metrics))
        records = {p.name: self.ledger.of(self.test, p.name) for p in self.settings.profiles}
        if any(self.boot not in record.boots for record in records.values()):
            return  # the round is not complete (or a boot of it failed): nothing to compare yet
        spec = metric_spec(metric)
        booked = profiles_to_book({name: record.summaries.get(metric, []) for name, record in records.items()},
                                  self.settings.reference_profile.name, direction=spec.direction,
                                  tolerance=self.tolerance(metric),
                                  rules=InSessionRules.of(self.settings.deployment, plan=plan).for_metric(metric))
        for name in booked:
            records[name].wants_boot = max(records[name].wants_boot or 0, self.boot + 1)
        if booked:
            result.messages.append(BootsBooked(spec.label, self.boot, tuple(booked), plan.cap))

    def _boot_samples(self, metric: str) -> list[float]:
        """A boot metric's one sample: this boot's seconds to ready, or in one phase of it. None
        for the session's first boot of the deployment: it fills the page and compile caches
        for the boots that follow, so its time is another quantity (metric_specs.py)."""
        account = self.server.boot_account
        if account is None or account.first_of_deployment:
            return []
        phase = metric_spec(metric).boot_phase
        seconds = account.total_s if phase is None else account.phase_s(phase)
        return [] if seconds is None else [float(seconds)]

    def _finish(self, result: TestResult) -> TestResult:
        outcome = decide_test(result, missing_baseline_fails=self.settings.missing_baseline_fails)
        self._publish(result)
        if outcome is not PerfOutcome.PASSED:
            self._fail(joined(result.failures))  # what a failed perf test fails with, in one line
        return result


def host_watched(watched: WatchedRun) -> HostWatched | None:
    """What the host watch read during the last attempt, as the test's note (None: nothing was
    watched, as on an attached server)."""
    if not watched.readings:
        return None
    last = watched.readings[-1]
    shortfalls = tuple(s for gpu in last.gpus if (s := gpu.pcie_shortfall()) is not None)
    placed = (str(said),) if (said := watched.run.client_placement.get("said")) else ()
    return HostWatched(
        attempts=len(watched.readings), foreign_cpu_share=last.foreign_cpu_share, steal_share=last.steal_share,
        blind=tuple(last.blind), psi=tuple(sorted(last.psi.items())),
        nodes=tuple((node.node, node.foreign_cpu_share) for node in watched.node_readings),
        nodes_here=tuple(watched.nodes_here), remarks=(*last.own_throttling(), *shortfalls, *last.quota_remarks(), *placed))
