"""What the summary's first screen answers: one line per question, with its
compact rows, what each boot measured, the engine's clock and the next step.

Did each profile change the reference on its test's primary metric, did any metric move against
the baseline, did the run pass: one line each (:func:`answer_lines`, :func:`run_verdict`,
:func:`failure_lines`), from the compact rows (:class:`CompactRow`) that the terminal's tables
and `kimiperf compare` show too. A figure that could not be taken is a count with its reason, on the
answer whose sides lost any (measure/coverage.py). What the engine's clock says of a comparison
was decided in judge/engine_clock.py; this module only says it.

A missing baseline is said once (:func:`missing_baseline_warning`: once per metric, test and boot
was 48 warnings for one fact), with the command that records it (:func:`outcome_line`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
import enum

from pytest_kimiperf.config.metric_specs import METRICS, SampleKind, metric_spec
from pytest_kimiperf.judge.engine_clock import EngineChange, engine_change, two_clocks_of
from pytest_kimiperf.judge.gate import PerfOutcome, outcome_of
from pytest_kimiperf.judge.noise import misdeclared
from pytest_kimiperf.judge.notes import BootsForWithin
from pytest_kimiperf.judge.profiles import WITHIN_INTERVAL
from pytest_kimiperf.judge.stats import Comparison, VerdictLeaning, VerdictKind, leaning
from pytest_kimiperf.judge.verdicts import BaselineState, MissingBaselines as MissingBaselineNote, TestResult
from pytest_kimiperf.measure.coverage import CLIENT_REASONS, Coverage, StreamShape
from pytest_kimiperf.measure.invalid_causes import advice_for
from pytest_kimiperf.measure.results import median
from pytest_kimiperf.measure.server_view import ENGINE_METRICS
from pytest_kimiperf.numbers import fmt_change, fmt_ci, fmt_value
from pytest_kimiperf.reports.model import SessionReport, boot_label, metric_heading, profile_verdict, short_test
from pytest_kimiperf.reports.sentences import (
    RECORDING_ACCEPTS, beside_comparison, missing_reason, note_text, select_hardware, withheld_words,
)


# A tail of the inter-token gaps counts gaps, not requests.
GAPS = "inter-token gaps"


def figure_of(metric: str) -> str | None:
    """The per-request figure whose count a checked metric rests on (GAPS for the ITL tail);
    None for a metric of rounds or boots."""
    spec = metric_spec(metric)
    if spec.sample is SampleKind.REQUEST:
        return metric
    if spec.sample is SampleKind.TAIL and spec.base is not None:
        return GAPS if spec.base == "itl_ms" else spec.base
    return None


# A test of rounds (throughputs) checks no per-request figure: its line counts its requests by the
# one every request that completed gives (E2EL rests on the last stamp, which always holds).
COMPLETED = "requests"


def _figures(results: Sequence[TestResult]) -> list[str]:
    found = list(dict.fromkeys(f for res in results for m in res.metrics if (f := figure_of(m)) is not None))
    return found or [COMPLETED]


def _count(account: Coverage, figure: str) -> tuple[int, int, Counter[str]]:
    """(measured, sent, withheld by reason) of one figure in one boot's window."""
    if figure == GAPS:
        held = account.gaps_client_held
        return account.gaps_measured, account.gaps_measured + held, Counter({"client-held": held} if held else {})
    count = account.of("e2el_ms" if figure == COMPLETED else figure)
    return count.measured, count.sent, Counter(count.withheld)


def _why(withheld: Counter[str], loop_worst_ms: float | None) -> str:
    """Why figures were withheld, and the client's worst loop latency where the client held them."""
    reasons = ", ".join(f"{n} {withheld_words(reason)}" for reason, n in withheld.most_common())
    if not any(r in CLIENT_REASONS for r in withheld):
        return reasons
    late = f" (its loop ran up to {loop_worst_ms:.1f} ms late)" if loop_worst_ms is not None else ""
    return f"{reasons}; the client was held off the CPU{late}"


