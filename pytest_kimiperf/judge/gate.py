"""Where a verdict is decided: floors, SLOs and baselines under one false-alarm budget per run,
and every reason a run fails or is held back: decided here and nowhere else.

:func:`judge` fills one test boot's result with every failure it finds; :func:`decide_test`
adds a missing baseline under ``--kimiperf-missing-baseline=fail`` and names the test's
:class:`PerfOutcome`; :func:`decide_run` gives the run's exit status. The run's family of
comparisons shares one budget for signs (``stats.family_critical`` per test, :func:`holm` once
every comparison is in: Holm (1979), Scand. J. Statist. 6). The reports only say what these
decided.

Exit statuses of their own, where pytest would exit 1 for these failures alone:
:data:`INVALID_ONLY_EXIT`, 75 (``EX_TEMPFAIL`` in sysexits.h: every failure an INVALID
measurement, nothing learned about the build) and :data:`UNRESOLVED_EXIT`, 76 (every failure
UNRESOLVED, or INVALID with an UNRESOLVED one: a change one boot of an attached server can never
convict). Each such test carries the JUnit property ``kimiperf_outcome``, which is also how the
xdist controller learns it.

The method and why: docs/explanation/methods.md, "The gate: the run's family and the verdict".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
import enum
import math
from typing import assert_never

from scipy import stats as scipy_stats

from pytest_kimiperf.config.deployments import Deployment, Spreads
from pytest_kimiperf.config.metric_specs import Direction, metric_spec
from pytest_kimiperf.judge.baselines import LoadedBaselines, stated_apart
from pytest_kimiperf.judge.engine_clock import engine_boot_of, vllm_named
from pytest_kimiperf.judge.history import DEFAULT_HISTORIES, against_history, drift_failures, joint_placements
from pytest_kimiperf.judge.noise import plan, wants_another_boot
from pytest_kimiperf.judge.notes import (
    BootAsked, BootPlanned, ChangeSoFar, FailedRequests, FloorNote, FloorResult, GoodputSlos, InvalidRun,
    LeftOut, NoDecode, PrefixCacheReused, SloCheck, SoftFingerprint, Unresolved, floor_check,
)
from pytest_kimiperf.judge.profiles import ProfileComparison
from pytest_kimiperf.judge.stats import (
    BootSummary, Comparison, EngineBoot, VerdictLeaning, MIN_BOOTS_DIRECTIONAL, RUN_ALPHA as RUN_ALPHA, TestBoots,
    VerdictKind, band_log, compare_boots, family_critical as family_critical,
)
from pytest_kimiperf.judge.verdicts import (
    BaselineLine, BaselineState, MetricResult, MissingBaselines, ResultWarning, TestResult, VerdictNote,
    WarningKind,
)
from pytest_kimiperf.measure.invalid_causes import InvalidCause


# pytest.ExitCode's values, without importing pytest here.
EXIT_OK = 0
EXIT_TESTS_FAILED = 1
INVALID_ONLY_EXIT = 75
UNRESOLVED_EXIT = 76
OUTCOME_PROPERTY = "kimiperf_outcome"
# An INVALID test's cause (measure.invalid_causes.InvalidCause's value), beside its outcome.
CAUSE_PROPERTY = "kimiperf_invalid_cause"


class PerfOutcome(str, enum.Enum):
    """How one test ended, as the run's exit status counts it."""

    PASSED = "passed"
    FAILED = "failed"  # any failure that is a finding about the build, or not kimiperf's
    INVALID = "invalid"  # nothing learned: its cause says why (measure/invalid_causes.py)
    UNRESOLVED = "unresolved"  # a change beyond the tolerance this run can never convict


def missing_baselines(result: TestResult) -> list[BaselineLine]:
    """The baseline lines of the metrics that have no baseline on this hardware (under any
    software versions): what ``--kimiperf-missing-baseline`` warns or fails on."""
    return [m.baseline_line for m in result.metrics.values()
            if m.baseline_line is not None and m.baseline_line.state.missing]


