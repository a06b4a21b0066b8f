"""How often the gate cries wolf, how often it catches a real change, and how many boots it costs.

A simulation of whole gate sessions with the noise structure measured on real servers: the
boot, not the request, is the unit that varies most (pytest_kimiperf/judge/stats.py). Each simulated
session has 2 NCCL profiles, each judged against its own baseline history of ``--history``
boots, and the perf suite's shape: 5 tests gating 3, 1, 2, 2, 2 metrics (decode tok/s, ITL,
TPOT; TTFT; output and request throughput at 8, 32 and 64 streams). Per request, log-normal
noise at CV ``c`` with heavy tails (5% of requests 1.5-3x worse); per boot, a boot effect of SD
``b`` that half of the metrics of one boot share (a slow boot is slow at everything) and half is
the metric's own; a linear drift of ``--drift`` over the session, which the current boots see
and the baseline history (recorded in earlier sessions) does not.

The gate is the plugin's own code: ``boots.summarize_boot`` for each boot,
``stats.compare_boots`` for each verdict, and boots on demand as ``recorder.py`` does them: the
server boots once per profile; a test whose comparison ``planning.wants_another_boot`` says so
reboots the server (up to ``--max-boots``) and is measured again, and the tests after it run on
the new boot.

Targets for the default GPU design (tolerance 3%, declared spread 1%, 10-boot history):
false alarms (any REGRESSION or IMPROVEMENT with no true change) <= 1% per session; REGRESSION
for a true change of 2x the tolerance >= 90% of the changed comparisons; REGRESSION for a true
change of 0.8x the tolerance <= 10%; mean boots per gate run (per profile) <= 1.3. Rates come
with 95% Wilson intervals; seeded, so the same arguments print the same table.

    python benchmarks/gate_power.py [--trials N] [--history 10] [--max-boots 3] [--json PATH]
                                    [--replay] [--profiles]

``--profiles`` adds the profile comparison's tables (benchmarks/profile_power.py): A/A splits
of every host's real sessions and spawn-mode cells, judged by the summary's own function.

The single-boot table shows what a run that boots once can honestly claim.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

# Runs from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.noise import wants_another_boot  # noqa: E402
from pytest_kimiperf.judge.gate import verdict_fails  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary, summarize_boot  # noqa: E402
from pytest_kimiperf.judge import stats  # noqa: E402
from pytest_kimiperf.judge.stats import Comparison, VerdictKind  # noqa: E402
from nightly import drift_tonight  # noqa: E402
from pytest_kimiperf.config.deployments import Spreads  # noqa: E402
from pytest_kimiperf.judge.history import (  # noqa: E402
    compare_with_history, history_steps, joint_placements, judged_part,
)
from pytest_kimiperf.judge.noise import canary_shift  # noqa: E402
from noise_corpus import CorpusBoot, load_corpus  # noqa: E402
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS  # noqa: E402
from pytest_kimiperf.config.metric_specs import metric_spec  # noqa: E402

TESTS = (3, 1, 2, 2, 2)  # metrics gated per test, as in perf_tests/
PROFILES = 2
REQUESTS_PER_BOOT = 20
OUTLIER_SHARE = 0.05
SHARED_BOOT_SHARE = 0.5
TARGETS = {"false_alarm_per_session": 0.01, "detect_2x": 0.90, "regress_0_8x": 0.10, "mean_boots": 1.3}


@dataclass(frozen=True)
class Rate:
    """A count out of trials, with its 95% Wilson interval."""

    hits: int
    trials: int
    low: float
    high: float

    @property
    def value(self) -> float:
        """The observed rate."""
        return self.hits / self.trials if self.trials else math.nan


def rate(hits: int, trials: int) -> Rate:
    """``hits`` of ``trials`` with a 95% Wilson interval."""
    if trials == 0:
        return Rate(0, 0, math.nan, math.nan)
    ci = scipy_stats.binomtest(hits, trials).proportion_ci(confidence_level=0.95, method="wilson")
    return Rate(hits, trials, float(ci.low), float(ci.high))


@dataclass(frozen=True)
class Noise:
    """The noise model of one cell of the table: per-boot SD ``boot_sd``, per-request ``cv``,
    a linear ``drift`` over the session; a session effect of SD ``session_sd`` shared by every
    boot of a session (half of it shared by all metrics, like the boot effect); the history's
    ``history_sessions`` sessions (1: recorded by one --update-baselines run); spawn modes: a
    share ``slow_share`` of boots ``slow_drop`` slower; ``host_factor``: the run's host is this
    much slower than the history's (same fingerprint), which its canary shows."""

    boot_sd: float
    cv: float
    drift: float
    session_sd: float = 0.0
    history_sessions: int = 1
    slow_share: float = 0.0
    slow_drop: float = 0.0
    host_factor: float = 1.0
    history_boots: int | None = None  # the cell's own history length (else --history)
    label: str = ""
    # The run is on another host than the history (a reboot counted as a new host, another
    # runner): its boots carry another host id, though the host is as fast.
    new_host: bool = False
    # The history stepped: its older half of boots sits ``history_step`` (a fraction) off the
    # level the current build has; ``history_drift``: a linear trend from that far off at the
    # oldest boot to none at the newest. ``segment``: the gate judges against the last segment
    # of a stepped history (history.py); False measures the gate without it.
    history_step: float = 0.0
    history_drift: float = 0.0
    segment: bool = True
    # Spawn modes: ``current_slow_share`` the share of the run's boots in the slow mode (None: as
    # the history's); ``first_only``: the change moves only each test's first metric (decode),
    # the others are left alone; ``joint``: a boot's mode is placed by the test's metrics
    # together (history.joint_placements), as the gate does; False: by each metric alone.
    current_slow_share: float | None = None
    first_only: bool = False
    joint: bool = True


