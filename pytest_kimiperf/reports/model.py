"""What the session's reports say, gathered once from the run.

The terminal summary, the Markdown summary, the JSON report and the plots show the same facts,
collected here once into a :class:`SessionReport` (the profile comparisons computed once too). The
table cells (``81.4``, ``+0.6%``, ``-0.8..+2.0%``) are formatted here, so the terminal and Markdown
tables cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, assert_never

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.judge.gate import RunDecision
from pytest_kimiperf.judge.history import NotAppended
from pytest_kimiperf.judge.profiles import InSessionRules, ProfileComparison, profile_comparisons
from pytest_kimiperf.judge.stats import Comparison, VerdictLeaning, leaning
from pytest_kimiperf.judge.verdicts import BaselineLine, MetricResult, TestResult
from pytest_kimiperf.measure.time_account import TimeAccount
from pytest_kimiperf.numbers import fmt_value
from pytest_kimiperf.reports.nccl import NcclDebugCheck, reach_summary, sets_nccl
from pytest_kimiperf.reports.sentences import RECORDING_ACCEPTS, baseline_line, warning_lines
from pytest_kimiperf.roofline.inputs import RooflineReport
from pytest_kimiperf.server.boot_account import BootAccount
from pytest_kimiperf.server.zombies import SweepAccount
from pytest_kimiperf.server.weight_cache import WeightCacheFacts


@dataclass(frozen=True)
class BootFigure:
    """What a table shows for one metric of one boot: the figure the gate compares (the boot's
    median, or its quantile for a tail metric, so a p90 row never shows the median of the row
    above it) and a range around it (the IQR for a median; the boot's bootstrap interval for a
    quantile, which an IQR would not describe)."""

    value: float | None
    low: float | None
    high: float | None
    quantile: float | None = None  # 0.9 for a p90 row; None for a median

    @property
    def name(self) -> str:
        """``median``, or ``p90`` for a tail metric."""
        return "median" if self.quantile is None else f"p{self.quantile * 100:g}"


# The standard normal's 95% quantile: the tail's range is its two-sided 90% interval, from the
# bootstrap standard error of the boot's log-quantile (boots.summarize_boot_quantile).
_NORMAL_95 = 1.6449


def short_test(test: str) -> str:
    """``perf_tests/test_decode.py::test_single_stream_decode`` -> ``single_stream_decode``."""
    name = test.rpartition("::")[2]
    return name.removeprefix("test_")


def boot_figure(mres: MetricResult) -> BootFigure:
    """The boot's figure of ``mres`` and its range, as the tables and plots show them."""
    spec = METRICS.get(mres.metric)
    if spec is None or spec.quantile is None:
        summary = mres.summary()
        return BootFigure(*(None if (v := summary[k]) is None else float(v) for k in ("median", "q1", "q3")))
    boot = mres.boot_summary()
    if not (boot.n and math.isfinite(boot.median)):
        return BootFigure(None, None, None, spec.quantile)
    if not (math.isfinite(boot.se_log) and boot.median > 0):
        return BootFigure(boot.median, None, None, spec.quantile)
    half = _NORMAL_95 * boot.se_log  # the two-sided 90% interval, on the log scale
    return BootFigure(boot.median, boot.median * math.exp(-half), boot.median * math.exp(half), spec.quantile)


def range_names(has_tails: bool) -> tuple[str, str]:
    """The headers of the figure and range columns: ``median``/``IQR``, or, in a table with
    tail rows, ``median or pNN``/``IQR or 90% CI``."""
    return ("median or pNN", "IQR or 90% CI") if has_tails else ("median", "IQR")


def figure_legend(has_tails: bool) -> str:
    """What the figure and range columns hold, in one sentence above a table."""
    text = "each boot's median (IQR of its samples)"
    return text + (", or for a pNN metric its pNN (90% bootstrap interval)" if has_tails else "")


