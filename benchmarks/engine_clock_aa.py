"""A/A runs with the engine's figures present: how often an unchanged build is told which way a
metric moved once the engine's clock stands beside the client's (issue 65).

Every simulated run is judged as benchmarks/sign_claims.py judges it (the plugin's own
``profiles.compare_in_session`` and ``history.compare_with_history`` under Kimi's declared rules),
and each profile comparison then goes through the engine's rule as the answers apply it
(``judge/engine_clock.py``): its engine figure, one value a boot, compared over the boots, and
the comparison's sign withdrawn where the profile reaches only the engine and the engine did not
move. Every comparison is taken as such a profile (NCCL's variables alone): the rule applies to
each one. A boot's engine figure shares the boot's own level with the client's figure (a spawn
mode slows both) and adds its own noise, ``--engine-noise`` (default 0.5%). The gate is judged on
the client's clock alone, as the plugin judges it: its cells are printed with the engine present
to show that nothing of the gate moves.

    nice -n 10 python benchmarks/engine_clock_aa.py [--runs 400]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from sign_claims import (  # noqa: E402
    HIGHER, SIGNS, SPREADS, TOLERANCE, Rate, _boot, gate_run, in_session_rules,
)

from pytest_kimiperf.judge.engine_clock import engine_change, where_change_lives, Where  # noqa: E402
from pytest_kimiperf.judge.profiles import compare_in_session  # noqa: E402


def profile_run_with_engine(rng: np.random.Generator, metrics: int, boots: int, engine_noise: float) -> tuple[bool, bool]:
    """One A/A session: whether any comparison states a sign on the client's clock alone, and
    whether any still does once the engine's rule has withdrawn what was not the profile's."""
    sd = math.log1p(SPREADS.boot)
    rules = in_session_rules(metrics)
    before = after = False
    for _ in range(metrics):
        levels_cur, levels_ref = rng.normal(0.0, sd, boots), rng.normal(0.0, sd, boots)
        cur = [_boot(x, "now") for x in levels_cur]
        ref = [_boot(x, "now") for x in levels_ref]
        c = compare_in_session(cur, ref, direction=HIGHER, tolerance=TOLERANCE, rules=rules)
        if c.verdict not in SIGNS:
            continue
        before = True
        engine = engine_change("engine_decode_tok_s",
                               [100.0 * math.exp(x + e) for x, e in zip(levels_cur, rng.normal(0.0, engine_noise, boots))],
                               [100.0 * math.exp(x + e) for x, e in zip(levels_ref, rng.normal(0.0, engine_noise, boots))])
        withdrawn = engine is not None and where_change_lives(c, engine) is Where.OUTSIDE
        after = after or not withdrawn
    return before, after


def main(argv: list[str] | None = None) -> int:
    """Print the A/A table with the engine's figures present."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=65)
    parser.add_argument("--engine-noise", type=float, default=0.005, help="a boot's own engine noise (log sd)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print(f"engine_clock_aa: {args.runs} runs a cell, seed {args.seed}; declared boot 1% (3 df), session 1%, "
          f"host 2% (10 df), tolerance 3%; engine noise {args.engine_noise:.1%} a boot beside the boot's level")
    print("design | metrics | client clock alone: any sign | with the engine's rule: any sign")
    for i, metrics in enumerate((10, 24)):
        for j, boots in enumerate((2, 3)):
            rng = np.random.default_rng(args.seed + 10 * i + j)
            runs = [profile_run_with_engine(rng, metrics, boots, args.engine_noise) for _ in range(args.runs)]
            print(f"profiles {boots} v {boots} | {metrics} | {Rate(sum(b for b, _ in runs), args.runs)} | "
                  f"{Rate(sum(a for _, a in runs), args.runs)}")
        rng = np.random.default_rng(args.seed + 10 * i + 5)
        gate = sum(any(c.verdict in SIGNS for _, c in gate_run(rng, metrics, 1.0)) for _ in range(args.runs))
        print(f"gate 3 boots vs 10 x 2 | {metrics} | {Rate(gate, args.runs)} | {Rate(gate, args.runs)} (the gate "
              "judges on the client's clock)")
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
