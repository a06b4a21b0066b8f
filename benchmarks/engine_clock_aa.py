"""The engine's clock beside the client's, measured (issues 65 and 72): how often an unchanged
build is told which way a metric moved once the engine's rule applies, and how many boots each
clock needs to resolve a 1% change.

**A/A.** Every simulated run is judged as benchmarks/sign_claims.py judges it (the plugin's own
``profiles.compare_in_session`` and ``history.compare_with_history`` under Kimi's declared rules:
boot 1% (3 df), session 1%, host 2% (10 df), tolerance 3%), and each profile comparison then goes
through the engine's rule exactly as the plugin applies it (``engine_clock.on_two_clocks``): the
boots' two clocks (the client's mean time per token and the engine's) set beside each other, and
the comparison's sign withdrawn where the profile reaches only the engine and the engine's own
figure (its boots' spread floored by ``ENGINE_SPREAD_FLOOR``) did not move the same way. Every
comparison is taken as such a profile (NCCL's variables alone): the rule applies to each one. A
boot's engine figure shares the boot's level with the client's (a spawn mode slows both) and adds
its own noise, ``--engine-noise`` (default 0.5%). The gate is judged on the client's clock alone,
as the plugin judges it (the engine's placement explains and never changes its verdict): its cells
are printed to show that nothing of the gate moves.

**Boots needed.** Simulated from the spreads, not measured on a GPU: the client's boot spread is
Kimi's declared 1% (true 1%); the engine's true spread is a quarter of it (the engine's interval
in ``make perf`` on the CPU engine was about a quarter of the client's: engine decode
-5.9..+6.4% against -20.4..+27.1%), held to the declared floor ``ENGINE_SPREAD_FLOOR`` as the
client's is held to its declaration. Each clock is judged by the same in-session rule
(``compare_in_session``, a session of 10 comparisons); a 1% change is *resolved* when the bounds
every sign needs (``bound_low``/``bound_high``, at the run's critical value) lie beyond zero the
change's way in at least 90% of runs: under a 3% tolerance the verdict then reads "within", but
the direction is known. The boots are a side; the run stops at ``--max-boots``.

    nice -n 10 python benchmarks/engine_clock_aa.py [--runs 400] [--tables aa,boots]
"""

from __future__ import annotations

import argparse
import dataclasses
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

from pytest_kimiperf.judge.stats import EngineBoot  # noqa: E402
from pytest_kimiperf.judge.engine_clock import ENGINE_SPREAD_FLOOR, on_two_clocks  # noqa: E402
from pytest_kimiperf.judge.profiles import compare_in_session  # noqa: E402

CLIENT_TPOT_MS = 10.0  # the boot's time per token at its level (100 tok/s)


def _two_clocks(levels: np.ndarray, engine_noise: np.ndarray) -> list[EngineBoot]:
    """Boots whose client and engine read the same level; the engine adds its own noise."""
    return [EngineBoot(engine_tpot_ms=CLIENT_TPOT_MS * math.exp(-x + e), client_tpot_ms=CLIENT_TPOT_MS * math.exp(-x))
            for x, e in zip(levels, engine_noise)]


def profile_run_with_engine(rng: np.random.Generator, metrics: int, boots: int, engine_noise: float) -> tuple[bool, bool]:
    """One A/A session: whether any comparison states a sign on the client's clock alone, and
    whether any still does once the engine's rule (the plugin's on_two_clocks) has run."""
    sd = math.log1p(SPREADS.boot)
    rules = in_session_rules(metrics)
    before = after = False
    for _ in range(metrics):
        levels_cur, levels_ref = rng.normal(0.0, sd, boots), rng.normal(0.0, sd, boots)
        c = compare_in_session([_boot(x, "now") for x in levels_cur], [_boot(x, "now") for x in levels_ref],
                               direction=HIGHER, tolerance=TOLERANCE, rules=rules)
        if c.verdict not in SIGNS:
            continue
        before = True
        judged = on_two_clocks("decode_tok_s", c, _two_clocks(levels_cur, rng.normal(0.0, engine_noise, boots)),
                               _two_clocks(levels_ref, rng.normal(0.0, engine_noise, boots)),
                               engine_only_profile=True)
        after = after or judged.verdict in SIGNS
    return before, after


