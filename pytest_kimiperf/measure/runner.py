"""The runner: plays a scenario against a target and returns what it measured.

``run_scenario`` is synchronous (it runs its own event loop, uvloop when installed) so a pytest
test calls it directly; ``run_sweep`` plays every point of a ``ConcurrencySweep``;
``run_scenario_async`` plays on the caller's loop.

A run is: requests built once and dealt to rounds and processes (``prepare`` and
``process_plans``), a warm-up that is never counted, the client placed off the server's CPUs
where the host has some to spare (``placement``: the server's threads read over the warm-up,
where :func:`server_processes` names them), the server's ``/metrics`` read, the rounds (each
process starts together; ``engine``), ``/metrics`` read again. The runner checks
itself while it measures (see config.deployments.HealthBounds): CPU share and event-loop latency
of every client process, and how late each request went out. When one
process cannot keep up, ``client_processes`` spreads the streams over several processes.

**Dealing.** ``prepare`` builds every request a run sends (warm-up and rounds) with fresh prompts
from ``first_index`` on; a budget in seconds only reuses ``SECONDS_BUDGET_PROMPTS`` prompts in turn
(their ids marked, see ``workload.reused_prompt_requests``). ``process_plans`` gives each client
process its share of one round: specs, streams or cap, and arrival times for an open loop.

**Under the host watch.** The recorder hands :func:`measure_watched` the scenario's play (one
attempt, fresh prompts per attempt) and the server it measures; the watch (``hostwatch``, on this
host and on the nodes behind a launch template) reads what else used the host meanwhile. A disturbed
attempt is measured again, at most :data:`HOST_RETRIES` times; one disturbed every time makes the
run INVALID (``WatchedRun.busy``); so does a CPU quota that throttled every attempt
(``cgroup_quota``). An attempt whose client was held off the CPU (:func:`descheduled`) is measured
again too; one held off every time stays INVALID as client-bound. An attached server is measured
unwatched but for its client's CPU quota: its processes are unknown here, so on this host they
would count as foreign, and on another host this host says nothing about them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

from pytest_kimiperf.config.deployments import Deployment, HostBounds
from pytest_kimiperf.config.server_url import parse_base_url
from pytest_kimiperf.errors import ConfigError, ServerError
from pytest_kimiperf.measure.client import RequestSpec
from pytest_kimiperf.measure.connection import EVENT_LOOP_TIMING
from pytest_kimiperf.measure.engine import (
    Engine,
    EngineConfig,
    ProcessPlan,
    ScenarioStalled,
    WorkerPool,
    loop_factory,
)
from pytest_kimiperf.measure.cgroup_quota import QuotaWatch
from pytest_kimiperf.measure.hostwatch import HostReading, HostWatch, NodeWatch
from pytest_kimiperf.measure.placement import Placement, ThreadCpu, not_known, place_client, read_threads
from pytest_kimiperf.measure.coverage import FIGURES
from pytest_kimiperf.measure.invalid_causes import InvalidCause
from pytest_kimiperf.measure.results import (
    ClientBound, LoopLatency, NoMeasuredRequests, NoValidRequest, ProcessHealth, RequestRecord, RoundResult, RunInvalid,
    RunResult, SendLag, Unmeasured,
)
from pytest_kimiperf.measure.server_view import ServerView, Snapshot, fetch_snapshot
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.measure.workload import (
    REUSED_MARK,
    Concurrency,
    ConcurrencySweep,
    RequestRate,
    Scenario,
    SingleStream,
    build_requests,
    load_facts,
    reused_prompt_requests,
)
from pytest_kimiperf.server.process import ServerHandle

# Dealing: a scenario's requests built once, then split into rounds and processes.

# Distinct prompts built for a budget in seconds only (the request count is not known ahead);
# they are reused in turn past that, and the run says so in its notes.
SECONDS_BUDGET_PROMPTS = 256
MAX_DISTINCT_PROMPTS = 1024


@dataclass(frozen=True)
class Prepared:
    """A run's requests: the warm-up's, each round's, and what the next run starts from."""

    warmup: tuple[RequestSpec, ...]
    rounds: tuple[tuple[RequestSpec, ...], ...]
    cycle: bool
    next_index: int
    notes: tuple[str, ...]