@dataclass(frozen=True)
class _FigureAccount:
    """One test's figure over its boots: each profile's measured/sent per boot, and why the rest
    were not measured."""

    test: str
    name: str
    counts: str
    not_measured: int
    why: str


def _accounts(report: SessionReport) -> list[_FigureAccount]:
    by_test: dict[str, list[TestResult]] = {}
    for res in report.results:
        if res.run is not None and res.run.measured is not None:
            by_test.setdefault(res.test, []).append(res)
    accounts = []
    for test, results in by_test.items():
        for figure in _figures(results):
            profiles: dict[str, list[str]] = {}
            lost: Counter[str] = Counter()
            loop_worst_ms: float | None = None
            for res in sorted(results, key=lambda r: r.boot):
                assert res.run is not None and res.run.measured is not None
                measured, sent, withheld = _count(res.run.measured, figure)
                if not sent:
                    continue  # a boot that sent nothing (its run failed before its window) counts nothing
                profiles.setdefault(res.profile, []).append(f"{measured}/{sent}")
                lost += withheld
                if (late := res.run.measured.loop_max_ms) is not None:
                    loop_worst_ms = max(loop_worst_ms or 0.0, late)
            if not profiles:
                continue
            name = GAPS if figure == GAPS else "requests completed" if figure == COMPLETED else metric_spec(figure).label
            counts = "; ".join(f"{profile} {', '.join(boots)}" for profile, boots in profiles.items())
            why = _why(lost, loop_worst_ms)
            accounts.append(_FigureAccount(short_test(test), name, counts, sum(lost.values()), why))
    return accounts


def measured_lines(report: SessionReport, *, only_lost: bool = False) -> list[str]:
    """One line per test and figure it checks: every boot's measured of sent, by profile, and why
    the rest were not measured (``only_lost``: only the lines where some were not)."""
    return [f"{a.test}, {a.name} measured of sent: {a.counts}"
            + (f" ({a.not_measured} not measured: {a.why})" if a.not_measured else "")
            for a in _accounts(report) if a.not_measured or not only_lost]


def unmeasured_line(report: SessionReport) -> str | None:
    """One line on every figure the run did not measure for every request it sent, all tests and
    boots together (None: it measured every one): what ``-q`` keeps of the lines above."""
    parts = [f"{a.test}, {a.name}: {a.not_measured} ({a.why})" for a in _accounts(report) if a.not_measured]
    return "kimiperf: not measured: " + " | ".join(parts) if parts else None


def lost_remark(report: SessionReport, test: str, metric: str, profiles: Sequence[str]) -> str:
    """'' where every boot of ``profiles`` measured ``metric``'s figure for every request it sent;
    else what each side measured of what it sent, and why not the rest."""
    figure = figure_of(metric)
    if figure is None:
        return ""
    sides = []
    lost: Counter[str] = Counter()
    for profile in profiles:
        boots = [res for res in report.results if res.test == test and res.profile == profile
                 and res.run is not None and res.run.measured is not None]
        measured = sent = 0
        for res in boots:
            assert res.run is not None and res.run.measured is not None
            m, s, withheld = _count(res.run.measured, figure)
            measured, sent, lost = measured + m, sent + s, lost + withheld
        if sent:
            sides.append(f"{measured} of {sent} on {profile}")
    if not sum(lost.values()):
        return ""
    name = GAPS if figure == GAPS else metric_spec(figure).label
    short = ", ".join(f"{n} {_SHORT.get(reason, reason)}" for reason, n in lost.most_common())
    return f" ({name} measured {', '.join(sides)}: {short})"


# The answers' remark says why in few words; the summary's lines say it in full.
_SHORT: dict[str, str] = {
    "failed": "failed", "no-token": "without a token", "one-token": "of one token",
    "client-held": "held by the client", "one-read": "written whole in one read",
}


