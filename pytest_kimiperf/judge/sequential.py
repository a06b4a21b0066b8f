"""Boots on demand for a profile comparison: after each round, stop with a verdict or book
one more boot of each side.

A session boots each profile ``start`` times (``--kimiperf-boots``), then, while a profile's
comparison with the reference is undecided on the test's primary metric (neither a direction
nor "within"), one more boot of that profile and of the reference, up to ``cap`` a side
(``--kimiperf-max-boots``). Every look judges at its share of the error budget
(judge/spending.py: the direction O'Brien-Fleming-type, "within" Pocock-type), so booking until
a verdict keeps the direction's rate at :data:`~pytest_kimiperf.judge.in_session.IN_SESSION_ALPHA`
and "within" at the TOST's 5%. The comparison at the last look (the session report's) uses
the same levels. Pure functions of the boots so far.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.boot_summary import BootSummary
from pytest_kimiperf.judge.in_session import DECIDED, InSessionRules, compare_in_session
from pytest_kimiperf.judge.spending import SequentialPlan
from pytest_kimiperf.judge.stats import Comparison


def session_plan(*, profiles: int, boots: int, max_boots: int, control: bool) -> SequentialPlan | None:
    """The boots on demand of a session's profile comparison: from its planned boots a profile
    up to its cap (``--kimiperf-max-boots``, else the deployment's ``max_boots``). None where no
    two profiles are compared, or against a control (--kimiperf-control: the gate's rule)."""
    if profiles < 2 or control:
        return None
    return SequentialPlan(boots, max(max_boots, boots))


class Step(Enum):
    """What a look decides: stop with its verdict, or book one more boot of each side."""

    STOP = "stop"
    BOOK = "book"


@dataclass(frozen=True)
class Decision:
    """A look's step and why: ``decided`` (a direction or "within"), ``cap`` (no more boots
    allowed) or ``undecided`` (book one more boot a side)."""

    step: Step
    why: str
    boots: int


def next_step(comparison: Comparison, plan: SequentialPlan) -> Decision:
    """After a look (``comparison`` judged at this look's levels, in_session.compare_in_session
    with the plan in its rules): stop at a verdict that answers the question or at the cap,
    otherwise book one more boot of each side."""
    boots = min(comparison.boots_current, comparison.boots_reference)
    if comparison.verdict in DECIDED:
        return Decision(Step.STOP, "decided", boots)
    if plan.final(boots):
        return Decision(Step.STOP, "cap", boots)
    return Decision(Step.BOOK, "undecided", boots)


def run_sequentially(look: Callable[[int], Comparison], plan: SequentialPlan) -> tuple[Comparison, Decision]:
    """Look at ``start``, ``start + 1``, ... boots a side until :func:`next_step` stops;
    ``look(k)`` judges the first ``k`` boots of each side (the benchmark's and the tests' loop:
    a session does the same one boot at a time)."""
    boots = plan.start
    while True:
        comparison = look(boots)
        decision = next_step(comparison, plan)
        if decision.step is Step.STOP:
            return comparison, decision
        boots += 1


def profiles_to_book(boots: Mapping[str, Sequence[BootSummary]], reference: str, *, direction: Direction,
                     tolerance: float, rules: InSessionRules) -> tuple[str, ...]:
    """One test's profiles that get one more boot after a round: ``boots`` holds each profile's
    boots of the test's primary metric so far, every profile at the same count (call it when
    the round is complete). Each profile is judged against ``reference`` at this look
    (``rules.plan``); an undecided one books a boot of itself and of the reference. None
    without a plan, or with a profile that has no boot."""
    plan = rules.plan
    ref = boots.get(reference)
    if plan is None or not ref or any(not side for side in boots.values()):
        return ()
    booked: list[str] = []
    for profile, current in boots.items():
        if profile == reference:
            continue
        comparison = compare_in_session(current, ref, direction=direction, tolerance=tolerance, rules=rules)
        if next_step(comparison, plan).step is Step.BOOK:
            booked += [profile] if reference in booked else [reference, profile]
    return tuple(booked)