def aa_table(runs: int, seed: int, engine_noise: float) -> None:
    print("design | metrics | client clock alone: any sign | with the engine's rule: any sign")
    for i, metrics in enumerate((10, 24)):
        for j, boots in enumerate((2, 3)):
            rng = np.random.default_rng(seed + 10 * i + j)
            done = [profile_run_with_engine(rng, metrics, boots, engine_noise) for _ in range(runs)]
            print(f"profiles {boots} v {boots} | {metrics} | {Rate(sum(b for b, _ in done), runs)} | "
                  f"{Rate(sum(a for _, a in done), runs)}")
        rng = np.random.default_rng(seed + 10 * i + 5)
        gate = sum(any(c.verdict in SIGNS for _, c in gate_run(rng, metrics, 1.0)) for _ in range(runs))
        print(f"gate 3 boots vs 10 x 2 | {metrics} | {Rate(gate, runs)} | {Rate(gate, runs)} (the gate "
              "judges on the client's clock)")


def _resolved(rng: np.random.Generator, boots: int, true_sd: float, declared: float, runs: int,
              change: float) -> int:
    """Runs of ``boots`` a side whose comparison states the sign of a ``change`` (log) the right way."""
    rules = dataclasses.replace(in_session_rules(10), boot_spread=declared)
    hits = 0
    for _ in range(runs):
        cur = [_boot(change + x, "now") for x in rng.normal(0.0, true_sd, boots)]
        ref = [_boot(x, "now") for x in rng.normal(0.0, true_sd, boots)]
        c = compare_in_session(cur, ref, direction=HIGHER, tolerance=TOLERANCE, rules=rules)
        # The bounds every sign needs (the run's budget), clear of zero the change's way: whether
        # the verdict then reads "within" a 3% tolerance or "changed" is the tolerance's business.
        hits += c.bound_high < 0 if change < 0 else c.bound_low > 0
    return hits


def boots_table(runs: int, seed: int, max_boots: int, power: float = 0.90) -> None:
    client_sd = math.log1p(SPREADS.boot)
    engine_true = client_sd / 4
    print(f"clock | true boot spread | declared (floor) | boots a side whose sign bounds clear zero for a -1% change in >= {power:.0%}")
    for k, (name, true_sd, declared) in enumerate((("client", client_sd, SPREADS.boot),
                                                   ("engine", engine_true, ENGINE_SPREAD_FLOOR))):
        rng = np.random.default_rng(seed + 100 + k)
        found, rate = None, Rate(0, runs)
        for boots in range(2, max_boots + 1):
            rate = Rate(_resolved(rng, boots, true_sd, declared, runs, math.log(0.99)), runs)
            if rate.hits >= power * runs:
                found = boots
                break
        said = f"{found} ({rate})" if found is not None else f"more than {max_boots} ({rate} at {max_boots})"
        print(f"{name} | {math.expm1(true_sd):.2%} | {declared:.2%} | {said}")


def main(argv: list[str] | None = None) -> int:
    """Print the A/A table with the engine's rule, and the boots each clock needs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=65)
    parser.add_argument("--engine-noise", type=float, default=0.005, help="a boot's own engine noise (log sd)")
    parser.add_argument("--tables", default="aa,boots")
    parser.add_argument("--max-boots", type=int, default=24)
    args = parser.parse_args(argv)
    tables = set(args.tables.split(","))
    started = time.perf_counter()
    print(f"engine_clock_aa: {args.runs} runs a cell, seed {args.seed}; declared boot 1% (3 df), session 1%, "
          f"host 2% (10 df), tolerance 3%; engine noise {args.engine_noise:.1%} a boot beside the boot's level; "
          f"engine spread floor {ENGINE_SPREAD_FLOOR:.1%}")
    if "aa" in tables:
        aa_table(args.runs, args.seed, args.engine_noise)
    if "boots" in tables:
        print()
        boots_table(args.runs, args.seed, args.max_boots)
    print(f"\n{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