def prepare(target: Target, scenario: Scenario, *, rounds: int, first_index: int) -> Prepared:
    """The warm-up's and each round's requests, built once (prompts from the server's tokenizer)."""
    warmup_n = scenario.effective_warmup_requests
    cycle = False
    if isinstance(scenario, RequestRate):
        per_round = [len(scenario.arrival_offsets_s(k)) for k in range(rounds)]
    elif scenario.requests is not None:
        per_round = [scenario.requests] * rounds
    else:
        per_round = [min(SECONDS_BUDGET_PROMPTS, MAX_DISTINCT_PROMPTS)] * rounds
        cycle = True
    total = warmup_n + sum(per_round)
    distinct = min(total, MAX_DISTINCT_PROMPTS)
    specs = build_requests(
        target.base_url, target.model, scenario.workload, distinct, endpoint=target.endpoint,
        api_key=target.api_key, first_index=first_index, id_prefix=scenario.scenario_name,
    )
    notes: list[str] = []
    if specs and specs[0].prompt_tokens is None:
        notes.append(
            "the server has no /tokenize or /detokenize: prompts are "
            f"{scenario.prompt_tokens} words, their token count is not exact or checked"
        )

    def take(start: int, count: int, lap_tag: str) -> tuple[RequestSpec, ...]:
        out = []
        for i in range(start, start + count):
            spec = specs[i % distinct]
            if i >= distinct:
                spec = replace(spec, request_id=f"{spec.request_id}{REUSED_MARK}{lap_tag}{i // distinct}")
            out.append(spec)
        return tuple(out)

    warmup = take(0, warmup_n, "w")
    position = warmup_n
    round_specs = []
    for k, count in enumerate(per_round):
        round_specs.append(take(position, count, f"r{k}"))
        position += count
    return Prepared(warmup, tuple(round_specs), cycle, first_index + distinct, tuple(notes))


