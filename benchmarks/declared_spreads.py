"""Declared spreads held at their degrees of freedom: the gate when the truth is twice the declaration.

Issue 46, item 6. A deployment declares the boot, session and host spreads; before, the gate took
the session and host declarations as exact (infinite df) and its directional rule as a normal
critical value, so a session effect twice the declared one failed 5.7-26% of unchanged sessions
(benchmarks/README.md). Now each declaration is a prior worth its ``*_spread_df`` degrees of
freedom, pooled with what the history measures, and the critical value is Student's t at the
difference's effective df (judge/noise.py, judge/stats.py).

Each cell is gate_power.py's session (2 profiles x 12 gated metrics, 2 planned boots a run and a
third on demand, tolerance 3%) against the history shapes of issue 46's detection target
(1 session x 5 boots, 3 x 2, 10 x 1), with the spreads declared 1% (boot) and 1% (session) and the
truth: as declared; the session spread twice the declaration; both twice. Seeded: the same
arguments print the same table, on this checkout or another (run it with ``PYTHONPATH`` at an
older checkout for the rule before; ``--df`` is then left out)::

    nice -n 19 python benchmarks/declared_spreads.py --trials 200
    nice -n 19 python benchmarks/declared_spreads.py --trials 200 --df inf      # every declaration exact
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_power import Noise, GateRules, print_table, run_cell  # noqa: E402

from pytest_kimiperf.config.deployments import Spreads  # noqa: E402

SHAPES = ((1, 5), (3, 2), (10, 1))
TRUTHS = (("declared right (boot 1%, session 1%)", 0.01, 0.01),
          ("session 2% (declared 1%)", 0.01, 0.02),
          ("boot 2%, session 2% (both declared 1%)", 0.02, 0.02))


def cells() -> list[Noise]:
    """Every truth against every history shape."""
    return [Noise(boot, 0.02, 0.005, session_sd=session, history_sessions=k, history_boots=k * n,
                  label=f"{name}; {k} x {n}") for name, boot, session in TRUTHS for k, n in SHAPES]


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write it as JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="sessions per cell (default 200)")
    parser.add_argument("--df", type=float, default=None,
                        help="every declaration's degrees of freedom (default: the deployment defaults; "
                             "inf: exact); leave out on a checkout before declared df")
    parser.add_argument("--seed", type=int, default=4600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    spreads = Spreads(0.01, 0.01, 0.02)
    if args.df is not None:
        spreads = replace(spreads, boot_df=args.df, session_df=args.df, host_df=args.df)
    rules = GateRules(0.03, spreads, 3, boots=2)
    started = time.monotonic()
    table = [run_cell(noise, trials=args.trials, history_boots=10, rules=rules, seed=args.seed + i)
             for i, noise in enumerate(cells())]
    said = "defaults" if args.df is None else f"{args.df:g}"
    print_table(f"declared spreads boot 1% / session 1% (df: {said}); tolerance 3%, 2 planned boots a run "
                f"(up to 3), {args.trials} sessions a cell", table)
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in table], indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
