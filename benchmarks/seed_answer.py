"""The seed's question, answered with boots booked on demand: two NCCL settings 0.6% apart.

A user asks whether two profiles differ; on the GPU they are 0.6% apart, a boot's figure
scatters by 1% and the tolerance is 3%. The answer should be "within +/-3%" (the TOST at 5%),
never a direction, in the fewest boots. Each simulated session starts with ``--start`` boots a
profile and books one more boot of each at a time until the plugin's own rule stops
(judge/profiles.profiles_to_book after each round, as a session calls it, then
profiles.compare_in_session with the plan in its rules), at most ``--cap`` a profile.

Rows: the seed's case (true 0.6%), the band's edges (true -3.0% and +3.09%: "within" there is the
error the TOST bounds at 5%), A/A (no change: any direction is a false alarm, bounded by
IN_SESSION_ALPHA) and a real change (-10%: the direction and the boots it took); each under the
sequential rule and, for comparison, at a fixed budget of ``--start`` and of ``--cap`` a side.

    python benchmarks/seed_answer.py [--trials 2000] [--cap 6] [--start 2] [--seed 46]

Seeded: the same arguments print the same table.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary  # noqa: E402
from pytest_kimiperf.judge.profiles import InSessionRules, compare_in_session  # noqa: E402
from pytest_kimiperf.judge.notes import BootsForWithin  # noqa: E402
from pytest_kimiperf.judge.profiles import profiles_to_book  # noqa: E402
from pytest_kimiperf.judge.profiles import SequentialPlan  # noqa: E402
from pytest_kimiperf.judge.stats import VerdictKind, band_log  # noqa: E402

HIGHER = Direction.HIGHER_IS_BETTER
TOLERANCE = 0.03
BOOT_NOISE = 0.01
# The Kimi deployment's declared rules: boot spread 1% (3 df), no spawn modes.
RULES = InSessionRules(boot_spread=0.01, boot_spread_df=3.0)
SE_LOG = 0.003  # a boot's own error of its median (20 requests at a 1.5% CV)


@dataclass(frozen=True)
class Cell:
    """What one row's sessions ended with."""

    label: str
    trials: int
    within: float
    direction: float
    right_direction: float
    mean_boots: float
    p90_boots: float
    more_boots: dict[str, int]  # the fixed budget's answer: "N more a side" -> sessions


def _boot(log_figure: float) -> BootSummary:
    return BootSummary(median=100.0 * math.exp(log_figure), n=20, se_log=SE_LOG)


def run_cell(label: str, shift: float, plan: SequentialPlan, *, trials: int, seed: int,
             noise: float = BOOT_NOISE, rules: InSessionRules = RULES) -> Cell:
    """``trials`` sessions of two profiles ``shift`` (log) apart, boot noise ``noise`` (SD of a
    boot's log figure), judged by ``plan`` as a session judges them."""
    rng = np.random.default_rng(seed)
    sd = math.log1p(noise)
    planned = replace(rules, plan=plan)
    within = direction = right = 0
    boots: list[int] = []
    more: dict[str, int] = {}
    for _ in range(trials):
        ref = [_boot(x) for x in rng.normal(0.0, sd, plan.cap)]
        cur = [_boot(x) for x in rng.normal(shift, sd, plan.cap)]
        k = plan.start  # a session's rounds: one more boot a side while the plugin books one
        while profiles_to_book({"cur": cur[:k], "ref": ref[:k]}, "ref", direction=HIGHER, tolerance=TOLERANCE, rules=planned):
            k += 1
        c = compare_in_session(cur[:k], ref[:k], direction=HIGHER, tolerance=TOLERANCE, rules=planned)
        boots.append(k)
        within += c.verdict is VerdictKind.WITHIN_TOLERANCE
        if c.verdict in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT):
            direction += 1
            right += (c.verdict is VerdictKind.IMPROVEMENT) == (shift > 0)
        for note in c.notes:
            if isinstance(note, BootsForWithin):
                key = "none" if note.needed is None else f"+{max(note.needed - note.have, 0)}"
                more[key] = more.get(key, 0) + 1
    return Cell(label, trials, within / trials, direction / trials, right / trials,
                float(np.mean(boots)), float(np.percentile(boots, 90, method="inverted_cdf")), more)


def table(args: argparse.Namespace) -> list[Cell]:
    """Every row, for the sequential plan and the fixed budgets."""
    band = band_log(TOLERANCE)
    cases = (("seed: 0.6% apart", math.log1p(0.006)), ("edge: -3.0%", -band), ("edge: +3.09%", band),
             ("A/A: no change", 0.0), ("real: -10%", math.log1p(-0.10)))
    designs = ((f"on demand {args.start}..{args.cap}", SequentialPlan(args.start, args.cap)),
               (f"fixed {args.start}", SequentialPlan(args.start, args.start)),
               (f"fixed {args.cap}", SequentialPlan(args.cap, args.cap)))
    cells = []
    for i, (case, shift) in enumerate(cases):
        for design, plan in designs:
            cells.append(run_cell(f"{case} | {design}", shift, plan, trials=args.trials, seed=args.seed + i))
    return cells


def main(argv: list[str] | None = None) -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--start", type=int, default=2)
    parser.add_argument("--cap", type=int, default=6)
    parser.add_argument("--seed", type=int, default=46)
    args = parser.parse_args(argv)
    print(f"boot noise {BOOT_NOISE:.0%}, tolerance {TOLERANCE:.0%}, declared spread 1% (3 df), "
          f"{args.trials} sessions a row, seed {args.seed}")
    print("case | design | within | any direction | right direction | boots a side: mean | p90 | "
          "fixed budget's answer")
    for cell in table(args):
        more = ", ".join(f"{k}: {v}" for k, v in sorted(cell.more_boots.items())) or "-"
        print(f"{cell.label} | {cell.within:.1%} | {cell.direction:.2%} | {cell.right_direction:.1%} | "
              f"{cell.mean_boots:.2f} | {cell.p90_boots:g} | {more}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