def split(count: int, parts: int) -> list[int]:
    """``count`` in ``parts`` near-equal shares, the larger ones first."""
    base, extra = divmod(count, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def process_plans(scenario: Scenario, specs: Sequence[RequestSpec], *, round_index: int | None,
                  cycle: bool, processes: int) -> list[ProcessPlan]:
    """One round's (or the warm-up's, round_index None) work, split over the processes."""
    if isinstance(scenario, RequestRate) and round_index is not None:
        offsets = scenario.arrival_offsets_s(round_index)
        cap = scenario.max_concurrency
        caps = split(cap, processes) if cap is not None else [0] * processes
        return [
            ProcessPlan(
                specs=tuple(specs[p::processes]), slots=caps[p],
                arrivals_s=tuple(offsets[p::processes]), seconds=None, cycle=False,
            )
            for p in range(processes)
        ]
    streams = scenario.streams
    if round_index is None and isinstance(scenario, RequestRate):
        streams = min(scenario.streams, max(1, len(specs)))
    slots = split(streams, processes)
    counts = split(len(specs), processes)
    plans = []
    start = 0
    for p in range(processes):
        share = tuple(specs[start:start + counts[p]])
        start += counts[p]
        plans.append(ProcessPlan(
            specs=share, slots=slots[p], arrivals_s=None,
            seconds=scenario.seconds if round_index is not None else None,
            cycle=cycle and round_index is not None,
        ))
    return plans


def round_result(start_ns: int, outcomes: Sequence[tuple[list[RequestRecord], ProcessHealth]]) -> RoundResult:
    """One round's figures from every process's records, timed from the common start."""
    records = tuple(sorted((r for recs, _ in outcomes for r in recs), key=lambda r: r.t_send_ns))
    end_ns = max((r.t_done_ns for r in records), default=start_ns)
    return RoundResult(records=records, wall_s=max(0.0, (end_ns - start_ns) / 1e9),
                       health=tuple(h for _, h in outcomes))


# Playing: a scenario's rounds on one loop or on worker processes.

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


def _stamped(plans: Sequence[ProcessPlan], margin_ns: int,
             placement: Placement | None = None) -> tuple[int, list[ProcessPlan]]:
    """The plans with a common start time ``margin_ns`` from now, on the placement's CPUs."""
    start_ns = time.perf_counter_ns() + margin_ns
    cpus = placement.client_cpus if placement is not None else frozenset()
    return start_ns, [replace(plan, start_ns=start_ns, client_cpus=cpus) for plan in plans]


# The server's processes, where the caller knows them (measure_watched: a server this session
# booted): runs started inside place their client off the server's CPUs.
_SERVER_PIDS: ContextVar[Callable[[], Sequence[int]] | None] = ContextVar("kimiperf_server_pids", default=None)


@contextlib.contextmanager
def server_processes(pids: Callable[[], Sequence[int]]) -> Iterator[None]:
    """Runs started inside this block know the server's processes (``pids()``, asked when the
    warm-up starts and ends), so their client is placed off the server's CPUs (placement.py)."""
    token = _SERVER_PIDS.set(pids)
    try:
        yield
    finally:
        _SERVER_PIDS.reset(token)


class _Placer:
    """Watches the server's threads over the warm-up and places the measured rounds' client."""

    def __init__(self) -> None:
        self._pids = _SERVER_PIDS.get()
        self._before: dict[int, ThreadCpu] | None = None
        self._t0_s = 0.0

    def warmup_starts(self, warmup: bool) -> None:
        if self._pids is not None and warmup:
            self._before, self._t0_s = read_threads(self._pids()), time.monotonic()

    def place(self) -> Placement:
        """Where the measured rounds run (called once the warm-up is over)."""
        if self._pids is None:
            return not_known()
        window_s = time.monotonic() - self._t0_s
        return place_client(os.sched_getaffinity(0), self._before, read_threads(self._pids()), window_s)


async def _play_in_loop(config: EngineConfig, scenario: Scenario, prepared: Prepared,
                        watch: _ServerWatch, placer: _Placer) -> tuple[list[RoundResult], Placement]:
    """Warm-up and rounds on the running loop, one connection pool throughout."""
    engine = Engine(config)
    results: list[RoundResult] = []
    try:
        await asyncio.to_thread(placer.warmup_starts, bool(prepared.warmup))
        if prepared.warmup:
            warmup = process_plans(scenario, prepared.warmup, round_index=None, cycle=False, processes=1)
            await engine.execute(_stamped(warmup, 0)[1][0])
        placement = await asyncio.to_thread(placer.place)
        await asyncio.to_thread(watch.before)
        for k, specs in enumerate(prepared.rounds):
            plans = process_plans(scenario, specs, round_index=k, cycle=prepared.cycle, processes=1)
            start_ns, stamped = _stamped(plans, 0, placement)
            results.append(round_result(start_ns, [await engine.execute(stamped[0])]))
        await asyncio.to_thread(watch.after)
    finally:
        await engine.close()
    return results, placement


def _play_in_workers(configs: Sequence[EngineConfig], scenario: Scenario, prepared: Prepared,
                     watch: _ServerWatch, placer: _Placer) -> tuple[list[RoundResult], Placement]:
    """Warm-up and rounds spread over worker processes that start each round together."""
    processes = len(configs)
    timeout_s = scenario.request_timeout_s + (scenario.seconds or 0.0) + 60.0
    if isinstance(scenario, RequestRate):
        timeout_s += max((max(scenario.arrival_offsets_s(k), default=0.0)
                          for k in range(len(prepared.rounds))), default=0.0)
    results: list[RoundResult] = []
    pool = WorkerPool(configs)
    try:
        placer.warmup_starts(bool(prepared.warmup))
        if prepared.warmup:
            warmup = process_plans(scenario, prepared.warmup, round_index=None, cycle=False,
                                   processes=processes)
            pool.execute(_stamped(warmup, _START_MARGIN_NS)[1], timeout_s)
        placement = placer.place()
        watch.before()
        for k, specs in enumerate(prepared.rounds):
            plans = process_plans(scenario, specs, round_index=k, cycle=prepared.cycle, processes=processes)
            start_ns, stamped = _stamped(plans, _START_MARGIN_NS, placement)
            results.append(round_result(start_ns, pool.execute(stamped, timeout_s)))
        watch.after()
    finally:
        pool.close()
    return results, placement


def _with_load(result: RunResult, scenario: Scenario, target: Target) -> RunResult:
    """``result`` with its load facts, and how its chunks were timed."""
    https = parse_base_url(target.base_url).scheme == "https"
    notes = result.notes + ((EVENT_LOOP_TIMING,) if https and EVENT_LOOP_TIMING not in result.notes else ())
    timing = "event-loop" if https else "kernel"
    return replace(result, notes=notes,
                   load={**load_facts(scenario), "endpoint": target.endpoint, "timing": timing})


def _result(scenario: Scenario, prepared: Prepared, rounds: Sequence[RoundResult],
            watch: _ServerWatch, placement: Placement) -> RunResult:
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
        load=load_facts(scenario), client_placement=placement.to_json(),
    )


