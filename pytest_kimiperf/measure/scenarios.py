"""Load patterns and the runner that plays them against a server.

A scenario is a frozen dataclass: the request shape (prompt and output tokens, seed), a budget
per round (requests, seconds, or both: whichever ends first), how many rounds, and warm-up
requests that run first and are never counted. The load patterns:

* :class:`SingleStream`: one request at a time (decode speed as one user sees it).
* :class:`Concurrency`: ``concurrency`` streams, each sending its next request when the last ends.
* :class:`RequestRate`: open loop, Poisson (seeded) or evenly spaced arrivals at ``rate_per_s``,
  optionally capped at ``max_concurrency`` in flight.
* :class:`ConcurrencySweep`: the same workload at several concurrencies (``run_sweep``).

``run_scenario`` is synchronous (it runs its own event loop, uvloop when installed) so a pytest
test calls it directly; ``extend`` runs more rounds of the same scenario, never beyond
``max_rounds``, when the statistics want more samples.

The runner checks itself while it measures (see metrics.HealthBounds): CPU share and event-loop
latency of every client process, and how late each request went out. When one process cannot
keep up, ``client_processes`` spreads the streams over several processes, each with its own loop;
their ``perf_counter_ns`` stamps (CLOCK_MONOTONIC) are system-wide on Linux, so records merge.
One process handled 128 streams x 200 tok/s (25,600 chunks/s) at ~0.3 of a core on the
2-core CI machine (benchmarks/client_accuracy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import multiprocessing
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_kimiperf.measure.client import (
    RequestSpec,
    check_endpoint,
    StreamingClient,
    parse_base_url,
)
from pytest_kimiperf.measure.client_https import EVENT_LOOP_TIMING
from pytest_kimiperf.errors import ConfigError, KimiperfError, ServerError
from pytest_kimiperf.measure.results import (
    HealthBounds,
    ProcessHealth,
    RequestRecord,
    RoundResult,
    RunResult,
    merge_rounds,
)
from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.measure.server_view import ServerView, Snapshot, fetch_snapshot
from pytest_kimiperf.measure.workload import Workload, build_requests

_ARRIVALS = ("poisson", "constant")
# Connection-pool size of a request rate without max_concurrency (connections open on demand).
_UNCAPPED_STREAMS = 4096
# Distinct prompts built for a budget in seconds only (the request count is not known ahead);
# they are reused in turn past that, and the run says so in its notes.
_SECONDS_BUDGET_PROMPTS = 256
_MAX_DISTINCT_PROMPTS = 1024
_PROBE_INTERVAL_S = 0.002
# Marks the request id of a prompt sent again (cycled budget), so the run can say so.
_REUSED = "~"
# Workers get this long between "go" and the common start time.
_START_MARGIN_NS = 300_000_000
_WORKER_READY_TIMEOUT_S = 120.0


def _positive_int(owner: str, name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        extra = " or None" if allow_none else ""
        raise ConfigError(f"{owner}.{name}={value!r}: must be an integer >= 1{extra}")


def _positive_number(owner: str, name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        extra = " or None" if allow_none else ""
        raise ConfigError(f"{owner}.{name}={value!r}: must be a positive number{extra}")


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What every load pattern has: request shape, budget per round, rounds, client resources."""

    prompt_tokens: int
    output_tokens: int
    # Budget per round: requests, seconds of sending, or both (whichever ends first).
    requests: int | None = None
    seconds: float | None = None
    rounds: int = 1
    # Sent first with the same load and never counted; None: one per stream (at least 1).
    warmup_requests: int | None = None
    # extend() stops here.
    max_rounds: int = 10
    seed: int = 0
    client_processes: int = 1
    name: str | None = None
    bounds: HealthBounds = field(default_factory=HealthBounds)
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        Workload(self.prompt_tokens, self.output_tokens, self.seed)
        _positive_int(owner, "requests", self.requests, allow_none=True)
        _positive_number(owner, "seconds", self.seconds, allow_none=True)
        if self.requests is None and self.seconds is None:
            raise ConfigError(f"{owner}: give a budget per round: requests=N, seconds=S, or both")
        _positive_int(owner, "rounds", self.rounds)
        _positive_int(owner, "max_rounds", self.max_rounds)
        if self.max_rounds < self.rounds:
            raise ConfigError(f"{owner}.max_rounds={self.max_rounds} is below rounds={self.rounds}")
        if self.warmup_requests is not None and (
            not isinstance(self.warmup_requests, int) or isinstance(self.warmup_requests, bool)
            or self.warmup_requests < 0
        ):
            raise ConfigError(f"{owner}.warmup_requests={self.warmup_requests!r}: must be an integer >= 0 or None")
        _positive_int(owner, "client_processes", self.client_processes)
        _positive_number(owner, "request_timeout_s", self.request_timeout_s)
        if not isinstance(self.bounds, HealthBounds):
            raise ConfigError(f"{owner}.bounds={self.bounds!r}: must be a HealthBounds")
        if self.name is not None:
            check_safe_name("scenario", self.name, source=f"{owner}.name")

    @property
    def workload(self) -> Workload:
        """The shape of every request."""
        return Workload(self.prompt_tokens, self.output_tokens, self.seed)

    @property
    def streams(self) -> int:
        """How many requests can be in flight at once (the connection pool's size)."""
        raise NotImplementedError

    @property
    def scenario_name(self) -> str:
        """``name``, or one derived from the load and the shape (e.g. ``concurrency-8-128in-128out``)."""
        return self.name or f"{self._load_name()}-{self.prompt_tokens}in-{self.output_tokens}out"

    def _load_name(self) -> str:
        raise NotImplementedError

    @property
    def effective_warmup_requests(self) -> int:
        """Warm-up requests actually sent."""
        return self.warmup_requests if self.warmup_requests is not None else self.streams

    def _check_processes(self) -> None:
        if self.client_processes > self.streams:
            raise ConfigError(
                f"{type(self).__name__}.client_processes={self.client_processes} exceeds the "
                f"{self.streams} stream(s) it can have in flight"
            )