def outcome_of(result: TestResult) -> PerfOutcome:
    """The outcome of a result whose failures are final (after :func:`decide_test`)."""
    if not result.failures:
        return PerfOutcome.PASSED
    if result.invalid is not None:
        return PerfOutcome.INVALID
    if all(isinstance(failure, Unresolved) for failure in result.failures):
        return PerfOutcome.UNRESOLVED
    return PerfOutcome.FAILED


def decide_test(result: TestResult, *, missing_baseline_fails: bool) -> PerfOutcome:
    """Finish one judged test boot: the metrics without a baseline here become one more failure
    where ``missing_baseline_fails``; then the test's outcome."""
    missing = missing_baselines(result) if missing_baseline_fails and result.invalid is None else []
    if missing:
        result.failures.append(MissingBaselines(tuple(missing)))
    return outcome_of(result)


def failed_outcome(when: str, user_properties: Iterable[tuple[str, object]]) -> PerfOutcome:
    """A failed test report's outcome: its call phase's ``kimiperf_outcome`` property, else FAILED
    (a setup error, a failed teardown, a test that is no perf test)."""
    if when == "call":
        marked = {value for name, value in user_properties if name == OUTCOME_PROPERTY}
        for outcome in (PerfOutcome.INVALID, PerfOutcome.UNRESOLVED):
            if outcome.value in marked:
                return outcome
    return PerfOutcome.FAILED


def invalid_cause(when: str, user_properties: Iterable[tuple[str, object]]) -> str | None:
    """A failed call report's INVALID cause (its ``kimiperf_invalid_cause`` property), else None."""
    if when != "call":
        return None
    return next((str(value) for name, value in user_properties if name == CAUSE_PROPERTY), None)


@dataclass
class FailedTests:
    """The run's failed test reports, by outcome (a test can fail in setup, call and teardown:
    each report counts)."""

    by_outcome: dict[PerfOutcome, list[str]] = field(default_factory=dict)
    invalid_causes: list[str] = field(default_factory=list)

    def add(self, nodeid: str, outcome: PerfOutcome, cause: str | None = None) -> None:
        self.by_outcome.setdefault(outcome, []).append(nodeid)
        if outcome is PerfOutcome.INVALID and cause:
            self.invalid_causes.append(cause)

    def causes(self) -> tuple[str, ...]:
        """The INVALID tests' causes, each once, in the order they came."""
        return tuple(dict.fromkeys(self.invalid_causes))

    def tests(self, outcome: PerfOutcome) -> int:
        """How many distinct tests failed with ``outcome``."""
        return len(dict.fromkeys(self.by_outcome.get(outcome, [])))


class RunEnd(str, enum.Enum):
    """Why the run ends as it does (each is one exit status)."""

    PYTEST = "pytest"  # as pytest decided: passed, or tests failed, or pytest's own status
    CONTROL_REGRESSION = "control-regression"  # slower than the control booted in this session
    OUTPUT_ERROR = "output-error"  # a report or baseline could not be written (or a warning escalated)
    ONLY_INVALID = "only-invalid"  # every failure INVALID: the causes' advice says what to do
    ONLY_UNRESOLVED = "only-unresolved"  # every failure UNRESOLVED (or INVALID)


@dataclass(frozen=True)
class RunDecision:
    """How the run ends: its exit status, why, and what of this run failed it."""

    exit_status: int
    end: RunEnd
    control_regressions: tuple[ProfileComparison, ...] = ()
    errors: tuple[str, ...] = ()
    invalid_tests: int = 0
    unresolved_tests: int = 0
    invalid_causes: tuple[str, ...] = ()  # the INVALID tests' causes (InvalidCause values), each once

    @property
    def passed(self) -> bool:
        """Whether the run passed (what --kimiperf-append-on-pass asks)."""
        return self.exit_status == EXIT_OK