def _run(target: Target, scenario: Scenario, *, rounds: int, first_index: int) -> RunResult:
    prepared = prepare(target, scenario, rounds=rounds, first_index=first_index)
    configs = _engine_configs(target, scenario)
    watch, placer = _ServerWatch(target), _Placer()
    try:
        if len(configs) == 1:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                results, placement = runner.run(_play_in_loop(configs[0], scenario, prepared, watch, placer))
        else:
            results, placement = _play_in_workers(configs, scenario, prepared, watch, placer)
    except ScenarioStalled as stall:  # in this process or a worker's (engine.WorkerPool)
        raise ServerError(_stall_verdict(str(stall), target)) from None
    return _with_load(_result(scenario, prepared, results, watch, placement), scenario, target)


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
    rounds, placement = await _play_in_loop(config, scenario, prepared, watch, _Placer())
    return _with_load(_result(scenario, prepared, rounds, watch, placement), scenario, target)


# Under the host watch: a disturbed measurement is taken again.

# A measurement the host watch finds disturbed is measured again this many times before the
# run is INVALID: one burst of a cron job should cost a repeat, a busy host a verdict.
HOST_RETRIES = 2


@dataclass(frozen=True)
class HostBusy:
    """The host watch found every attempt disturbed: the last attempt's disturbed readings (this
    machine's and its nodes'), the bounds they broke, and how many attempts were made."""

    readings: tuple[HostReading, ...]
    bounds: HostBounds
    attempts: int

    @property
    def foreign_processes(self) -> list[tuple[str, int, str, float]]:
        """(node, pid, name, share of the host's CPU) of the other processes the watch named
        ("" for this machine)."""
        return [(r.node, p.pid, p.name, p.cpu_share) for r in self.readings for p in r.top_foreign]


InvalidReason = RunInvalid | HostBusy


