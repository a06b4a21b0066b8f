"""Every sentence a user reads about a measurement or a verdict: the one place that writes them.

The gate (judge/gate.py) and the statistics (judge/stats.py, judge/profiles.py) return typed
values: a :class:`~pytest_kimiperf.judge.stats.Comparison` and notes (judge/notes.py,
judge/verdicts.py). :func:`note_text` turns a note into its line, :func:`comparison_line` a comparison
into the line a test report shows; the terminal summary, the JSON report, the pytest warnings and
a test's failure message all read them from here. The measurement returns facts too (why a run
cannot be judged, measure/results.py and measure/runner.py): the ``say_*`` functions word them.
No module outside reports/ defines a ``say_*`` (tests/unit/test_architecture.py). Nothing reads
these sentences back.
"""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING, assert_never

from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT, Direction, metric_spec
from pytest_kimiperf.judge.engine_clock import UNPLACED_DF, Part, TwoClocks, UnplacedWhy, ChangeLocation
from pytest_kimiperf.judge.history import AppendWhy, NotAppended
from pytest_kimiperf.measure.invalid_causes import advice_for
from pytest_kimiperf.measure.coverage import Withheld
from pytest_kimiperf.measure.results import (
    ClientBound, ClientCpu, ClientProblem, LoopLatency, NoMeasuredRequests, NoValidRequest, RunInvalid, SendLag,
    Unmeasured,
)
from pytest_kimiperf.judge.notes import FloorResult, FloorStatus
from pytest_kimiperf.judge.noise import CanaryCheck
from pytest_kimiperf.judge.notes import (
    BootAsked, BootPlanned, BootsBooked, BootsForWithin, BootsToDecide, DeclaredModes, FailedRequests, FloorNote,
    ChangeSoFar, GoodputSlos, HistoryModes, HistoryStep, HistorySteps, HostWatched, InvalidRun, LeftOut, LevelSpread,
    MeasuredAgain, NeedsBoots, NoDecode, Note, ResolvePlan, PrefixCacheReused, SavedLine, SloCheck, SoftFingerprint,
    SpreadSource, TooFewSamples, Unresolved, Drifted,
)
from pytest_kimiperf.judge.noise import SpreadBeyond, SpreadsMisdeclared
from pytest_kimiperf.judge.stats import Comparison, VerdictKind, band_log, fmt_tolerance
from pytest_kimiperf.judge.verdicts import (
    BaselineLine, BaselineState, EnvDiff, MissingBaselines, TestResult, VerdictNote,
)
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_spread, fmt_value

if TYPE_CHECKING:  # the runner (and its event loop) is not loaded to word what it found
    from pytest_kimiperf.measure.runner import HostBusy, InvalidReason

# What recording accepts, said wherever recording is the advice: it is never a neutral step.
RECORDING_ACCEPTS = "records this run's figures as the new baseline: review the diff"
RECORD_ADVICE = f"run --kimiperf-update-baselines (it {RECORDING_ACCEPTS})"


def select_hardware(recorded: str) -> str:
    """The advice where a baseline of the same server was recorded under other stated hardware:
    the option (and its variable) that selects it, with the value recorded. Recording here would
    take whatever this run measured, a regression included, as the baseline of a new name."""
    return (f"if this is the server it was recorded on, state its hardware as recorded: "
            f"--kimiperf-server-hardware {shlex.quote(recorded)} (or KIMIPERF_SERVER_HARDWARE, the "
            "kimiperf_server_hardware ini option, the deployment's server_hardware)")


def note_texts(notes: Iterable[Note]) -> list[str]:
    """Each note's line."""
    return [note_text(n) for n in notes]


def joined(notes: Iterable[Note]) -> str:
    """The notes' lines in one, ``; ``-separated."""
    return "; ".join(note_text(n) for n in notes)


@functools.singledispatch
def note_text(note: Note) -> str:
    """The line a note is shown as."""
    raise TypeError(f"no sentence for note kind {note.kind!r} ({type(note).__name__})")


@note_text.register
def _(note: SavedLine) -> str:
    return note.text


# --- what the measurement saw beside its figures --------------------------------------------