def control_regressions(comparisons: Sequence[ProfileComparison], *, control: bool) -> tuple[ProfileComparison, ...]:
    """Under --kimiperf-control, the candidate's comparisons with its control that are a
    REGRESSION: each fails the run (the in-session rule, judge/profiles.py)."""
    if not control:
        return ()
    return tuple(r for r in comparisons if r.comparison is not None and r.comparison.verdict is VerdictKind.REGRESSION)


def decide_run(pytest_status: int, failed: FailedTests, *, comparisons: Sequence[ProfileComparison] = (),
               control: bool = False, errors: Sequence[str] = ()) -> RunDecision:
    """The run's exit status. A control regression (under ``control``) or an error of the reports
    and baselines fails the run (exit 1), whatever the tests did; else, where pytest would exit 1,
    the module's own statuses apply; any other status of pytest's stands."""
    regressions = control_regressions(comparisons, control=control)
    invalid, unresolved = failed.tests(PerfOutcome.INVALID), failed.tests(PerfOutcome.UNRESOLVED)
    if regressions or errors:
        end = RunEnd.CONTROL_REGRESSION if regressions else RunEnd.OUTPUT_ERROR
        return RunDecision(EXIT_TESTS_FAILED, end, regressions, tuple(errors), invalid, unresolved, failed.causes())
    status, end = pytest_status, RunEnd.PYTEST
    if pytest_status == EXIT_TESTS_FAILED and not failed.by_outcome.get(PerfOutcome.FAILED):
        if failed.by_outcome.get(PerfOutcome.UNRESOLVED):
            status, end = UNRESOLVED_EXIT, RunEnd.ONLY_UNRESOLVED
        elif failed.by_outcome.get(PerfOutcome.INVALID):
            status, end = INVALID_ONLY_EXIT, RunEnd.ONLY_INVALID
    return RunDecision(status, end, invalid_tests=invalid, unresolved_tests=unresolved, invalid_causes=failed.causes())


def holm(p_values: Sequence[float], alpha: float = RUN_ALPHA) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise level ``alpha``: the
    smallest p-value against alpha/m, the next against alpha/(m-1), ..., stopping at the first
    kept. NaN p-values are never rejected (and count in m)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    rejected = [False] * m
    for rank, i in enumerate(order):
        p = p_values[i]
        if math.isnan(p) or p > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def sign_p(c: Comparison) -> float:
    """The two-sided p-value of "no change" for a comparison, the sign's test (NaN where it
    compared nothing)."""
    if not (math.isfinite(c.change) and math.isfinite(c.se_log)) or c.se_log <= 0:
        return math.nan
    return float(2.0 * scipy_stats.norm.sf(abs(math.log1p(c.change)) / c.se_log))


def decide_family(comparisons: Sequence[Comparison], alpha: float = RUN_ALPHA) -> list[Comparison]:
    """The run's comparisons (those that compared something) with their signs decided together:
    a sign stays only where Holm rejects "no change" at the run's ``alpha``; else "inconclusive"
    beyond the tolerance, "no detectable change" within it."""
    nothing = (VerdictKind.INSUFFICIENT_SAMPLES, VerdictKind.NOT_COMPARABLE, VerdictKind.NOT_JUDGED)
    judged = [i for i, c in enumerate(comparisons) if c.verdict not in nothing]
    keep = holm([sign_p(comparisons[i]) for i in judged], alpha)
    out = list(comparisons)
    for i, kept in zip(judged, keep):
        c = comparisons[i]
        if c.claim is VerdictLeaning.NEITHER or kept:
            continue
        beyond = abs(math.log1p(c.change)) > band_log(c.tolerance)
        out[i] = dataclasses.replace(
            c, verdict=VerdictKind.INCONCLUSIVE if beyond else VerdictKind.NO_DETECTABLE_CHANGE)
    return out


def family_size(entries: Iterable[tuple[str, str, str]], collected: Iterable[tuple[str, str]]) -> int | None:
    """How many baseline comparisons a run makes: the stored ``(test, profile, metric)`` entries
    whose test and profile the run collected; None where it makes none."""
    wanted = set(collected)
    m = sum(1 for test, profile, _metric in entries if (test, profile) in wanted)
    return m or None