def stream_remark(report: SessionReport, test: str, profiles: Sequence[str]) -> str:
    """What the streams of ``test`` on ``profiles`` showed of the server, where they showed
    anything a smooth stream of one token a chunk does not: its stalls, chunks it wrote
    together, tokens several to a chunk, and a server that counted no chunk's tokens ('' else)."""
    shapes: list[tuple[str, StreamShape]] = [
        (res.profile, res.run.measured.stream) for res in report.results
        if res.test == test and res.profile in profiles and res.run is not None and res.run.measured is not None]
    if not shapes:
        return ""
    said = []
    for profile in dict.fromkeys(p for p, _ in shapes):
        mine = [shape for p, shape in shapes if p == profile]
        requests = sum(shape.requests for shape in mine)
        where = f" on {profile}" if len(profiles) > 1 else ""
        stalls = [ms for shape in mine for ms in shape.stall_ms]
        if stalls:
            said.append(f"the server stalled about {median(stalls):.0f} ms mid-stream in {len(stalls)} of {requests} "
                        f"requests{where}")
        whole = sum(shape.one_read_requests for shape in mine)
        together = sum(shape.written_together_requests for shape in mine) - whole
        if whole:
            said.append(f"it wrote {whole} of {requests} streams whole in one read{where}")
        if together > 0:
            said.append(f"it wrote chunks together in {together} of {requests} streams{where}")
        widest = max((shape.tokens_per_chunk_max or 0 for shape in mine), default=0)
        if widest > 1:
            said.append(f"its chunks carried up to {widest} tokens{where} (decode counts each token)")
    return f" ({'; '.join(said)})" if said else ""


def no_counts_line(report: SessionReport) -> str | None:
    """Once a session: the server put no running token count in its chunks, so decode and TPOT
    take the first chunk for one token, as bench serve does (None: every run had the counts, or
    its report predates them)."""
    uncounted = sorted({res.profile for res in report.results if res.run is not None and res.run.measured is not None
                        and res.run.measured.stream.requests and not res.run.measured.stream.counted_requests})
    if not uncounted:
        return None
    return (f"token counts: the server on {', '.join(uncounted)} gave none per chunk (stream_options."
            "continuous_usage_stats): decode and TPOT take each first chunk for one token, as bench serve does")


def _boots(results: Sequence[TestResult], test: str, profile: str) -> list[TestResult]:
    return sorted((r for r in results if r.test == test and r.profile == profile and r.invalid is None
                   and r.run is not None and r.run.server_metrics), key=lambda r: r.boot)


def engine_words(results: Sequence[TestResult], test: str, comparison: Comparison | None, current: str,
                 reference: str | None) -> str:
    """What the engine's clock said of ``comparison``, after the client's answer: ``"; ..."``, or
    "" where it said nothing; against a ``reference`` profile, also whether what lies between the
    engine and the client moved."""
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


def primary_of(results: Sequence[TestResult]) -> dict[str, str]:
    """Each test's primary metric, as its boots recorded it (TestResult.primary): the metric its
    answer line speaks of; a test whose boots recorded none (an older report) takes the first
    metric it checked."""
    primary: dict[str, str] = {}
    for res in results:
        if res.primary is not None:
            primary[res.test] = res.primary
        elif res.test not in primary and res.metrics:
            primary[res.test] = next(iter(res.metrics))
    return primary


def interval_level(comparison: Comparison, *, in_session: bool) -> float:
    """The level of the interval a row shows: the gate's equivalence level, or for a profile
    judged within tolerance in one session the narrower interval that claim rests on."""
    if in_session and comparison.verdict is VerdictKind.WITHIN_TOLERANCE:
        return WITHIN_INTERVAL
    return comparison.equivalence_confidence


