"""Groups of runs judged against the first group: the profile comparison's rule, run by run.

Each run is one server boot, so the first group is judged against each other one by
:func:`judge.profiles.compare_in_session`, the rule that judges two NCCL profiles booted in one
session. Runs of one live server (``same_server``) are not boots: the group is one boot, pooled,
which can screen a change, never convict it (as an attached server without a restart command).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pytest_kimiperf.compare.runs import ResultFileError, ToolRun
from pytest_kimiperf.config.deployments import MIN_BOOTS_DIRECTIONAL
from pytest_kimiperf.config.metric_specs import METRICS, primary_metric
from pytest_kimiperf.judge.gate import MAX_FAILED_FRACTION, UNRESOLVED_EXIT
from pytest_kimiperf.judge.profiles import InSessionRules, compare_in_session
from pytest_kimiperf.judge.stats import BootSummary, Comparison, VerdictKind, band_log, min_samples

PASSED_EXIT = 0
REGRESSION_EXIT = 1  # pytest.ExitCode.TESTS_FAILED, as the gate's run exits for a regression


@dataclass(frozen=True)
class Group:
    """One configuration's runs, under the label the user gave it."""

    label: str
    runs: tuple[ToolRun, ...]


@dataclass(frozen=True)
class CompareRules:
    """What the groups are judged by (``metrics`` None: every metric the runs report)."""

    rules: InSessionRules = InSessionRules()
    tolerances: Mapping[str, float] = field(default_factory=dict)
    metrics: tuple[str, ...] | None = None
    same_server: bool = False
    strict: bool = False

    def tolerance(self, metric: str) -> float:
        """Given, else the metric table's default."""
        return self.tolerances.get(metric, METRICS[metric].default_tolerance)


@dataclass(frozen=True)
class Row:
    """One metric of one load: a group against the reference group."""

    load: str
    group: str
    reference: str
    metric: str
    primary: bool
    comparison: Comparison
    screened: bool  # one live server a side: a direction cannot be claimed, only screened

    @property
    def unresolved(self) -> bool:
        """A change beyond the tolerance that these runs cannot convict (one boot a side)."""
        c = self.comparison
        few = self.screened or min(c.boots_current, c.boots_reference) < MIN_BOOTS_DIRECTIONAL
        return few and c.verdict is not VerdictKind.WITHIN_TOLERANCE and _beyond(c)


@dataclass(frozen=True)
class CompareOutcome:
    """The comparison's rows, the runs whose failed requests fail them, and the exit status."""

    tool: str
    rows: tuple[Row, ...]
    failed_runs: tuple[str, ...]
    same_server: bool
    strict: bool = False

    @property
    def exit_status(self) -> int:
        """The gate's exit status for these findings."""
        if self.failed_runs or any(r.comparison.verdict is VerdictKind.REGRESSION for r in self.rows):
            return REGRESSION_EXIT
        if self.strict and any(r.comparison.unresolved_beyond_tolerance and not r.unresolved for r in self.rows):
            return REGRESSION_EXIT  # --strict: inconclusive beyond the tolerance fails, as the gate's
        if any(r.unresolved for r in self.rows):
            return UNRESOLVED_EXIT
        return PASSED_EXIT


def _beyond(c: Comparison) -> bool:
    return math.isfinite(c.change) and abs(math.log1p(c.change)) > band_log(c.tolerance)


def judge_groups(groups: Sequence[Group], rules: CompareRules) -> CompareOutcome:
    """Every other group against the first, load by load and metric by metric."""
    if len(groups) < 2:
        raise ResultFileError("compare needs two groups of result files at least (--a and --b, or --group twice)")
    tool = _one_tool(groups)
    loads = _loads(groups)
    failed = tuple(f"{run.path} ({run.label}): {run.failed_requests} of {run.requests} requests failed"
                   for group in groups for run in group.runs
                   if run.requests and run.failed_requests > MAX_FAILED_FRACTION * run.requests)
    reference = groups[0]
    pending = []
    for load in loads:
        runs = {g.label: [r for r in g.runs if r.load == load] for g in groups}
        metrics = _metrics(load, runs, rules.metrics)
        kind = next(r.load_kind for rs in runs.values() for r in rs)
        primary = primary_metric(kind, metrics)
        for group in groups[1:]:
            for metric in metrics:
                pending.append((load, group.label, metric, metric == primary,
                                _boots(runs[group.label], metric, rules.same_server),
                                _boots(runs[reference.label], metric, rules.same_server)))
    # Every row that compares something shares one budget for its signs (stats.RUN_ALPHA), as a
    # session's profile comparisons do.
    family = sum(1 for *_, cur, ref in pending if any(b.usable for b in cur) and any(b.usable for b in ref))
    in_session = replace(rules.rules, family=max(1, family)) if rules.rules.family is None else rules.rules
    rows = []
    for load, label, metric, primary_row, cur, ref in pending:
        spec = METRICS[metric]
        comparison = compare_in_session(cur, ref, direction=spec.direction, tolerance=rules.tolerance(metric),
                                        rules=in_session.for_metric(metric), metric=metric, unit=spec.unit)
        rows.append(Row(load, label, reference.label, metric, primary_row, comparison, rules.same_server))
    return CompareOutcome(tool, tuple(rows), failed, rules.same_server, rules.strict)


