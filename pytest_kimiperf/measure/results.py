"""A run's measured figures, request by request and round by round (pure: no I/O, no pytest).

A run that cannot be judged says why as facts (:data:`RunInvalid`: no request measured, none
valid, or a client that limited the load; a busy host is ``runner``'s); decisions read them
(``RunResult.valid`` is ``invalid is None``), they travel as JSON (:func:`invalid_to_json`), and
``reports/sentences.py`` words them. Every figure is summarized with :func:`percentile` (numpy's
default method).
The module imports nothing that reads the host, so the judge can import it.

**Per-request figures.** TTFT, E2EL, ITL, TPOT and decode tok/s follow vLLM's ``bench serve``
(vllm/benchmarks/serve.py ``calculate_metrics`` and vllm/benchmarks/lib/endpoint_request_func.py),
so numbers line up with what vLLM users know:

* TTFT: request sent -> first chunk that carries choices.
* E2EL: request sent -> last chunk that carries choices (the trailing usage chunk is not a token).
* ITL: gaps between consecutive chunks that carry choices (a chunk may hold several tokens).
* TPOT: (E2EL - TTFT) / (output_tokens - 1), output_tokens from ``usage.completion_tokens``.
* decode tok/s (ours): (output_tokens - 1) / (last chunk - first chunk): the decode rate one
  stream sees, excluding prefill. It is ``1000 / TPOT`` when the first chunk holds one token.

**Samples.** One sample is one valid request for per-request metrics (``itl_ms``: that request's
median gap, so a long request does not weigh more than a short one) and one round for run-level
metrics (throughputs). The p50/p90/p99 of ``itl_ms`` pool every gap of every valid request, as
bench serve does.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT, SampleKind, metric_spec, metrics_of
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.measure import coverage as reads
from pytest_kimiperf.measure.coverage import NO_HOLDS, Coverage, Holds, Withheld

# Why a run's own figures cannot be judged: typed reasons (reports/sentences.py words them).


@dataclass(frozen=True)
class NoMeasuredRequests:
    """The run measured no request at all."""


@dataclass(frozen=True)
class NoValidRequest:
    """Every measured request failed; ``first_reason`` is the commonest reason."""

    invalid: int
    first_reason: str


@dataclass(frozen=True)
class ClientCpu:
    """A client process ran a core past its bound."""

    worst_fraction: float
    bound: float


@dataclass(frozen=True)
class LoopLatency:
    """The client's event loop ran callbacks late, so its chunk timestamps are stale.
    ``idle_p50_ms``/``idle_p99_ms``: what the same probe read with the loop idle on this host
    (None where it was not read), which raised the bounds (:func:`loop_latency_bounds`)."""

    p50_ms: float
    p99_ms: float
    bound_p50_ms: float
    bound_p99_ms: float
    idle_p50_ms: float | None = None
    idle_p99_ms: float | None = None


@dataclass(frozen=True)
class SendLag:
    """Requests went out later than their schedule."""

    p99_ms: float
    bound_ms: float


ClientProblem = ClientCpu | LoopLatency | SendLag


@dataclass(frozen=True)
class ClientBound:
    """The load generator, not the server, limited the run: each bound it broke."""

    problems: tuple[ClientProblem, ...]


@dataclass(frozen=True)
class FigureLoss:
    """One figure that lost more than its bound of the window's requests to the client's holds:
    ``lost`` of ``sent``, by reason (coverage.Withheld value -> count)."""

    figure: str
    lost: int
    sent: int
    reasons: tuple[tuple[str, int], ...]
    unit: str = "requests"


@dataclass(frozen=True)
class Unmeasured:
    """Figures a window could not measure for too many of its requests because the client was
    held off the CPU (its loop ran up to ``loop_max_ms`` late) while their stamps were taken,
    and the bound. Only the client's holds count: what the server did is measured."""

    losses: tuple[FigureLoss, ...]
    bound: float
    loop_max_ms: float | None = None


RunInvalid = NoMeasuredRequests | NoValidRequest | ClientBound | Unmeasured


def invalid_to_json(reason: RunInvalid | None) -> dict[str, Any] | None:
    """``reason`` as JSON-ready facts, its kind first (None stays None): how a run's reason
    crosses from an xdist worker to the controller, where reports/ words it."""
    match reason:
        case None:
            return None
        case NoMeasuredRequests():
            return {"kind": "no-measured-requests"}
        case NoValidRequest(invalid, first):
            return {"kind": "no-valid-request", "invalid": invalid, "first_reason": first}
        case ClientBound(problems):
            return {"kind": "client-bound", "problems": [_problem_to_json(p) for p in problems]}
        case Unmeasured(losses, bound, loop_max):
            return {"kind": "unmeasured", "bound": bound, "loop_max_ms": loop_max,
                    "losses": [{"figure": loss.figure, "lost": loss.lost, "sent": loss.sent,
                                "reasons": [list(r) for r in loss.reasons], "unit": loss.unit} for loss in losses]}
        case _:
            assert_never(reason)