# The verdict on one test: floors, SLOs and baselines.
FLOOR_METRIC = "decode_tok_s"


def judge_metric(
    result: MetricResult,
    *,
    test: str,
    profile: str,
    baselines: LoadedBaselines | None,
    profile_env: Mapping[str, str], profile_args: Sequence[str] = (),
    current: Sequence[BootSummary],
    prior_spread: float | Spreads,
    canary: Mapping[str, float] | None = None,
    placements: Sequence[str] | None = None,
    critical: float | None = None,
    histories: int = DEFAULT_HISTORIES,
    engine: Sequence[EngineBoot] = (),
) -> tuple[Comparison | None, BaselineLine]:
    """Compare one metric's boots so far with the baseline's boot history: the comparison (if
    any) and the line about it. ``placements``: the boots' spawn modes as the test's metrics
    placed them together; ``histories``: those that share the run's budget for a false step."""
    spreads = (prior_spread if isinstance(prior_spread, Spreads) else Spreads(prior_spread)).of(result.metric)
    spec = metric_spec(result.metric)
    if baselines is None:
        return None, BaselineLine(BaselineState.OFF, spec.label)
    base_file = baselines.file()
    entry = base_file.entry(test, profile, result.metric) if base_file else None
    if entry is None:
        upgrade = baselines.across_versions(test, profile, result.metric)
        if upgrade is not None:
            other, entry, versions = upgrade
            comparison, line = against_history(result, entry, current=current, spreads=spreads, canary=canary,
                                               profile_env=profile_env, profile_args=profile_args,
                                               state=BaselineState.OTHER_VERSIONS, placements=placements,
                                               critical=critical, histories=histories, engine=engine)
            return comparison, dataclasses.replace(line, other=other.fingerprint.key, versions=tuple(versions))
        elsewhere = [(f, e) for f in baselines.others if (e := f.entry(test, profile, result.metric))]
        if not elsewhere:
            return None, BaselineLine(BaselineState.MISSING, spec.label, fingerprint=baselines.fingerprint.key,
                                      others=baselines.other_keys)
        # Shown, never judged: the closest other hardware's baseline, with what differs.
        other, other_entry = min(
            elsewhere, key=lambda fe: (len(fe[0].fingerprint.diff(baselines.fingerprint)[0]), str(fe[0].path)))
        hard = other.fingerprint.diff(baselines.fingerprint)[0]
        comparison = compare_boots(
            current, other_entry.summaries(), direction=Direction(result.direction),
            tolerance=result.tolerance, prior_spread=spreads.boot, metric=spec.label, unit=result.unit,
            comparable=False,
        )
        return comparison, BaselineLine(BaselineState.OTHER_HARDWARE, comparison.label, comparison,
                                        fingerprint=baselines.fingerprint.key, other=other.fingerprint.key,
                                        hard=tuple(hard),
                                        recorded_hardware=stated_apart(other.fingerprint, baselines.fingerprint) or "")
    return against_history(result, entry, current=current, spreads=spreads, canary=canary,
                           profile_env=profile_env, profile_args=profile_args, placements=placements,
                           critical=critical, histories=histories, engine=engine)


def warning_kinds(result: TestResult, *, missing_baseline_fails: bool) -> list[ResultWarning]:
    """Each warning of ``result``, plus one per metric without a baseline (unless that fails
    the test) and one per metric judged across software versions."""
    kinds = list(result.warnings)
    if not missing_baseline_fails:
        kinds.extend(ResultWarning(WarningKind.MISSING_BASELINE, line) for line in missing_baselines(result))
    kinds.extend(ResultWarning(WarningKind.OTHER_VERSIONS, m.baseline_line) for m in result.metrics.values()
                 if m.baseline_line is not None and m.baseline_line.state is BaselineState.OTHER_VERSIONS)
    return kinds


def verdict_fails(comparison: Comparison, *, strict: bool) -> bool:
    """Whether a baseline verdict fails the test."""
    if comparison.verdict is VerdictKind.REGRESSION:
        return True
    return strict and comparison.unresolved_beyond_tolerance