def cause_of(reason: InvalidReason) -> InvalidCause:
    """The cause of an INVALID, which decides its advice."""
    match reason:
        case HostBusy(readings, bounds, _):
            busy = [r for r in readings if r.busy(bounds)]
            if not busy:
                return InvalidCause.CPU_QUOTA
            return InvalidCause.GPU_THROTTLE if all(r.only_gpu_clocks(bounds) for r in busy) else InvalidCause.BUSY_HOST
        case ClientBound():
            return InvalidCause.CLIENT_HELD
        case Unmeasured():
            return InvalidCause.CLIENT_HELD
        case NoMeasuredRequests() | NoValidRequest():
            return InvalidCause.NO_REQUEST
        case _:
            assert_never(reason)


def host_busy(readings: Sequence[HostReading], bounds: HostBounds, attempts: int) -> HostBusy | None:
    """The readings that broke a bound, as a HostBusy; None when none did."""
    disturbed = tuple(r for r in readings if r.disturbances(bounds))
    return HostBusy(disturbed, bounds, attempts) if disturbed else None


@dataclass
class WatchedRun:
    """The run, every attempt's host reading, the last attempt's node readings, and why the host
    was too busy for a verdict (None: an attempt was quiet, or nothing was watched)."""

    run: RunResult
    readings: list[HostReading] = field(default_factory=list)
    node_readings: list[HostReading] = field(default_factory=list)
    nodes_here: list[str] = field(default_factory=list)  # nodes behind a template that are this machine
    busy: HostBusy | None = None
    # Why each attempt before the last was measured again (the host's disturbance, or the
    # client's or the reads' evidence and the figures it would have spoiled), in order; words in
    # reports/sentences.py (say_measured_again).
    measured_again: list[InvalidReason] = field(default_factory=list)



def measure_watched(play: Callable[[int], RunResult], server: ServerHandle, deployment: Deployment, *,
                    first: Callable[[], RunResult] | None = None) -> WatchedRun:
    """``play(attempt)`` under the host watch until an attempt is quiet (at most 1 +
    HOST_RETRIES attempts). ``first`` takes the first attempt's place (pytest-benchmark's timed
    call of it)."""
    if server.external:
        return _quota_watched(play, first)
    bounds = HostBounds.from_mapping(deployment.host_bounds, source=f"deployment {deployment.name} host_bounds")
    watched = WatchedRun(run=None)  # type: ignore[arg-type]  # set by the first attempt
    for attempt in range(1 + HOST_RETRIES):
        nodes = NodeWatch(server.remote_nodes) if server.remote_nodes else None
        if nodes is not None:
            nodes.start()
        here = nodes.here_pids if nodes is not None else set()
        # The watch stops before the next attempt rebinds `here`.
        watch = HostWatch(own_pids=lambda: [*own_pids(server), *here], client_pids=lambda: client_pids(server),  # noqa: B023
                          **gpu_watch(deployment))
        watch.start()
        with server_processes(lambda: [*server_pids(server), *here]):  # noqa: B023
            watched.run = first() if attempt == 0 and first is not None else play(attempt)
        reading = watch.stop()
        watched.readings.append(reading)
        watched.node_readings = nodes.stop() if nodes is not None else []
        watched.nodes_here = nodes.here if nodes is not None else []
        watched.busy = host_busy((reading, *watched.node_readings), bounds, attempts=attempt + 1)
        if watched.busy is None and not descheduled(watched.run):
            return watched
        if attempt < HOST_RETRIES:
            watched.measured_again.append(_why_again(watched))
    return watched


def _why_again(watched: WatchedRun) -> InvalidReason:
    """Why this attempt is measured again: the host's disturbance, or the client's or the reads'
    evidence and the figures it would have spoiled."""
    run = watched.run
    reason = watched.busy or run.invalid or run.unmeasured(window_figures(run))
    assert reason is not None, "descheduled() holds only for a client-bound or an unmeasured window"
    return reason