@dataclass(frozen=True, kw_only=True)
class SingleStream(Scenario):
    """One request at a time: decode speed as one user sees it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_processes()

    @property
    def streams(self) -> int:
        """Always 1."""
        return 1

    def _load_name(self) -> str:
        return "single-stream"


@dataclass(frozen=True, kw_only=True)
class Concurrency(Scenario):
    """``concurrency`` closed-loop streams: each sends its next request when its last one ends."""

    concurrency: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("Concurrency", "concurrency", self.concurrency)
        self._check_processes()

    @property
    def streams(self) -> int:
        """The concurrency."""
        return self.concurrency

    def _load_name(self) -> str:
        return f"concurrency-{self.concurrency}"


@dataclass(frozen=True, kw_only=True)
class RequestRate(Scenario):
    """Open loop: requests arrive at ``rate_per_s`` (Poisson from the seed, or evenly spaced)."""

    rate_per_s: float
    arrivals: str = "poisson"
    # Cap on requests in flight; a request over the cap waits (bench serve's --max-concurrency).
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_number("RequestRate", "rate_per_s", self.rate_per_s)
        if self.arrivals not in _ARRIVALS:
            raise ConfigError(
                f"RequestRate.arrivals={self.arrivals!r}: use one of {', '.join(_ARRIVALS)}"
            )
        _positive_int("RequestRate", "max_concurrency", self.max_concurrency, allow_none=True)
        self._check_processes()

    @property
    def streams(self) -> int:
        """The cap; without one, as many as the connection pool allows (an open loop never waits)."""
        return self.max_concurrency if self.max_concurrency is not None else _UNCAPPED_STREAMS

    @property
    def effective_warmup_requests(self) -> int:
        """Warm-up requests actually sent (default 2: connections and server caches, not load)."""
        return self.warmup_requests if self.warmup_requests is not None else 2

    def _load_name(self) -> str:
        return f"rate-{self.arrivals}-{self.rate_per_s:g}rps"

    def arrival_offsets_s(self, round_index: int) -> list[float]:
        """Send times of one round's requests, seconds from its start; the same for the same seed."""
        rng = random.Random(f"kimiperf-arrivals:{self.seed}:{round_index}")
        limit_n = self.requests if self.requests is not None else math.inf
        limit_s = self.seconds if self.seconds is not None else math.inf
        offsets: list[float] = []
        t = 0.0
        while len(offsets) < limit_n and t < limit_s:
            offsets.append(t)
            t += rng.expovariate(self.rate_per_s) if self.arrivals == "poisson" else 1.0 / self.rate_per_s
        return offsets