def _boots(runs: Sequence[ToolRun], metric: str, same_server: bool) -> list[BootSummary]:
    """One boot a run; or, from one live server, the group's runs pooled into its one boot (the
    geometric mean of their figures, on all their requests)."""
    need = min_samples(metric)
    boots = [BootSummary(median=run.figures[metric].value, n=run.figures[metric].n, se_log=math.nan,
                         label=run.label, min_n=need) for run in runs]
    if not same_server:
        return boots
    usable = [b for b in boots if b.median > 0]
    if not usable:
        return boots[:1]
    mean_log = sum(math.log(b.median) for b in usable) / len(usable)
    return [BootSummary(median=math.exp(mean_log), n=sum(b.n for b in usable), se_log=math.nan,
                        label=f"{len(usable)} runs of one server", min_n=need)]


def _one_tool(groups: Sequence[Group]) -> str:
    first: dict[str, str] = {}
    for group in groups:
        if not group.runs:
            raise ResultFileError(f"group {group.label!r} holds no run: its pattern matched no file")
        for run in group.runs:
            first.setdefault(run.tool, run.path)
    if len(first) > 1:
        named = "; ".join(f"{tool} ({path})" for tool, path in first.items())
        raise ResultFileError(f"the files come from different tools: {named}. Each tool defines TTFT, ITL and "
                              "throughput its own way (which tokens, which clock, which percentile), so a "
                              "difference between them is not a change of the server: compare files of one tool")
    return next(iter(first))


def _loads(groups: Sequence[Group]) -> list[str]:
    """The loads every group ran, in the reference's order; a load one group lacks is an error."""
    loads = list(dict.fromkeys(run.load for run in groups[0].runs))
    for group in groups:
        have = {run.load: run.path for run in group.runs}
        for load in loads:
            if load not in have:
                raise ResultFileError(f"group {group.label!r} has no run at load {load!r} "
                                      f"(group {groups[0].label!r} has: {_path_at(groups[0], load)})")
        for load, path in have.items():
            if load not in loads:
                raise ResultFileError(f"{path}: load {load!r} is in group {group.label!r} only; group "
                                      f"{groups[0].label!r} ran {', '.join(repr(x) for x in loads)}")
    return loads


def _path_at(group: Group, load: str) -> str:
    return next(run.path for run in group.runs if run.load == load)


def _metrics(load: str, runs: Mapping[str, Sequence[ToolRun]], wanted: Sequence[str] | None) -> list[str]:
    """The metrics to judge at ``load``: those asked for, else every one a run reports; each must
    be in every run (a metric missing on one side is an error naming the file and the field)."""
    every = [run for group in runs.values() for run in group]
    names = list(wanted) if wanted else list(dict.fromkeys(m for run in every for m in run.figures))
    names = [m for m in METRICS if m in names] + [m for m in names if m not in METRICS]
    for metric in names:
        if metric not in METRICS:
            raise ResultFileError(f"unknown metric {metric!r}; known metrics: {', '.join(sorted(METRICS))}")
        having = next((run for run in every if metric in run.figures), None)
        for run in every:
            if metric not in run.figures:
                where = (f"{having.path} has it (field {having.figures[metric].field!r})" if having
                         else "no file has it")
                raise ResultFileError(f"{run.path}: metric {metric!r} is missing at load {load!r} ({run.label}); "
                                      f"{where}. Judge the metrics every file has with --metric")
    return names