@note_text.register
def _(note: HostWatched) -> str:
    psi = ", ".join(f"PSI {name.replace('_', ' ')} {share * 100:.0f}%" for name, share in sorted(note.psi))
    cpu = ("; ".join(note.blind) if note.blind else
           f"foreign CPU {note.foreign_cpu_share * 100:.0f}% of the host, steal {note.steal_share * 100:.0f}%")
    return (f"host watch ({note.attempts} attempt(s)): {cpu}" + (f", {psi}" if psi else "")
            + "".join(f"; node {node}: foreign CPU {share * 100:.0f}%" for node, share in note.nodes)
            + "".join(f"; node {node}: this machine, read above" for node in note.nodes_here)
            + "".join(f"; {remark}" for remark in note.remarks))


@note_text.register
def _(note: MeasuredAgain) -> str:
    return "; ".join(f"attempt {i} measured again: {why}" for i, why in enumerate(note.reasons, 1))


# --- why a measurement was not judged, or measured again -------------------------------------

CLIENT_BOUND = "client-bound: the load generator, not the server, limited this run: "
_CLIENT_BOUND_HINT = " (spread streams over more client processes, or give the client more CPU)"
_RUN_INVALID = (NoMeasuredRequests, NoValidRequest, ClientBound, Unmeasured)


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
    """Why a run's own figures cannot be judged, as the report prints it."""
    match reason:
        case NoMeasuredRequests():
            return "no measured requests"
        case NoValidRequest(invalid, first):
            return f"no valid request ({invalid} invalid; first reason: {first})"
        case ClientBound(problems):
            return CLIENT_BOUND + "; ".join(say_client_problem(p) for p in problems) + _CLIENT_BOUND_HINT
        case Unmeasured(losses, bound, loop_max):
            lost = "; ".join(f"{loss.figure} lost for {loss.lost} of {loss.sent} {loss.unit}" for loss in losses)
            loop = f"{loop_max:.1f} ms" if loop_max is not None else "an unread time"
            return (f"unmeasured: the client was held off the CPU (its loop ran up to {loop} late) while more than "
                    f"{bound:.0%} of the window's stamps were taken: {lost}")
        case _:
            assert_never(reason)


def say_host_disturbed(busy: HostBusy) -> str:
    """What disturbed the host in the last attempt: each reading's line (hostwatch)."""
    return "; ".join(r.describe_busy(busy.bounds) for r in busy.readings)


def say_invalid(reason: InvalidReason) -> str:
    """Why a measurement was not judged, as the report prints it (its advice is
    :func:`invalid_causes.advice` of ``runner.cause_of``)."""
    if isinstance(reason, _RUN_INVALID):
        return say_run_invalid(reason)
    said = say_host_disturbed(reason)
    if not any(r.busy(reason.bounds) for r in reason.readings):
        return (f"{said}; measured {reason.attempts} times, throttled every time: no verdict from a run its CPU "
                "quota held back")
    return f"{said}; measured {reason.attempts} times, disturbed every time: no verdict from a busy host"


def say_measured_again(reason: InvalidReason) -> str:
    """Why an attempt was thrown out and measured again: the host's disturbance, or the client's
    or the reads' evidence and the figures it would have spoiled."""
    return say_run_invalid(reason) if isinstance(reason, _RUN_INVALID) else say_host_disturbed(reason)


# What each reason a request gave no figure reads as, after its count.
_WITHHELD_WORDS: Mapping[Withheld, str] = {
    Withheld.FAILED: "failed",
    Withheld.NO_TOKEN: "with no token",
    Withheld.ONE_TOKEN: "of one token",
    Withheld.CLIENT_HELD: "whose stamps the client's hold spoiled",
    Withheld.ONE_READ: "the server wrote whole in one read",
}


def withheld_words(reason: str) -> str:
    """A coverage.Withheld value in words, as it reads after its count (a reason of a report
    from another version reads as itself)."""
    return _WITHHELD_WORDS[Withheld(reason)] if reason in Withheld._value2member_map_ else reason


@note_text.register
def _(note: PrefixCacheReused) -> str:
    queried = note.queried_tokens
    share = f" ({note.hit_tokens / queried:.1%} of {queried:.0f} queried)" if queried else ""
    return (f"vLLM's prefix cache served {note.hit_tokens:.0f} prompt tokens of this run{share} though its "
            "prompts are unique: another request's prefill was reused (a prompt sent twice, or other "
            "traffic on the server), so TTFT and throughput do not measure a cold prefill")


@note_text.register
def _(note: BootsBooked) -> str:
    return (f"profiles: {note.metric} undecided at {note.boots} boots a profile (within the tolerance or a "
            f"direction, at this look's share of the error budget); boot {note.boots + 1} of "
            f"{', '.join(note.booked)} booked (at most {note.cap})")