def descheduled(run: RunResult) -> bool:
    """Whether this attempt is to be measured again for the client's sake: the client was held
    off the CPU (its loop ran late where it spoiled stamps, or its sends went late) without
    being short of CPU itself, or the figures its load exists for (:func:`window_figures`) lost
    more than their bound of its requests to the client's holds. A server that stalled or wrote
    in bursts is never measured again: that is what the window is for, and the first attempt's
    figures say it. On a host too small to
    place the client off the server's CPUs (placement.py), the scheduler can hold a
    normal-priority client off for hundreds of ms now and then while the server keeps both cores
    busy; a client that ran out of CPU is not helped by another attempt."""
    reason = run.invalid
    if isinstance(reason, ClientBound):
        return all(isinstance(p, (LoopLatency, SendLag)) for p in reason.problems)
    return reason is None and run.unmeasured(window_figures(run)) is not None


def window_figures(run: RunResult) -> tuple[str, ...]:
    """The per-request figures a window is measured again for: every one for one stream and for
    a request rate, whose tests judge them; none for a closed loop of several streams, whose
    figure is its throughput (a test that checks one of its per-request figures has it judged at
    check time, recorder.py)."""
    return () if run.load.get("kind") == "concurrency" else FIGURES


def _quota_watched(play: Callable[[int], RunResult], first: Callable[[], RunResult] | None) -> WatchedRun:
    """An attached server's measurement: the host is not watched (its processes are not known
    here), the client's CPU quota is, and one that throttles every attempt makes it INVALID; an
    attempt whose client was held off, or whose figures its reads spoiled, is measured again as
    on a server this session booted."""
    watched = WatchedRun(run=None)  # type: ignore[arg-type]  # set by the first attempt
    for attempt in range(1 + HOST_RETRIES):
        quota = QuotaWatch(lambda: _trees((os.getpid(),)), client=lambda: _trees((os.getpid(),)))
        quota.start()
        watched.run = first() if attempt == 0 and first is not None else play(attempt)
        reading = HostReading.of_quota(quota.stop())
        watched.busy = host_busy((reading,), HostBounds(), attempts=attempt + 1)
        if watched.busy is None and not descheduled(watched.run):
            return watched
        if attempt < HOST_RETRIES:
            watched.measured_again.append(_why_again(watched))
    return watched


def own_pids(server: ServerHandle) -> list[int]:
    """The server's process tree and this client with its worker processes."""
    pids = []
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The xdist controller only relays reports; other workers' tests are foreign load.
        pids.append(os.getppid())
    return pids + _trees((server.pid, *server.node_pids, os.getpid()))


def client_pids(server: ServerHandle) -> list[int]:
    """This process and its descendants that are not the server's (its client workers)."""
    theirs = set(server_pids(server))
    return [pid for pid in _trees((os.getpid(),)) if pid not in theirs]


def server_pids(server: ServerHandle) -> list[int]:
    """The server's process tree (a deployment that spans nodes: its worker nodes on this
    machine too), without this client."""
    return _trees((server.pid, *server.node_pids))


def _trees(roots: Sequence[int | None]) -> list[int]:
    """Each root process and its descendants, those that still exist."""
    import psutil

    pids = []
    for root in roots:
        if root is None:
            continue
        try:
            proc = psutil.Process(root)
            pids.append(proc.pid)
            pids.extend(child.pid for child in proc.children(recursive=True))
        except psutil.Error:
            continue
    return pids


def gpu_watch(deployment: Deployment) -> Mapping[str, Any]:
    """NVML and the deployment's GPU indices, where the deployment runs on GPUs."""
    if not deployment.needs_gpus:
        return {}
    try:
        import pynvml
    except ImportError:
        return {}
    from pytest_kimiperf.server.gpu import visible_nvml_indices

    # The server's GPUs: CUDA_VISIBLE_DEVICES as the server gets it (manager.py: the shell's,
    # then the deployment's env), which NVML's indices do not follow.
    visible = {**os.environ, **deployment.env}.get("CUDA_VISIBLE_DEVICES")
    return {"nvml": pynvml, "gpu_indices": visible_nvml_indices(visible, deployment.gpu_count)}