def check_floor(median: float, *, floor: float, target: float) -> FloorResult:
    """Decode median against the deployment's floor (fail) and target (warn)."""
    return floor_check(median, floor, target, "tok/s", "single-stream decode")


# Failed requests beyond this share of a run fail the test: the figures of the requests that
# did succeed would describe a server that is not the one being tested.
MAX_FAILED_FRACTION = 0.10


@dataclass(frozen=True)
class BootRun:
    """One boot's measurement as the gate needs it: plain numbers, no request objects.
    ``samples`` covers every metric the check, its SLOs and the floor name; ``invalid`` says why
    the run cannot be judged at all; ``cross_checks`` are what the server's own view showed against
    what the client sent (an unexpected prefix-cache hit), each a warning of the test."""

    samples: Mapping[str, Sequence[float]]
    requests: int = 0
    failed_requests: int = 0
    failed_reasons: Mapping[str, int] = field(default_factory=dict)
    invalid: str | None = None
    invalid_cause: InvalidCause | None = None  # what to do about ``invalid`` (measure/invalid_causes.py)
    cross_checks: Sequence[PrefixCacheReused] = ()
    goodput_samples: Sequence[float] = ()
    # Why each request sent gave no decode figure (reason -> count, measure/coverage.py): what a
    # floor that finds none says.
    decode_withheld: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GateRules:
    """What a run is judged against, from the settings and the deployment.

    ``strict`` makes an inconclusive verdict fail. ``no_more_boots``: an attached server without
    a restart_command, where a change beyond the tolerance fails as UNRESOLVED instead of passing
    with a warning. ``family``: the run's baseline comparisons; each then needs
    :func:`family_critical` of the family times its :attr:`looks` standard errors, so the run's
    :data:`RUN_ALPHA` holds whatever the suite's size and its boots on demand (None:
    stats.GATE_CRITICAL).
    """

    tolerances: Mapping[str, float]
    decode_floor_tok_s: float
    decode_target_tok_s: float
    spreads: Spreads
    boots: int = 1
    max_boots: int = 1
    strict: bool = False
    no_more_boots: str | None = None
    family: int | None = None

    @property
    def looks(self) -> int:
        """The boots at which a comparison can be decided: the last planned one and each boot on
        demand after it (a verdict taken at any of them is final)."""
        return max(1, self.max_boots - self.boots + 1)

    @property
    def critical(self) -> float | None:
        """The standard errors a direction needs in this run (None: stats.GATE_CRITICAL)."""
        return None if self.family is None else family_critical(self.family * self.looks)

    @classmethod
    def for_deployment(cls, deployment: Deployment, *, tolerances: Mapping[str, float],
                       canary: Mapping[str, float] | None, boots: int, max_boots: int, strict: bool,
                       attached: bool = False, family: int | None = None) -> GateRules:
        """The deployment's floor and target (scaled to this host's ``canary`` where it declares
        them per canary Mops) and its declared spreads, with the run's boots and strictness."""
        floor, target = deployment.decode_floor_and_target(canary)
        no_more = deployment.name if attached and not deployment.restart_command else None
        return cls(tolerances=dict(tolerances), decode_floor_tok_s=floor, decode_target_tok_s=target,
                   spreads=deployment.spreads, boots=boots, max_boots=max_boots, strict=strict,
                   no_more_boots=no_more, family=family)


@dataclass
class Judgement:
    """What :func:`judge` decided: the filled result, the baseline comparisons, this boot's
    summaries and two clocks for the test's boot record (None for a boot that is no sample of this
    build) and the boot this test asks for next (None when it is settled)."""

    result: TestResult
    comparisons: list[Comparison]
    recorded: dict[str, BootSummary] | None
    wants_boot: int | None
    engine: EngineBoot | None = None


