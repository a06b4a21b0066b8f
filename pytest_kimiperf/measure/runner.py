"""The runner: plays a scenario against a target and returns what it measured.

``run_scenario`` is synchronous (it runs its own event loop, uvloop when installed) so a pytest
test calls it directly; ``run_sweep`` plays every point of a ``ConcurrencySweep``;
``run_scenario_async`` plays on the caller's loop.

A run is: requests built once and dealt to rounds and processes (dealing.py), a warm-up that is never counted, the server's
``/metrics`` read, the rounds (each process starts together; engine.py), ``/metrics`` read
again. The runner checks itself while it measures (see config.measure_bounds.HealthBounds): CPU share and
event-loop latency of every client process, and how late each request went out. When one
process cannot keep up, ``client_processes`` spreads the streams over several processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pytest_kimiperf.errors import ConfigError, ServerError
from pytest_kimiperf.config.server_url import parse_base_url
from pytest_kimiperf.measure.client_https import EVENT_LOOP_TIMING
from pytest_kimiperf.measure.engine import (
    Engine,
    EngineConfig,
    ProcessPlan,
    ScenarioStalled,
    WorkerPool,
    loop_factory,
)
from pytest_kimiperf.measure.dealing import Prepared, prepare, process_plans, round_result, split
from pytest_kimiperf.measure.results import RoundResult, RunResult
from pytest_kimiperf.measure.scenarios import (
    Concurrency,
    ConcurrencySweep,
    RequestRate,
    Scenario,
    SingleStream,
    load_facts,
)
from pytest_kimiperf.measure.server_view import ServerView, Snapshot, fetch_snapshot
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.measure.workload import reused_prompt_requests

# Workers get this long between "go" and the common start time.
_START_MARGIN_NS = 300_000_000


def _engine_configs(target: Target, scenario: Scenario) -> list[EngineConfig]:
    return [
        EngineConfig(
            base_url=target.base_url, model=target.model, endpoint=target.endpoint,
            api_key=target.api_key, extra_body=dict(target.extra_body or {}),
            request_timeout_s=scenario.request_timeout_s, max_connections=max(1, slots),
            first_token_deadline_s=scenario.bounds.first_token_deadline_s,
            idle_deadline_s=scenario.bounds.idle_deadline_s,
        )
        for slots in split(scenario.streams, scenario.client_processes)
    ]


def _check_call(target: object, scenario: object) -> None:
    if not isinstance(target, Target):
        raise ConfigError(f"target={target!r}: must be a Target (measure.target)")
    if isinstance(scenario, ConcurrencySweep):
        raise ConfigError("a ConcurrencySweep runs with run_sweep(), one RunResult per concurrency")
    if not isinstance(scenario, (SingleStream, Concurrency, RequestRate)):
        raise ConfigError(
            f"scenario {scenario!r}: must be a SingleStream, Concurrency or RequestRate"
        )


class _ServerWatch:
    """Reads the server's /metrics after the warm-up and after the last round."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._enabled = target.server_metrics
        self._before: Snapshot | None = None
        self.view: dict[str, Any] | None = None
        self.note = ""

    def _read(self) -> Snapshot | None:
        try:
            return fetch_snapshot(self._target.base_url, model=self._target.model,
                                  api_key=self._target.api_key)
        except Exception as exc:  # noqa: BLE001 - a server without /metrics still gets measured
            self.note = f"server metrics unavailable ({type(exc).__name__}: {exc})"
            self._enabled = False
            return None

    def before(self) -> None:
        if self._enabled:
            self._before = self._read()

    def after(self) -> None:
        if self._enabled and self._before is not None:
            after = self._read()
            if after is not None:
                self.view = ServerView.between(self._before, after).to_json()


def _stamped(plans: Sequence[ProcessPlan], margin_ns: int) -> tuple[int, list[ProcessPlan]]:
    """The plans with a common start time ``margin_ns`` from now."""
    start_ns = time.perf_counter_ns() + margin_ns
    return start_ns, [replace(plan, start_ns=start_ns) for plan in plans]


async def _play_in_loop(config: EngineConfig, scenario: Scenario, prepared: Prepared,
                        watch: _ServerWatch) -> list[RoundResult]:
    """Warm-up and rounds on the running loop, one connection pool throughout."""
    engine = Engine(config)
    results: list[RoundResult] = []
    try:
        if prepared.warmup:
            warmup = process_plans(scenario, prepared.warmup, round_index=None, cycle=False, processes=1)
            await engine.execute(_stamped(warmup, 0)[1][0])
        await asyncio.to_thread(watch.before)
        for k, specs in enumerate(prepared.rounds):
            plans = process_plans(scenario, specs, round_index=k, cycle=prepared.cycle, processes=1)
            start_ns, stamped = _stamped(plans, 0)
            results.append(round_result(start_ns, [await engine.execute(stamped[0])]))
        await asyncio.to_thread(watch.after)
    finally:
        await engine.close()
    return results