@dataclass(frozen=True)
class CompactRow:
    """One metric of one test under one profile: its change against the reference (another
    profile, or the baseline), the interval at its level, and the verdict; or why there is none."""

    test: str
    metric: str
    profile: str
    comparison: Comparison | None
    note: str | None = None
    in_session: bool = True  # against another profile of this session; False: against the baseline
    primary: bool = False  # the test's primary metric (TestResult.primary); the others are secondary
    invalid: bool = False  # the boot's measurement was INVALID: the note says why

    @property
    def verdict(self) -> str:
        """The verdict as the table shows it (between profiles "worse"/"better", against the
        baseline the gate's REGRESSION), or the note that stands in for one."""
        if self.comparison is None or self.note:
            return self.note or ""
        if self.in_session:
            return profile_verdict(self.comparison)
        verdict = self.comparison.verdict
        return "REGRESSION" if verdict is VerdictKind.REGRESSION else str(verdict.value)

    @property
    def interval(self) -> str:
        """``-4.8..+5.4% (90%)``: the interval with its level ("" where there is no comparison)."""
        c = self.comparison
        if c is None:
            return ""
        return f"{fmt_ci(c.ci_low, c.ci_high)} ({interval_level(c, in_session=self.in_session) * 100:.0f}%)"


def profile_rows(report: SessionReport) -> list[CompactRow]:
    """Each test, metric and non-reference profile against the reference profile, on all boots:
    one row each, the comparison where there is one, else the first boot's note (an INVALID boot
    is named in the answers, not once a row)."""
    rows: dict[tuple[str, str, str], CompactRow] = {}
    primary = primary_of(report.results)
    for block in report.test_blocks():
        for metric in block.metrics:
            for cell in metric.cells:
                if cell.is_reference or (cell.comparison is None and cell.note is None):
                    continue  # the reference, or an earlier boot: compared once, on the last
                key = (block.test, metric.metric, cell.name or cell.profile)
                if key not in rows or (rows[key].comparison is None and cell.comparison is not None):
                    note = None if cell.comparison is not None else cell.note
                    rows[key] = CompactRow(*key, cell.comparison, note,
                                           primary=primary.get(block.test) == metric.metric, invalid=cell.invalid)
    return list(rows.values())


def last_boots(results: Sequence[TestResult]) -> list[TestResult]:
    """Each test's and profile's last boot, whose baseline verdict rests on all its boots."""
    last: dict[tuple[str, str], TestResult] = {}
    for res in results:
        key = (res.test, res.profile)
        if key not in last or res.boot >= last[key].boot:
            last[key] = res
    return list(last.values())


def baseline_rows(report: SessionReport) -> list[CompactRow]:
    """Each test, metric and profile against the baseline, on its last boot; metrics with no
    baseline are left to the answer block's one line."""
    rows = []
    primary = primary_of(report.results)
    for res in last_boots(report.results):
        for metric, mres in res.metrics.items():
            first = primary.get(res.test) == metric
            if mres.baseline is not None:
                rows.append(CompactRow(res.test, metric, res.profile, mres.baseline, in_session=False, primary=first))
            elif res.invalid:
                rows.append(CompactRow(res.test, metric, res.profile, None, "INVALID measurement", in_session=False,
                                       primary=first, invalid=True))
    return rows


@dataclass(frozen=True)
class MissingBaselineWarning:
    """The tests, profiles and metrics that had no baseline for this machine's fingerprint."""

    fingerprint: str
    # test -> (profiles, metric labels), in the order the run met them
    tests: dict[str, tuple[list[str], list[str]]]
    metrics: int  # metric x test x profile, each counted once however many boots it had
    # The hardware a baseline of the same server was recorded under (BaselineLine.recorded_hardware):
    # stating it is the advice, not recording.
    recorded_hardware: str = ""

    def listing(self) -> str:
        """``test_ttft [default, ring-ll]: time to first token, p90 time to first token; ...``"""
        return "; ".join(self.lines())

    def lines(self, most: int | None = None) -> list[str]:
        """One line per test (``most`` of them, then how many more)."""
        lines = [f"{test} [{', '.join(profiles)}]: {', '.join(labels)}" for test, (profiles, labels) in self.tests.items()]
        if most is not None and len(lines) > most:
            more = len(lines) - most
            lines = [*lines[:most], f"and {more} more test{'s' * (more != 1)} (the summary's tables list them)"]
        return lines

    def next_step(self, record_command: str, *, gate: bool) -> str:
        """What to do: state the hardware a baseline of this server was recorded under (under a
        gate, only that), else record, saying what recording accepts."""
        record = f"{record_command} (it {RECORDING_ACCEPTS})"
        if not self.recorded_hardware:
            return record
        return select_hardware(self.recorded_hardware) + ("" if gate else f"; if the hardware is new, {record}")