@dataclass(frozen=True, kw_only=True)
class ConcurrencySweep(Scenario):
    """The same workload at each of ``concurrencies`` (run with ``run_sweep``)."""

    concurrencies: tuple[int, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.concurrencies, tuple) or not self.concurrencies:
            raise ConfigError(
                f"ConcurrencySweep.concurrencies={self.concurrencies!r}: must be a non-empty tuple"
            )
        for value in self.concurrencies:
            _positive_int("ConcurrencySweep", "concurrencies[]", value)

    @property
    def streams(self) -> int:
        """The highest concurrency."""
        return max(self.concurrencies)

    def _load_name(self) -> str:
        return "sweep"

    def scenarios(self) -> tuple[Concurrency, ...]:
        """One Concurrency scenario per point, named ``<sweep name>-c<N>``."""
        return tuple(
            Concurrency(
                prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                requests=self.requests, seconds=self.seconds, rounds=self.rounds,
                warmup_requests=self.warmup_requests, max_rounds=self.max_rounds, seed=self.seed,
                client_processes=min(self.client_processes, n), bounds=self.bounds,
                request_timeout_s=self.request_timeout_s, name=f"{self.scenario_name}-c{n}",
                concurrency=n,
            )
            for n in self.concurrencies
        )


# --------------------------------------------------------------------------- what a process runs


@dataclass(frozen=True)
class _EngineConfig:
    base_url: str
    model: str
    endpoint: str
    api_key: str | None
    extra_body: Mapping[str, Any]
    request_timeout_s: float
    max_connections: int
    first_token_deadline_s: float | None = None
    idle_deadline_s: float | None = None


@dataclass(frozen=True)
class _ProcessPlan:
    """One process's share of one round (or of the warm-up)."""

    specs: tuple[RequestSpec, ...]
    # Closed loop: streams; open loop: cap on requests in flight (0: none).
    slots: int
    # Open loop only: each spec's send time, seconds after start.
    arrivals_s: tuple[float, ...] | None
    # Stop sending new requests this long after start (None: when specs run out).
    seconds: float | None
    # Closed loop with a time budget: reuse the specs in turn until the time is up.
    cycle: bool
    start_ns: int = 0


