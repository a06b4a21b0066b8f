"""Why a run's own figures cannot be judged, as facts: no request measured, none valid, or a
client that limited the load (the host watch's reason, a busy host, is measure/watched.py's).

Decisions read these values (``RunResult.valid`` is ``invalid is None``); the sentence a
report prints is rendered from them by :func:`say_run_invalid`, one place, so the words stay
what they were while nothing downstream has to parse them. This module imports nothing that
reads the host: the judge reaches it through results.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

CLIENT_BOUND = "client-bound: the load generator, not the server, limited this run: "
_CLIENT_BOUND_HINT = " (spread streams over more client processes, or give the client more CPU)"


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
    (None where it was not read), which raised the bounds (results.loop_latency_bounds)."""

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


RunInvalid = NoMeasuredRequests | NoValidRequest | ClientBound


def say_client_problem(problem: ClientProblem) -> str:
    """One clause of the client-bound sentence."""
    match problem:
        case ClientCpu(worst, bound):
            return f"a client process used {worst:.0%} of a core (bound {bound:.0%})"
        case LoopLatency(p50, p99, bound50, bound99, idle50, idle99):
            host = f"; this host's idle loop {idle50:.2f} / {idle99:.2f} ms" if idle50 is not None else ""
            return (f"event-loop latency p50 {p50:.2f} ms / p99 {p99:.2f} ms (bounds "
                    f"{bound50:.3g} / {bound99:.3g} ms{host}), so chunk timestamps are stale")
        case SendLag(p99, bound):
            return f"requests went out late versus schedule: p99 {p99:.2f} ms (bound {bound:g} ms)"
        case _:
            assert_never(problem)


def say_run_invalid(reason: RunInvalid) -> str:
    """The sentence a report prints for ``reason``."""
    match reason:
        case NoMeasuredRequests():
            return "no measured requests"
        case NoValidRequest(invalid, first):
            return f"no valid request ({invalid} invalid; first reason: {first})"
        case ClientBound(problems):
            return CLIENT_BOUND + "; ".join(say_client_problem(p) for p in problems) + _CLIENT_BOUND_HINT
        case _:
            assert_never(reason)