def fmt_range(figure: BootFigure) -> str:
    """The figure's range as ``80.9-82.0`` (the IQR, or a tail's bootstrap interval)."""
    if figure.value is None:
        return "n/a (no valid sample)"
    if figure.low is None or figure.high is None:
        return "n/a (fewer than 2 samples)"
    return f"{fmt_value(figure.low)}-{fmt_value(figure.high)}"


@dataclass(frozen=True)
class ProfileFacts:
    """One profile as it ran: its overrides (environment and server arguments) and what its
    server did. ``boots`` is None when this process did not start the server (an xdist worker, or
    an attached server), so the report says "unknown" instead of "0"."""

    name: str
    description: str = ""
    profile_env: Mapping[str, str] = field(default_factory=dict)
    server_env: Mapping[str, str] = field(default_factory=dict)
    # variable -> (value in the shell, value the profile set), as ServerRecord keeps them
    overridden_shell_env: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    boots: int | None = None
    boot_s: float | None = None
    log_path: str | None = None
    leftovers: tuple[str, ...] = ()
    error: str | None = None
    # --kimiperf-nccl-debug: what the server's log says about the profile's variables (None without it)
    nccl_debug: NcclDebugCheck | None = None
    # Where each boot's seconds went (server/progress.py), in boot order; empty when this process
    # booted nothing (attached, or an xdist worker's boots not sent back).
    boot_accounts: tuple[BootAccount, ...] = ()
    # The profile's server arguments, and the deployment arguments they replaced ("old -> new").
    profile_args: tuple[str, ...] = ()
    replaced_args: tuple[str, ...] = ()
    # What the sweep before this profile's first boot ended of a killed run (server/zombies.py).
    sweep: SweepAccount | None = None


@dataclass(frozen=True)
class BaselineUpdate:
    """The baseline file written by --kimiperf-update-baselines (or appended by a passing run,
    ``on_pass``) and how many entries went into it."""

    path: str
    entries: int
    not_recorded: tuple[str, ...] = ()  # "test [profile, boot N]: why" for each boot left out
    on_pass: bool = False
    # Entries this recording started anew: it was judged changed against their history (new_level).
    restarted: int = 0


@dataclass(frozen=True)
class ProfileCell:
    """One profile's figures for one metric of one test, and its comparison to the reference."""

    profile: str
    is_reference: bool
    figure: BootFigure
    n: int
    samples: tuple[float, ...]
    comparison: Comparison | None = None
    note: str | None = None  # replaces the verdict: invalid run, no reference, error
    name: str = ""  # the profile's name, without the boot that ``profile`` labels
    invalid: bool = False  # the boot's measurement was INVALID (the note says why)


@dataclass(frozen=True)
class ServerViewRow:
    """One test under one profile: means from vLLM's /metrics histograms and from the client."""

    test: str
    profile: str
    server_ttft_ms: float | None
    client_ttft_ms: float | None
    server_itl_ms: float | None
    client_itl_ms: float | None
    server_tokens: float | None
    client_tokens: float | None
    # The engine's time per output token (its core's stamps) and the client's mean TPOT over the
    # same window: their ratio is what lies between the engine and the client's stamps.
    engine_tpot_ms: float | None = None
    client_tpot_ms: float | None = None

    @property
    def client_over_engine(self) -> float | None:
        """The client's TPOT over the engine's (None where either is missing)."""
        if self.engine_tpot_ms and self.client_tpot_ms is not None:
            return self.client_tpot_ms / self.engine_tpot_ms
        return None