class _LoopProbe:
    """Times how late the loop runs a callback that became due at a known moment.

    A thread wakes every ``_PROBE_INTERVAL_S`` and posts a callback stamped with the moment it
    was *due* (not when the post happened): the delay then holds everything a socket event
    would wait through before the client reads it, including the GIL held by another
    thread of the process and CPU taken by other processes.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stop = threading.Event()
        self.latencies_ms: list[float] = []
        self._thread = threading.Thread(target=self._post, name="kimiperf-loop-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _post(self) -> None:
        _set_thread_timer_slack_ns(1000)
        interval_ns = int(_PROBE_INTERVAL_S * 1e9)
        due_ns = time.perf_counter_ns() + interval_ns
        while not self._stop.is_set():
            wait_ns = due_ns - time.perf_counter_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
            try:
                self._loop.call_soon_threadsafe(self._answer, due_ns)
            except RuntimeError:
                return  # loop closed
            due_ns += interval_ns
            now_ns = time.perf_counter_ns()
            if due_ns < now_ns:
                due_ns = now_ns + interval_ns  # fell behind: do not post a burst to catch up

    def _answer(self, due_ns: int) -> None:
        self.latencies_ms.append((time.perf_counter_ns() - due_ns) / 1e6)


def _set_thread_timer_slack_ns(slack_ns: int) -> None:
    # Linux lets sleeps end up to 50 us late by default (timer slack, man 2 prctl); the probe
    # would count that as loop latency. PR_SET_TIMERSLACK applies to the calling thread only.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, slack_ns, 0, 0, 0)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def _realtime_priority() -> Iterator[None]:
    """Run the measured part at SCHED_FIFO where the OS allows it, then restore.

    On a host where the server shares cores with the client (the 2-core CPU deployment: API
    server, engine core and client on one core), the scheduler can hold the client off the CPU
    for 100+ ms; chunks then pile up and are read, and stamped, together. The client uses a
    small fraction of a core, so letting it preempt costs the server little and keeps stamps
    on time. Linux applies the policy per thread (the probe thread, started inside, inherits
    it); without CAP_SYS_NICE this is a no-op and the self-check still guards the numbers.
    """
    try:
        before = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(_CLIENT_RT_PRIORITY))
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, before[0], before[1])


# Low among real-time priorities: above every normal process, below kernel threads and
# anything an administrator set up as real-time.
_CLIENT_RT_PRIORITY = 5


class _Engine:
    """Runs plans on one event loop with one connection pool."""

    def __init__(self, config: _EngineConfig) -> None:
        self.client = StreamingClient(
            config.base_url, config.model, endpoint=config.endpoint, api_key=config.api_key,
            max_connections=config.max_connections, request_timeout_s=config.request_timeout_s,
            extra_body=config.extra_body, first_token_deadline_s=config.first_token_deadline_s,
            idle_deadline_s=config.idle_deadline_s,
        )
        self._stalls_in_a_row = 0

    def _count_stall(self, record: RequestRecord) -> None:
        """Raise ScenarioStalled once ``STALLS_TO_ABORT`` requests in a row have stalled."""
        if not record.error.startswith(STALL_PREFIX):
            self._stalls_in_a_row = 0
            return
        self._stalls_in_a_row += 1
        if self._stalls_in_a_row >= STALLS_TO_ABORT:
            raise ScenarioStalled(f"{STALLS_TO_ABORT} requests in a row stalled; the last: {record.error}")

    async def execute(self, plan: _ProcessPlan) -> tuple[list[RequestRecord], ProcessHealth]:
        # A collection is a pause of the loop; the hot path makes no reference cycles, so hold
        # the collector off while measuring (bench serve freezes its heap for the same reason).
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            delay_s = (plan.start_ns - time.perf_counter_ns()) / 1e9
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            with _realtime_priority():
                probe = _LoopProbe(asyncio.get_running_loop())
                cpu_start_s = time.process_time()
                wall_start_ns = time.perf_counter_ns()
                probe.start()
                try:
                    if plan.arrivals_s is None:
                        records = await self._closed_loop(plan, wall_start_ns)
                    else:
                        records = await self._open_loop(plan, wall_start_ns)
                finally:
                    probe.stop()
            wall_s = (time.perf_counter_ns() - wall_start_ns) / 1e9
            cpu_fraction = (time.process_time() - cpu_start_s) / wall_s if wall_s > 0 else 0.0
        finally:
            if gc_was_enabled:
                gc.enable()
        return records, ProcessHealth(cpu_fraction, tuple(probe.latencies_ms), wall_s)

    async def _closed_loop(self, plan: _ProcessPlan, start_ns: int) -> list[RequestRecord]:
        records: list[RequestRecord] = []
        specs = plan.specs
        deadline_ns = start_ns + int(plan.seconds * 1e9) if plan.seconds is not None else None
        taken = 0

        def next_spec() -> RequestSpec | None:
            nonlocal taken
            if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
                return None
            if taken >= len(specs) and not plan.cycle:
                return None
            lap, index = divmod(taken, len(specs))
            taken += 1
            spec = specs[index]
            return replace(spec, request_id=f"{spec.request_id}{_REUSED}{lap}") if lap else spec

        async def stream_slot() -> None:
            # The first request of a slot has no schedule (all slots start together and go out
            # one after another); every later one is due the moment the previous one ended.
            scheduled: int | None = None
            while (spec := next_spec()) is not None:
                record = await self.client.stream(spec, scheduled_send_ns=scheduled)
                records.append(record)
                self._count_stall(record)
                scheduled = record.t_done_ns

        if specs:
            await asyncio.gather(*(stream_slot() for _ in range(max(1, plan.slots))))
        return records

    async def _open_loop(self, plan: _ProcessPlan, start_ns: int) -> list[RequestRecord]:
        assert plan.arrivals_s is not None
        semaphore = asyncio.Semaphore(plan.slots) if plan.slots > 0 else None
        tasks: list[asyncio.Task[RequestRecord]] = []

        async def send(spec: RequestSpec, due_ns: int) -> RequestRecord:
            if semaphore is None:
                record = await self.client.stream(spec, scheduled_send_ns=due_ns)
            else:
                async with semaphore:
                    # Waiting for a free slot is the cap working, not the client lagging.
                    scheduled = max(due_ns, time.perf_counter_ns())
                    record = await self.client.stream(spec, scheduled_send_ns=scheduled)
            self._count_stall(record)
            return record

        for spec, offset_s in zip(plan.specs, plan.arrivals_s):
            due_ns = start_ns + int(offset_s * 1e9)
            # Loop timers have ms resolution and may fire a little early: never send early.
            while (wait_ns := due_ns - time.perf_counter_ns()) > 0:
                await asyncio.sleep(wait_ns / 1e9)
            tasks.append(asyncio.create_task(send(spec, due_ns)))
        return list(await asyncio.gather(*tasks))

    async def close(self) -> None:
        await self.client.aclose()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    # uvloop's loop iteration is cheaper (more CPU left at 128 streams, and send stamps and
    # reads less late); plain asyncio works too.
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def _worker_main(connection: Any, config: _EngineConfig) -> None:
    """Entry point of a client worker process: run the plans it is sent until told to stop."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            engine = _Engine(config)
            connection.send(("ready", None))
            while True:
                message = connection.recv()
                if message[0] == "stop":
                    break
                connection.send(("done", runner.run(engine.execute(message[1]))))
            runner.run(engine.close())
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("error", traceback.format_exc()))