# --- spreads ---------------------------------------------------------------------------------

def source_text(source: SpreadSource | None) -> str:
    """Where a spread came from: "declared 18%", "measured over 2 + 10 boots", ..."""
    return "" if source is None else note_text(source)


def _pct(fraction: float | None, whole: bool) -> str:
    return f"{fraction or 0.0:.0%}" if whole else fmt_spread(fraction)


@note_text.register
def _(note: SpreadSource) -> str:
    how, unit = note.how, note.unit
    if how == SpreadSource.MEASURED:
        if note.sides is not None:
            return f"measured over {note.sides[0]} + {note.sides[1]} boots"
        if note.within:
            return f"measured over {note.count} boots of {note.within} sessions"
        return f"measured over {note.count} {unit}s"
    if how == SpreadSource.DECLARED:
        return f"declared {_pct(note.declared, note.whole)}"
    if how == SpreadSource.FLOOR:
        over = f"{note.sides[0]} + {note.sides[1]}" if note.sides is not None else f"{note.count}"
        return f"declared {fmt_spread(note.declared)}; {over} {unit}s measured {fmt_spread(note.measured)}"
    if how == SpreadSource.SIDES:
        return f"measured {_pct(note.measured, note.whole)} inside the sides"
    return {"boot": "one boot per session", "session": "one session per host"}.get(unit, "one host")


@note_text.register
def _(note: SpreadBeyond) -> str:
    chance = f"{note.p:.1g}" if note.p > 0 else "below 1e-300"
    return (f"{note.level} spread {fmt_spread(note.measured)} where {fmt_spread(note.declared)} is declared, the "
            f"widest of {note.flagged} of {note.checked} {note.level} checks beyond it ({note.where}: {note.units} "
            f"{note.level}{'s' * (note.units != 1)}, {note.df:g} df; chance {chance} at the declared)")


@note_text.register
def _(note: SpreadsMisdeclared) -> str:
    if note.deployment:
        declare = " and ".join(f"{b.level}_spread = {b.measured:.2g}" for b in note.beyond)
        change = f"declare {declare} in deployment {note.deployment!r}"
    else:
        change = f"pass --boot-spread {note.beyond[0].measured:.2g}"
    return (f"spreads wider than declared, at the run's level ({note.alpha:.0%} over {note.checks} checks): "
            f"{joined(note.beyond)}: {change}, or find what spreads the boots (the judge already used the larger)")


def level_spread_text(level: LevelSpread) -> str:
    """``session spread 0.8% (declared 0.8%)``."""
    return f"{level.name} spread {fmt_spread(level.spread)} ({note_text(level.source)})"


# --- a comparison ---------------------------------------------------------------------------

def evidence_text(c: Comparison) -> str:
    """What the verdict rests on, e.g. "2 boots (40 samples) vs 10 reference boots; boot
    spread 0.8% (measured over 2 + 10 boots)"."""
    def side(boots: int, sessions: int, what: str) -> str:
        text = f"{boots} {what}boot{'s' * (boots != 1)}"
        return text + (f" of {sessions} session{'s' * (sessions != 1)}" if c.levels else "")
    levels = "".join(f", {level_spread_text(term.level)}" for term in c.levels)
    return (f"{side(c.boots_current, c.sessions_current, '')} ({c.n_current} samples) vs "
            f"{side(c.boots_reference, c.sessions_reference, 'reference ')}; boot spread "
            f"{fmt_spread(math.expm1(c.spread_sd_log))} ({source_text(c.spread_source)}){levels}")


