"""The engine's clock beside the client's in the answers, and each run's fidelity (the ratio of
the client's time per token to the engine's): read from each boot's server view, judged by
judge/engine_clock.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.judge.engine_clock import (
    ENGINE_FIGURE_OF, ENGINE_WORDS, EngineChange, Where, engine_change, engine_only, where_change_lives,
)
from pytest_kimiperf.judge.stats import Comparison
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.server_view import ENGINE_METRICS
from pytest_kimiperf.numbers import fmt_change, fmt_ci


def _boots(results: Sequence[TestResult], test: str, profile: str) -> list[TestResult]:
    return sorted((r for r in results if r.test == test and r.profile == profile and r.invalid is None
                   and r.run is not None and r.run.server_metrics), key=lambda r: r.boot)


def engine_values(results: Sequence[TestResult], test: str, profile: str, figure: str) -> list[float]:
    """One value of the engine's ``figure`` per judged boot of ``test`` under ``profile``."""
    values = []
    for res in _boots(results, test, profile):
        assert res.run is not None
        value = res.run.server_metrics[0].get(figure)
        if isinstance(value, (int, float)):
            values.append(float(value))
    return values


@dataclass(frozen=True)
class EngineRemark:
    """What the engine's clock says of one comparison: the words after the client's answer, and
    whether the comparison's sign is withdrawn (a profile that reaches only the engine, whose
    engine did not move)."""

    text: str
    withdrawn: bool = False


def engine_remark(results: Sequence[TestResult], test: str, metric: str, comparison: Comparison | None,
                  current: str, reference: str | None) -> EngineRemark | None:
    """The engine's change beside the client's, for ``current`` against ``reference`` (a profile),
    or against the baseline (``reference`` None: the current boots alone, no engine comparison);
    None where the metric has no engine figure or the boots carry none."""
    figure = ENGINE_FIGURE_OF.get(metric)
    if figure is None or comparison is None or reference is None:
        return None
    change = engine_change(figure, engine_values(results, test, current, figure),
                           engine_values(results, test, reference, figure))
    if change is None:
        return None
    where = where_change_lives(comparison, change)
    text = f"; {_said(change)}{_WHERE_WORDS[where]}"
    moved = fidelity_change(results, test, current, reference)
    if moved is not None and moved.beyond_zero:
        text += (f"; the client's time per token over the engine's moved {fmt_change(moved.change)} "
                 f"({fmt_ci(moved.low, moved.high)}): what lies between the engine and the client changed")
    if where is Where.OUTSIDE and _engine_only(results, test, current, reference):
        return EngineRemark(text + f"; {current} differs from {reference} only in what reaches the engine's "
                                   "workers, so this change is not the profile's", withdrawn=True)
    return EngineRemark(text)


def _said(change: EngineChange) -> str:
    interval = (f" ({fmt_ci(change.low, change.high)}, {change.level:.0%})" if change.low is not None
                and change.high is not None else " (one boot a side: no interval)")
    return f"{ENGINE_WORDS[change.figure]} {fmt_change(change.change)}{interval}"


_WHERE_WORDS = {
    Where.ENGINE: ": the engine changed",
    Where.OUTSIDE: ": the time went outside the engine (API server, network or client)",
    Where.NO_CLAIM: "",
    Where.UNKNOWN: "",
}


def _engine_only(results: Sequence[TestResult], test: str, current: str, reference: str) -> bool:
    cur, ref = _boots(results, test, current), _boots(results, test, reference)
    if not cur or not ref:
        return False
    return engine_only(cur[0].profile_env, ref[0].profile_env, cur[0].profile_args, ref[0].profile_args)


def client_clock_only(results: Sequence[TestResult]) -> str | None:
    """The one line for a run whose server exported none of the engine's histograms (not vLLM):
    only the client's clock judged. None where any boot carried them, or none read /metrics."""
    views = [view for r in results if r.run is not None for view in r.run.server_metrics]
    if not views or any(view.get("engine_tpot_ms") is not None or view.get("engine_ttft_ms") is not None
                        for view in views):
        return None
    return ("only the client's clock judged: the server's /metrics has none of vLLM's engine histograms ("
            + ", ".join(ENGINE_METRICS) + "), so no answer says whether a change was the engine's")


@dataclass(frozen=True)
class Fidelity:
    """One run's client mean time per token against the engine's over the same window: their
    ratio is what lies between the engine and the client's stamps."""

    client_tpot_ms: float
    engine_tpot_ms: float

    @property
    def ratio(self) -> float:
        """Client over engine (1.0: the client saw the engine's pace)."""
        return self.client_tpot_ms / self.engine_tpot_ms


def fidelity(result: TestResult) -> Fidelity | None:
    """The run's fidelity, where both clocks read a time per token."""
    run = result.run
    if run is None or not run.server_metrics:
        return None
    engine = run.server_metrics[0].get("engine_tpot_ms")
    client = run.stat("tpot_ms", "mean")
    if not isinstance(engine, (int, float)) or not engine or client is None:
        return None
    return Fidelity(float(client), float(engine))


def fidelity_change(results: Sequence[TestResult], test: str, current: str, reference: str) -> EngineChange | None:
    """The client/engine ratio, current boots against reference boots (its move says what lies
    between the engine and the client changed)."""
    def ratios(profile: str) -> list[float]:
        return [f.ratio for r in _boots(results, test, profile) if (f := fidelity(r)) is not None]

    return engine_change("fidelity", ratios(current), ratios(reference))