CANARY_NOISE = 0.03  # SD of a canary score between sessions of one host (corpus: benchmarks/README.md)


class World:
    """Draws boots of a server whose metrics follow :class:`Noise`."""

    def __init__(self, noise: Noise, rng: np.random.Generator) -> None:
        self.noise = noise
        self.rng = rng
        self.metrics = sum(TESTS)

    def _effects(self, sd: float) -> np.ndarray:
        shared = self.rng.normal() * math.sqrt(SHARED_BOOT_SHARE)
        own = self.rng.normal(size=self.metrics) * math.sqrt(1 - SHARED_BOOT_SHARE)
        return sd * (shared + own)

    def session_effects(self) -> np.ndarray:
        """Per-metric log offsets every boot of one session shares."""
        return self._effects(self.noise.session_sd)

    def boot_effects(self, slow_share: float | None = None) -> np.ndarray:
        """Per-metric log offsets of one boot: a shared part and each metric's own, plus the
        spawn mode (a slow boot is slow at everything), at ``slow_share`` (else the cell's)."""
        effects = self._effects(self.noise.boot_sd)
        share = self.noise.slow_share if slow_share is None else slow_share
        if self.noise.slow_drop and share and self.rng.random() < share:
            effects = effects + math.log1p(-self.noise.slow_drop)
        return effects

    def canary(self, host_factor: float = 1.0) -> dict[str, float]:
        """A session's canary scores on a host ``host_factor`` as fast as the history's."""
        return {"python_mops": host_factor * math.exp(self.rng.normal(0.0, CANARY_NOISE)),
                "copy_gbs": host_factor * math.exp(self.rng.normal(0.0, CANARY_NOISE))}

    def requests(self, offset: float) -> np.ndarray:
        """One test's per-request samples of a higher-is-better metric around exp(offset)."""
        logs = offset + self.rng.normal(0.0, self.noise.cv, REQUESTS_PER_BOOT)
        slow = self.rng.random(REQUESTS_PER_BOOT) < OUTLIER_SHARE
        logs[slow] -= np.log(self.rng.uniform(1.5, 3.0, int(slow.sum())))
        return np.exp(logs)

    def history(self, boots: int) -> tuple[list[list[BootSummary]], list[dict[str, float]]]:
        """A baseline history, oldest boot first: ``boots`` boots of the unchanged server over
        the cell's sessions (each session's boots together, as they were recorded), per metric,
        with the cell's step or drift; and each session's canary."""
        per_metric: list[list[BootSummary]] = [[] for _ in range(self.metrics)]
        sessions = max(1, min(self.noise.history_sessions, boots))
        session_effects = [self.session_effects() for _ in range(sessions)]
        for i in range(boots):
            k = i * sessions // boots
            effects = self.boot_effects() + session_effects[k]
            if i < boots // 2:
                effects = effects + math.log1p(self.noise.history_step)
            if boots > 1:
                effects = effects + math.log1p(self.noise.history_drift) * (boots - 1 - i) / (boots - 1)
            for m in range(self.metrics):
                summary = summarize_boot(self.requests(effects[m]))
                per_metric[m].append(replace(summary, session=f"history-{k}", host="history"))
        return per_metric, [self.canary() for _ in range(sessions)]


@dataclass(frozen=True)
class GateRules:
    """The gate's settings in a cell."""

    tolerance: float
    spreads: Spreads
    max_boots: int
    boots: int = 1  # planned boots per run (the gate's --kimiperf-boots); more on demand up to max_boots
    # The standard errors a direction needs (None: stats.GATE_CRITICAL; the gate's
    # gate.family_critical(m) for a run of m comparisons).
    critical: float | None = None


def gate_run(world: World, history: tuple[list[list[BootSummary]], list[dict[str, float]]], *, change: float,
             rules: GateRules, start: float, span: float, session_name: str = "current",
             out: dict[str, object] | None = None, session: np.ndarray | None = None) -> tuple[list[VerdictKind], int]:
    """One profile against its baseline, boots on demand: its verdicts and how many boots it took.

    As the plugin schedules it: every test is measured on boot 1; boot k+1 happens only if a
    test's comparison on boots 1..k wants another boot, and then re-measures just those tests.
    The comparison is the plugin's own ``history.compare_with_history`` after its canary check.
    ``out``, when given, receives each metric's boots (``"boots"``) and last comparison
    (``"comparisons"``): what append-on-pass needs. ``session``: the session's effects, where
    another profile of the same session shares them (else drawn).
    """
    summaries, canaries = history
    shift = math.log1p(change) + math.log(world.noise.host_factor)
    check = canary_shift(world.canary(world.noise.host_factor), canaries)
    comparable = not (check is not None and check.moved)
    measured: dict[int, list[BootSummary]] = {m: [] for m in range(world.metrics)}
    final: dict[int, VerdictKind] = {}
    last: dict[int, Comparison] = {}
    groups, first = [], 0
    for size in TESTS:
        groups.append(range(first, first + size))
        first += size
    open_groups = groups
    boots = 0
    if session is None:
        session = world.session_effects()
    while open_groups and boots < rules.max_boots:
        boots += 1
        effects = world.boot_effects(world.noise.current_slow_share) + session
        when = start + span * (boots - 1) / max(rules.max_boots, 1)
        still_open = []
        for metrics in open_groups:
            for m in metrics:
                moved = shift if not world.noise.first_only or m == metrics[0] else math.log(world.noise.host_factor)
                offset = effects[m] + moved + world.noise.drift * when
                other_host = world.noise.host_factor != 1.0 or world.noise.new_host
                measured[m].append(replace(summarize_boot(world.requests(offset)), session=session_name,
                                           host="current" if other_host else "history"))

            def judged(m: int, placements: tuple[str, ...] | None = None) -> Comparison:
                return compare_with_history(
                    measured[m], summaries[m], direction=Direction.HIGHER_IS_BETTER, tolerance=rules.tolerance,
                    spreads=rules.spreads, comparable=comparable, segment=world.noise.segment, placements=placements,
                    critical=rules.critical)

            comparisons = [judged(m) for m in metrics]
            if world.noise.joint:  # as gate.judge: one mode per boot for the test's metrics
                for i, placements in joint_placements(comparisons).items():
                    comparisons[i] = judged(metrics[i], placements)
            for m, c in zip(metrics, comparisons):
                final[m] = c.verdict
                last[m] = c
            if boots < rules.boots or any(wants_another_boot(c) for c in comparisons):
                still_open.append(metrics)
        open_groups = still_open
    if out is not None:
        out["boots"] = measured
        out["comparisons"] = last
    return [final[m] for m in range(world.metrics)], boots


