"""The verdict invariants (tests/unit/test_verdict_invariants.py), run longer and on fresh examples.

`make test` runs each property on a thousand examples, the same every run. This runs them on
``--examples`` each, under ``--seeds`` fresh Hypothesis seeds, and prints each property's
outcome: a counter-example found here is shrunk by Hypothesis and belongs in the test module
as a named regression test.

    nice -n 19 python benchmarks/verdict_invariants.py --examples 5000 --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="examples per property and seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="Hypothesis seeds, one run each")
    parser.add_argument("-k", default="", help="only the properties whose names match (pytest -k)")
    args = parser.parse_args(argv)
    env = dict(os.environ, KIMIPERF_HYPOTHESIS_EXAMPLES=str(args.examples), KIMIPERF_HYPOTHESIS_FRESH="1")
    failed = 0
    for seed in args.seeds:
        command = [sys.executable, "-m", "pytest", "tests/unit/test_verdict_invariants.py", "-q", "-p", "no:randomly",
                   "-p", "no:cacheprovider", f"--hypothesis-seed={seed}", "-k", args.k or "not regression"]
        print(f"seed {seed}: {' '.join(command[1:])}", flush=True)
        done = subprocess.run(command, cwd=ROOT, env=env, check=False)
        failed += done.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