def judge(
    result: TestResult,
    metrics: Sequence[str],
    run: BootRun,
    rules: GateRules,
    *,
    baselines: LoadedBaselines | None,
    earlier: TestBoots,
    floor: bool = False,
    slo: Mapping[str, float] | None = None,
    goodput: Mapping[str, float] | None = None,
) -> Judgement:
    """Judge one boot of one test (validity, failed requests, SLOs, the decode floor, each metric
    against its baseline) over this boot and the ``earlier`` boots of the same test and profile,
    in a copy of ``result``. A boot that looks worse than the tolerance without a verdict asks for
    another boot (up to ``rules.max_boots``) and passes with a note; planned boots are judged after
    the last of them. A BaselineError when this fingerprint's file cannot be trusted.
    """
    result = dataclasses.replace(result, metrics={}, messages=list(result.messages),
                                 failures=list(result.failures), warnings=list(result.warnings))
    label = f"{result.profile} boot {result.boot}"
    for name in metrics:
        spec = metric_spec(name)
        result.metrics[name] = MetricResult(
            metric=name, unit=spec.unit, direction=spec.direction.value,
            tolerance=rules.tolerances[name], samples=[float(x) for x in run.samples[name]], boot_label=label,
        )
    if run.invalid is not None:
        result.invalid = run.invalid
        result.invalid_cause = run.invalid_cause.value if run.invalid_cause is not None else None
        result.failures.append(InvalidRun(run.invalid, result.invalid_cause or ""))
        return Judgement(result, [], None, None)
    _check_boot(result, run, rules, label=label, floor=floor, slo=slo, goodput=goodput)
    current, recorded = _with_this_boot(result, earlier, vllm_named(baselines.fingerprint.hard) if baselines else "")
    comparisons = _against_baselines(result, current, rules, baselines)
    wants_boot = _settle(result, comparisons, current, rules, baselines)
    soft = baselines.soft_changes() if baselines is not None and comparisons else []
    if soft:
        result.warn(WarningKind.SOFT_FINGERPRINT, SoftFingerprint(tuple(soft)))
    return Judgement(result, comparisons, recorded, wants_boot,
                     current.engine.get(result.boot) if recorded is not None else None)


def _check_boot(result: TestResult, run: BootRun, rules: GateRules, *, label: str, floor: bool,
                slo: Mapping[str, float] | None, goodput: Mapping[str, float] | None) -> None:
    """What this boot alone decides: failed requests, the client's cross-checks, the goodput
    metric, the SLOs and the decode floor."""
    if run.failed_requests:
        total = run.requests
        reasons = tuple(run.failed_reasons.items())
        if run.failed_requests > MAX_FAILED_FRACTION * total:
            result.failures.append(FailedRequests(run.failed_requests, total, reasons, MAX_FAILED_FRACTION))
        else:
            result.warn(WarningKind.OTHER, FailedRequests(run.failed_requests, total, reasons))
    for surprise in run.cross_checks:
        result.warn(WarningKind.OTHER, surprise)
    if goodput is not None:
        result.metrics["request_goodput"] = MetricResult(
            metric="request_goodput", unit="req/s", direction="higher_is_better",
            tolerance=rules.tolerances["request_goodput"],
            samples=[float(x) for x in run.goodput_samples], boot_label=label)
        result.messages.append(GoodputSlos(tuple(goodput.items())))
    for name, limit in (slo or {}).items():
        _check_slo(name, limit, run.samples[name], rules.tolerances[name], result)
    if floor:
        _check_decode_floor(result, run, rules)


def _with_this_boot(result: TestResult, earlier: TestBoots,
                    vllm: str = "") -> tuple[TestBoots, dict[str, BootSummary] | None]:
    """The test's boots so far with this one added, and this boot's summaries to record (None,
    and added nowhere, when it failed for another reason than a verdict)."""
    current = TestBoots(summaries={k: list(v) for k, v in earlier.summaries.items()}, boots=list(earlier.boots),
                        engine=dict(earlier.engine))
    if result.failures:
        result.unrecordable = tuple(result.failures)
        return current, None
    origin = result.origin
    recorded = {name: dataclasses.replace(mres.boot_summary(), session=origin.session, host=origin.host)
                if origin is not None else mres.boot_summary() for name, mres in result.metrics.items()}
    current.add(result.boot, recorded)
    if (engine := engine_boot_of(result.run, vllm)) is not None:
        current.engine[result.boot] = engine
    return current, recorded