def comparison_line(c: Comparison, *, label: bool = True) -> str:
    """One line for the test report: the verdict, its numbers and what it rests on (after the
    metric's label unless ``label`` is false)."""
    prefix = f"{c.label}: " if label and c.label else ""
    note = joined(c.notes)
    tol = fmt_tolerance(c.tolerance)
    change = fmt_change(c.change)
    worse_bound, better_bound = ((c.bound_high, c.bound_low) if c.direction is Direction.HIGHER_IS_BETTER
                                 else (c.bound_low, c.bound_high))
    level = f"{c.confidence * 100:.4g}% bound"
    ci = f"{c.equivalence_confidence * 100:g}% CI {fmt_change(c.ci_low)}..{fmt_change(c.ci_high)}"
    # The bounds every sign needs clear of zero (the run's budget): what a row without one shows.
    bounds = f"its {level}s {fmt_change(c.bound_low)}..{fmt_change(c.bound_high)}"
    no_sign = f"a sign needs {bounds} clear of zero"
    kind = c.verdict
    decided = next((n.decided for n in c.notes if isinstance(n, HistoryModes) and n.decided), "")
    if decided:  # the spawn modes, not the figures, gave it (judge/history.py)
        body = (f"REGRESSION {change} (the run lands in the worse spawn mode more often than chance explains"
                if decided == "frequency" else f"inconclusive ({change}: the boots' spawn modes are unclear, and "
                "the placings that are likely disagree")
    else:  # every kind named: a new one fails the type check here until it has its words
        match kind:
            case VerdictKind.REGRESSION:
                body = f"REGRESSION {change} (beyond the {tol} tolerance, and its {level} {fmt_change(worse_bound)} excludes zero"
            case VerdictKind.IMPROVEMENT:
                body = (f"improvement {change} (beyond the {tol} tolerance, and its {level} {fmt_change(better_bound)} "
                        "excludes zero")
            case VerdictKind.WITHIN_TOLERANCE:
                body = f"within +/-{tol} ({change}, {ci}"
            case VerdictKind.NO_DETECTABLE_CHANGE:
                body = (f"no detectable change ({change}, {ci}; {no_sign}; this design detects changes of "
                        f"{c.mdc * 100:.2g}% or more")
            case VerdictKind.CHANGED_SIZE_UNRESOLVED:
                beyond = c.ci_high < -c.tolerance or c.ci_low > c.tolerance
                inside = -band_log(c.tolerance) <= math.log1p(c.ci_low) and math.log1p(c.ci_high) <= band_log(c.tolerance)
                reach = (f"lies beyond the {tol} tolerance" if beyond else
                         f"lies inside the {tol} tolerance, short of this look's level for \"within\"" if inside
                         else f"crosses the {tol} tolerance")
                body = f"changed, size unresolved ({change}: {bounds} exclude zero, and its {ci} {reach}"
            case VerdictKind.INSUFFICIENT_SAMPLES:
                body = (f"insufficient samples ({c.boots_current} current and {c.boots_reference} reference "
                        f"boots with enough valid samples, at least {MIN_SAMPLES_PER_BOOT} each)")
                return prefix + body + (f"; {note}" if note else "")
            case VerdictKind.NOT_COMPARABLE:
                body = f"not comparable to the baseline ({change}, {ci}; reported only"
            case VerdictKind.NOT_JUDGED:
                return prefix + f"not judged ({note})"
            case VerdictKind.INCONCLUSIVE:
                body = f"inconclusive ({change} is beyond the {tol} tolerance, but {no_sign}"
            case _:
                assert_never(kind)
    tail = f"; {note}" if note else ""
    return f"{prefix}{body}; {evidence_text(c)}{tail})"


# --- the engine's clock beside the client's (judge/engine_clock.py) ---------------------------

# What each figure's change is in a sentence: the client's and the engine's side of it.
_CLIENT_FIGURE = {"tpot": ("client", " a token"), "ttft": ("client TTFT", "")}
_ENGINE_FIGURE = {"tpot": "engine", "ttft": "engine queue+prefill"}
_ENGINE_RELATIVE = {"tpot": "engine time per token", "ttft": "engine queue+prefill"}
_WHERE_WORDS = {
    ChangeLocation.ENGINE: "the engine's",
    ChangeLocation.OUTSIDE: "outside the engine (API server, network or client)",
}


def _ms(value: float) -> str:
    """A signed change in milliseconds: ``+8.1``, ``+0.32``, ``+0.0`` (under 5 us: no change a
    histogram of milliseconds can tell)."""
    if abs(value) < 0.005:
        return "+0.0"
    return f"{value:+.2g}" if abs(value) < 1 else f"{value:+.1f}"


def _ms_interval(part: Part) -> str:
    return f"{_ms(part.low)}..{_ms(part.high)}"


