"""How often the regression gate cries wolf, and how often it catches a real regression.

Synthetic decode tok/s samples (log-normal, one sample = one request) at CV 1%, 2% and 5%, with
and without outliers (5% of requests 1.5x slower), n samples per side. For each scenario:

* false-regression rate: current and reference drawn from the same distribution (target <= 1%);
* detection rate: current 2 x tolerance slower (3% tolerance -> tok/s x 0.94; target >= 90% at
  CV 2%);

for the gate (pytest_kimiperf.stats.compare) and for pytest-benchmark's single-threshold rule
(``--benchmark-compare-fail=median:<tolerance>``) side by side. Rates come with 95% Wilson
intervals, so a table from few trials does not claim more than it shows. Seeded: the same
arguments print the same table.

    python benchmarks/gate_power.py [--trials N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

# Runs from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimiperf.metric_specs import Direction
from pytest_kimiperf.stats import VerdictKind, compare, single_threshold_regression

OUTLIER_SHARE = 0.05
OUTLIER_SLOWDOWN = 1.5
FALSE_REGRESSION_TARGET = 0.01
DETECTION_TARGET = 0.90
DETECTION_TARGET_CV = 0.02
BASE_TOK_S = 40.0


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
        return self.hits / self.trials


@dataclass(frozen=True)
class ScenarioResult:
    """Both rules' error and detection rates for one noise scenario."""

    cv: float
    outliers: bool
    gate_false_regression: Rate
    single_false_regression: Rate
    gate_detection: Rate
    single_detection: Rate
    # Where the gate's no-change trials ended up: a "pass" needs the CI inside tolerance.
    gate_null_verdicts: dict[str, int]
    gate_shift_verdicts: dict[str, int]


def rate(hits: int, trials: int) -> Rate:
    """A rate with its 95% Wilson interval (scipy's binomtest)."""
    ci = scipy_stats.binomtest(hits, trials).proportion_ci(confidence_level=0.95, method="wilson")
    return Rate(hits=hits, trials=trials, low=float(ci.low), high=float(ci.high))


def draw_tok_s(rng: np.random.Generator, n: int, cv: float, outliers: bool, scale: float) -> np.ndarray:
    """n decode tok/s samples: log-normal with coefficient of variation cv, optional slow outliers."""
    sigma = np.sqrt(np.log1p(cv**2))  # CV of a log-normal is sqrt(exp(sigma^2) - 1)
    samples = BASE_TOK_S * scale * rng.lognormal(-sigma**2 / 2, sigma, n)
    if outliers:
        slow = rng.random(n) < OUTLIER_SHARE
        samples[slow] /= OUTLIER_SLOWDOWN
    return samples


def run_scenario(
    cv: float, outliers: bool, *, trials: int, n: int, tolerance: float, alpha: float, n_boot: int,
    seed: int,
) -> ScenarioResult:
    """Run ``trials`` no-change and ``trials`` 2 x tolerance comparisons for one scenario."""
    rng = np.random.default_rng([seed, int(cv * 1000), int(outliers)])
    direction = Direction.HIGHER_IS_BETTER
    slower = 1.0 - 2.0 * tolerance
    counts = {"gate_null": 0, "single_null": 0, "gate_shift": 0, "single_shift": 0}
    null_verdicts: dict[str, int] = {kind.value: 0 for kind in VerdictKind}
    shift_verdicts: dict[str, int] = {kind.value: 0 for kind in VerdictKind}
    for trial in range(trials):
        for label, scale, verdicts in (("null", 1.0, null_verdicts), ("shift", slower, shift_verdicts)):
            reference = draw_tok_s(rng, n, cv, outliers, 1.0)
            current = draw_tok_s(rng, n, cv, outliers, scale)
            c = compare(current, reference, direction=direction, tolerance=tolerance, alpha=alpha,
                        n_boot=n_boot, seed=trial)
            verdicts[c.verdict.value] += 1
            counts[f"gate_{label}"] += c.verdict is VerdictKind.REGRESSION
            counts[f"single_{label}"] += single_threshold_regression(current, reference, direction, tolerance)
    return ScenarioResult(
        cv=cv,
        outliers=outliers,
        gate_false_regression=rate(counts["gate_null"], trials),
        single_false_regression=rate(counts["single_null"], trials),
        gate_detection=rate(counts["gate_shift"], trials),
        single_detection=rate(counts["single_shift"], trials),
        gate_null_verdicts={k: v for k, v in null_verdicts.items() if v},
        gate_shift_verdicts={k: v for k, v in shift_verdicts.items() if v},
    )