def _against_baselines(result: TestResult, current: TestBoots, rules: GateRules,
                       baselines: LoadedBaselines | None) -> list[Comparison]:
    """Each metric's boots so far against its baseline: the line about it on the result, and the
    comparisons there were."""
    def against(mres: MetricResult, placements: Sequence[str] | None = None) -> tuple[Comparison | None, BaselineLine]:
        return judge_metric(mres, test=result.test, profile=result.profile, baselines=baselines, profile_env=result.profile_env,
                            profile_args=result.profile_args, current=current.summaries.get(mres.metric, []),
                            prior_spread=rules.spreads, canary=result.origin.canary if result.origin is not None else None,
                            placements=placements, critical=rules.critical,
                            histories=rules.family or DEFAULT_HISTORIES,
                            engine=[current.engine[b] for b in current.boots if b in current.engine])

    judged = [(mres, *against(mres)) for mres in result.metrics.values()]
    # A boot is in one spawn mode for every metric whose history splits alike (history.joint_placements).
    for i, placements in joint_placements([c for _, c, _ in judged]).items():
        judged[i] = (judged[i][0], *against(judged[i][0], placements))
    comparisons: list[Comparison] = []
    for mres, comparison, line in judged:
        if comparison is not None and result.unrecordable:
            comparison, line = _left_out(comparison, line, result)
        mres.baseline_line = line
        result.messages.append(line)
        if comparison is not None:
            mres.baseline = comparison
            comparisons.append(comparison)
    return comparisons


def _settle(result: TestResult, comparisons: Sequence[Comparison], current: TestBoots, rules: GateRules,
            baselines: LoadedBaselines | None) -> int | None:
    """The boot this test asks for next (None: it is settled), or the verdicts and the drift
    test at its last boot."""
    screening = [c for c in comparisons if wants_another_boot(c)]
    if result.boot < rules.boots:
        result.messages.append(BootPlanned(result.boot, rules.boots))
        return result.boot + 1
    if (unresolved := [c for c in comparisons if c.unresolved_beyond_tolerance and c.gain < 0]) \
            and rules.no_more_boots is not None and not result.failures:
        # One boot of a server this run cannot restart: the change it saw can never be convicted
        # here, and passing with a warning would let a 20% slower server through the gate.
        result.unresolved = Unresolved(_changes_so_far(unresolved), rules.no_more_boots, MIN_BOOTS_DIRECTIONAL)
        result.failures.append(result.unresolved)
        for comparison in comparisons:
            if comparison not in unresolved:
                _verdict_to_result(comparison, result, strict=rules.strict)
        return None
    if screening and not result.failures and result.boot < rules.max_boots:
        result.messages.append(BootAsked(result.profile, result.boot + 1, _changes_so_far(screening)))
        return result.boot + 1
    for comparison in comparisons:
        _verdict_to_result(comparison, result, strict=rules.strict)
    base_file = baselines.file() if baselines is not None else None
    if base_file is not None and not result.unrecordable:
        result.failures.extend(drift_failures(result, base_file, current.summaries, spreads=rules.spreads,
                                              critical=rules.critical))
    return None


def _changes_so_far(comparisons: Sequence[Comparison]) -> tuple[ChangeSoFar, ...]:
    return tuple(ChangeSoFar(c.metric, c.change, c.boots_current, c.tolerance) for c in comparisons)


def _left_out(comparison: Comparison, line: BaselineLine, result: TestResult) -> tuple[Comparison, BaselineLine]:
    """A boot that failed for another reason is no sample of this build: shown, not compared, and
    the line says so instead of calling its samples insufficient."""
    why = LeftOut(result.boot, result.unrecordable)
    if comparison.boots_current == 0:
        comparison = dataclasses.replace(comparison, verdict=VerdictKind.NOT_JUDGED, notes=(why,))
        return comparison, BaselineLine(line.state, comparison.label, comparison)
    return comparison, dataclasses.replace(line, left_out=why)