@note_text.register
def _(note: TwoClocks) -> str:
    level = f"{note.level:.0%}"
    if note.engine is None or note.outside is None or note.client_ms is None:
        # No split in milliseconds: the engine's own figure, relative, and why nothing is placed.
        interval = (f"{fmt_ci(note.engine_low, note.engine_high)}, {level}" if note.engine_low is not None
                    else "one boot a side: no interval")
        text = f"{_ENGINE_RELATIVE[note.figure]} {fmt_change(note.engine_change)} ({interval})"
        if note.why is UnplacedWhy.MEANS_DISAGREE:
            text += (": unplaced: the client's mean over the same requests moved the other way from its "
                     "comparison's medians")
        elif note.why is UnplacedWhy.FEW_BOOTS:
            text += ": unplaced"
    else:
        client, per = _CLIENT_FIGURE[note.figure]
        unit = "" if per else " ms"
        text = (f"{client} {_ms(note.client_ms)} ms{per}, {_ENGINE_FIGURE[note.figure]} {_ms(note.engine.ms)}{unit} "
                f"({_ms_interval(note.engine)}, {level})")
        match note.where:
            case ChangeLocation.ENGINE | ChangeLocation.OUTSIDE:
                text += f": {_WHERE_WORDS[note.where]}"
            case ChangeLocation.BOTH:
                share = note.engine.ms / note.client_ms
                text += (f": both: the engine's {share:.0%} of it, outside {_ms(note.outside.ms)}{unit} "
                         f"({_ms_interval(note.outside)})")
            case ChangeLocation.UNPLACED if note.why is UnplacedWhy.FEW_DF:
                df = min(note.engine.df, note.outside.df)
                text += (f": unplaced: {note.boots_current} vs {note.boots_reference} boots give {df:.1f} degrees "
                         f"of freedom, too few to place it (more than {UNPLACED_DF:g})")
            case ChangeLocation.UNPLACED:
                text += ": unplaced: neither the engine's part nor the part outside it moved a material share on its own"
            case _:
                pass
    if note.withdrawn:
        text += (f"; sign withdrawn: this profile differs from {note.reference or 'its reference'} only in what "
                 "reaches the engine's workers, and the engine's clock did not move with the client's, so the "
                 "change is not the profile's")
    return text


@note_text.register
def _(note: NotAppended) -> str:
    if note.why is AppendWhy.FAILED:
        which = (f"{note.failed} perf test{'s' * (note.failed != 1)} failed or {'was' if note.failed == 1 else 'were'} "
                 "invalid" if note.failed else "a test failed")
        return f"not appended to the baseline history: {which}, and a failing run appends nothing"
    if note.why is AppendWhy.BRANCH:
        on = f"branch {note.branch!r}" if note.branch else "no branch (a detached checkout)"
        return f"not appended to the baseline history: this run is on {on}, and appends only on {','.join(note.allowed)}"
    label = metric_spec(note.metric).heading if note.metric else note.metric
    if note.why is AppendWhy.UNRESOLVED:
        return (f"not appended to the baseline history: {label} of {note.test} [{note.profile}] looked "
                f"{fmt_change(note.gain)} against it, beyond its {fmt_tolerance(note.tolerance)} tolerance, without "
                f"a verdict ({note.verdict}): a change this run could not rule out is not taken into the history")
    why = "the host canary moved" if note.canary_moved else "the profile's environment or arguments differ"
    return (f"not appended to the baseline history: {label} of {note.test} [{note.profile}] is not comparable to it "
            f"({why}; {fmt_change(note.gain)}): another host or configuration joins the history only on purpose "
            "(--kimiperf-update-baselines)")


@note_text.register
def _(note: NeedsBoots) -> str:
    return f"a verdict needs {note.boots} boots: one boot can screen, never convict"


@note_text.register
def _(note: TooFewSamples) -> str:
    if note.tail:
        return f"insufficient samples for this tail: a boot needs {note.need}, this one has {note.have}"
    return f"this boot has {note.have} valid sample{'s' * (note.have != 1)}: failed requests are not samples"


@note_text.register
def _(note: HistoryModes) -> str:
    apart = (note.high_center / note.low_center - 1.0) * 100
    between = (f"; {note.unclear} boot(s) of this run in neither mode (or both), read against the better one ("
               + ("another likely placing disagrees, so no direction)" if note.disagree else "every placing agrees)")
               ) if note.unclear else ""
    placed = "the mode the test's metrics place it in together" if note.joint else "the mode it clearly belongs to"
    worse = (f"; {note.worse} of {note.placed} boots in the worse mode, which holds {note.worse_share:.0%} of the "
             f"history (chance {note.p:.2g})") if note.placed else ""
    return (f"the history holds 2 modes {apart:.0f}% apart ({note.low_boots} boots at {note.low_center:.4g}, "
            f"{note.high_boots} at {note.high_center:.4g}): each boot judged against {placed}, so a change of "
            f"about that size reads as no change (never as better){between}{worse}")