class _WorkerPool:
    """Client worker processes (multiprocessing, spawn), each with its own event loop."""

    def __init__(self, configs: Sequence[_EngineConfig]) -> None:
        context = multiprocessing.get_context("spawn")
        self._workers: list[tuple[Any, Any]] = []
        try:
            for config in configs:
                parent, child = context.Pipe()
                process = context.Process(target=_worker_main, args=(child, config),
                                          name="kimiperf-client", daemon=True)
                process.start()
                child.close()
                self._workers.append((process, parent))
            for _, parent in self._workers:
                self._receive(parent, _WORKER_READY_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _receive(self, parent: Any, timeout_s: float) -> Any:
        if not parent.poll(timeout_s):
            raise KimiperfError(f"a client worker process gave no answer within {timeout_s:g} s")
        try:
            kind, payload = parent.recv()
        except EOFError:
            raise KimiperfError("a client worker process died") from None
        if kind == "error":
            raise KimiperfError(f"a client worker process failed:\n{payload}")
        return payload

    def execute(self, plans: Sequence[_ProcessPlan], timeout_s: float) -> list[tuple[list[RequestRecord], ProcessHealth]]:
        for (_, parent), plan in zip(self._workers, plans):
            parent.send(("run", plan))
        return [self._receive(parent, timeout_s) for _, parent in self._workers]

    def close(self) -> None:
        for process, parent in self._workers:
            try:
                parent.send(("stop", None))
            except (OSError, ValueError):
                pass
        for process, parent in self._workers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
            parent.close()
        self._workers = []


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class _Prepared:
    warmup: tuple[RequestSpec, ...]
    rounds: tuple[tuple[RequestSpec, ...], ...]
    cycle: bool
    next_index: int
    notes: tuple[str, ...]


def _prepare(
    base_url: str, model: str, scenario: Scenario, *, rounds: int, first_index: int,
    endpoint: str, api_key: str | None,
) -> _Prepared:
    warmup_n = scenario.effective_warmup_requests
    cycle = False
    if isinstance(scenario, RequestRate):
        per_round = [len(scenario.arrival_offsets_s(k)) for k in range(rounds)]
    elif scenario.requests is not None:
        per_round = [scenario.requests] * rounds
    else:
        per_round = [min(_SECONDS_BUDGET_PROMPTS, _MAX_DISTINCT_PROMPTS)] * rounds
        cycle = True
    total = warmup_n + sum(per_round)
    distinct = min(total, _MAX_DISTINCT_PROMPTS)
    specs = build_requests(
        base_url, model, scenario.workload, distinct, endpoint=endpoint, api_key=api_key,
        first_index=first_index, id_prefix=scenario.scenario_name,
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
                spec = replace(spec, request_id=f"{spec.request_id}{_REUSED}{lap_tag}{i // distinct}")
            out.append(spec)
        return tuple(out)

    warmup = take(0, warmup_n, "w")
    position = warmup_n
    round_specs = []
    for k, count in enumerate(per_round):
        round_specs.append(take(position, count, f"r{k}"))
        position += count
    return _Prepared(warmup, tuple(round_specs), cycle, first_index + distinct, tuple(notes))


def _split(count: int, parts: int) -> list[int]:
    base, extra = divmod(count, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _plans(scenario: Scenario, specs: Sequence[RequestSpec], *, round_index: int | None,
           cycle: bool, processes: int) -> list[_ProcessPlan]:
    """One round's (or the warm-up's, round_index None) work, split over the processes."""
    if isinstance(scenario, RequestRate) and round_index is not None:
        offsets = scenario.arrival_offsets_s(round_index)
        cap = scenario.max_concurrency
        caps = _split(cap, processes) if cap is not None else [0] * processes
        return [
            _ProcessPlan(
                specs=tuple(specs[p::processes]), slots=caps[p],
                arrivals_s=tuple(offsets[p::processes]), seconds=None, cycle=False,
            )
            for p in range(processes)
        ]
    streams = scenario.streams
    if round_index is None and isinstance(scenario, RequestRate):
        streams = min(scenario.streams, max(1, len(specs)))
    slots = _split(streams, processes)
    counts = _split(len(specs), processes)
    plans = []
    start = 0
    for p in range(processes):
        share = tuple(specs[start:start + counts[p]])
        start += counts[p]
        plans.append(_ProcessPlan(
            specs=share, slots=slots[p], arrivals_s=None,
            seconds=scenario.seconds if round_index is not None else None,
            cycle=cycle and round_index is not None,
        ))
    return plans


def _round_result(start_ns: int, outcomes: Sequence[tuple[list[RequestRecord], ProcessHealth]]) -> RoundResult:
    records = tuple(sorted((r for recs, _ in outcomes for r in recs), key=lambda r: r.t_send_ns))
    end_ns = max((r.t_done_ns for r in records), default=start_ns)
    return RoundResult(records=records, wall_s=max(0.0, (end_ns - start_ns) / 1e9),
                       health=tuple(h for _, h in outcomes))


# --------------------------------------------------------------------------- running


def _engine_configs(base_url: str, model: str, scenario: Scenario, *, endpoint: str,
                    api_key: str | None, extra_body: Mapping[str, Any] | None) -> list[_EngineConfig]:
    return [
        _EngineConfig(
            base_url=base_url, model=model, endpoint=endpoint, api_key=api_key,
            extra_body=dict(extra_body or {}), request_timeout_s=scenario.request_timeout_s,
            max_connections=max(1, slots), first_token_deadline_s=scenario.bounds.first_token_deadline_s,
            idle_deadline_s=scenario.bounds.idle_deadline_s,
        )
        for slots in _split(scenario.streams, scenario.client_processes)
    ]


def _check_call(base_url: str, model: object, scenario: object, endpoint: str) -> None:
    parse_base_url(base_url)
    check_endpoint(endpoint)
    if not isinstance(model, str) or not model:
        raise ConfigError(f"model={model!r}: must be the served model's name")
    if isinstance(scenario, ConcurrencySweep):
        raise ConfigError("a ConcurrencySweep runs with run_sweep(), one RunResult per concurrency")
    if not isinstance(scenario, (SingleStream, Concurrency, RequestRate)):
        raise ConfigError(
            f"scenario {scenario!r}: must be a SingleStream, Concurrency or RequestRate"
        )


class _ServerWatch:
    """Reads the server's /metrics after the warm-up and after the last round."""

    def __init__(self, base_url: str, model: str, api_key: str | None, enabled: bool) -> None:
        self._base_url = base_url
        self._model = model
        self._api_key = api_key
        self._enabled = enabled
        self._before: Snapshot | None = None
        self.view: dict[str, Any] | None = None
        self.note = ""

    def _read(self) -> Snapshot | None:
        try:
            return fetch_snapshot(self._base_url, model=self._model, api_key=self._api_key)
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


def _stamped(plans: Sequence[_ProcessPlan], margin_ns: int) -> tuple[int, list[_ProcessPlan]]:
    """The plans with a common start time ``margin_ns`` from now."""
    start_ns = time.perf_counter_ns() + margin_ns
    return start_ns, [replace(plan, start_ns=start_ns) for plan in plans]


async def _play_in_loop(config: _EngineConfig, scenario: Scenario, prepared: _Prepared,
                        watch: _ServerWatch) -> list[RoundResult]:
    """Warm-up and rounds on the running loop, one connection pool throughout."""
    engine = _Engine(config)
    results: list[RoundResult] = []
    try:
        if prepared.warmup:
            warmup = _plans(scenario, prepared.warmup, round_index=None, cycle=False, processes=1)
            await engine.execute(_stamped(warmup, 0)[1][0])
        await asyncio.to_thread(watch.before)
        for k, specs in enumerate(prepared.rounds):
            plans = _plans(scenario, specs, round_index=k, cycle=prepared.cycle, processes=1)
            start_ns, stamped = _stamped(plans, 0)
            results.append(_round_result(start_ns, [await engine.execute(stamped[0])]))
        await asyncio.to_thread(watch.after)
    finally:
        await engine.close()
    return results


def _play_in_workers(configs: Sequence[_EngineConfig], scenario: Scenario, prepared: _Prepared,
                     watch: _ServerWatch) -> list[RoundResult]:
    """Warm-up and rounds spread over worker processes that start each round together."""
    processes = len(configs)
    timeout_s = scenario.request_timeout_s + (scenario.seconds or 0.0) + 60.0
    if isinstance(scenario, RequestRate):
        timeout_s += max((max(scenario.arrival_offsets_s(k), default=0.0)
                          for k in range(len(prepared.rounds))), default=0.0)
    results: list[RoundResult] = []
    pool = _WorkerPool(configs)
    try:
        if prepared.warmup:
            warmup = _plans(scenario, prepared.warmup, round_index=None, cycle=False, processes=processes)
            pool.execute(_stamped(warmup, _START_MARGIN_NS)[1], timeout_s)
        watch.before()
        for k, specs in enumerate(prepared.rounds):
            plans = _plans(scenario, specs, round_index=k, cycle=prepared.cycle, processes=processes)
            start_ns, stamped = _stamped(plans, _START_MARGIN_NS)
            results.append(_round_result(start_ns, pool.execute(stamped, timeout_s)))
        watch.after()
    finally:
        pool.close()
    return results


def reused_prompt_requests(records: Iterable[RequestRecord]) -> int:
    """How many of ``records`` re-sent a prompt their run had already sent (a cycled budget)."""
    return sum(1 for r in records if _REUSED in r.request_id)


def load_facts(scenario: Scenario) -> dict[str, Any]:
    """The offered load of ``scenario`` in ``vllm bench serve``'s terms.

    A closed loop of N streams is bench serve's ``--request-rate inf --max-concurrency N``; a
    Poisson request rate is ``--burstiness 1.0``; an unlimited rate is the string "inf", as bench
    serve writes it. Evenly spaced arrivals have no finite gamma
    shape in bench serve, so their burstiness is None.
    """
    facts: dict[str, Any] = {
        "kind": "single-stream", "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1,
        "prompt_tokens": scenario.prompt_tokens, "output_tokens": scenario.output_tokens,
    }
    if isinstance(scenario, Concurrency):
        facts.update(kind="concurrency", max_concurrency=scenario.concurrency)
    elif isinstance(scenario, RequestRate):
        facts.update(kind="request-rate", request_rate=float(scenario.rate_per_s),
                     burstiness=1.0 if scenario.arrivals == "poisson" else None,
                     max_concurrency=scenario.max_concurrency)
    return facts


def _with_load(result: RunResult, scenario: Scenario, endpoint: str, base_url: str) -> RunResult:
    """``result`` with its load facts, and how its chunks were timed."""
    https = parse_base_url(base_url).scheme == "https"
    notes = result.notes + ((EVENT_LOOP_TIMING,) if https and EVENT_LOOP_TIMING not in result.notes else ())
    timing = "event-loop" if https else "kernel"
    return replace(result, notes=notes, load={**load_facts(scenario), "endpoint": endpoint, "timing": timing})


def _result(scenario: Scenario, prepared: _Prepared, rounds: Sequence[RoundResult],
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


def _run(base_url: str, model: str, scenario: Scenario, *, rounds: int, first_index: int,
         endpoint: str, api_key: str | None, extra_body: Mapping[str, Any] | None,
         server_metrics: bool) -> RunResult:
    prepared = _prepare(base_url, model, scenario, rounds=rounds, first_index=first_index,
                        endpoint=endpoint, api_key=api_key)
    configs = _engine_configs(base_url, model, scenario, endpoint=endpoint, api_key=api_key,
                              extra_body=extra_body)
    watch = _ServerWatch(base_url, model, api_key, server_metrics)
    try:
        if len(configs) == 1:
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                results = runner.run(_play_in_loop(configs[0], scenario, prepared, watch))
        else:
            results = _play_in_workers(configs, scenario, prepared, watch)
    except ScenarioStalled as stall:
        raise ServerError(_stall_verdict(str(stall), base_url, api_key)) from None
    except KimiperfError as error:
        if STALL_PREFIX not in str(error):  # a worker process's ScenarioStalled, as its traceback
            raise
        line = next(ln for ln in str(error).splitlines() if STALL_PREFIX in ln)
        raise ServerError(_stall_verdict(line.partition("ScenarioStalled: ")[2] or line, base_url, api_key)) from None
    return _with_load(_result(scenario, prepared, results, watch), scenario, endpoint, base_url)


def _stall_verdict(stall: str, base_url: str, api_key: str | None) -> str:
    """The stall and what the server's /health says now (alive but wedged, or gone)."""
    from pytest_kimiperf.server.process import check_health

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    why = check_health(base_url, headers, timeout_s=10.0)
    state = "still answers /health 200 but stopped streaming" if why is None else why
    return f"the scenario was aborted: {stall}; the server {state}"


# A request that stalled (client.StreamingClient deadlines) fails with an error that starts so.
STALL_PREFIX = "stalled: "
# Stalls in a row that end a scenario: one stall can be a hiccup, three in a row is a server
# that stopped serving, and every further request would only add its deadline to the run.
STALLS_TO_ABORT = 3


class ScenarioStalled(KimiperfError):
    """Requests stalled ``STALLS_TO_ABORT`` times in a row: the scenario is given up."""


def _check_no_running_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise ConfigError(f"{what} runs its own event loop; from async code use run_scenario_async()")


def run_scenario(
    base_url: str,
    model: str,
    scenario: Scenario,
    *,
    api_key: str | None = None,
    endpoint: str = "completions",
    extra_body: Mapping[str, Any] | None = None,
    server_metrics: bool = True,
) -> RunResult:
    """Play ``scenario`` against the OpenAI-compatible server at ``base_url`` and measure it.

    Scripts that use ``client_processes > 1`` must guard their entry point with
    ``if __name__ == "__main__":`` (workers are spawned and re-import the main module).
    """
    _check_call(base_url, model, scenario, endpoint)
    _check_no_running_loop("run_scenario()")
    return _run(base_url, model, scenario, rounds=scenario.rounds, first_index=0,
                endpoint=endpoint, api_key=api_key, extra_body=extra_body,
                server_metrics=server_metrics)


def run_sweep(
    base_url: str,
    model: str,
    sweep: ConcurrencySweep,
    *,
    api_key: str | None = None,
    endpoint: str = "completions",
    extra_body: Mapping[str, Any] | None = None,
    server_metrics: bool = True,
) -> list[RunResult]:
    """Play every concurrency of ``sweep``, lowest first; one RunResult each."""
    if not isinstance(sweep, ConcurrencySweep):
        raise ConfigError(f"run_sweep() takes a ConcurrencySweep, got {sweep!r}")
    return [
        run_scenario(base_url, model, scenario, api_key=api_key, endpoint=endpoint,
                     extra_body=extra_body, server_metrics=server_metrics)
        for scenario in sorted(sweep.scenarios(), key=lambda s: s.concurrency)
    ]


def extend(
    base_url: str,
    model: str,
    scenario: Scenario,
    previous: RunResult,
    *,
    rounds: int = 1,
    api_key: str | None = None,
    endpoint: str = "completions",
    extra_body: Mapping[str, Any] | None = None,
    server_metrics: bool = True,
) -> RunResult:
    """``previous`` plus up to ``rounds`` more rounds (fresh prompts), capped at ``max_rounds``."""
    _check_call(base_url, model, scenario, endpoint)
    _check_no_running_loop("extend()")
    _positive_int("extend", "rounds", rounds)
    if previous.scenario_name != scenario.scenario_name:
        raise ConfigError(
            f"extend(): the previous run is of scenario {previous.scenario_name!r}, not "
            f"{scenario.scenario_name!r}"
        )
    allowed = scenario.max_rounds - len(previous.rounds)
    if allowed <= 0:
        note = f"max_rounds={scenario.max_rounds} reached: extend() added nothing"
        return replace(previous, notes=previous.notes + ((note,) if note not in previous.notes else ()))
    more = _run(base_url, model, scenario, rounds=min(rounds, allowed),
                first_index=previous.next_request_index, endpoint=endpoint, api_key=api_key,
                extra_body=extra_body, server_metrics=server_metrics)
    return merge_rounds(previous, more)


async def run_scenario_async(
    base_url: str,
    model: str,
    scenario: Scenario,
    *,
    api_key: str | None = None,
    endpoint: str = "completions",
    extra_body: Mapping[str, Any] | None = None,
    server_metrics: bool = True,
) -> RunResult:
    """``run_scenario`` on the caller's running loop (one client process only)."""
    _check_call(base_url, model, scenario, endpoint)
    if scenario.client_processes != 1:
        raise ConfigError("run_scenario_async() runs in the caller's loop: client_processes must be 1")
    prepared = await asyncio.to_thread(
        _prepare, base_url, model, scenario, rounds=scenario.rounds, first_index=0,
        endpoint=endpoint, api_key=api_key,
    )
    config = _engine_configs(base_url, model, scenario, endpoint=endpoint, api_key=api_key,
                             extra_body=extra_body)[0]
    watch = _ServerWatch(base_url, model, api_key, server_metrics)
    result = _result(scenario, prepared, await _play_in_loop(config, scenario, prepared, watch), watch)
    return _with_load(result, scenario, endpoint, base_url)
