"""The object behind the ``perf`` fixture: measure a scenario, then let the gate judge it.

A perf test is a few lines::

    def test_single_stream_decode(perf):
        run = perf.measure(SingleStream(prompt_tokens=128, output_tokens=128, requests=20))
        perf.check(run, ["decode_tok_s", "itl_ms"], floor=True)

``check`` fails the test with the one-line verdict when a floor or baseline says so; everything
it decided is published as a JSON-able :class:`~pytest_kimiperf.gate.TestResult` for the
controller's reports and baselines.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from pytest_kimiperf import benchmark_bridge
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.gate import (
    FLOOR_METRIC,
    BaselineView,
    MetricResult,
    TestResult,
    check_floor,
    judge_metric,
    verdict_fails,
)
from pytest_kimiperf.metric_specs import metric_spec
from pytest_kimiperf.stats import needs_more_samples
from pytest_kimiperf.server import ServerHandle
from pytest_kimiperf.settings import Settings


# Failed requests beyond this share of a run fail the test: the figures of the requests that
# did succeed would describe a server that is not the one being tested.
MAX_FAILED_FRACTION = 0.10


class PerfRecorder:
    """Measures against the session's server and judges the result for one test."""

    def __init__(
        self,
        *,
        nodeid: str,
        test: str,
        server: ServerHandle,
        settings: Settings,
        profile_env: Mapping[str, str],
        view: BaselineView | None,
        ensure_alive: Callable[[], None],
        publish: Callable[[TestResult], None],
        fail: Callable[[str], NoReturn],
        tolerances: Mapping[str, float] | None = None,
        benchmark: Callable[[], Any | None] | None = None,
        boot: int = 1,
    ) -> None:
        self.nodeid = nodeid
        self.test = test
        self.server = server
        # Which boot of this profile's server measures: part of the prompt seed (workload.prompt_seed).
        self.boot = boot
        self.settings = settings
        self.profile_env = dict(profile_env)
        self.view = view
        self._ensure_alive = ensure_alive
        self._publish = publish
        self._fail = fail
        self._tolerances = dict(tolerances or {})
        # pytest-benchmark's fixture, asked for on the first measure (see benchmark_bridge).
        self._benchmark = benchmark
        self.intervals_ns: list[tuple[int, int]] = []
        # id(run) -> (scenario, measure options), so that check() can extend an inconclusive run.
        self._scenario_of: dict[int, tuple[Any, dict[str, Any]]] = {}

    @property
    def deployment(self) -> Any:
        """The deployment under test (floors, TP size, model)."""
        return self.settings.deployment

    def measure(
        self,
        scenario: Any,
        *,
        endpoint: str = "completions",
        server_metrics: bool = True,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``scenario`` against the server and return its RunResult.

        ``endpoint`` is ``"completions"`` or ``"chat"`` (``/v1/chat/completions``);
        ``server_metrics=False`` skips the ``/metrics`` cross-check (a server without it, or a
        test that wants no extra requests); ``extra_body`` adds fields to every request.
        Extra rounds taken while a comparison is inconclusive use the same choices.
        """
        from pytest_kimiperf.scenarios import run_scenario
        from pytest_kimiperf.workload import prompt_seed

        self._ensure_alive()
        scenario = self._with_deployment_bounds(scenario)
        # Prompts of this test, profile and boot only: vLLM's prefix cache must not hand this
        # run another test's prefill, and -k or test order must not change what is sent.
        scenario = dataclasses.replace(
            scenario, seed=prompt_seed(self.test, self.server.profile, self.boot, scenario.seed))
        options = {"endpoint": endpoint, "server_metrics": server_metrics, "extra_body": extra_body}

        def play() -> Any:
            return run_scenario(
                self.server.base_url, self.server.model, scenario, api_key=self.server.api_key, **options
            )

        benchmark = self._take_benchmark()
        start = time.monotonic_ns()
        try:
            run = play() if benchmark is None else benchmark_bridge.run_timed(benchmark, play)
        finally:
            self.intervals_ns.append((start, time.monotonic_ns()))
        if benchmark is not None:
            benchmark.extra_info.update(benchmark_bridge.extra_info(
                run, profile=self.server.profile, deployment=self.settings.deployment.name))
        self._ensure_alive()
        self._scenario_of[id(run)] = (scenario, options)
        return run

    def _take_benchmark(self) -> Any | None:
        """pytest-benchmark's fixture for this measure, once per test (it times one call)."""
        getter, self._benchmark = self._benchmark, None
        return getter() if getter is not None else None

    def _with_deployment_bounds(self, scenario: Any) -> Any:
        """Apply the deployment's client self-check bounds unless the scenario set its own."""
        from pytest_kimiperf.metrics import HealthBounds

        overrides = dict(self.settings.deployment.client_bounds)
        if not overrides or scenario.bounds != HealthBounds():
            return scenario
        return dataclasses.replace(scenario, bounds=HealthBounds(**overrides))

    def tolerance(self, metric: str) -> float:
        """Marker override, else the deployment's default, else the metric's."""
        return self._tolerances.get(metric, self.settings.deployment.tolerance(metric))

    def check(self, run: Any, metrics: Sequence[str], *, floor: bool = False) -> TestResult:
        """Judge ``run``'s metrics (floor, baseline); fail the test with the verdict line if needed.

        A baseline comparison that is inconclusive but could still be settled by more samples
        (stats.needs_more_samples) gets more rounds of the same scenario, up to its
        ``max_rounds``, before the verdict stands.
        """
        while True:
            try:
                result, comparisons = self._judge(run, metrics, floor=floor)
            except BaselineError as exc:  # a corrupt or newer baseline file: its message says which
                self._fail(str(exc))
            if result.invalid or not any(needs_more_samples(c) for c in comparisons):
                break
            longer = self._extend(run)
            if longer is None:
                break
            run = longer
        return self._finish(result)

    def _extend(self, run: Any) -> Any | None:
        """One more round of ``run``'s scenario, or None at its max_rounds."""
        from pytest_kimiperf.scenarios import extend

        scenario, options = self._scenario_of.get(id(run), (None, {}))
        if scenario is None or len(run.rounds) >= scenario.max_rounds:
            return None
        self._ensure_alive()
        start = time.monotonic_ns()
        longer = extend(self.server.base_url, self.server.model, scenario, run, rounds=1,
                        api_key=self.server.api_key, **options)
        self.intervals_ns.append((start, time.monotonic_ns()))
        self._scenario_of[id(longer)] = (scenario, options)
        return longer

    def _judge(self, run: Any, metrics: Sequence[str], *, floor: bool) -> tuple[TestResult, list[Any]]:
        comparisons: list[Any] = []
        result = TestResult(
            test=self.test,
            nodeid=self.nodeid,
            profile=self.server.profile,
            deployment=self.settings.deployment.name,
            scenario=run.scenario_name,
            run=run.to_json(),
            interval_ns=(self.intervals_ns[0][0], self.intervals_ns[-1][1]) if self.intervals_ns else None,
            server_env=dict(self.server.env),
            profile_env=self.profile_env,
            itl_timeline_ms=run.itl_timeline_ms(),
        )
        for name in metrics:
            spec = metric_spec(name)
            result.metrics[name] = MetricResult(
                metric=name, unit=spec.unit, direction=spec.direction.value,
                tolerance=self.tolerance(name), samples=[float(x) for x in run.samples(name)],
            )
        if not run.valid:
            result.invalid = run.invalid_reason
            result.failures.append(f"INVALID measurement: {run.invalid_reason}")
            return result, comparisons
        if run.invalid_count:
            total = len(run.records)
            reasons = "; ".join(f"{n}x {reason}" for reason, n in run.invalid_reasons.items())
            line = f"{run.invalid_count} of {total} measured requests failed and are not counted ({reasons})"
            if run.invalid_count > MAX_FAILED_FRACTION * total:
                result.failures.append(
                    f"{line}: more than {MAX_FAILED_FRACTION:.0%} failed, the server did not serve this load")
            else:
                result.warnings.append(line)
        from pytest_kimiperf.scenarios import reused_prompt_requests
        from pytest_kimiperf.server_metrics import unexpected_prefix_hits

        prefix_hits = unexpected_prefix_hits(
            run.server_metrics, endpoint=self._scenario_of.get(id(run), (None, {}))[1].get("endpoint", "completions"),
            reused_requests=reused_prompt_requests(run.records))
        if prefix_hits:
            result.warnings.append(prefix_hits)

        if floor:
            decode = result.metrics.get(FLOOR_METRIC) or MetricResult(
                FLOOR_METRIC, "tok/s", "higher_is_better", self.tolerance(FLOOR_METRIC),
                [float(x) for x in run.samples(FLOOR_METRIC)],
            )
            median = decode.summary()["median"]
            if median is None:
                result.failures.append("single-stream decode: no valid request to measure")
            else:
                dep = self.settings.deployment
                fr = check_floor(float(median), floor=dep.decode_floor_tok_s, target=dep.decode_target_tok_s)
                result.floor = {"median": fr.median, "floor": fr.floor, "target": fr.target,
                                "status": fr.status.value, "message": fr.message()}
                if fr.failed:
                    result.failures.append(fr.message())
                elif fr.warned:
                    result.warnings.append(fr.message())
                result.messages.append(fr.message())

        for mres in result.metrics.values():
            comparison, message = judge_metric(
                mres, test=self.test, profile=self.server.profile, view=self.view,
                profile_env=self.profile_env,
            )
            mres.baseline_message = message
            result.messages.append(message)
            if comparison is None:
                continue
            mres.baseline = comparison.to_dict()
            comparisons.append(comparison)
            if verdict_fails(comparison, strict=self.settings.perf_strict):
                result.failures.append(message)
            elif comparison.verdict.value in ("inconclusive", "improvement", "not comparable",
                                              "insufficient samples"):
                result.warnings.append(message + (
                    "; run --update-baselines to adopt it" if comparison.verdict.value == "improvement" else ""
                ))
        soft = self.view.soft_changes() if self.view is not None and comparisons else []
        if soft:
            result.warnings.append(
                "the baseline was recorded with other soft facts (they only warn; the hardware "
                f"and software that set speed match): {'; '.join(soft)}")
        scenario, _ = self._scenario_of.get(id(run), (None, {}))
        if scenario is not None and len(run.rounds) > scenario.rounds:
            result.messages.append(
                f"{len(run.rounds)} rounds measured: extended from {scenario.rounds} while inconclusive")
        return result, comparisons

    def _finish(self, result: TestResult) -> TestResult:
        self._publish(result)
        if result.failures:
            self._fail("; ".join(result.failures))
        return result