def _when(at: str, commit: str) -> str:
    """A stored boot as a reader finds it: its recording time to the minute, and its commit."""
    when = at.replace("T", " ")[:16] if at else "an unknown time"
    return f"{when} ({commit[:10]})" if commit else when


@note_text.register
def _(note: HistoryStep) -> str:
    return (f"stepped {note.change * 100:+.1f}% between {_when(note.before, note.before_commit)} and "
            f"{_when(note.after, note.after_commit)} ({note.boots_before} boots before, {note.boots_after} after)")


@note_text.register
def _(note: HistorySteps) -> str:
    steps = "; ".join(note_text(step) for step in note.steps)
    return (f"the history {steps}: judged against the {note.judged_boots} "
            f"boot{'s' * (note.judged_boots != 1)} since the last step")


@note_text.register
def _(note: DeclaredModes) -> str:
    return f"spawn modes {note.drop:.0%} apart declared ({note.slow_share:.0%} of boots slow)"


@note_text.register
def _(note: BootsToDecide) -> str:
    if note.have_them:
        return "the boots' own spread is what holds it back"
    if note.needed is not None:
        return f"{note.needed} boots a side would decide a change this size"
    return (f"no number of boots up to {note.max_boots} a side decides a change this size: "
            "the spawn modes explain it")


@note_text.register
def _(note: BootsForWithin) -> str:
    if note.needed is None:
        return (f"no number of boots up to {note.max_boots} a side would show it within the tolerance, "
                "at the change and spread these boots show")
    if note.needed <= note.have:
        return "the boots' own spread is what keeps it from \"within\""
    more = note.needed - note.have
    return (f"{more} more boot{'s' * (more != 1)} a side ({note.needed} in all, --kimiperf-boots {note.needed}) "
            "would show it within the tolerance, with 90% power")


@note_text.register
def _(note: LeftOut) -> str:
    return f"boot {note.boot} failed and is no sample of this build: {joined(note.reasons)}"


@note_text.register
def _(note: ResolvePlan) -> str:
    goal = fmt_tolerance(note.goal)
    if note.boots is None and note.levels:
        level = ", ".join(level_spread_text(ls) for ls in note.levels)
        if note.sessions is None:
            return (f"to resolve a {goal} change neither boots in this run nor up to {note.max_sessions} "
                    f"sessions of this profile are enough ({level}): it takes a wider tolerance")
        return (f"to resolve a {goal} change no number of boots in this run is enough "
                f"({level}: each run shares its session); it takes about {note.sessions} sessions of this profile "
                f"(separate runs, {note.boots_per_session} boots each) against a baseline recorded over as many")
    spread = fmt_tolerance(note.spread)
    if note.boots is None:
        return (f"to resolve a {goal} change at a boot spread of {spread} "
                f"the baseline's {note.boots_reference} boots are too few: record more with --kimiperf-update-baselines "
                "--kimiperf-boots N")
    return (f"to resolve a {goal} change at a boot spread of {spread} "
            f"you need {note.boots} boots of this profile against the baseline's {note.boots_reference}")


# --- a metric against its baseline ----------------------------------------------------------

def canary_text(check: CanaryCheck) -> str:
    """``host differs (canary cpu_gflops -48%, copy_gbs -41%)``, or what was compared."""
    parts = ", ".join(f"{k} {v * 100:+.0f}%" for k, v in sorted(check.shifts.items()))
    return f"host differs (canary {parts})" if check.moved else f"host canary within noise ({parts})"


def _env_text(env: EnvDiff) -> str:
    said = bool(env.baseline_args or env.run_args)  # server arguments: said where either side has some
    return (f"the baseline was recorded with profile environment {dict(env.baseline_env)}"
            f"{f' and args {list(env.baseline_args)}' * said}, this run used {dict(env.run_env)}"
            f"{f' and args {list(env.run_args)}' * said}")


def _apart(line: BaselineLine) -> list[str]:
    """How the baseline's host or set-up differs from this run's: its canary, its environment."""
    said = []
    if line.canary is not None:
        said.append(f"{canary_text(line.canary)}: the baseline was measured on a host of other speed")
    if line.env is not None:
        said.append(_env_text(line.env))
    return said


def _versions(line: BaselineLine) -> list[str]:
    return [f"judged against the baseline of other software versions on the same hardware ({line.other}): "
            f"{'; '.join(line.versions)}"] if line.versions else []


def beside_comparison(line: BaselineLine) -> list[str]:
    """What a baseline line says beside its comparison, each clause alone: how the baseline's
    host or set-up differs, the software versions it was judged across, the boots left out."""
    return [*_apart(line), *_versions(line), *([note_text(line.left_out)] if line.left_out is not None else [])]