def _play_in_workers(configs: Sequence[EngineConfig], scenario: Scenario, prepared: Prepared,
                     watch: _ServerWatch) -> list[RoundResult]:
    """Warm-up and rounds spread over worker processes that start each round together."""
    processes = len(configs)
    timeout_s = scenario.request_timeout_s + (scenario.seconds or 0.0) + 60.0
    if isinstance(scenario, RequestRate):
        timeout_s += max((max(scenario.arrival_offsets_s(k), default=0.0)
                          for k in range(len(prepared.rounds))), default=0.0)
    results: list[RoundResult] = []
    pool = WorkerPool(configs)
    try:
        if prepared.warmup:
            warmup = process_plans(scenario, prepared.warmup, round_index=None, cycle=False,
                                   processes=processes)
            pool.execute(_stamped(warmup, _START_MARGIN_NS)[1], timeout_s)
        watch.before()
        for k, specs in enumerate(prepared.rounds):
            plans = process_plans(scenario, specs, round_index=k, cycle=prepared.cycle, processes=processes)
            start_ns, stamped = _stamped(plans, _START_MARGIN_NS)
            results.append(round_result(start_ns, pool.execute(stamped, timeout_s)))
        watch.after()
    finally:
        pool.close()
    return results


def _with_load(result: RunResult, scenario: Scenario, target: Target) -> RunResult:
    """``result`` with its load facts, and how its chunks were timed."""
    https = parse_base_url(target.base_url).scheme == "https"
    notes = result.notes + ((EVENT_LOOP_TIMING,) if https and EVENT_LOOP_TIMING not in result.notes else ())
    timing = "event-loop" if https else "kernel"
    return replace(result, notes=notes,
                   load={**load_facts(scenario), "endpoint": target.endpoint, "timing": timing})


def _result(scenario: Scenario, prepared: Prepared, rounds: Sequence[RoundResult],
            watch: _ServerWatch) -> RunResult:
    notes = prepared.notes + ((watch.note,) if watch.note else ())
    reused = reused_prompt_requests(r for rnd in rounds for r in rnd.records)
    if reused:
        notes += ((
            f"{reused} request(s) reused a prompt already sent (the budget outran the distinct "
            "prompts built); vLLM's prefix cache may shorten their prefill (TTFT)"
        ),)
    return RunResult(
        scenario_name=scenario.scenario_name, rounds=tuple(rounds),
        warmup_requests=len(prepared.warmup), bounds=scenario.bounds,
        client_processes=scenario.client_processes, notes=notes,
        next_request_index=prepared.next_index,
        server_metrics=(watch.view,) if watch.view is not None else (),
        load=load_facts(scenario),
    )


def _run(target: Target, scenario: Scenario, *, rounds: int, first_index: int) -> RunResult:
    prepared = prepare(target, scenario, rounds=rounds, first_index=first_index)
    configs = _engine_configs(target, scenario)
    watch = _ServerWatch(target)
    try:
        if len(configs) == 1:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                results = runner.run(_play_in_loop(configs[0], scenario, prepared, watch))
        else:
            results = _play_in_workers(configs, scenario, prepared, watch)
    except ScenarioStalled as stall:  # in this process or a worker's (engine.WorkerPool)
        raise ServerError(_stall_verdict(str(stall), target)) from None
    return _with_load(_result(scenario, prepared, results, watch), scenario, target)


def _stall_verdict(stall: str, target: Target) -> str:
    """The stall and what the server's /health says now (alive but wedged, or gone)."""
    from pytest_kimiperf.server.process import check_health

    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    why = check_health(target.base_url, headers, timeout_s=10.0)
    state = "still answers /health 200 but stopped streaming" if why is None else why
    return f"the scenario was aborted: {stall}; the server {state}"


def _check_no_running_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise ConfigError(f"{what} runs its own event loop; from async code use run_scenario_async()")


def run_scenario(target: Target, scenario: Scenario) -> RunResult:
    """Play ``scenario`` against the OpenAI-compatible server ``target`` and measure it.

    Scripts that use ``client_processes > 1`` must guard their entry point with
    ``if __name__ == "__main__":`` (workers are spawned and re-import the main module).
    """
    _check_call(target, scenario)
    _check_no_running_loop("run_scenario()")
    return _run(target, scenario, rounds=scenario.rounds, first_index=0)


def run_sweep(target: Target, sweep: ConcurrencySweep) -> list[RunResult]:
    """Play every concurrency of ``sweep``, lowest first; one RunResult each."""
    if not isinstance(sweep, ConcurrencySweep):
        raise ConfigError(f"run_sweep() takes a ConcurrencySweep, got {sweep!r}")
    return [run_scenario(target, scenario)
            for scenario in sorted(sweep.scenarios(), key=lambda s: s.concurrency)]


async def run_scenario_async(target: Target, scenario: Scenario) -> RunResult:
    """``run_scenario`` on the caller's running loop (one client process only)."""
    _check_call(target, scenario)
    if scenario.client_processes != 1:
        raise ConfigError("run_scenario_async() runs in the caller's loop: client_processes must be 1")
    prepared = await asyncio.to_thread(prepare, target, scenario, rounds=scenario.rounds, first_index=0)
    config = _engine_configs(target, scenario)[0]
    watch = _ServerWatch(target)
    result = _result(scenario, prepared, await _play_in_loop(config, scenario, prepared, watch), watch)
    return _with_load(result, scenario, target)