@dataclass(frozen=True)
class Cell:
    """One row of the table."""

    label: str
    boot_sd: float
    cv: float
    false_alarm_per_session: Rate
    false_regression_per_session: Rate
    false_alarm_per_comparison: Rate
    false_regression_per_comparison: Rate
    detect_2x: Rate
    regress_0_8x: Rate
    mean_boots: float
    within_claimed_null: Rate
    # --kimiperf-strict fails a REGRESSION and a change beyond the tolerance left unresolved too
    strict_fail_per_session: Rate = Rate(0, 0, math.nan, math.nan)


def first_metrics() -> list[int]:
    """The index of each test's first metric (its decode), as gate_run numbers them."""
    return [sum(TESTS[:i]) for i in range(len(TESTS))]


def mode_cells(args: argparse.Namespace) -> list[Noise]:
    """Spawn modes, each boot placed by the test's metrics together and by each metric alone:
    a change that moves every metric, one that moves only decode (the others place the boot),
    and a build that lands in the slow mode more often (no change inside either mode)."""
    d = args.drift
    cells = []
    for share, drop, k, n in ((0.30, 0.20, 10, 2), (0.15, 0.10, 20, 1)):
        for first_only in (False, True):
            for joint in (True, False):
                cells.append(Noise(0.01, 0.02, d, slow_share=share, slow_drop=drop, history_sessions=k,
                                   history_boots=k * n, first_only=first_only, joint=joint,
                                   label=f"{share:.0%} of boots {drop:.0%} slower, {k} x {n}; "
                                         f"{'decode alone changed' if first_only else 'all changed'}; "
                                         f"{'joint' if joint else 'each metric alone'}"))
    for current in (0.15, 0.5, 1.0):
        cells.append(Noise(0.01, 0.02, d, slow_share=0.15, slow_drop=0.20, history_sessions=20, history_boots=20,
                           current_slow_share=current,
                           label=f"15% of history boots 20% slower, 20 x 1; run's boots slow at {current:.0%}"))
    return cells


def run_cell(noise: Noise, *, trials: int, history_boots: int, rules: GateRules, seed: int) -> Cell:
    """Simulate ``trials`` sessions for each true change (0, 0.8x and 2x the tolerance)."""
    rng = np.random.default_rng(seed)
    world = World(noise, rng)
    history_boots = noise.history_boots or history_boots
    sessions_alarm = sessions_regress = comparisons_alarm = comparisons = within = false_regressions = 0
    boots_total = runs = 0
    detect = regress_small = changed = 0
    sessions_strict_fail = 0
    for _ in range(trials):
        alarm = regress = strict_fail = False
        for p in range(PROFILES):
            history = world.history(history_boots)
            out: dict[str, object] = {}
            verdicts, boots = gate_run(world, history, change=0.0, rules=rules, start=p / PROFILES,
                                       span=1 / PROFILES, out=out)
            finals: dict[int, Comparison] = out["comparisons"]  # type: ignore[assignment]
            strict_fail = strict_fail or any(verdict_fails(c, strict=True) for c in finals.values())
            boots_total += boots
            runs += 1
            directional = sum(v in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT) for v in verdicts)
            comparisons_alarm += directional
            false_regressions += sum(v is VerdictKind.REGRESSION for v in verdicts)
            comparisons += len(verdicts)
            within += sum(v is VerdictKind.WITHIN_TOLERANCE for v in verdicts)
            alarm = alarm or directional > 0
            regress = regress or any(v is VerdictKind.REGRESSION for v in verdicts)
        sessions_alarm += alarm
        sessions_regress += regress
        sessions_strict_fail += strict_fail
        for factor, counter in ((-2.0, "detect"), (-0.8, "small")):
            history = world.history(history_boots)
            verdicts, _ = gate_run(world, history, change=factor * rules.tolerance, rules=rules, start=0.5, span=0.5)
            if noise.first_only:  # the metrics the change moved
                verdicts = [verdicts[m] for m in first_metrics()]
            hits = sum(v is VerdictKind.REGRESSION for v in verdicts)
            if counter == "detect":
                detect += hits
                changed += len(verdicts)
            else:
                regress_small += hits
    return Cell(
        label=noise.label, boot_sd=noise.boot_sd, cv=noise.cv,
        false_alarm_per_session=rate(sessions_alarm, trials),
        false_regression_per_session=rate(sessions_regress, trials),
        false_alarm_per_comparison=rate(comparisons_alarm, comparisons),
        false_regression_per_comparison=rate(false_regressions, comparisons),
        detect_2x=rate(detect, changed), regress_0_8x=rate(regress_small, changed),
        mean_boots=boots_total / runs, within_claimed_null=rate(within, comparisons),
        strict_fail_per_session=rate(sessions_strict_fail, trials),
    )


