"""How a scenario's requests are dealt out: built once, then split into rounds and processes.

``prepare`` builds every request a run sends (warm-up and rounds) with fresh prompts from
``first_index`` on; a budget in seconds only reuses ``SECONDS_BUDGET_PROMPTS`` prompts in turn
(their ids marked, see ``workload.reused_prompt_requests``). ``process_plans`` gives each client
process its share of one round: specs, streams or cap, and arrival times for an open loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytest_kimiperf.measure.client import RequestSpec
from pytest_kimiperf.measure.engine import ProcessPlan
from pytest_kimiperf.measure.records import RequestRecord
from pytest_kimiperf.measure.results import ProcessHealth, RoundResult
from pytest_kimiperf.measure.scenarios import RequestRate, Scenario
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.measure.workload import REUSED_MARK, build_requests

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