def time_compare_ms(n: int, n_boot: int, repeats: int = 20) -> float:
    """Median wall time of one compare() of n vs n samples, in milliseconds."""
    rng = np.random.default_rng(0)
    current, reference = rng.lognormal(0, 0.02, n), rng.lognormal(0, 0.02, n)
    times_ms = []
    for _ in range(repeats):
        start = time.perf_counter()
        compare(current, reference, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, n_boot=n_boot)
        times_ms.append((time.perf_counter() - start) * 1000.0)
    return float(np.median(times_ms))


def _fmt(r: Rate) -> str:
    return f"{r.value * 100:5.1f}% [{r.low * 100:4.1f}-{r.high * 100:5.1f}]"


def format_table(results: list[ScenarioResult], tolerance: float, n: int, trials: int) -> str:
    """The side-by-side table printed to stdout."""
    lines = [
        (
            f"n={n} per side, tolerance {tolerance * 100:g}%, true change for detection "
            f"-{2 * tolerance * 100:g}% tok/s, {trials} trials per cell; rate [95% Wilson CI]"
        ),
        "",
        f"{'CV':>4} {'outliers':>8} | {'false regression':^41} | {'detection':^41}",
        f"{'':>4} {'':>8} | {'gate':^20} {'single threshold':^20} | {'gate':^20} {'single threshold':^20}",
    ]
    for r in results:
        lines.append(
            f"{r.cv * 100:3g}% {'5% x1.5' if r.outliers else 'none':>8} | "
            f"{_fmt(r.gate_false_regression):>20} {_fmt(r.single_false_regression):>20} | "
            f"{_fmt(r.gate_detection):>20} {_fmt(r.single_detection):>20}"
        )
    lines.append("")
    lines.append("gate verdicts with no true change / with the true change:")
    for r in results:
        lines.append(
            f"  CV {r.cv * 100:g}% {'with' if r.outliers else 'no'} outliers: "
            f"{_fmt_verdicts(r.gate_null_verdicts)} / {_fmt_verdicts(r.gate_shift_verdicts)}"
        )
    return "\n".join(lines)


def _fmt_verdicts(verdicts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in verdicts.items())


def check_targets(results: list[ScenarioResult]) -> list[str]:
    """One line per target: met or missed by the observed rate, and whether its CI settles it."""
    lines = []
    for r in results:
        name = f"CV {r.cv * 100:g}% {'with' if r.outliers else 'without'} outliers"
        checks = [("false regression", r.gate_false_regression, FALSE_REGRESSION_TARGET, "<=")]
        if r.cv == DETECTION_TARGET_CV:
            checks.append(("detection", r.gate_detection, DETECTION_TARGET, ">="))
        for what, observed, target, op in checks:
            met = observed.value <= target if op == "<=" else observed.value >= target
            settled = (observed.high <= target or observed.low > target) if op == "<=" else (
                observed.low >= target or observed.high < target
            )
            lines.append(
                f"{name}: {what} {observed.value:.1%} {'meets' if met else 'MISSES'} {op} {target:.0%}"
                + ("" if settled else " (its 95% CI straddles the target: run more --trials)")
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run every scenario, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000, help="trials per cell (default 1000)")
    parser.add_argument("--n", type=int, default=10, help="samples per side (default 10)")
    parser.add_argument("--tolerance", type=float, default=0.03, help="gate tolerance (default 0.03)")
    parser.add_argument("--alpha", type=float, default=0.01, help="gate significance (default 0.01)")
    parser.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.n < 2:
        parser.error("--trials must be >= 1 and --n >= 2")

    start = time.perf_counter()
    results = [
        run_scenario(cv, outliers, trials=args.trials, n=args.n, tolerance=args.tolerance,
                     alpha=args.alpha, n_boot=args.n_boot, seed=args.seed)
        for cv in (0.01, 0.02, 0.05)
        for outliers in (False, True)
    ]
    elapsed_s = time.perf_counter() - start
    compare_ms = {n: time_compare_ms(n, args.n_boot) for n in (args.n, 100)}
    print(format_table(results, args.tolerance, args.n, args.trials))
    print()
    print("compare() median time: " + ", ".join(f"n={n}: {ms:.1f} ms" for n, ms in compare_ms.items()))
    targets = check_targets(results)
    print("targets for the gate (false regression <= 1% everywhere, detection >= 90% at CV 2%):")
    print("\n".join(f"  {line}" for line in targets))
    print(f"({elapsed_s:.0f} s)")
    if args.json:
        payload = {
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "outlier_share": OUTLIER_SHARE,
            "outlier_slowdown": OUTLIER_SLOWDOWN,
            "scenarios": [
                {**asdict(r), **{f"{k}_rate": getattr(r, k).value for k in (
                    "gate_false_regression", "single_false_regression", "gate_detection",
                    "single_detection")}}
                for r in results
            ],
            "compare_ms": {str(n): ms for n, ms in compare_ms.items()},
            "targets": targets,
        }
        args.json.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
