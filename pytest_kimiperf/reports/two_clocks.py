"""The engine's clock beside the client's in the answers, and each run's fidelity (the ratio of
the client's time per token to the engine's): judge/engine_clock.py decided what the engine's
clock says of each comparison (a note on it); this module only says it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kimiperf.judge.engine_clock import EngineChange, engine_change, two_clocks_of
from pytest_kimiperf.judge.stats import Comparison
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.server_view import ENGINE_METRICS
from pytest_kimiperf.numbers import fmt_change, fmt_ci
from pytest_kimiperf.reports.sentences import note_text


def _boots(results: Sequence[TestResult], test: str, profile: str) -> list[TestResult]:
    return sorted((r for r in results if r.test == test and r.profile == profile and r.invalid is None
                   and r.run is not None and r.run.server_metrics), key=lambda r: r.boot)


def engine_words(results: Sequence[TestResult], test: str, comparison: Comparison | None, current: str,
                 reference: str | None) -> str:
    """What the engine's clock said of ``comparison`` (judge/engine_clock.py decided it and put
    it among the comparison's notes), after the client's answer: ``"; ..."``, or "" where it said
    nothing. Between two profiles of this session (``reference``), also whether what lies between
    the engine and the client moved."""
    clocks = two_clocks_of(comparison)
    if clocks is None:
        return ""
    text = f"; {note_text(clocks)}"
    moved = fidelity_change(results, test, current, reference) if reference is not None else None
    if moved is not None and moved.beyond_zero:
        text += (f"; the client's time per token over the engine's moved {fmt_change(moved.change)} "
                 f"({fmt_ci(moved.low, moved.high)}): what lies between the engine and the client changed")
    return text


def judged_on_the_client_clock_alone(lines_client_only: int) -> str | None:
    """The one line for a gate whose baseline keeps no engine figures while this run's boots
    carry them (``lines_client_only`` baseline lines say so): None where none does."""
    if not lines_client_only:
        return None
    return ("against the baseline: judged on the client's clock alone: the baseline's boots keep no engine figures "
            "(recorded before they were stored); the next recording keeps them")


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
