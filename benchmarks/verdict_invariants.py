"""The verdict invariants and the other statistical properties, run longer and on fresh examples.

The properties are the Hypothesis tests of tests/unit/test_verdict_invariants.py,
test_sequential.py and test_declared_spreads.py. `make test` runs each on 150 examples, the same
every run (derandomized), which keeps the suite's time in bounds. This runs every one of them on
``--examples`` each, under ``--seeds`` fresh Hypothesis seeds, and prints each property's outcome:
a counter-example found here is shrunk by Hypothesis and belongs in the test module as a named
regression test.

    nice -n 19 python benchmarks/verdict_invariants.py --examples 5000 --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Every module with Hypothesis properties; `-m hypothesis` (Hypothesis's pytest plugin marks each
# @given test) leaves out their plain tests and the named regression examples.
MODULES = ("tests/unit/test_verdict_invariants.py", "tests/unit/test_sequential.py",
           "tests/unit/test_declared_spreads.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="examples per property and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="Hypothesis seeds, one run each")
    parser.add_argument("-k", default="", help="only the properties whose names match (pytest -k)")
    args = parser.parse_args(argv)
    env = dict(os.environ, KIMIPERF_HYPOTHESIS_EXAMPLES=str(args.examples), KIMIPERF_HYPOTHESIS_FRESH="1")
    failed = 0
    for seed in args.seeds:
        command = [sys.executable, "-m", "pytest", *MODULES, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                   f"--hypothesis-seed={seed}", "-m", "hypothesis", *(["-k", args.k] if args.k else [])]
        print(f"seed {seed}: {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, cwd=ROOT, env=env, check=False)
        failed += done.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