def missing_baselines(results: Sequence[TestResult], fingerprint: str) -> MissingBaselineWarning | None:
    """What had no baseline on this hardware in ``results`` (None when nothing is missing)."""
    tests: dict[str, tuple[list[str], list[str]]] = {}
    seen: set[tuple[str, str, str]] = set()
    recorded = ""
    for res in results:
        for metric, mres in res.metrics.items():
            if mres.baseline_line is None or not mres.baseline_line.state.missing:
                continue
            recorded = recorded or mres.baseline_line.recorded_hardware
            profiles, labels = tests.setdefault(res.test, ([], []))
            if res.profile not in profiles:
                profiles.append(res.profile)
            label = METRICS[metric].label if metric in METRICS else metric
            if label not in labels:
                labels.append(label)
            seen.add((res.test, res.profile, metric))
    return MissingBaselineWarning(fingerprint, tests, len(seen), recorded) if tests else None


# The tests the warning names before "and N more": it stays a few lines however many tests miss one.
_WARNING_TESTS = 3


def missing_baseline_warning(report: SessionReport, record_command: str) -> str | None:
    """The session's one MissingBaselineWarning text, or None when every metric had a baseline
    (or this run records them): a few lines, the tests it covers and the command."""
    if report.baselines_update is not None:
        return None
    missing = missing_baselines(report.results, _fingerprint(report))
    if missing is None:
        return None
    boots = max((res.boot for res in report.results), default=0)  # the most any profile had
    metrics, tests = missing.metrics, len(missing.tests)
    command = f"{record_command} ({boots} boot{'s' * (boots != 1)} per profile, as this run)"
    return "\n".join([
        f"no baseline for this hardware ({missing.fingerprint}) for {metrics} metric{'s' * (metrics != 1)} "
        f"of {tests} test{'s' * (tests != 1)}, judged against no history:",
        *(f"  {line}" for line in missing.lines(_WARNING_TESTS)),
        f"  next: {missing.next_step(command, gate=report.gate)}"])


def outcome_line(report: SessionReport, record_command: str) -> str | None:
    """One line: what this run judged, and what to do next."""
    if not report.results:
        return None
    judged = _judged_besides_history(report)
    update = report.baselines_update
    if update is not None:
        if not update.entries:
            return "no baseline recorded: no test produced a boot that may be recorded (see above)"
        left = len(update.not_recorded)
        skipped = f"; {left} test boot{'s' * (left != 1)} not recorded (listed above)" if left else ""
        if update.on_pass:
            return f"this passing run appended its boots to {update.entries} baseline entries in {update.path}{skipped}"
        anew = (f"; {update.restarted} of them judged changed against their history (a REGRESSION or an "
                "improvement above) start it anew at this run's level, their older boots dropped: review the diff"
                if update.restarted else "")
        return (f"recorded {update.entries} baseline entries in {update.path}{skipped}{anew}; the same run "
                "without --kimiperf-update-baselines now judges against them")
    missing = missing_baselines(report.results, _fingerprint(report))
    tally = _tally(report.results)
    if missing is not None and not tally:
        did = f"this run judged {judged}, nothing against history" if judged else "this run measured but judged nothing"
        then = "" if missing.recorded_hardware else ", then the run you just made judges against it"
        return (f"no baseline for this machine ({missing.fingerprint}) yet: {did}. Next: "
                f"{missing.next_step(record_command, gate=report.gate)}{then}") + _invalid(report.results)
    if not tally:
        return f"this run judged {judged or 'nothing'}; no metric was compared with a baseline"
    order = {word: i for i, word in enumerate(_VERDICT_ORDER)}
    verdicts = ", ".join(f"{tally[v]} {v}" for v in sorted(tally, key=lambda v: order.get(v, len(order))))
    line = f"against this machine's baseline, each test's last boot: {verdicts}"
    if judged:
        line += f"; besides, {judged}"
    if missing is not None:
        metrics = f"{missing.metrics} metric{'s' * (missing.metrics != 1)}"
        line += f". {metrics} had no baseline: {missing.next_step(record_command, gate=report.gate)}"
    return line + _invalid(report.results)


