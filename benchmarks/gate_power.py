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

The gate is the plugin's own code: ``boot_summary.summarize_boot`` for each boot,
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

The single-boot table shows what a run that boots once can honestly claim.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

# Runs from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.planning import wants_another_boot  # noqa: E402
from pytest_kimiperf.judge.boot_summary import BootSummary, summarize_boot  # noqa: E402
from pytest_kimiperf.judge.stats import VerdictKind, compare_boots  # noqa: E402

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
    """The noise model of one cell of the table."""

    boot_sd: float
    cv: float
    drift: float


class World:
    """Draws boots of a server whose metrics follow :class:`Noise`."""

    def __init__(self, noise: Noise, rng: np.random.Generator) -> None:
        self.noise = noise
        self.rng = rng
        self.metrics = sum(TESTS)

    def boot_effects(self) -> np.ndarray:
        """Per-metric log offsets of one boot: a shared part and each metric's own."""
        b = self.noise.boot_sd
        shared = self.rng.normal() * math.sqrt(SHARED_BOOT_SHARE)
        own = self.rng.normal(size=self.metrics) * math.sqrt(1 - SHARED_BOOT_SHARE)
        return b * (shared + own)

    def requests(self, offset: float) -> np.ndarray:
        """One test's per-request samples of a higher-is-better metric around exp(offset)."""
        logs = offset + self.rng.normal(0.0, self.noise.cv, REQUESTS_PER_BOOT)
        slow = self.rng.random(REQUESTS_PER_BOOT) < OUTLIER_SHARE
        logs[slow] -= np.log(self.rng.uniform(1.5, 3.0, int(slow.sum())))
        return np.exp(logs)

    def history(self, boots: int) -> list[list[BootSummary]]:
        """A baseline history: ``boots`` boots of the unchanged server, per metric."""
        per_metric: list[list[BootSummary]] = [[] for _ in range(self.metrics)]
        for _ in range(boots):
            effects = self.boot_effects()
            for m in range(self.metrics):
                per_metric[m].append(summarize_boot(self.requests(effects[m])))
        return per_metric


def gate_run(world: World, history: list[list[BootSummary]], *, change: float, tolerance: float,
             prior: float, max_boots: int, start: float, span: float) -> tuple[list[VerdictKind], int]:
    """One profile against its baseline, boots on demand: its verdicts and how many boots it took.

    As the plugin schedules it: every test is measured on boot 1; boot k+1 happens only if a
    test's comparison on boots 1..k wants another boot, and then re-measures just those tests.
    """
    shift = math.log1p(change)
    measured: dict[int, list[BootSummary]] = {m: [] for m in range(world.metrics)}
    final: dict[int, VerdictKind] = {}
    groups, first = [], 0
    for size in TESTS:
        groups.append(range(first, first + size))
        first += size
    open_groups = groups
    boots = 0
    while open_groups and boots < max_boots:
        boots += 1
        effects = world.boot_effects()
        when = start + span * (boots - 1) / max(max_boots, 1)
        still_open = []
        for metrics in open_groups:
            comparisons = []
            for m in metrics:
                offset = effects[m] + shift + world.noise.drift * when
                measured[m].append(summarize_boot(world.requests(offset)))
                comparisons.append(compare_boots(measured[m], history[m], direction=Direction.HIGHER_IS_BETTER,
                                                 tolerance=tolerance, prior_spread=prior))
            for m, c in zip(metrics, comparisons):
                final[m] = c.verdict
            if any(wants_another_boot(c) for c in comparisons):
                still_open.append(metrics)
        open_groups = still_open
    return [final[m] for m in range(world.metrics)], boots


@dataclass(frozen=True)
class Cell:
    """One row of the table."""

    boot_sd: float
    cv: float
    false_alarm_per_session: Rate
    false_alarm_per_comparison: Rate
    detect_2x: Rate
    regress_0_8x: Rate
    mean_boots: float
    within_claimed_null: Rate