def _pct(r: Rate) -> str:
    return f"{r.value * 100:5.1f}% [{r.low * 100:.1f}-{r.high * 100:.1f}]"


def print_table(title: str, cells: list[Cell]) -> None:
    """The cells as a plain-text table."""
    print(title)
    print(f"{'noise':<46} | {'false REGR/session':>22} | {'strict fails/session':>22} | {'false alarm/session':>22} | "
          f"{'false REGR/metric':>20} | {'detect 2x tol':>22} | {'REGRESSION at 0.8x':>22} | {'boots/run':>9}")
    for c in cells:
        print(f"{c.label:<46} | {_pct(c.false_regression_per_session):>22} | {_pct(c.strict_fail_per_session):>22} | "
              f"{_pct(c.false_alarm_per_session):>22} | {_pct(c.false_regression_per_comparison):>20} | "
              f"{_pct(c.detect_2x):>22} | {_pct(c.regress_0_8x):>22} | {c.mean_boots:9.2f}")
    print()


def simulation_cells(args: argparse.Namespace) -> list[Noise]:
    """The independent cells of earlier tables, and the levels measured on real hosts."""
    d = args.drift
    cells = [Noise(b, cv, d, history_sessions=args.history,
                   label=f"boot {b:.1%}, CV {cv:.0%}, indep.; history {args.history} sessions")
             for b in args.boot_sd for cv in args.cv]
    cells += [
        Noise(0.01, 0.02, d, history_sessions=1, label="boot 1%, CV 2%, indep.; history 1 session"),
        Noise(0.01, 0.02, d, session_sd=0.01, history_sessions=1, label="session 1% + boot 1%; history 1 session"),
        Noise(0.01, 0.02, d, session_sd=0.02, history_sessions=1, label="session 2% + boot 1%; history 1 session"),
        Noise(0.01, 0.02, d, session_sd=0.02, history_sessions=3, label="session 2% + boot 1%; history 3 sessions"),
        Noise(0.01, 0.02, d, session_sd=0.02, history_sessions=5, label="session 2% + boot 1%; history 5 sessions"),
        Noise(0.01, 0.02, d, slow_share=0.30, slow_drop=0.20, history_sessions=20, history_boots=20,
              label="bimodal 30% of boots 20% slower; history 20"),
        Noise(0.01, 0.02, d, slow_share=0.15, slow_drop=0.10, history_sessions=20, history_boots=20,
              label="bimodal 15% of boots 10% slower; history 20"),
        Noise(0.01, 0.02, d, host_factor=0.5, history_sessions=args.history, label="host 2x slower, same fingerprint"),
        Noise(0.015, 0.02, d, history_sessions=max(1, args.history // 2),
              label=f"boot 1.5%, indep.; history {max(1, args.history // 2)} sessions x 2 boots"),
    ]
    return cells


def shape_cells(args: argparse.Namespace) -> list[Noise]:
    """The cells of the history shapes users record (one session of 5 boots, three
    recordings of 2, nightly single boots), each against a run of 2 planned boots of one
    session (a third on demand), under boot, session and spawn-mode noise; and a run after a
    reboot that the host identity counts as another host."""
    d = args.drift
    shapes = ((1, 5), (3, 2), (10, 1), (20, 1))
    truths = (("boot 1%", 0.01, 0.0), ("boot 1%, session 1%", 0.01, 0.01), ("boot 1%, session 2%", 0.01, 0.02),
              ("boot 1.5%, session 1%", 0.015, 0.01))
    cells = [Noise(boot, 0.02, d, session_sd=session, history_sessions=k, history_boots=k * n,
                   label=f"{name}; history {k} x {n}")
             for name, boot, session in truths for k, n in shapes]
    cells += [Noise(0.01, 0.02, d, slow_share=0.30, slow_drop=0.20, history_sessions=k, history_boots=k * n,
                    label=f"30% of boots 20% slower; history {k} x {n}") for k, n in ((10, 2), (1, 5))]
    cells += [Noise(0.01, 0.02, d, history_sessions=k, history_boots=k * n, new_host=True,
                    label=f"boot 1%; history {k} x {n}, run on a new host id") for k, n in ((3, 2), (10, 1))]
    return cells


def calibration_cells(args: argparse.Namespace) -> list[Noise]:
    """The cells the gate's critical value is chosen on: every history shape, with the spreads
    declared as they are (boot 1%, session 1%), and with no session effect at all."""
    return [n for n in shape_cells(args)
            if n.label.split(";")[0] in ("boot 1%", "boot 1%, session 1%") and not n.new_host]


def calibrate(args: argparse.Namespace, rules: GateRules) -> dict[str, object]:
    """The same cells under each ``--critical`` (stats.GATE_CRITICAL): the one the gate uses is
    the smallest whose false REGRESSION per session stays within 1% in every cell."""
    out: dict[str, object] = {}
    kept = stats.GATE_CRITICAL
    try:
        for critical in args.critical:
            stats.GATE_CRITICAL = critical
            out[f"{critical:g}"] = run_table(
                calibration_cells(args), args, replace(rules, boots=2), seed=5000,
                title=f"critical {critical:g} standard errors: 2 planned boots a run (up to {args.max_boots}); "
                      f"tolerance {args.tolerance:.0%}, {args.trials} sessions per cell")
    finally:
        stats.GATE_CRITICAL = kept
    return out


def step_cells(args: argparse.Namespace) -> list[Noise]:
    """Change points: histories that stepped +-5% half-way, one that drifted
    5% over its length, and unstepped histories (shapes and spawn modes), each judged with
    the last segment (the gate) and without (one pool): what segmenting buys where
    a history stepped and what it costs where none did."""
    d = args.drift
    cells = []
    for segment in (True, False):
        how = "last segment" if segment else "one pool"
        for k, n in ((10, 1), (20, 1), (10, 2), (5, 2), (3, 2)):
            for step in (0.05, -0.05):
                cells.append(Noise(0.01, 0.02, d, session_sd=0.01, history_sessions=k, history_boots=k * n,
                                   history_step=step, segment=segment,
                                   label=f"stepped {step:+.0%}; history {k} x {n}; {how}"))
        cells += [Noise(0.01, 0.02, d, session_sd=0.01, history_sessions=k, history_boots=k * n, history_drift=0.05,
                        segment=segment, label=f"drifted +5%; history {k} x {n}; {how}") for k, n in ((10, 1), (20, 1))]
        cells += [Noise(0.01, 0.02, d, session_sd=0.01, history_sessions=k, history_boots=k * n, segment=segment,
                        label=f"no step; history {k} x {n}; {how}") for k, n in ((1, 5), (3, 2), (10, 1), (20, 1))]
        cells += [Noise(0.01, 0.02, d, session_sd=0.02, history_sessions=k, history_boots=k * n, segment=segment,
                        label=f"no step, session 2% declared 1%; {k} x {n}; {how}") for k, n in ((3, 2), (10, 1))]
        cells += [Noise(0.01, 0.02, d, slow_share=0.30, slow_drop=0.20, history_sessions=k, history_boots=k * n,
                        segment=segment, label=f"30% of boots 20% slower; {k} x {n}; {how}") for k, n in ((10, 2), (1, 5))]
    return cells


def append_nights(args: argparse.Namespace) -> list[dict[str, object]]:
    """A history that grows itself: nightly gate runs on main, each appending its boots to the
    history when it passed (the window keeps the last 20 boots), from a history of 10 nights of
    the unchanged server. Two threats: a slow drift of -0.25% a night (-6%, twice the tolerance,
    after 24 nights) and a -6% regression that lands on night 5. With the rule in force (each
    metric also judged against the anchor, the 10 recorded nights, by history.drift_of_entry,
    the nights appended since and tonight's boots; a drift fails the night) and without it (the
    window alone): the night the gate first fails, and the share of nights after the step that
    fail (of every night, with no threat: false alarms), and the nights appended."""
    rules = GateRules(args.tolerance, Spreads(args.prior, args.session_prior, args.host_prior), args.max_boots, boots=2)
    noise = Noise(0.01, 0.02, args.drift, session_sd=0.01)
    nights = 40
    rows = []
    print(f"history that grows itself: nightly runs (2 planned boots) appending when they pass, from 10 nights; "
          f"{min(args.trials, 200)} series a row")
    print(f"{'threat':<32} | {'rule':>11} | {'first failing night (median, p90)':>34} | "
          f"{'true change then':>16} | {'nights failing':>14} | {'nights appended':>15}")
    for threat in ("none", "drift -0.25%/night", "step -6% on night 5"):
        for guard in ("anchor", "window"):
            rng = np.random.default_rng(4000)
            world = World(noise, rng)
            firsts, changes, failing_after, appended = [], [], [], []
            for _ in range(min(args.trials, 200)):
                history, canaries = world.history(10)
                anchor = [list(h) for h in history]
                since: list[list[list[BootSummary]]] = [[] for _ in range(world.metrics)]
                first = None
                fails_after = appends = 0
                for night in range(nights):
                    level = (-0.0025 * night if threat.startswith("drift") else
                             -0.06 if threat.startswith("step") and night >= 5 else 0.0)
                    out: dict[str, object] = {}
                    verdicts, _ = gate_run(world, (history, canaries), change=level, rules=rules, start=0.0,
                                           span=1.0, session_name=f"night-{night}", out=out)
                    boots: dict[int, list[BootSummary]] = out["boots"]  # type: ignore[assignment]
                    failed = any(v is VerdictKind.REGRESSION for v in verdicts)
                    if guard == "anchor":
                        failed = failed or any(
                            (d := drift_tonight(anchor[m], since[m], boots[m], direction=Direction.HIGHER_IS_BETTER,
                                                tolerance=rules.tolerance, spreads=rules.spreads,
                                                critical=rules.critical)) is not None and d.failed
                            for m in range(world.metrics) if boots[m])
                    if failed and first is None:
                        first = night
                        changes.append(level)
                    if not threat.startswith("step") or night >= 5:
                        fails_after += failed
                    if not failed:
                        history = [(history[m] + boots[m])[-20:] for m in range(world.metrics)]
                        since = [since[m] + [boots[m]] for m in range(world.metrics)]
                        appends += 1
                firsts.append(first if first is not None else nights)
                failing_after.append(fails_after / (nights - 5 if threat.startswith("step") else nights))
                appended.append(appends / nights)
            med, p90 = float(np.median(firsts)), float(np.quantile(firsts, 0.9))
            never = sum(f == nights for f in firsts)
            row = {"threat": threat, "guard": guard, "first_failing_night_median": med, "first_failing_night_p90": p90,
                   "never_failed": never, "true_change_at_first_failure_median":
                   float(np.median(changes)) if changes else None,
                   "nights_failing": float(np.mean(failing_after)), "nights_appended": float(np.mean(appended))}
            rows.append(row)
            change = f"{row['true_change_at_first_failure_median'] * 100:+.1f}%" if changes else "-"
            print(f"{threat:<32} | {guard:>11} | {med:>15.0f}, {p90:>3.0f} ({never} never) {'':>6} | "
                  f"{change:>16} | {row['nights_failing'] * 100:13.1f}% | {row['nights_appended'] * 100:14.0f}%")
    print()
    return rows


# -- replay: sessions of real boots from the noise corpus -------------------------------------

def _test_groups(keys: list[str]) -> list[list[str]]:
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(key.split("|")[0], []).append(key)
    return list(groups.values())


def replay_run(current: list[CorpusBoot], history: list[CorpusBoot], *, keys: list[str], shift: float,
               deployment: str, max_boots: int, segment: bool = True) -> tuple[list[VerdictKind], int]:
    """One gate run replayed on real boots: ``current`` boots (of one session, in the order they
    would boot) against ``history``, every metric ``shift`` (a fraction) worse; boots on demand."""
    dep = BUILTIN_DEPLOYMENTS[deployment]
    final: dict[str, VerdictKind] = {}
    open_groups = _test_groups(keys)
    boots = 0
    while open_groups and boots < min(max_boots, len(current)):
        boots += 1
        still_open = []
        for group in open_groups:
            def judge(key: str, placements: tuple[str, ...] | None = None) -> Comparison:
                metric = key.split("|")[1]
                spec = metric_spec(metric)
                spreads = dep.spreads.of(metric)  # as gate.judge_metric: the metric's own declared boot spread
                worse = 1.0 - shift if spec.direction is Direction.HIGHER_IS_BETTER else 1.0 + shift
                cur = [replace(b.metrics[key], median=b.metrics[key].median * worse, session="current",
                               host=b.host) for b in current[:boots] if key in b.metrics]  # noqa: B023 - judged in this pass
                owners = [b for b in history if key in b.metrics]
                ref = [replace(b.metrics[key], session=b.session, host=b.host) for b in owners]
                # As the gate does (history.against_history): the canary against the boots judged.
                steps = history_steps(ref, spreads=spreads, segment=segment)
                judged = judged_part(owners, ref, steps)
                check = canary_shift(current[0].canary, [b.canary for b in judged if b.canary])
                return compare_with_history(cur, ref, direction=spec.direction, tolerance=dep.tolerance(metric),
                                            spreads=spreads, comparable=not (check is not None and check.moved),
                                            steps=steps, placements=placements)

            comparisons = [judge(key) for key in group]
            # As gate.judge: one spawn mode per boot for the metrics of a test that split alike.
            for i, placements in joint_placements(comparisons).items():
                comparisons[i] = judge(group[i], placements)
            final.update({key: c.verdict for key, c in zip(group, comparisons)})
            if any(wants_another_boot(c) for c in comparisons):
                still_open.append(group)
        open_groups = still_open
    return [final[k] for k in keys if k in final], boots


def replay(args: argparse.Namespace) -> dict[str, object]:
    """A/A and injected shifts on real boots: each session of the corpus in turn is "this run",
    the other sessions (or one other session) the baseline history; boots resampled inside
    sessions for the trials."""
    boots = load_corpus(sorted(args.corpus.glob("*.jsonl")), variant="default", max_foreign_cpu=args.max_foreign_cpu)
    by_session: dict[str, list[CorpusBoot]] = {}
    for b in boots:
        by_session.setdefault(b.session, []).append(b)
    sessions = sorted(s for s, v in by_session.items() if len(v) >= 2)
    if len(sessions) < 2:
        print(f"replay: {len(sessions)} sessions with 2+ valid boots in {args.corpus}; it needs 2")
        return {}
    keys = sorted({k for b in boots for k in b.metrics})
    rng = np.random.default_rng(7)
    dep = BUILTIN_DEPLOYMENTS[args.deployment]
    tol = max(dep.tolerance(k.split("|")[1]) for k in keys)
    out: dict[str, object] = {"sessions": len(sessions), "boots": len(boots),
                              "hosts": len({b.host for b in boots}), "metrics": len(keys), "rows": []}
    print(f"replay on the noise corpus: {len(boots)} valid boots in {len(sessions)} sessions on "
          f"{out['hosts']} host(s), {len(keys)} gated metrics, deployment {args.deployment} "
          f"(tolerance {tol:.0%}, declared boot/session/host spread {dep.boot_spread:.0%}/"
          f"{dep.session_spread:.0%}/{dep.host_spread:.0%}, up to {dep.max_boots} boots)")
    print(f"{'history':<28} | {'shift':>6} | {'sessions alarmed':>22} | {'REGRESSION/metric':>22} | {'boots/run':>9}")
    for history_kind in ("all other sessions", "one other session"):
        for factor in (0.0, 1.0, 2.0):
            alarmed = regress = metrics = boots_total = 0
            for _ in range(args.replay_trials):
                current_session = sessions[rng.integers(len(sessions))]
                others = [s for s in sessions if s != current_session]
                if history_kind == "one other session":
                    others = [others[rng.integers(len(others))]]
                pool = [b for s in others for b in by_session[s]]
                # Resampled within the pool, each session's boots kept together in time, as a
                # history is recorded (the change-point search reads the order).
                history = [pool[i] for i in sorted(rng.integers(len(pool), size=min(args.history, 2 * len(pool))))]
                mine = by_session[current_session]
                current = [mine[i] for i in rng.permutation(len(mine))]
                verdicts, used = replay_run(current, history, keys=keys, shift=factor * tol,
                                            deployment=args.deployment, max_boots=dep.max_boots,
                                            segment=not getattr(args, "one_pool", False))
                directional = sum(v in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT) for v in verdicts)
                alarmed += directional > 0
                regress += sum(v is VerdictKind.REGRESSION for v in verdicts)
                metrics += len(verdicts)
                boots_total += used
            row = {"history": history_kind, "shift_x_tolerance": factor,
                   "sessions_alarmed": asdict(rate(alarmed, args.replay_trials)),
                   "regression_per_metric": asdict(rate(regress, metrics)),
                   "mean_boots": boots_total / args.replay_trials}
            out["rows"].append(row)  # type: ignore[union-attr]
            what = "alarm" if factor == 0 else "detect"
            print(f"{history_kind:<28} | {factor:5.0f}x | {_pct(rate(alarmed, args.replay_trials)):>22} | "
                  f"{_pct(rate(regress, metrics)):>22} | {boots_total / args.replay_trials:9.2f}  ({what})")
    print()
    return out