def _invalid(results: Sequence[TestResult]) -> str:
    count = sum(1 for res in results if res.invalid)
    if not count:
        return ""
    return (f". {count} test boot{'s' * (count != 1)} measured INVALID (no verdict from a busy host or an "
            "untrusted client: the failures above say which)")


# The tally's order: what fails first, what passes last.
_VERDICT_ORDER = ("REGRESSION", "improvement", "changed, size unresolved", "inconclusive", "not comparable",
                  "insufficient samples", "no detectable change", "within tolerance")


def _judged_besides_history(report: SessionReport) -> str:
    parts = []
    if report.compared_profiles():
        others = [p for p in report.profile_names() if p != report.reference_profile]
        failed = len(report.control_regressions())
        parts.append(f"{', '.join(others)} against {report.reference_profile}" + (
            f" ({failed} REGRESSION{'s' * (failed != 1)} against the recorded build: the run fails)" if failed else ""))
    if report.floor_results():
        parts.append("the decode floor")
    return " and ".join(parts)


def _tally(results: Sequence[TestResult]) -> Counter[str]:
    last: dict[tuple[str, str], int] = {}
    for res in results:
        last[(res.test, res.profile)] = max(last.get((res.test, res.profile), 0), res.boot)
    tally: Counter[str] = Counter()
    for res in results:
        if res.boot != last[(res.test, res.profile)]:
            continue
        for mres in res.metrics.values():
            if mres.baseline is not None:
                verdict = mres.baseline.verdict.value
                tally["REGRESSION" if verdict == "regression" else verdict] += 1
    return tally


def _fingerprint(report: SessionReport) -> str:
    return str((report.fingerprint or {}).get("key", "unknown"))


def _primary_rows(rows: Sequence[CompactRow], report: SessionReport) -> list[CompactRow]:
    """For each profile, the row of the first test's primary metric that has one."""
    primary = primary_of(report.results)
    chosen: dict[str, CompactRow] = {}
    for row in rows:
        if row.profile in chosen or row.metric != primary.get(row.test):
            continue
        chosen[row.profile] = row
    return list(chosen.values())


class AnswerTone(enum.Enum):
    """How loud an answer is said: a failed check or a run with no verdict, a worse figure, or
    neither."""

    LOUD = "loud"
    WORSE = "worse"
    PLAIN = "plain"


@dataclass(frozen=True)
class Answer:
    """One line of the summary's answers, and how loud it is, decided from the facts it says."""

    text: str
    tone: AnswerTone = AnswerTone.PLAIN


