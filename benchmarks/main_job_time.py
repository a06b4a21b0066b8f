"""What the main job (`make perf`) takes, commit against commit, on this host in one session.

Each commit named is cloned afresh and runs `make perf` with this checkout's virtualenv
(``VENV``; the clone's own package is the one imported: ``python -m pytest`` puts the clone first
on the path), alternating A B A B when ``--rounds`` is above 1. Printed per run: the pytest
session's seconds (its "passed ... in N s" line), the wall clock of the make, and, where the
commit writes one, the JSON report's time account (boots, measuring, measured again, the rest).

    python benchmarks/main_job_time.py 0b2ea79 HEAD            # one run each
    python benchmarks/main_job_time.py 0b2ea79 HEAD --rounds 2

Boots a real engine on both cores: run it alone on the machine, as every engine benchmark here
(it takes /tmp/kimiperf-engine.lock). A figure from a busy host says so in its notes.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PYTEST_LINE = re.compile(r"in (\d+(?:\.\d+)?)s(?: \(\d+:\d\d:\d\d\))? =+\s*$", re.MULTILINE)


def run_once(rev: str, venv: Path, work: Path) -> dict[str, object]:
    """One fresh clone of ``rev`` and its `make perf`: seconds and the time account."""
    clone = work / f"clone-{rev}-{time.monotonic_ns()}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", rev], check=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.monotonic()
    # -o: the shared virtualenv is not set up again from the clone (that would reinstall the package from it).
    done = subprocess.run(["make", "perf", f"VENV={venv}", "-o", str(venv / ".kimiperf-setup")], cwd=clone, env=env,
                          capture_output=True, text=True)
    wall = time.monotonic() - start
    found = _PYTEST_LINE.findall(done.stdout)
    report = clone / "perf-results" / "report.json"
    account = json.loads(report.read_text()).get("time_account") if report.exists() else None
    (work / f"{rev}-{len(list(work.glob(f'{rev}-*.txt')))}.txt").write_text(done.stdout + done.stderr)
    return {"rev": rev, "exit": done.returncode, "make_s": round(wall, 1),
            "pytest_s": float(found[-1]) if found else None, "time_account": account}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revs", nargs="+", help="commits to run, in this order each round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument("--keep", type=Path, default=None, help="folder for the clones and their output")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: use 1 or more")
    work = args.keep or Path(tempfile.mkdtemp(prefix="main-job-time-"))
    work.mkdir(parents=True, exist_ok=True)
    with open("/tmp/kimiperf-engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(args.rounds):
            for rev in args.revs:
                result = run_once(rev, args.venv.resolve(), work)
                print(json.dumps(result), flush=True)
    print(f"clones and their output: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