def invalid_from_json(data: Mapping[str, Any] | None) -> RunInvalid | None:
    """Inverse of :func:`invalid_to_json`."""
    if data is None:
        return None
    match data["kind"]:
        case "no-measured-requests":
            return NoMeasuredRequests()
        case "no-valid-request":
            return NoValidRequest(int(data["invalid"]), str(data["first_reason"]))
        case "client-bound":
            return ClientBound(tuple(_problem_from_json(p) for p in data["problems"]))
        case "unmeasured":
            losses = tuple(FigureLoss(str(loss["figure"]), int(loss["lost"]), int(loss["sent"]),
                                      tuple((str(r), int(n)) for r, n in loss["reasons"]), str(loss["unit"]))
                           for loss in data["losses"])
            return Unmeasured(losses, float(data["bound"]), data.get("loop_max_ms"))
        case kind:
            raise ValueError(f"unknown invalid-run kind {kind!r}")


def _problem_to_json(problem: ClientProblem) -> dict[str, Any]:
    kind = {ClientCpu: "client-cpu", LoopLatency: "loop-latency", SendLag: "send-lag"}[type(problem)]
    return {"kind": kind, **dataclasses.asdict(problem)}


def _problem_from_json(data: Mapping[str, Any]) -> ClientProblem:
    fields = {k: v for k, v in data.items() if k != "kind"}
    match data["kind"]:
        case "client-cpu":
            return ClientCpu(**fields)
        case "loop-latency":
            return LoopLatency(**fields)
        case "send-lag":
            return SendLag(**fields)
        case kind:
            raise ValueError(f"unknown client problem {kind!r}")


# One request's timeline and the per-request figures read from it.
PER_REQUEST_METRICS: tuple[str, ...] = metrics_of(SampleKind.REQUEST)

NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, as numpy's default method."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q!r} is outside 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


def median(values: Sequence[float]) -> float:
    """The median (the 50th percentile)."""
    return percentile(values, 50)