def _check_decode_floor(result: TestResult, run: BootRun, rules: GateRules) -> None:
    """This boot's single-stream decode median against the deployment's floor and target."""
    decode = result.metrics.get(FLOOR_METRIC) or MetricResult(
        FLOOR_METRIC, "tok/s", "higher_is_better", rules.tolerances[FLOOR_METRIC],
        [float(x) for x in run.samples[FLOOR_METRIC]],
    )
    median = decode.summary()["median"]
    if median is None:
        result.failures.append(NoDecode(run.requests, tuple(run.decode_withheld.items())))
        return
    fr = check_floor(float(median), floor=rules.decode_floor_tok_s, target=rules.decode_target_tok_s)
    result.floor = fr
    if fr.failed:
        result.failures.append(FloorNote(fr))
    elif fr.warned:
        result.warn(WarningKind.BELOW_TARGET, FloorNote(fr))
    result.messages.append(FloorNote(fr))


def _check_slo(name: str, limit: float, samples: Sequence[float], tolerance: float, result: TestResult) -> None:
    """An absolute limit on this boot's figure (its median, or its quantile for a tail)."""
    spec = metric_spec(name)
    mres = MetricResult(metric=name, unit=spec.unit, direction=spec.direction.value,
                        tolerance=tolerance, samples=[float(x) for x in samples])
    boot = mres.boot_summary()
    lower = spec.direction.value == "lower_is_better"
    ok = boot.usable and (boot.median <= limit if lower else boot.median >= limit)
    status = SloCheck.UNCHECKED if not boot.usable else SloCheck.MET if ok else SloCheck.MISSED
    note = SloCheck(name, spec.label, limit, spec.unit, lower, status, boot.median, boot.n, boot.needed)
    if not boot.usable:
        result.warn(WarningKind.OTHER, note)
        return
    (result.messages if ok else result.failures).append(note)


def _verdict_to_result(comparison: Comparison, result: TestResult, *, strict: bool) -> None:
    """A final verdict becomes a failure, a warning (with the planner's advice) or a note."""
    if verdict_fails(comparison, strict=strict):
        result.failures.append(VerdictNote(comparison))
        return
    match kind := comparison.verdict:
        case VerdictKind.REGRESSION | VerdictKind.WITHIN_TOLERANCE | VerdictKind.NOT_JUDGED:
            pass  # a regression failed above; the others' baseline lines say them
        case VerdictKind.IMPROVEMENT:
            result.warn(WarningKind.OTHER, VerdictNote(comparison, adopt=True))
        case VerdictKind.INCONCLUSIVE | VerdictKind.CHANGED_SIZE_UNRESOLVED | VerdictKind.NO_DETECTABLE_CHANGE:
            note = VerdictNote(comparison, plan(comparison))
            if not comparison.unresolved_beyond_tolerance:
                result.messages.append(note)
            elif kind is VerdictKind.NO_DETECTABLE_CHANGE:
                result.warn(WarningKind.OTHER, note)
            else:
                result.warn(WarningKind.INCONCLUSIVE, note)
        case VerdictKind.NOT_COMPARABLE:
            # The baseline line says why: the host canary moved, or the profile's environment differs.
            line = next((m.baseline_line for m in result.metrics.values() if m.baseline is comparison), None)
            if line is None or line.state is not BaselineState.OTHER_HARDWARE:
                # Other hardware's is the missing baseline's to say, once for the run (or in the
                # failure under --kimiperf-missing-baseline=fail), not once more per metric.
                result.warn(WarningKind.OTHER, line if line is not None else VerdictNote(comparison))
        case VerdictKind.INSUFFICIENT_SAMPLES:
            result.warn(WarningKind.OTHER, VerdictNote(comparison))
        case _:
            assert_never(kind)
