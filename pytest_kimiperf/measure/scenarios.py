"""Load patterns: what a perf test asks the runner to play, and their validation.

A scenario is a frozen dataclass: the request shape (prompt and output tokens, seed), a budget
per round (requests, seconds, or both: whichever ends first), how many rounds, and warm-up
requests that run first and are never counted. A load of many streams defaults to
``MIN_SAMPLES_PER_BOOT`` rounds: its throughputs are one sample per round, and a boot's needs
that many to count (``perf.check`` refuses fewer). The load patterns:

* :class:`SingleStream`: one request at a time (decode speed as one user sees it).
* :class:`Concurrency`: ``concurrency`` streams, each sending its next request when the last ends.
* :class:`RequestRate`: open loop, Poisson (seeded) or evenly spaced arrivals at ``rate_per_s``,
  optionally capped at ``max_concurrency`` in flight.
* :class:`ConcurrencySweep`: the same workload at several concurrencies (``runner.run_sweep``).

``runner.run_scenario`` plays one against a server (``target.Target``); ``load_facts`` says
what load a scenario offers in ``vllm bench serve``'s terms.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT
from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.measure_bounds import HealthBounds
from pytest_kimiperf.measure.workload import Workload
from pytest_kimiperf.numbers import positive_int, positive_number

_ARRIVALS = ("poisson", "constant")
# Connection-pool size of a request rate without max_concurrency (connections open on demand).
_UNCAPPED_STREAMS = 4096
# The load kind of one stream, one request at a time (load_facts' "kind"): what single-stream
# decode figures (the floor, the roofline) are measured under.
SINGLE_STREAM = "single-stream"


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
    seed: int = 0
    client_processes: int = 1
    name: str | None = None
    bounds: HealthBounds = field(default_factory=HealthBounds)
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        Workload(self.prompt_tokens, self.output_tokens, self.seed)
        positive_int(self.requests, what=f"{owner}.requests", allow_none=True)
        positive_number(self.seconds, what=f"{owner}.seconds", allow_none=True)
        if self.requests is None and self.seconds is None:
            raise ConfigError(f"{owner}: give a budget per round: requests=N, seconds=S, or both")
        positive_int(self.rounds, what=f"{owner}.rounds")
        if self.warmup_requests is not None and (
            not isinstance(self.warmup_requests, int) or isinstance(self.warmup_requests, bool)
            or self.warmup_requests < 0
        ):
            raise ConfigError(f"{owner}.warmup_requests={self.warmup_requests!r}: must be an integer >= 0 or None")
        positive_int(self.client_processes, what=f"{owner}.client_processes")
        positive_number(self.request_timeout_s, what=f"{owner}.request_timeout_s")
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
        return SINGLE_STREAM


@dataclass(frozen=True, kw_only=True)
class Concurrency(Scenario):
    """``concurrency`` closed-loop streams: each sends its next request when its last one ends."""

    concurrency: int
    # Its throughputs are one sample per round: by default enough rounds for a verdict.
    rounds: int = MIN_SAMPLES_PER_BOOT

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int(self.concurrency, what="Concurrency.concurrency")
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
    # Its throughputs are one sample per round: by default enough rounds for a verdict.
    rounds: int = MIN_SAMPLES_PER_BOOT
    arrivals: str = "poisson"
    # Cap on requests in flight; a request over the cap waits (bench serve's --max-concurrency).
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_number(self.rate_per_s, what="RequestRate.rate_per_s")
        if self.arrivals not in _ARRIVALS:
            raise ConfigError(
                f"RequestRate.arrivals={self.arrivals!r}: use one of {', '.join(_ARRIVALS)}"
            )
        positive_int(self.max_concurrency, what="RequestRate.max_concurrency", allow_none=True)
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
    # Its throughputs are one sample per round: by default enough rounds for a verdict.
    rounds: int = MIN_SAMPLES_PER_BOOT

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.concurrencies, tuple) or not self.concurrencies:
            raise ConfigError(
                f"ConcurrencySweep.concurrencies={self.concurrencies!r}: must be a non-empty tuple"
            )
        for value in self.concurrencies:
            positive_int(value, what="ConcurrencySweep.concurrencies[]")

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
                warmup_requests=self.warmup_requests, seed=self.seed,
                client_processes=min(self.client_processes, n), bounds=self.bounds,
                request_timeout_s=self.request_timeout_s, name=f"{self.scenario_name}-c{n}",
                concurrency=n,
            )
            for n in self.concurrencies
        )


def load_facts(scenario: Scenario) -> dict[str, Any]:
    """The offered load of ``scenario`` in ``vllm bench serve``'s terms.

    A closed loop of N streams is bench serve's ``--request-rate inf --max-concurrency N``; a
    Poisson request rate is ``--burstiness 1.0``; an unlimited rate is the string "inf", as bench
    serve writes it. Evenly spaced arrivals have no finite gamma
    shape in bench serve, so their burstiness is None.
    """
    facts: dict[str, Any] = {
        "kind": SINGLE_STREAM, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1,
        "prompt_tokens": scenario.prompt_tokens, "output_tokens": scenario.output_tokens,
    }
    if isinstance(scenario, Concurrency):
        facts.update(kind="concurrency", max_concurrency=scenario.concurrency)
    elif isinstance(scenario, RequestRate):
        facts.update(kind="request-rate", request_rate=float(scenario.rate_per_s),
                     burstiness=1.0 if scenario.arrivals == "poisson" else None,
                     max_concurrency=scenario.max_concurrency)
    return facts