def answer_lines(report: SessionReport) -> list[Answer]:
    """One line per question: each profile against the reference on its primary metric (and what
    its NCCL variables could reach, where decode bypassed NCCL), each profile against the baseline
    on it, the decode floor, and INVALID boots."""
    ref = report.reference_profile
    answers = [Answer(f"{row.profile} vs {ref}, {_about(row)}"
                      f"{engine_words(report.results, row.test, row.comparison, row.profile, ref)}"
                      f"{lost_remark(report, row.test, row.metric, (row.profile, ref))}"
                      f"{stream_remark(report, row.test, (row.profile, ref))}", _tone(row))
               for row in _primary_rows(profile_rows(report), report)]
    if (only_client := client_clock_only(report.results)) is not None:
        answers.append(Answer(only_client))
    if (reach := report.what_nccl_reached()) is not None:  # where decode's all-reduces bypassed NCCL
        others = [p for p in report.profile_names() if p != ref]
        answers.append(Answer(f"{others[0] if len(others) == 1 else 'profiles'} vs {ref}, what NCCL could reach: {reach}"))
    answers += [Answer(f"{row.profile} vs its baseline, {_about(row)}"
                       f"{engine_words(report.results, row.test, row.comparison, row.profile, None)}"
                       f"{lost_remark(report, row.test, row.metric, (row.profile,))}"
                       f"{stream_remark(report, row.test, (row.profile,))}", _tone(row))
                for row in _primary_rows(baseline_rows(report), report)]
    client_alone = sum(1 for res in last_boots(report.results) for m in res.metrics.values()
                       if m.baseline_line is not None and m.baseline_line.client_clock_only)
    if (alone := judged_on_the_client_clock_alone(client_alone)) is not None:
        answers.append(Answer(alone))
    if (uncounted := no_counts_line(report)) is not None:
        answers.append(Answer(uncounted))
    floor = _floor_line(report)
    if floor is not None:
        answers.append(Answer(floor[0], AnswerTone.LOUD if floor[1] else AnswerTone.PLAIN))
    answers += [Answer(line) for line in _not_compared(report)]
    spreads = spread_line(report)
    if spreads is not None:
        answers.append(Answer(spreads))
    invalid = _invalid_line(report)
    if invalid:
        answers.append(Answer(invalid, AnswerTone.LOUD))
    return answers


def spread_line(report: SessionReport) -> str | None:
    """The one line on spreads the run's boots show beyond the deployment's declaration (the
    profile comparisons and each test's last boot against its baseline), None where they show
    none at the run's level (judge/noise.py)."""
    ref = report.reference_profile
    judged = [(f"{metric_heading(pc.metric)} of {short_test(pc.test)} [{pc.profile} vs {ref}]", pc.comparison)
              for pc in report.profile_comparisons if pc.comparison is not None]
    judged += [(f"{metric_heading(row.metric)} of {short_test(row.test)} [{row.profile}]", row.comparison)
               for row in baseline_rows(report) if row.comparison is not None
               and row.comparison.verdict not in (VerdictKind.NOT_COMPARABLE, VerdictKind.NOT_JUDGED)]
    note = misdeclared(judged, deployment=str(report.deployment.get("name") or ""))
    return None if note is None else note_text(note)


def _tone(row: CompactRow) -> AnswerTone:
    """WORSE where the row's verdict leans worse (a slower profile, a regression), else PLAIN."""
    c = row.comparison
    return AnswerTone.WORSE if c is not None and not row.note and leaning(c.verdict) is VerdictLeaning.WORSE else AnswerTone.PLAIN


def _invalid_line(report: SessionReport) -> str | None:
    """The INVALID boots in one line, by test; each test's failure above says why."""
    by_test: dict[str, list[str]] = {}
    for res in report.results:
        if res.invalid:
            by_test.setdefault(short_test(res.test), []).append(f"{res.profile} boot {res.boot}")
    if not by_test:
        return None
    count = sum(len(boots) for boots in by_test.values())
    listing = "; ".join(f"{test} [{', '.join(boots)}]" for test, boots in by_test.items())
    first = next(res.invalid for res in report.results if res.invalid)
    reason = first.split(":", 2)[:2]
    return (f"INVALID, no verdict ({count} test boot{'s' * (count != 1)}, each failure above says why; the "
            f"first: {':'.join(reason).strip()}): {listing}")