def control_table(args: argparse.Namespace, rules: GateRules) -> list[dict[str, object]]:
    """Where the session level is large against the tolerance (a 2% session
    effect, declared as it is, on a 3% tolerance), the gate against a history of 10 sessions and
    the candidate against its control booted beside it (--kimiperf-control): the session effect
    is one draw shared by both sides, and the comparison is the plugin's own
    (profiles.compare_with_control), boot against boot, over the suite's 10 gated metrics; and, for
    contrast, the profile comparison's rule (profiles.compare_in_session), which the control
    uses where a deployment declares spawn modes."""
    from pytest_kimiperf.judge.profiles import compare_with_control  # noqa: PLC0415
    from pytest_kimiperf.judge.profiles import InSessionRules, compare_in_session  # noqa: PLC0415

    d = args.drift
    session_rules = replace(rules, spreads=Spreads(rules.spreads.boot, 0.02, rules.spreads.host), boots=2)
    rows: list[dict[str, object]] = []
    print(f"an in-session control where the session level dominates: boot 1%, session 2% (declared), tolerance "
          f"{args.tolerance:.0%}, {args.trials} sessions a row")
    print(f"{'design':<58} | {'REGRESSION/session, A/A':>24} | {'REGRESSION at 2x tol':>22} | boots/run")
    for k, n in ((10, 1), (20, 1)):
        cell = run_cell(Noise(0.01, 0.02, d, session_sd=0.02, history_sessions=k, history_boots=k * n,
                              label=f"against a history of {k} x {n}"), trials=args.trials, history_boots=k * n,
                        rules=session_rules, seed=7000 + k)
        rows.append({"design": cell.label, "false_regression_per_session": asdict(cell.false_regression_per_session),
                     "detect_2x": asdict(cell.detect_2x), "boots": cell.mean_boots})
        print(f"{cell.label:<58} | {_pct(cell.false_regression_per_session):>24} | {_pct(cell.detect_2x):>22} | "
              f"{cell.mean_boots:9.2f}")
    in_session = InSessionRules(rules.spreads.boot, 3.0)
    for boots, rule in ((2, "gate"), (3, "gate"), (2, "in-session"), (3, "in-session")):
        rng = np.random.default_rng(7100 + boots)
        world = World(Noise(0.01, 0.02, d, session_sd=0.02), rng)
        compare = compare_with_control if rule == "gate" else compare_in_session
        false_sessions = detected = judged = 0
        for _ in range(args.trials):
            for change, counting in ((0.0, "null"), (-2 * args.tolerance, "detect")):
                session = world.session_effects()
                sides = {side: [[] for _ in range(world.metrics)] for side in ("candidate", "control")}
                # Interleaved A B B A as the plugin boots them, one session (its effect cancels),
                # with the session's drift over the boots.
                order = [pair[::-1] if k % 2 else pair for k, pair in enumerate([("candidate", "control")] * boots)]
                for k, side in enumerate(side for pair in order for side in pair):
                    effects = world.boot_effects() + session + world.noise.drift * k / (2 * boots)
                    shift = math.log1p(change) if side == "candidate" else 0.0
                    for m in range(world.metrics):
                        sides[side][m].append(summarize_boot(world.requests(effects[m] + shift)))
                verdicts = [compare(sides["candidate"][m], sides["control"][m], direction=Direction.HIGHER_IS_BETTER,
                                    tolerance=args.tolerance, rules=in_session).verdict for m in range(world.metrics)]
                hits = sum(v is VerdictKind.REGRESSION for v in verdicts)
                if counting == "null":
                    false_sessions += hits > 0
                else:
                    detected += hits
                    judged += len(verdicts)
        label = f"against its control, {boots} boots a side" + (
            "" if rule == "gate" else " (the profile comparison's rule)")
        false_rate, detect_rate = rate(false_sessions, args.trials), rate(detected, judged)
        rows.append({"design": label, "false_regression_per_session": asdict(false_rate),
                     "detect_2x": asdict(detect_rate), "boots": 2 * boots})
        print(f"{label:<58} | {_pct(false_rate):>24} | {_pct(detect_rate):>22} | {2 * boots:9.2f}")
    print()
    return rows


