"""What one client process runs: an event loop, one connection pool, and the self-check.

Every request of a :class:`ProcessPlan` (its share of one round) goes through one
``StreamingClient``. While it plays, the loop probe times how late the loop runs a callback and
the process's CPU share is taken (config.deployments.HealthBounds), the measured part runs on the
CPUs the plan places it on (placement.py), and the garbage collector is held off.
:class:`WorkerPool` runs one Engine per worker process when ``client_processes`` spreads the
streams; their ``perf_counter_ns`` stamps (CLOCK_MONOTONIC) are system-wide on Linux, so records
merge. One process handled 128 streams x 200 tok/s (25,600 chunks/s) at ~0.3 of a core on the
2-core CI machine (benchmarks/client_accuracy.py).
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.measure.client import RequestSpec, StreamingClient
from pytest_kimiperf.measure.loop_probe import LoopProbe, host_idle_loop_latency_ms
from pytest_kimiperf.measure.placement import placed
from pytest_kimiperf.measure.results import ProcessHealth, RequestRecord
from pytest_kimiperf.measure.workload import REUSED_MARK

# The engine: one round's requests on one event loop, one per client process.
_WORKER_READY_TIMEOUT_S = 120.0
# Stalls in a row that end a scenario: one stall can be a hiccup, three in a row is a server
# that stopped serving, and every further request would only add its deadline to the run.
STALLS_TO_ABORT = 3


class ScenarioStalled(KimiperfError):
    """Requests stalled ``STALLS_TO_ABORT`` times in a row: the scenario is given up."""


@dataclass(frozen=True)
class EngineConfig:
    """What one process's client is built from (picklable: it travels to worker processes)."""

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
class ProcessPlan:
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
    # The CPUs the measured part runs on (placement.Placement.client_cpus; empty: not placed).
    client_cpus: frozenset[int] = frozenset()


class Engine:
    """Runs plans on one event loop with one connection pool."""

    def __init__(self, config: EngineConfig) -> None:
        self.client = StreamingClient(
            config.base_url, config.model, endpoint=config.endpoint, api_key=config.api_key,
            max_connections=config.max_connections, request_timeout_s=config.request_timeout_s,
            extra_body=config.extra_body, first_token_deadline_s=config.first_token_deadline_s,
            idle_deadline_s=config.idle_deadline_s,
        )
        self._stalls_in_a_row = 0

    def _count_stall(self, record: RequestRecord) -> None:
        """Raise ScenarioStalled once ``STALLS_TO_ABORT`` requests in a row have stalled."""
        if not record.stalled:
            self._stalls_in_a_row = 0
            return
        self._stalls_in_a_row += 1
        if self._stalls_in_a_row >= STALLS_TO_ABORT:
            raise ScenarioStalled(f"{STALLS_TO_ABORT} requests in a row stalled; the last: {record.error}")

    async def execute(self, plan: ProcessPlan) -> tuple[list[RequestRecord], ProcessHealth]:
        """Play ``plan`` from its start time: its records, and how healthy the process was."""
        # A collection is a pause of the loop; the hot path makes no reference cycles, so hold
        # the collector off while measuring (bench serve freezes its heap for the same reason).
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            idle = await asyncio.to_thread(host_idle_loop_latency_ms, tuple(sorted(plan.client_cpus)))
            delay_s = (plan.start_ns - time.perf_counter_ns()) / 1e9
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            with placed(plan.client_cpus):
                probe = LoopProbe(asyncio.get_running_loop())
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
        return records, ProcessHealth(cpu_fraction, tuple(probe.latencies_ms), wall_s, idle,
                                      tuple(sorted(plan.client_cpus)), tuple(probe.holds_ns))

    async def _closed_loop(self, plan: ProcessPlan, start_ns: int) -> list[RequestRecord]:
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
            return replace(spec, request_id=f"{spec.request_id}{REUSED_MARK}{lap}") if lap else spec

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

    async def _open_loop(self, plan: ProcessPlan, start_ns: int) -> list[RequestRecord]:
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


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop the client runs on: uvloop's when installed."""
    # uvloop's loop iteration is cheaper (more CPU left at 128 streams, and send stamps and
    # reads less late); plain asyncio works too.
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def _worker_main(connection: Any, config: EngineConfig) -> None:
    """Entry point of a client worker process: run the plans it is sent until told to stop."""
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            engine = Engine(config)
            connection.send(("ready", None))
            while True:
                message = connection.recv()
                if message[0] == "stop":
                    break
                connection.send(("done", runner.run(engine.execute(message[1]))))
            runner.run(engine.close())
    except ScenarioStalled as stall:  # a finding, not a crash: the parent raises it as such
        connection.send(("stalled", str(stall)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        connection.send(("error", traceback.format_exc()))


class WorkerPool:
    """Client worker processes (multiprocessing, spawn), each with its own event loop."""

    def __init__(self, configs: Sequence[EngineConfig]) -> None:
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
        if kind == "stalled":
            raise ScenarioStalled(payload)
        if kind == "error":
            raise KimiperfError(f"a client worker process failed:\n{payload}")
        return payload

    def execute(self, plans: Sequence[ProcessPlan], timeout_s: float) -> list[tuple[list[RequestRecord], ProcessHealth]]:
        for (_, parent), plan in zip(self._workers, plans):
            parent.send(("run", plan))
        return [self._receive(parent, timeout_s) for _, parent in self._workers]

    def close(self) -> None:
        for _process, parent in self._workers:
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