def run_cell(noise: Noise, *, trials: int, history_boots: int, max_boots: int, tolerance: float,
             prior: float, seed: int) -> Cell:
    """Simulate ``trials`` sessions for each true change (0, 0.8x and 2x the tolerance)."""
    rng = np.random.default_rng(seed)
    world = World(noise, rng)
    sessions_alarm = comparisons_alarm = comparisons = within = 0
    boots_total = runs = 0
    detect = regress_small = changed = 0
    for _ in range(trials):
        alarm = False
        for p in range(PROFILES):
            history = world.history(history_boots)
            verdicts, boots = gate_run(world, history, change=0.0, tolerance=tolerance, prior=prior,
                                       max_boots=max_boots, start=p / PROFILES, span=1 / PROFILES)
            boots_total += boots
            runs += 1
            directional = sum(v in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT) for v in verdicts)
            comparisons_alarm += directional
            comparisons += len(verdicts)
            within += sum(v is VerdictKind.WITHIN_TOLERANCE for v in verdicts)
            alarm = alarm or directional > 0
        sessions_alarm += alarm
        for factor, counter in ((-2.0, "detect"), (-0.8, "small")):
            history = world.history(history_boots)
            verdicts, _ = gate_run(world, history, change=factor * tolerance, tolerance=tolerance,
                                   prior=prior, max_boots=max_boots, start=0.5, span=0.5)
            hits = sum(v is VerdictKind.REGRESSION for v in verdicts)
            if counter == "detect":
                detect += hits
                changed += len(verdicts)
            else:
                regress_small += hits
    return Cell(
        boot_sd=noise.boot_sd, cv=noise.cv,
        false_alarm_per_session=rate(sessions_alarm, trials),
        false_alarm_per_comparison=rate(comparisons_alarm, comparisons),
        detect_2x=rate(detect, changed), regress_0_8x=rate(regress_small, changed),
        mean_boots=boots_total / runs, within_claimed_null=rate(within, comparisons),
    )


def _pct(r: Rate) -> str:
    return f"{r.value * 100:5.1f}% [{r.low * 100:.1f}-{r.high * 100:.1f}]"


def print_table(title: str, cells: list[Cell]) -> None:
    """The cells as a plain-text table."""
    print(title)
    print(f"{'b':>5} {'CV':>4} | {'false alarm/session':>24} | {'detect 2x tol':>24} | "
          f"{'REGRESSION at 0.8x':>24} | {'boots/run':>9} | {'within claimed (null)':>24}")
    for c in cells:
        print(f"{c.boot_sd * 100:4.1f}% {c.cv * 100:3.0f}% | {_pct(c.false_alarm_per_session):>24} | "
              f"{_pct(c.detect_2x):>24} | {_pct(c.regress_0_8x):>24} | {c.mean_boots:9.2f} | "
              f"{_pct(c.within_claimed_null):>24}")
    print()


def main(argv: list[str] | None = None) -> int:
    """Print the tables (and write them as JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="sessions per cell (default 1000)")
    parser.add_argument("--history", type=int, default=10, help="baseline boots (default 10)")
    parser.add_argument("--max-boots", type=int, default=3, help="boots on demand per profile (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--prior", type=float, default=0.01, help="declared boot spread (default 0.01)")
    parser.add_argument("--drift", type=float, default=0.005, help="linear drift over a session (default 0.005)")
    parser.add_argument("--boot-sd", type=float, nargs="*", default=[0.0, 0.005, 0.01, 0.015, 0.03])
    parser.add_argument("--cv", type=float, nargs="*", default=[0.01, 0.02])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.trials < 1 or args.history < 1 or args.max_boots < 1:
        parser.error("--trials, --history and --max-boots must be at least 1")
    started = time.monotonic()
    tables: dict[str, list[Cell]] = {}
    for label, max_boots in ((f"boots on demand (up to {args.max_boots})", args.max_boots),
                             ("single boot (what one boot can claim)", 1)):
        cells = []
        for i, b in enumerate(args.boot_sd):
            for j, cv in enumerate(args.cv):
                cells.append(run_cell(Noise(b, cv, args.drift), trials=args.trials, history_boots=args.history,
                                      max_boots=max_boots, tolerance=args.tolerance, prior=args.prior,
                                      seed=1000 * i + j))
        tables[label] = cells
        print_table(f"{label}; tolerance {args.tolerance:.0%}, history {args.history} boots, "
                    f"declared spread {args.prior:.1%}, drift {args.drift:.1%}, {args.trials} sessions per cell",
                    cells)
    print(f"targets: {TARGETS}; {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({k: [asdict(c) for c in v] for k, v in tables.items()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