def _pooled_mean(views: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """Count-weighted mean of the per-run means (a run extended while inconclusive has several)."""
    pairs = [(count, mean) for v in views
             if (count := v.get(f"{key}_count")) is not None and (mean := v.get(f"mean_{key}_ms")) is not None]
    if not views or len(pairs) != len(views):
        return None
    total = sum(count for count, _ in pairs)
    return sum(count * mean for count, mean in pairs) / total if total else None


@dataclass(frozen=True)
class MetricBlock:
    """One metric of one test across the profiles (reference first)."""

    metric: str
    heading: str
    cells: tuple[ProfileCell, ...]


@dataclass(frozen=True)
class PerfTestBlock:
    """One perf test (node id without the profile) across profiles and metrics."""

    test: str
    scenario: str
    metrics: tuple[MetricBlock, ...]


@dataclass(frozen=True)
class BaselineRow:
    """One metric of one test under one profile against its stored baseline."""

    test: str
    profile: str
    metric: str
    heading: str
    figure: BootFigure
    baseline: Comparison | None
    message: str  # the gate's line without the metric's label; a missing baseline's says what records it
    line: BaselineLine | None = None  # the gate's facts behind the message (None: not compared at all)

    @property
    def verdict(self) -> str | None:
        """The gate's verdict word, or None when there was nothing to compare with."""
        return None if self.baseline is None else self.baseline.verdict.value


@dataclass
class SessionReport:
    """Everything the reports show about one pytest session."""

    generator: str
    created_at: str  # ISO 8601 UTC
    deployment: Mapping[str, Any]
    fingerprint: Mapping[str, Any] | None
    reference_profile: str
    profiles: list[ProfileFacts]
    results: list[TestResult]
    profile_comparisons: list[ProfileComparison]
    baselines_path: str | None = None
    baselines_update: BaselineUpdate | None = None
    # --kimiperf-append-on-pass: why this run appended nothing (None: it appended, or was not asked).
    not_appended: NotAppended | None = None
    # what was written where: kind (reports/outputs.py) -> path
    outputs: dict[str, str] = field(default_factory=dict)
    plot_files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # the single-stream decode medians against the model's and hardware's ceilings
    roofline: RooflineReport | None = None
    # the `vllm preload` daemons' part in the session (weight_cache.py); None: no boot here
    weight_cache: WeightCacheFacts | None = None
    # the command that records this machine's baselines, quoted when a run finds none
    record_command: str = "python -m pytest --kimiperf-update-baselines"
    # --kimiperf-gate: the advice never records over a baseline of the same server stated otherwise
    gate: bool = False
    # perf scenarios left out of pytest-benchmark's table (reports/reporter.py)
    benchmark_rows_hidden: int = 0
    # --kimiperf-control: the reference profile is the control (the recorded build, booted in this
    # session), and a REGRESSION against it fails the run.
    control: bool = False
    # How the run ends (judge/gate.py), decided at session end before anything renders it.
    decision: RunDecision | None = None
    # Where the session's wall clock went, beside the plan (measure/time_account.py); None: not kept.
    time_account: TimeAccount | None = None

    def control_regressions(self) -> tuple[ProfileComparison, ...]:
        """The comparisons the decision found slower than the control (each failed the run)."""
        return self.decision.control_regressions if self.decision is not None else ()

    def profile_names(self) -> list[str]:
        """Profiles in display order: the reference first, then as selected, then any others seen."""
        names = [p.name for p in self.profiles]
        for res in self.results:
            if res.profile not in names:
                names.append(res.profile)
        if self.reference_profile in names:
            names.remove(self.reference_profile)
            names.insert(0, self.reference_profile)
        return names

    def compared_profiles(self) -> bool:
        """Whether more than one profile produced results, so a profile table means something."""
        return len({res.profile for res in self.results}) > 1

    def what_nccl_reached(self) -> str | None:
        """The NCCL line: where the compared profiles' NCCL variables could not reach decode's
        all-reduces, from each boot's log (nccl_reach.reach_summary); None where they could, or
        nothing says."""
        if not self.compared_profiles():
            return None
        hard = (self.fingerprint or {}).get("hard") or {}
        return reach_summary(
            {p.name: [a.all_reduce for a in p.boot_accounts if a.all_reduce is not None] for p in self.profiles},
            nccl_profiles=[p.name for p in self.profiles if sets_nccl(p.profile_env)],
            interconnect=str(hard["gpu.interconnect"]) if hard.get("gpu.interconnect") else None)

    def test_blocks(self) -> list[PerfTestBlock]:
        """Per test and metric, each profile's figures and its comparison to the reference."""
        order = {name: i for i, name in enumerate(self.profile_names())}
        comparisons = {(c.test, c.metric, c.profile): c for c in self.profile_comparisons}
        by_test: dict[str, list[TestResult]] = {}
        for res in self.results:
            by_test.setdefault(res.test, []).append(res)
        blocks = []
        for test, results in by_test.items():
            results = sorted(results, key=lambda r: order.get(r.profile, len(order)))
            has_reference = any(
                r.profile == self.reference_profile and not r.invalid for r in results
            )
            metrics: list[str] = []
            for res in results:
                metrics.extend(m for m in res.metrics if m not in metrics)
            last_boot: dict[str, int] = {}
            for res in results:
                last_boot[res.profile] = max(last_boot.get(res.profile, 0), res.boot)
            results = sorted(results, key=lambda r: (order.get(r.profile, len(order)), r.boot))
            metric_blocks = []
            for metric in metrics:
                cells = []
                for res in results:
                    mres = res.metrics.get(metric)
                    if mres is None:
                        continue
                    cells.append(self._cell(res, mres, has_reference, comparisons,
                                            last=res.boot == last_boot[res.profile]))
                metric_blocks.append(MetricBlock(metric, metric_heading(metric), tuple(cells)))
            scenario = results[0].scenario if results else ""
            blocks.append(PerfTestBlock(test, scenario, tuple(metric_blocks)))
        return blocks

    def _cell(
        self,
        res: TestResult,
        mres: MetricResult,
        has_reference: bool,
        comparisons: Mapping[tuple[str, str, str], ProfileComparison],
        *,
        last: bool = True,
    ) -> ProfileCell:
        is_reference = res.profile == self.reference_profile
        note: str | None = None
        comparison: Comparison | None = None
        if res.invalid:
            note = f"INVALID measurement: {res.invalid}"
        elif not is_reference and last:
            # The comparison rests on every boot of the profile: shown once, on its last boot.
            found = comparisons.get((res.test, mres.metric, res.profile))
            if found is not None and found.comparison is not None:
                comparison = found.comparison
            elif found is not None and found.error:
                note = found.error
            elif not has_reference:
                note = f"no valid result of the reference profile {self.reference_profile}"
        if note is None and comparison is None and not (boot := mres.boot_summary()).usable and boot.n:
            name = boot_figure(mres).name
            note = f"not counted: {boot.n} samples, a {name} needs {boot.needed}"
        return ProfileCell(
            profile=boot_label(res), is_reference=is_reference, figure=boot_figure(mres),
            n=len(mres.finite),
            samples=tuple(mres.samples), comparison=comparison, note=note, name=res.profile,
            invalid=bool(res.invalid),
        )

    def record_advice(self) -> str:
        """What records a missing baseline: this run, when it records, else the command that
        does it here (``--kimiperf-record-command``, or this run's own with --kimiperf-update-baselines)."""
        if self.baselines_update is not None:
            return "this run records it"
        return f"record it with {self.record_command} (it {RECORDING_ACCEPTS})"

    def baseline_rows(self) -> list[BaselineRow]:
        """Each test, profile and metric against its baseline (or why there is none)."""
        rows = []
        advice = self.record_advice()
        for res in self.results:
            for mres in res.metrics.values():
                # The tables have a metric column, so the line goes without the metric's label.
                if mres.baseline_line is not None:
                    message = baseline_line(mres.baseline_line, label=False, advice=advice, record=not self.gate)
                elif res.invalid:
                    message = f"not compared: INVALID measurement ({res.invalid})"
                else:
                    message = "not compared with a baseline"
                rows.append(BaselineRow(
                    test=res.test, profile=boot_label(res), metric=mres.metric,
                    heading=metric_heading(mres.metric), figure=boot_figure(mres),
                    baseline=mres.baseline, message=message, line=mres.baseline_line,
                ))
        return rows

    def has_tails(self) -> bool:
        """Whether any metric of the run is a tail (a quantile), so range columns say so."""
        return any(METRICS[m].quantile is not None for res in self.results for m in res.metrics if m in METRICS)

    def floor_results(self) -> list[TestResult]:
        """The results that were checked against the deployment's decode floor."""
        return [res for res in self.results if res.floor]

    def nccl_checks(self) -> list[NcclDebugCheck]:
        """The --kimiperf-nccl-debug verdicts of the profiles that have one, in display order."""
        order = {name: i for i, name in enumerate(self.profile_names())}
        checks = [facts.nccl_debug for facts in self.profiles if facts.nccl_debug is not None]
        return sorted(checks, key=lambda check: order.get(check.profile, len(order)))

    def server_views(self) -> list[ServerViewRow]:
        """The server's own figures (vLLM's /metrics, read around each run) beside the client's."""
        rows = []
        for res in self.results:
            views = [v for v in res.run.server_metrics if v] if res.run is not None else []
            if not views or res.run is None:
                continue
            tokens = [v.get("generation_tokens") for v in views]
            rows.append(ServerViewRow(
                test=res.test, profile=boot_label(res),
                server_ttft_ms=_pooled_mean(views, "ttft"), client_ttft_ms=res.run.stat("ttft_ms", "mean"),
                server_itl_ms=_pooled_mean(views, "itl"), client_itl_ms=res.run.stat("itl_ms", "mean"),
                server_tokens=None if None in tokens else float(sum(t for t in tokens if t is not None)),
                client_tokens=float(res.run.total_output_tokens),
                engine_tpot_ms=views[0].get("engine_tpot_ms"), client_tpot_ms=res.run.stat("tpot_ms", "mean"),
            ))
        return rows

    def warnings(self) -> list[str]:
        """Warnings worth reading after the run: inconclusive, improvements, below target, invalid."""
        lines = []
        for res in self.results:
            where = f"{res.test} [{boot_label(res)}]"
            if res.invalid:
                lines.append(f"{where}: INVALID measurement: {res.invalid}")
            lines.extend(f"{where}: {warning}" for warning in warning_lines(res))
        for check in self.nccl_checks():
            lines.extend(
                f"NCCL profile {check.profile}: {v.variable}={v.expected} did not take effect, "
                f"NCCL logged {v.variable}={v.logged} ({check.log_path})"
                for v in check.mismatches
            )
        return lines


def build_session_report(
    *,
    results: Sequence[TestResult],
    reference_profile: str,
    profiles: Sequence[ProfileFacts],
    deployment: Mapping[str, Any],
    fingerprint: Mapping[str, Any] | None,
    created_at: str,
    generator: str,
    baselines_path: str | None = None,
    roofline: RooflineReport | None = None,
    rules: InSessionRules = InSessionRules(),
    control: bool = False,
) -> SessionReport:
    """Gather the run's facts and compare every profile with the reference profile, boot
    against boot (``control``: the reference is the recorded build)."""
    return SessionReport(
        generator=generator,
        created_at=created_at,
        deployment=dict(deployment),
        fingerprint=None if fingerprint is None else dict(fingerprint),
        reference_profile=reference_profile,
        profiles=list(profiles),
        results=list(results),
        profile_comparisons=profile_comparisons(results, reference_profile, rules=rules, control=control),
        baselines_path=baselines_path,
        roofline=roofline,
        control=control,
    )


def metric_heading(metric: str) -> str:
    """The metric as a table row names it: label and unit, e.g. ``decode tok/s``."""
    spec = METRICS.get(metric)
    return metric if spec is None else spec.heading


def boot_label(res: TestResult) -> str:
    """``ring-ll`` for a profile's first boot, ``ring-ll boot 2`` for its second."""
    return res.profile if res.boot == 1 else f"{res.profile} boot {res.boot}"


def profile_verdict(comparison: Comparison) -> str:
    """The verdict of a profile against the reference: "worse"/"better" between two profiles of
    one session, where the gate's "regression"/"improvement" speak of a change over time."""
    match lean := leaning(comparison.verdict):
        case VerdictLeaning.WORSE:
            return "worse"
        case VerdictLeaning.BETTER:
            return "better"
        case VerdictLeaning.NEITHER:
            return str(comparison.verdict.value)
        case _:
            assert_never(lean)