def _not_compared(report: SessionReport) -> list[str]:
    """Why metrics that have a baseline were not judged against it (another host's canary, other
    versions), one line per reason; a missing baseline is the run line's to say, once."""
    last = {(res.test, boot_label(res)) for res in last_boots(report.results) if not res.invalid}
    reasons: dict[str, int] = {}
    for row in report.baseline_rows():
        if (row.test, row.profile) not in last or (row.line is not None and row.line.state is BaselineState.MISSING):
            continue
        if row.line is not None and row.line.state is BaselineState.OTHER_HARDWARE:
            # The same for every metric: said once; the figures are the table's, and what to do
            # the run line's (outcome_line), once.
            reason = f"not comparable, shown only: {missing_reason(row.line)}"
        elif row.baseline is None and row.line is not None:
            reason = row.message
        elif row.baseline is not None and row.baseline.verdict is VerdictKind.NOT_COMPARABLE:
            # The figures are the table's; what stands beside them is the same for every metric.
            beside = beside_comparison(row.line) if row.line is not None else []
            reason = "not comparable: " + " — ".join(beside) if beside else row.message
        else:
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
    return [f"against the baseline ({count} metric{'s' * (count != 1)}): {message}" for message, count in reasons.items()]


def _about(row: CompactRow) -> str:
    what = f"{metric_heading(row.metric)} ({short_test(row.test)})"
    c = row.comparison
    if c is None:
        return f"{what}: {row.verdict}"
    # Undecided between profiles: how many boots a side would show it within (judge/profiles.py).
    more = next((f"; {note_text(n)}" for n in c.notes if isinstance(n, BootsForWithin)), "") if row.in_session else ""
    return (f"{what}: {fmt_change(c.change)}, {row.interval}: {row.verdict} "
            f"(tolerance {c.tolerance * 100:g}%, {c.boots_current} vs {c.boots_reference} boots){more}")


def _floor_line(report: SessionReport) -> tuple[str, bool] | None:
    """The decode floor's answer, and whether a boot fell below it."""
    floored = [res for res in report.floor_results() if res.floor is not None]
    if not floored:
        return None
    first = floored[0].floor
    assert first is not None
    below = [res for res in floored if res.floor is not None and res.floor.failed]
    lowest = min(floored, key=lambda res: res.floor.median if res.floor else 0.0)
    limit = f"floor {fmt_value(first.floor)} {first.unit}" if first.floor is not None else "no floor"
    if below:
        names = ", ".join(f"{r.profile} boot {r.boot}" for r in below)
        return f"decode {limit}: BELOW on {names} (lowest {fmt_value(lowest.floor.median if lowest.floor else None)})", True
    low = lowest.floor
    assert low is not None
    return f"decode {limit}: every boot above it (lowest {fmt_value(low.median)}, {lowest.profile} boot {lowest.boot})", False


def run_verdict(report: SessionReport) -> str:
    """``passed``, or ``FAILED`` with what failed it, as the run's answer opens."""
    outcomes = [outcome_of(res) for res in report.results]  # as judge/gate.py decided each
    failed = sum(o in (PerfOutcome.FAILED, PerfOutcome.UNRESOLVED) for o in outcomes) + len(report.control_regressions())
    invalid = outcomes.count(PerfOutcome.INVALID)
    parts = []
    if failed:
        parts.append(f"{failed} test boot{'s' * (failed != 1)} failed")
    if invalid:
        causes = [res.invalid_cause for res in report.results if res.invalid_cause and outcome_of(res) is PerfOutcome.INVALID]
        parts.append(f"{invalid} INVALID ({advice_for(causes) or 'each line says why'})")
    return f"FAILED ({', '.join(parts)})" if parts else "passed"


def failure_lines(report: SessionReport) -> list[str]:
    """Why tests failed: each failed boot's first failure, one line per test and reason, naming
    the boots it holds for (INVALID boots have the answers' line). A missing baseline points to
    the lines that say why (another hardware's, above) and what to do (the run line), once."""
    said: dict[tuple[str, str], list[str]] = {}
    for res in report.results:
        if not res.failures or res.invalid:
            continue
        first = res.failures[0]
        text = (f"missing baseline (--kimiperf-missing-baseline=fail) for {', '.join(line.label for line in first.lines)}: "
                "the run line says what to do" if isinstance(first, MissingBaselineNote) else note_text(first))
        said.setdefault((short_test(res.test), text), []).append(f"{res.profile} boot {res.boot}")
    return [f"FAILED {test} [{', '.join(boots)}]: {text}" for (test, text), boots in said.items()]