def run_table(noises: list[Noise], args: argparse.Namespace, rules: GateRules, *, seed: int,
              title: str) -> list[dict[str, object]]:
    """Run each cell (seeded ``seed`` + its index), print the table, return it as JSON rows."""
    cells = [run_cell(noise, trials=args.trials, history_boots=args.history, rules=rules, seed=seed + i)
             for i, noise in enumerate(noises)]
    print_table(title, cells)
    return [asdict(c) for c in cells]


def main(argv: list[str] | None = None) -> int:
    """Print the tables (and write them as JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="sessions per cell (default 1000)")
    parser.add_argument("--history", type=int, default=10, help="baseline boots (default 10)")
    parser.add_argument("--max-boots", type=int, default=3, help="boots on demand per profile (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--prior", type=float, default=0.01, help="declared boot spread (default 0.01)")
    parser.add_argument("--session-prior", type=float, default=0.01, help="declared session spread (default 0.01)")
    parser.add_argument("--host-prior", type=float, default=0.02, help="declared host spread (default 0.02)")
    parser.add_argument("--drift", type=float, default=0.005, help="linear drift over a session (default 0.005)")
    parser.add_argument("--boot-sd", type=float, nargs="*", default=[0.01, 0.015])
    parser.add_argument("--cv", type=float, nargs="*", default=[0.02])
    parser.add_argument("--critical", type=float, nargs="*", default=[2.5, 3.0, 3.5, 4.0],
                        help="--cells calibrate: the critical values (standard errors) to compare")
    parser.add_argument("--cells", choices=("all", "shapes", "steps", "append", "calibrate", "modes", "control", "none"), default="all",
                        help="'shapes': the history shapes users record (2 planned boots a run); 'steps': stepped and "
                             "drifting histories, with and without the last segment; 'append': a history that grows "
                             "itself night by night; 'calibrate': the shapes under each --critical; 'modes': spawn modes, "
                             "placed jointly and alone, and the mode frequency; 'control': the history against an "
                             "in-session control where the session level dominates; 'none': the "
                             "replay alone")
    parser.add_argument("--seed", type=int, default=None,
                        help="--cells modes: the first cell's seed (default 6000), to rerun the table on others")
    parser.add_argument("--replay", action="store_true", help="also replay sessions of the noise corpus")
    parser.add_argument("--replay-trials", type=int, default=300)
    parser.add_argument("--one-pool", action="store_true",
                        help="the replay judges each history as one pool, steps or not (as before change points)")
    parser.add_argument("--corpus", type=Path, default=Path(__file__).parent / "data" / "noise")
    parser.add_argument("--deployment", default="tiny-cpu", help="the replay's deployment (default tiny-cpu)")
    parser.add_argument("--max-foreign-cpu", type=float, default=0.10)
    parser.add_argument("--profiles", action="store_true",
                        help="also the profile comparison's tables (benchmarks/profile_power.py)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.trials < 1 or args.history < 1 or args.max_boots < 1:
        parser.error("--trials, --history and --max-boots must be at least 1")
    started = time.monotonic()
    tables: dict[str, object] = {}
    rules = GateRules(args.tolerance, Spreads(args.prior, args.session_prior, args.host_prior), args.max_boots)
    spreads = (f"declared boot/session/host spread {args.prior:.1%}/{args.session_prior:.1%}/{args.host_prior:.1%}, "
               f"drift {args.drift:.1%}, {args.trials} sessions per cell")
    if args.cells == "shapes":
        tables["shapes"] = run_table(
            shape_cells(args), args, replace(rules, boots=2), seed=2000,
            title=f"history shapes, 2 planned boots a run (up to {args.max_boots}); tolerance {args.tolerance:.0%}, {spreads}")
    if args.cells == "steps":
        tables["steps"] = run_table(
            step_cells(args), args, replace(rules, boots=2), seed=3000,
            title=f"stepped histories, 2 planned boots a run (up to {args.max_boots}); tolerance {args.tolerance:.0%}, {spreads}")
    if args.cells == "modes":
        tables["modes"] = run_table(
            mode_cells(args), args, replace(rules, boots=2), seed=args.seed if args.seed is not None else 6000,
            title=f"spawn modes, 2 planned boots a run (up to {args.max_boots}); tolerance {args.tolerance:.0%}, {spreads}")
    if args.cells == "control":
        tables["control"] = control_table(args, rules)
    if args.cells == "append":
        tables["append"] = append_nights(args)
    if args.cells == "calibrate":
        tables["calibrate"] = calibrate(args, rules)
    if args.cells == "all":
        tables["simulation"] = run_table(
            simulation_cells(args), args, rules, seed=1000,
            title=f"simulation, boots on demand (up to {args.max_boots}); tolerance {args.tolerance:.0%}, history "
                  f"{args.history} boots, {spreads}")
    if args.replay:
        tables["replay"] = replay(args)
    if args.profiles:
        import profile_power

        profile_power.main(["--trials", str(min(args.trials, 400)), "--splits", str(args.replay_trials),
                            "--deployment", args.deployment, "--max-foreign-cpu", str(args.max_foreign_cpu)])
    print(f"targets: {TARGETS}; {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(tables, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