def missing_reason(line: BaselineLine) -> str:
    """Why a metric has no baseline here, without its figures: the same words for every metric
    it holds for, so a report can say them once."""
    missing = f"no baseline for this hardware ({line.fingerprint})"
    if line.state is BaselineState.OTHER_HARDWARE:
        hard = list(line.hard)
        shown = "; ".join(hard[:3]) + (f"; and {len(hard) - 3} more" if len(hard) > 3 else "")
        return f"the baseline was recorded on other hardware ({line.other}: {shown}); {missing}"
    return missing


def _missing_advice(line: BaselineLine, advice: str = RECORD_ADVICE, *, record: bool = True) -> str:
    """What to do where ``line`` has no baseline: state the hardware a baseline of the same
    server was recorded with, and (``record``: not a gate) record only if the hardware is new;
    else ``advice``, what records one."""
    if not line.recorded_hardware:
        return advice
    return select_hardware(line.recorded_hardware) + (f"; if the hardware is new, {advice}" if record else "")


def baseline_line(line: BaselineLine, *, label: bool = True, advice: str = RECORD_ADVICE, record: bool = True) -> str:
    """The gate's line about one metric against its baseline: ``"{label}: {body}: {advice}{tail}"``;
    the advice (:func:`_missing_advice`) only where it is missing, and a report puts its own
    command there (and under a gate, ``record=False``, never records over a same-server baseline)."""
    tail = ""
    if line.state is BaselineState.OFF:
        body = "baselines not in use"
    elif line.state is BaselineState.MISSING:
        body = missing_reason(line)
        if line.others:
            tail = f" (baselines exist for other hardware: {', '.join(line.others)}; not comparable)"
    elif line.state is BaselineState.OTHER_HARDWARE and line.comparison is not None:
        body = f"{comparison_line(line.comparison, label=False)} — {missing_reason(line)}"
    else:
        body = comparison_line(line.comparison, label=False) if line.comparison is not None else ""
        body += "".join(f" — {clause}" for clause in _apart(line))
        tail = "".join(f" — {clause}" for clause in _versions(line))
    if line.left_out is not None:
        tail += f" — {note_text(line.left_out)}"
    head = f"{line.label}: " if label and line.label else ""
    return f"{head}{body}{f': {_missing_advice(line, advice, record=record)}' if line.state.missing else ''}{tail}"


@note_text.register
def _(note: BaselineLine) -> str:
    return baseline_line(note)


@note_text.register
def _(note: VerdictNote) -> str:
    line = comparison_line(note.comparison)
    if note.adopt:
        return line + f"; to adopt it, {RECORD_ADVICE}"
    return line + (f"; {note_text(note.plan)}" if note.plan is not None else "")


@note_text.register
def _(note: MissingBaselines) -> str:
    # One reason, once: the metrics it holds for share it (another hardware's figures are the
    # tables', shown, never judged). Never the record advice over a same-server baseline: this
    # is a gate's failure, and recording would take a regression as the baseline.
    by_reason: dict[tuple[str, str], list[str]] = {}
    for line in note.lines:
        by_reason.setdefault((missing_reason(line), _missing_advice(line, record=False)), []).append(line.label)
    said = [f"{', '.join(labels)}: {reason}: {advice}" for (reason, advice), labels in by_reason.items()]
    return "missing baseline (--kimiperf-missing-baseline=fail): " + "; ".join(said)


# --- what the gate says of a boot -----------------------------------------------------------

@note_text.register
def _(note: InvalidRun) -> str:
    advice = advice_for((note.cause,))
    return f"INVALID measurement: {note.reason}" + (f" ({advice})" if advice else "")


@note_text.register
def _(note: FailedRequests) -> str:
    reasons = "; ".join(f"{n}x {reason}" for reason, n in note.reasons)
    line = f"{note.failed} of {note.total} measured requests failed and are not counted ({reasons})"
    if note.limit is None:
        return line
    return f"{line}: more than {note.limit:.0%} failed, the server did not serve this load"


@note_text.register
def _(note: GoodputSlos) -> str:
    return "goodput SLOs: " + ", ".join(f"{k} <= {v:g}" for k, v in note.limits)