@dataclass(frozen=True)
class RequestRecord:
    """One request's timeline, in ``perf_counter_ns`` (CLOCK_MONOTONIC, comparable across processes)."""

    ok: bool
    error: str
    prompt_tokens: int
    output_tokens: int
    t_send_ns: int
    # Arrival of each chunk that carries choices, in order.
    chunk_ns: tuple[int, ...]
    t_done_ns: int
    # When the load pattern wanted it sent (None: no schedule, e.g. a lone test request).
    scheduled_send_ns: int | None = None
    request_id: str = ""
    # When the client started handling it (before building the HTTP request).
    t_start_ns: int = 0
    # The client gave up waiting for a token (its first-token or inter-chunk deadline): the
    # fact engine.py counts stalls in a row by; ``error`` says it in words.
    stalled: bool = False
    # When the call that put the request in the kernel returned (0: not known): the send went
    # out between t_send_ns and this.
    send_done_ns: int = 0
    # For each token chunk, when the read that brought it returned (user space; equal values are
    # one read, and a stamp equal to its read time is a fallback: no kernel stamp). Empty in a
    # record made before the plugin kept it: reads are then told apart by their stamps.
    chunk_read_ns: tuple[int, ...] = ()
    # usage.completion_tokens as each token chunk carried it (continuous_usage_stats): the
    # running count, so each chunk's last token is known. Empty: the server gave no counts.
    chunk_tokens: tuple[int, ...] = ()
    # Token chunks whose read went on to bring later bytes (their stamp is those bytes' arrival).
    followed: tuple[int, ...] = ()

    @property
    def ttft_ms(self) -> float | None:
        """Send -> first chunk carrying choices."""
        if not self.chunk_ns:
            return None
        return (self.chunk_ns[0] - self.t_send_ns) / NS_PER_MS

    @property
    def e2el_ms(self) -> float | None:
        """Send -> last chunk carrying choices."""
        if not self.chunk_ns:
            return None
        return (self.chunk_ns[-1] - self.t_send_ns) / NS_PER_MS

    @property
    def itl_ms(self) -> list[float]:
        """Gaps between consecutive chunks carrying choices."""
        chunks = self.chunk_ns
        return [(b - a) / NS_PER_MS for a, b in itertools.pairwise(chunks)]

    @property
    def median_itl_ms(self) -> float | None:
        """This request's median gap (its one ``itl_ms`` sample)."""
        gaps = self.itl_ms
        return median(gaps) if gaps else None

    @property
    def decode_tokens(self) -> int:
        """The tokens that arrived after the first chunk's: exact where the server counted each
        chunk's tokens (``chunk_tokens``), else ``output_tokens - 1`` as bench serve assumes
        (a first chunk of k tokens then moves decode by (N-1)/(N-k))."""
        if self.chunk_tokens:
            return self.chunk_tokens[-1] - self.chunk_tokens[0]
        return self.output_tokens - 1

    @property
    def tpot_ms(self) -> float | None:
        """(last chunk - first chunk) / the tokens after the first chunk: bench serve's
        (E2EL - TTFT) / (output_tokens - 1) where each chunk carried one token; None with fewer
        than two output tokens."""
        if self.output_tokens < 2 or not self.chunk_ns or self.decode_tokens < 1:
            return None
        return (self.chunk_ns[-1] - self.chunk_ns[0]) / NS_PER_MS / self.decode_tokens

    @property
    def decode_tok_s(self) -> float | None:
        """The tokens after the first chunk / (last chunk - first chunk); None when that span is empty."""
        if self.output_tokens < 2 or len(self.chunk_ns) < 2 or self.decode_tokens < 1:
            return None
        span_ns = self.chunk_ns[-1] - self.chunk_ns[0]
        if span_ns <= 0:
            return None
        return self.decode_tokens * _NS_PER_S / span_ns

    @property
    def tokens_per_chunk_max(self) -> int | None:
        """The most tokens one chunk carried (None: the server gave no counts)."""
        counts = self.chunk_tokens
        if not counts:
            return None
        return max(b - a for a, b in itertools.pairwise((0, *counts)))

    @property
    def send_lag_ms(self) -> float | None:
        """How late the request went out versus its schedule."""
        if self.scheduled_send_ns is None:
            return None
        return (self.t_send_ns - self.scheduled_send_ns) / NS_PER_MS

    def measured_itl_ms(self, holds: Holds = NO_HOLDS) -> list[float]:
        """The gaps whose two stamps hold, given the client's ``holds`` (coverage.true_gaps_ms)."""
        return reads.true_gaps_ms(self, reads.stamps(self, holds))

    def withheld(self, metric_name: str, holds: Holds = NO_HOLDS) -> Withheld | None:
        """Why this request gives no value of a per-request metric, given the client's ``holds``
        over its window (None: it gives one)."""
        return reads.withheld(metric_name, self, reads.stamps(self, holds))

    def value(self, metric_name: str, holds: Holds = NO_HOLDS) -> float | None:
        """This request's one sample of a per-request metric, given the client's ``holds`` over
        its window (None when it gives none: :meth:`withheld` says why)."""
        if metric_name not in PER_REQUEST_METRICS:
            raise ConfigError(
                f"{metric_name!r} is not a per-request metric; per-request metrics: "
                f"{', '.join(PER_REQUEST_METRICS)}"
            )
        if self.withheld(metric_name, holds) is not None:
            return None
        if metric_name == "itl_ms":
            return median(self.measured_itl_ms(holds))
        result: float | None = getattr(self, metric_name)
        return result

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        """Inverse of :meth:`to_json` (a run's ``requests`` in the JSON it travels as)."""
        scheduled = data.get("scheduled_send_ns")
        return cls(ok=bool(data["ok"]), error=str(data.get("error") or ""), prompt_tokens=int(data["prompt_tokens"]),
                   output_tokens=int(data["output_tokens"]), t_send_ns=int(data["t_send_ns"]),
                   chunk_ns=tuple(int(c) for c in data.get("chunk_ns") or ()), t_done_ns=int(data["t_done_ns"]),
                   scheduled_send_ns=None if scheduled is None else int(scheduled),
                   request_id=str(data.get("request_id") or ""), t_start_ns=int(data.get("t_start_ns") or 0),
                   stalled=bool(data.get("stalled")),
                   send_done_ns=int(data.get("send_done_ns") or 0),
                   chunk_read_ns=tuple(int(c) for c in data.get("chunk_read_ns") or ()),
                   chunk_tokens=tuple(int(c) for c in data.get("chunk_tokens") or ()),
                   followed=tuple(int(c) for c in data.get("followed") or ()))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (timestamps kept in ns)."""
        return {
            "ok": self.ok, "error": self.error, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, "t_send_ns": self.t_send_ns,
            "chunk_ns": list(self.chunk_ns), "t_done_ns": self.t_done_ns,
            "scheduled_send_ns": self.scheduled_send_ns, "request_id": self.request_id,
            "t_start_ns": self.t_start_ns, **({"stalled": True} if self.stalled else {}),
            "send_done_ns": self.send_done_ns,
            "chunk_read_ns": list(self.chunk_read_ns), "chunk_tokens": list(self.chunk_tokens),
            "followed": list(self.followed),
        }


# The run-level figures: rounds, goodput, the client's self-check and the run's JSON.
PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)

# The loop-latency bounds follow the host: never below this many times the latency the same
# probe reads with the loop idle on this host (ProcessHealth.idle_loop_latency_ms). A loop that
# keeps up adds the time of one callback batch to an idle wake; one that cannot keep up queues
# and its latency grows without bound, far past a few idle wakes.
HOST_LOOP_FACTOR = 4.0


def loop_latency_bounds(bounds: HealthBounds,
                        health: Sequence[ProcessHealth]) -> tuple[float, float, tuple[float, float] | None]:
    """The p50 and p99 loop-latency bounds in force (the deployment's, or HOST_LOOP_FACTOR times
    this host's idle loop, whichever is larger) and the idle loop's p50 and p99 (None: not read)."""
    idle = [x for h in health for x in h.idle_loop_latency_ms]
    if not idle:
        return bounds.max_loop_latency_p50_ms, bounds.max_loop_latency_p99_ms, None
    idle50, idle99 = percentile(idle, 50), percentile(idle, 99)
    bound50 = max(bounds.max_loop_latency_p50_ms, HOST_LOOP_FACTOR * idle50)
    bound99 = max(bounds.max_loop_latency_p99_ms, HOST_LOOP_FACTOR * idle99)
    return bound50, bound99, (idle50, idle99)


@dataclass(frozen=True)
class ProcessHealth:
    """What one client process saw of itself during one round."""

    cpu_fraction: float
    loop_latency_ms: tuple[float, ...]
    wall_s: float
    # The same probe with the process's loop idle, before its first round (engine.py).
    idle_loop_latency_ms: tuple[float, ...] = ()
    # The CPUs the process ran the round on (placement.py; empty: where the scheduler put it).
    cpus: tuple[int, ...] = ()
    # The stretches its loop may not have run (loop_probe.LoopProbe.holds_ns).
    loop_holds_ns: tuple[tuple[int, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with the loop-latency distribution summarized."""
        lat = self.loop_latency_ms
        return {
            "cpu_fraction": round(self.cpu_fraction, 4),
            "loop_latency_p50_ms": round(median(lat), 4) if lat else None,
            "loop_latency_p99_ms": round(percentile(lat, 99), 4) if lat else None,
            "loop_latency_max_ms": round(max(lat), 4) if lat else None,
            "idle_loop_latency_p50_ms": round(median(idle), 4) if (idle := self.idle_loop_latency_ms) else None,
            "idle_loop_latency_p99_ms": round(percentile(idle, 99), 4) if idle else None,
            "wall_s": round(self.wall_s, 4),
            "cpus": list(self.cpus),
            "loop_holds": len(self.loop_holds_ns),
        }


@dataclass(frozen=True)
class RoundResult:
    """One round: its requests (warm-up excluded), its wall time and its processes' health."""

    records: tuple[RequestRecord, ...]
    wall_s: float
    health: tuple[ProcessHealth, ...] = ()

    @property
    def valid_records(self) -> list[RequestRecord]:
        """The requests that count."""
        return [r for r in self.records if r.ok]

    @property
    def output_throughput(self) -> float:
        """Output tokens of valid requests per second of this round."""
        if self.wall_s <= 0:
            return 0.0
        return sum(r.output_tokens for r in self.valid_records) / self.wall_s

    @property
    def request_throughput(self) -> float:
        """Valid requests per second of this round."""
        if self.wall_s <= 0:
            return 0.0
        return len(self.valid_records) / self.wall_s

    def request_goodput(self, slo_ms: Mapping[str, float]) -> float:
        """Requests per second of this round that met every per-request SLO (vLLM bench serve's
        ``--goodput ttft:300 tpot:50``: a request counts only if each of its figures is within)."""
        if self.wall_s <= 0:
            return 0.0
        good = 0
        holds = Holds((stretch for h in self.health for stretch in h.loop_holds_ns),
                      ran_ns={t for r in self.records for t in r.chunk_read_ns})
        for r in self.valid_records:
            values = [r.value(metric, holds) for metric in slo_ms]
            if all(v is not None and v <= limit for v, limit in zip(values, slo_ms.values())):
                good += 1
        return good / self.wall_s


GOODPUT_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2el_ms")


def check_rounds(metrics: Sequence[str], rounds: int) -> None:
    """ConfigError unless a run of ``rounds`` rounds gives each per-round metric of ``metrics``
    (throughputs, goodput) the samples a boot needs for a verdict: one round is one sample."""
    short = [m for m in metrics if metric_spec(m).sample.per_round]
    if short and rounds < MIN_SAMPLES_PER_BOOT:
        raise ConfigError(
            f"{', '.join(short)} {'is' if len(short) == 1 else 'are'} one sample per round: this run has "
            f"{rounds} round{'s' * (rounds != 1)} and a boot needs {MIN_SAMPLES_PER_BOOT} for a verdict "
            f"(fewer would pass as 'insufficient samples' and gate nothing); measure it with "
            f"rounds={MIN_SAMPLES_PER_BOOT} or more")


def check_slo(limits: object, *, goodput: bool = False) -> dict[str, float]:
    """``perf.check``'s limits checked, each a finite number > 0; ConfigError naming what is wrong.

    ``slo={"p99_ttft_ms": 2000}`` limits any metric of the boot; ``goodput={"ttft_ms": 300}``
    limits each request, in ms, on the per-request metrics vLLM's goodput knows."""
    if not isinstance(limits, Mapping) or not limits:
        usage = ("give a mapping such as {'ttft_ms': 300, 'tpot_ms': 50}" if goodput
                 else "give a mapping of metric name to limit, e.g. {'p99_itl_ms': 60}")
        raise ConfigError(f"{'goodput' if goodput else 'slo'}={limits!r}: {usage}")
    checked: dict[str, float] = {}
    for name, limit in limits.items():
        if goodput:
            if name not in GOODPUT_METRICS:
                raise ConfigError(f"goodput SLO {name!r}: allowed are {', '.join(GOODPUT_METRICS)} (as vLLM's --goodput)")
        elif name == "request_goodput":
            raise ConfigError("slo: request_goodput is gated against its baseline; pass goodput={...} instead")
        else:
            metric_spec(name)  # ConfigError listing the known metrics
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
            what = "goodput SLO" if goodput else "slo"
            raise ConfigError(f"{what} {name} = {limit!r}: must be a number{' of ms' if goodput else ''} > 0")
        checked[name] = float(limit)
    return checked


@dataclass(frozen=True)
class RunResult:
    """A scenario's outcome: rounds of request records, the figures, and whether to trust them."""

    scenario_name: str
    rounds: tuple[RoundResult, ...]
    warmup_requests: int = 0
    bounds: HealthBounds = field(default_factory=HealthBounds)
    client_processes: int = 1
    notes: tuple[str, ...] = ()
    # Workload index of the next request (the runner deals prompts from it).
    next_request_index: int = 0
    # The server's own view (server_metrics.ServerView.to_json()), one per run or extension.
    server_metrics: tuple[Mapping[str, Any], ...] = ()
    # The offered load in bench serve's terms (workload.load_facts): what the exports need to
    # say which --max-concurrency / --request-rate this run stands for.
    load: Mapping[str, Any] = field(default_factory=dict)
    # Where the client ran its measured rounds and why (placement.Placement.to_json()).
    client_placement: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ records

    @property
    def records(self) -> list[RequestRecord]:
        """Every measured request (valid or not), warm-up excluded."""
        return [r for rnd in self.rounds for r in rnd.records]

    @property
    def valid_records(self) -> list[RequestRecord]:
        """The requests that count."""
        return [r for r in self.records if r.ok]

    @property
    def invalid_count(self) -> int:
        """How many measured requests were not counted."""
        return sum(1 for r in self.records if not r.ok)

    @property
    def invalid_reasons(self) -> dict[str, int]:
        """Why requests were not counted: reason -> how many."""
        return dict(Counter(r.error for r in self.records if not r.ok).most_common())

    @property
    def wall_s(self) -> float:
        """Measured wall time, all rounds together."""
        return sum(rnd.wall_s for rnd in self.rounds)

    @property
    def output_throughput(self) -> float:
        """Output tokens of valid requests per measured second, all rounds together."""
        wall = self.wall_s
        return sum(r.output_tokens for r in self.valid_records) / wall if wall > 0 else 0.0

    @property
    def request_throughput(self) -> float:
        """Valid requests per measured second, all rounds together."""
        wall = self.wall_s
        return len(self.valid_records) / wall if wall > 0 else 0.0

    # ------------------------------------------------------------------ samples

    def samples(self, metric_name: str) -> list[float]:
        """The samples of a metric: one per valid request, or one per round for throughputs."""
        spec = metric_spec(metric_name)
        if spec.sample is SampleKind.GOODPUT:
            raise ConfigError(f"{metric_name} needs its SLOs: perf.check(run, [...], goodput={{'ttft_ms': 300, "
                              "'tpot_ms': 50}) computes it per round (RoundResult.request_goodput)")
        if spec.sample is SampleKind.BOOT:
            raise ConfigError(f"{metric_name} is the boot's, not the run's: perf.check(run, [{metric_name!r}]) "
                              "takes it from the server's boot account")
        if spec.sample is SampleKind.TAIL:
            # A tail metric's samples are its base's distribution (every ITL gap pooled).
            assert spec.base is not None
            return self._distribution(spec.base)
        if spec.sample is SampleKind.ROUND:
            return [float(getattr(rnd, metric_name)) for rnd in self.rounds]
        holds = self.holds
        values = (r.value(metric_name, holds) for r in self.valid_records)
        return [v for v in values if v is not None]

    def _distribution(self, metric_name: str) -> list[float]:
        if metric_name == "itl_ms":
            holds = self.holds
            return [gap for r in self.valid_records for gap in r.measured_itl_ms(holds)]
        return self.samples(metric_name)

    def itl_timeline_ms(self) -> list[float]:
        """Every measured gap of every valid request, in the order the run produced them (by arrival)."""
        holds = self.holds
        stamped: list[tuple[int, float]] = []
        for r in self.valid_records:
            chunk_ns = r.chunk_ns
            stamped.extend((chunk_ns[i + 1], (chunk_ns[i + 1] - chunk_ns[i]) / NS_PER_MS)
                           for i in reads.true_gaps(r, reads.stamps(r, holds)))
        stamped.sort(key=lambda pair: pair[0])
        return [gap for _, gap in stamped]

    def percentiles(self, metric_name: str) -> dict[int, float]:
        """p50/p90/p99 of a metric ({} when it has no values); itl_ms pools every gap."""
        values = self._distribution(metric_name)
        if not values:
            return {}
        return {q: percentile(values, q) for q in PERCENTILES}

    # ------------------------------------------------------------------ self-check

    @property
    def send_lags_ms(self) -> list[float]:
        """Send lag of every measured request that had a schedule."""
        lags = (r.send_lag_ms for r in self.records)
        return [lag for lag in lags if lag is not None]

    @functools.cached_property
    def holds(self) -> Holds:
        """The stretches the client's loops may not have run over the window, every client
        process's together (a record does not say which process read it, so a hold of any one
        of them is taken to touch every stream: the cautious side)."""
        return Holds((stretch for rnd in self.rounds for h in rnd.health for stretch in h.loop_holds_ns),
                     ran_ns={t for r in self.records for t in r.chunk_read_ns})

    @functools.cached_property
    def coverage(self) -> Coverage:
        """What the window measured of what it sent, figure by figure (measure/coverage.py)."""
        latencies = [x for rnd in self.rounds for h in rnd.health for x in h.loop_latency_ms]
        return reads.coverage(self.records, self.holds, max(latencies) if latencies else None)

    def unmeasured(self, figures: Sequence[str]) -> Unmeasured | None:
        """The ``figures`` (per-request metrics, or tails of one) that lost more than the bound of
        the window's requests to the client's holds; for a tail, its gaps the holds spoiled count
        against its gaps. None when every one of them is within. What the server did (a stall, a
        stream written whole) is measured, never counted here."""
        account = self.coverage
        bound = self.bounds.max_unmeasured_fraction
        losses = []
        for figure in dict.fromkeys(_base_figure(name) for name in figures):
            if figure is None:
                continue
            count = account.of(figure)
            if count.lost_to_client > bound * count.sent:
                reasons = tuple((r, n) for r, n in count.withheld.items() if r in reads.CLIENT_REASONS)
                losses.append(FigureLoss(figure, count.lost_to_client, count.sent, reasons))
        gaps = account.gaps_measured + account.gaps_client_held
        tails = [name for name in figures
                 if metric_spec(name).sample is SampleKind.TAIL and metric_spec(name).base == "itl_ms"]
        if tails and account.gaps_client_held > bound * gaps:
            held = account.gaps_client_held
            losses.append(FigureLoss("inter-token gaps", held, gaps, ((Withheld.CLIENT_HELD.value, held),), "gaps"))
        if not losses:
            return None
        return Unmeasured(tuple(losses), bound, account.loop_max_ms)

    @property
    def invalid(self) -> RunInvalid | None:
        """Why the whole run cannot be trusted (None when it can).

        Where the kernel stamped the reads (``load["timing"]`` is ``kernel``), a late loop spoils
        only the stamps its holds touched (measure/coverage.py): a window none of whose stamps a
        hold spoiled is not client-bound for it. A late send shapes the load only where a schedule sets it (a request
        rate); in a closed loop it is reported (``send_lag_p99_ms``), not judged."""
        if not self.rounds or not self.records:
            return NoMeasuredRequests()
        if not self.valid_records:
            return NoValidRequest(self.invalid_count, next(iter(self.invalid_reasons)))
        problems: list[ClientProblem] = []
        bounds = self.bounds
        health = [h for rnd in self.rounds for h in rnd.health]
        if health:
            worst_cpu = max(h.cpu_fraction for h in health)
            if worst_cpu > bounds.max_cpu_fraction:
                problems.append(ClientCpu(worst_cpu, bounds.max_cpu_fraction))
            latencies = [x for h in health for x in h.loop_latency_ms]
            stamps_at_stake = self.load.get("timing") != "kernel" or self.coverage.client_held_requests > 0
            if latencies and stamps_at_stake:
                p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
                bound50, bound99, idle = loop_latency_bounds(bounds, health)
                if p50 > bound50 or p99 > bound99:
                    problems.append(LoopLatency(p50, p99, bound50, bound99, *(idle or (None, None))))
        lags = self.send_lags_ms
        open_loop = self.load.get("kind") == "request-rate"
        if open_loop and lags and (p99 := percentile(lags, 99)) > bounds.max_send_lag_p99_ms:
            problems.append(SendLag(p99, bounds.max_send_lag_p99_ms))
        return ClientBound(tuple(problems)) if problems else None

    @property
    def valid(self) -> bool:
        """True when the run's numbers measure the server, not the client."""
        return self.invalid is None

    # ------------------------------------------------------------------ output

    def summary(self) -> RunSummary:
        """The run's figures, its request records and its context, as the gate and reports keep it."""
        valid = self.valid_records
        wall = self.wall_s
        stats = {}
        for name in PER_REQUEST_METRICS:
            values = self._distribution(name)
            stats[name] = MetricStats(
                mean=_mean(values), median=median(values) if values else None, std=_pstdev(values),
                percentiles={q: percentile(values, q) for q in PERCENTILES} if values else {},
            )
        lags = self.send_lags_ms
        return RunSummary(
            scenario=self.scenario_name, valid=self.valid, invalid=self.invalid,
            duration=wall, completed=len(valid), failed=self.invalid_count,
            invalid_reasons=self.invalid_reasons, warmup_requests=self.warmup_requests,
            rounds=tuple(RoundSummary(rnd.wall_s, rnd.output_throughput, rnd.request_throughput,
                                      tuple(h.to_json() for h in rnd.health)) for rnd in self.rounds),
            client_processes=self.client_processes,
            total_input_tokens=sum(r.prompt_tokens for r in valid),
            total_output_tokens=sum(r.output_tokens for r in valid),
            request_throughput=self.request_throughput, output_throughput=self.output_throughput,
            total_token_throughput=(sum(r.prompt_tokens + r.output_tokens for r in valid) / wall if wall > 0 else 0.0),
            stats=stats, send_lag_p99_ms=percentile(lags, 99) if lags else None, notes=self.notes,
            server_metrics=tuple(dict(view) for view in self.server_metrics), load=dict(self.load),
            requests=tuple(self.records), client_placement=dict(self.client_placement),
            measured=self.coverage,
        )

    def to_json(self) -> dict[str, Any]:
        """Summary with vLLM bench-serve field names, plus validity and client health."""
        return self.summary().to_json()


@dataclass(frozen=True)
class MetricStats:
    """A per-request metric's distribution over a run's valid requests (bench serve's figures)."""

    mean: float | None
    median: float | None
    std: float | None
    percentiles: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundSummary:
    """One round's wall time, throughputs and client health (ProcessHealth.to_json each)."""

    wall_s: float
    output_throughput: float
    request_throughput: float
    client_health: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class RunSummary:
    """What a run produced, as the gate and the reports keep it: bench serve's figures, each
    measured request's record (what the exports and figures are computed from, RequestRecord),
    the server's own view and the offered load. JSON only at the xdist and file boundaries
    (:meth:`to_json`, and :meth:`from_json` its inverse; the JSON report's ``run`` is it with
    ``invalid`` in words as ``invalid_reason``, reports/outputs.py)."""

    scenario: str
    valid: bool
    invalid: RunInvalid | None  # why the run cannot be trusted, as facts (reports word it)
    duration: float
    completed: int
    failed: int
    invalid_reasons: Mapping[str, int]
    warmup_requests: int
    rounds: tuple[RoundSummary, ...]
    client_processes: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    stats: Mapping[str, MetricStats]  # per-request metric -> its distribution
    send_lag_p99_ms: float | None = None
    notes: tuple[str, ...] = ()
    server_metrics: tuple[Mapping[str, Any], ...] = ()  # server_view.ServerView.to_json() each
    load: Mapping[str, Any] = field(default_factory=dict)  # workload.load_facts
    requests: tuple[RequestRecord, ...] = ()
    client_placement: Mapping[str, Any] = field(default_factory=dict)  # placement.Placement.to_json()
    # What the window measured of what it sent, figure by figure (None: a report written before
    # the plugin counted them).
    measured: Coverage | None = None

    def stat(self, metric: str, which: str) -> float | None:
        """``which`` ("mean", "median", "std") of a per-request metric; None when it has none."""
        stats = self.stats.get(metric)
        value: float | None = getattr(stats, which) if stats is not None else None
        return value

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "scenario": self.scenario, "valid": self.valid, "invalid": invalid_to_json(self.invalid),
            "duration": self.duration, "completed": self.completed, "failed": self.failed,
            "invalid_reasons": dict(self.invalid_reasons), "warmup_requests": self.warmup_requests,
            "rounds": len(self.rounds), "client_processes": self.client_processes,
            "total_input_tokens": self.total_input_tokens, "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput, "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for name, stats in self.stats.items():
            stem, unit = _stem(name)
            result[f"mean_{stem}{unit}"] = stats.mean
            result[f"median_{stem}{unit}"] = stats.median
            result[f"std_{stem}{unit}"] = stats.std
            for q in PERCENTILES:
                result[f"p{q}_{stem}{unit}"] = stats.percentiles.get(q)
        result["per_round"] = [
            {"wall_s": rnd.wall_s, "output_throughput": rnd.output_throughput,
             "request_throughput": rnd.request_throughput, "client_health": [dict(h) for h in rnd.client_health]}
            for rnd in self.rounds
        ]
        result["send_lag_p99_ms"] = self.send_lag_p99_ms
        result["notes"] = list(self.notes)
        result["server_metrics"] = [dict(view) for view in self.server_metrics]
        result["load"] = dict(self.load)
        result["client_placement"] = dict(self.client_placement)
        result["measured"] = self.measured.to_json() if self.measured is not None else None
        # Every measured request's timeline: the raw data behind the figures, and what the
        # bench-serve and JSON Lines exports are written from (reports/outputs.py).
        result["requests"] = [r.to_json() for r in self.requests]
        return result

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSummary:
        """Inverse of :meth:`to_json`."""
        stats = {}
        for name in PER_REQUEST_METRICS:
            stem, unit = _stem(name)
            if not any(f"{which}_{stem}{unit}" in data for which in ("mean", "median", "std")):
                continue
            stats[name] = MetricStats(
                mean=data.get(f"mean_{stem}{unit}"), median=data.get(f"median_{stem}{unit}"),
                std=data.get(f"std_{stem}{unit}"),
                percentiles={q: v for q in PERCENTILES if (v := data.get(f"p{q}_{stem}{unit}")) is not None},
            )
        return cls(
            scenario=str(data.get("scenario") or ""), valid=bool(data.get("valid", True)),
            invalid=invalid_from_json(data.get("invalid")), duration=float(data.get("duration") or 0.0),
            completed=int(data.get("completed") or 0), failed=int(data.get("failed") or 0),
            invalid_reasons=dict(data.get("invalid_reasons") or {}),
            warmup_requests=int(data.get("warmup_requests") or 0),
            rounds=tuple(RoundSummary(float(r["wall_s"]), float(r["output_throughput"]),
                                      float(r["request_throughput"]), tuple(r.get("client_health") or ()))
                         for r in data.get("per_round") or ()),
            client_processes=int(data.get("client_processes") or 1),
            total_input_tokens=int(data.get("total_input_tokens") or 0),
            total_output_tokens=int(data.get("total_output_tokens") or 0),
            request_throughput=float(data.get("request_throughput") or 0.0),
            output_throughput=float(data.get("output_throughput") or 0.0),
            total_token_throughput=float(data.get("total_token_throughput") or 0.0),
            stats=stats, send_lag_p99_ms=data.get("send_lag_p99_ms"),
            notes=tuple(data.get("notes") or ()),
            server_metrics=tuple(dict(v) for v in data.get("server_metrics") or ()),
            load=dict(data.get("load") or {}),
            requests=tuple(RequestRecord.from_json(r) for r in data.get("requests") or ()),
            client_placement=dict(data.get("client_placement") or {}),
            measured=Coverage.from_json(m) if (m := data.get("measured")) else None,
        )


def _base_figure(name: str) -> str | None:
    # A per-request metric is its own figure; a tail's base is the figure its samples are.
    spec = metric_spec(name)
    if spec.sample is SampleKind.REQUEST:
        return name
    if spec.sample is SampleKind.TAIL and spec.base is not None and spec.base != "itl_ms":
        return spec.base
    return None


def _stem(name: str) -> tuple[str, str]:
    # bench serve's figure names: "ttft_ms" -> mean_ttft_ms, "decode_tok_s" -> mean_decode_tok_s.
    return (name[:-3], "_ms") if name.endswith("_ms") else (name, "")


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _pstdev(values: Sequence[float]) -> float | None:
    # Population standard deviation, as numpy.std (what bench serve reports).
    if not values:
        return None
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