@note_text.register
def _(note: SloCheck) -> str:
    label = f"SLO {note.metric} {'<=' if note.lower_is_better else '>='} {note.limit:g} {note.unit}"
    if note.status == SloCheck.UNCHECKED:
        return (f"{label}: insufficient samples for {note.label} ({note.n} on this boot, "
                f"{note.needed} needed): not checked")
    line = f"{label}: {note.median:.4g} {note.unit} on this boot ({note.n} samples)"
    return line + (" — SLO missed" if note.status == SloCheck.MISSED else "")


def floor_line(fr: FloorResult) -> str:
    """One line, e.g. "decode 38.2 tok/s is below the floor of 40 tok/s"."""
    unit = f" {fr.unit}" if fr.unit else ""
    head = f"{fr.label} {fmt_value(fr.median)}{unit}".strip()
    if fr.status is FloorStatus.BELOW_FLOOR:
        return f"{head} is below the floor of {fmt_value(fr.floor)}{unit}"
    if fr.status is FloorStatus.BELOW_TARGET:
        floor = "" if fr.floor is None else f"above the floor of {fmt_value(fr.floor)}{unit} but "
        return f"{head} is {floor}below the target of {fmt_value(fr.target)}{unit}"
    if fr.target is not None:
        return f"{head} meets the target of {fmt_value(fr.target)}{unit}"
    if fr.floor is not None:
        return f"{head} meets the floor of {fmt_value(fr.floor)}{unit} (no target set)"
    return f"{head} (no floor or target set)"


@note_text.register
def _(note: FloorNote) -> str:
    return floor_line(note.floor)


@note_text.register
def _(note: NoDecode) -> str:
    if not note.sent:
        return "single-stream decode: no valid request to measure"
    why = ", ".join(f"{n} {withheld_words(reason)}" for reason, n in note.withheld)
    return f"single-stream decode: none of the {note.sent} requests sent gave a decode figure ({why})"


@note_text.register
def _(note: BootPlanned) -> str:
    return f"boot {note.boot} of {note.boots} planned: the verdict comes after boot {note.boots}"


def _change_so_far(look: ChangeSoFar, *, tolerance: bool) -> str:
    line = f"{look.metric} looks {look.change * 100:+.1f}% on {look.boots} boot(s)"
    return line + (f", beyond the {look.tolerance:.0%} tolerance" if tolerance else "")


@note_text.register
def _(note: BootAsked) -> str:
    return (f"boot {note.boot} of {note.profile} asked for: "
            + "; ".join(_change_so_far(look, tolerance=False) for look in note.looks)
            + " (one boot can screen, never convict)")


def unresolved_text(note: Unresolved) -> str:
    """Why a change stays unresolved for good, and what would resolve it."""
    return ("; ".join(_change_so_far(look, tolerance=True) for look in note.looks)
            + " (one boot can screen, never convict); this run cannot boot the attached server again: "
            f"give deployment {note.deployment} a restart_command (such as ['systemctl', 'restart', 'vllm']) "
            f"and the plugin restarts it for the {note.boots_needed} or more boots a verdict needs")


@note_text.register
def _(note: Unresolved) -> str:
    return f"UNRESOLVED: {unresolved_text(note)}"


@note_text.register
def _(note: Drifted) -> str:
    return (f"DRIFT: {note.label} {fmt_change(note.change)} since the baseline was recorded ({note.anchor_at}), on the line "
            f"through the {note.nights} runs since (this one and {note.nights - 1} appended on passing), at best "
            f"{fmt_change(note.bound)}: beyond the {fmt_tolerance(note.tolerance)} tolerance; find the change, or if "
            f"it is meant, record the baseline again (--kimiperf-update-baselines: it {RECORDING_ACCEPTS})")


@note_text.register
def _(note: SoftFingerprint) -> str:
    return ("the baseline was recorded with other soft facts (they only warn; the hardware "
            f"and software that set speed match): {'; '.join(note.changes)}")


# --- a whole test ---------------------------------------------------------------------------

def warning_lines(result: TestResult) -> list[str]:
    """The test's warnings as shown."""
    return [note_text(w.note) for w in result.warnings]


def unrecordable_text(result: TestResult) -> str | None:
    """Why --kimiperf-update-baselines does not record this boot (None: it may)."""
    return joined(result.unrecordable) if result.unrecordable else None


def not_recorded_line(result: TestResult) -> str:
    """A boot --kimiperf-update-baselines left out, and why."""
    why = f"INVALID: {result.invalid}" if result.invalid else unrecordable_text(result)
    return f"{result.test} [{result.profile}, boot {result.boot}]: {why}"
