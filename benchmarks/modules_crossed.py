"""How many of the package's modules one perf test runs through, counted by tracing, not by reading.

One perf test (``perf.measure`` of a single-stream scenario, then ``perf.check`` of decode and ITL
with the floor, against a recorded baseline) runs on the stub server in a fresh pytest process.
A profile hook (``sys.setprofile``) records every ``pytest_kimiperf`` module whose code is called
from the start of the test's call phase through session finish and the terminal summary: the
path a result takes from the measurement to the answer on the screen. The server's boot (the
fixture's setup), collection and the header are left out: they are the same for any test.

    python benchmarks/modules_crossed.py            # the count and the modules, by package
    python benchmarks/modules_crossed.py --json     # the same as JSON

Lazy imports count once they run; a module only imported (its constants read) but none of whose
functions is called does not count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import stub_deployment_toml  # noqa: E402 - after the root is on the path

TRACER = '''
import json, os, sys, threading
import pytest

SEEN = set()
PACKAGE = "pytest_kimiperf"


def _profile(frame, event, arg):
    if event == "call":
        name = frame.f_globals.get("__name__", "")
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            SEEN.add(name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    sys.setprofile(_profile)
    threading.setprofile(_profile)  # the host watch and the client's threads
    return (yield)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    sys.setprofile(None)
    with open(os.environ["KIMIPERF_MODULES_OUT"], "w") as out:
        json.dump(sorted(SEEN), out)
'''

PERF_TEST = '''
from pytest_kimiperf import SingleStream


def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=32, output_tokens=16, requests=6, warmup_requests=1))
    perf.check(run, ["decode_tok_s", "itl_ms"], floor=True)
'''


def _run(project: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KIMIPERF_MODULES_OUT": str(out), "KIMIPERF_STATE_DIR": str(project / "state"),
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tracer",
                           "test_perf.py", "--kimiperf-deployment", "stub", *args],
                          cwd=project, env={**env, "PYTHONPATH": f"{project}{os.pathsep}{ROOT}"},
                          capture_output=True, text=True, timeout=600)


def crossed() -> list[str]:
    """The modules one perf test runs through, from its call to the terminal summary."""
    with tempfile.TemporaryDirectory(prefix="kimiperf-modules-") as tmp:
        project = Path(tmp)
        (project / "pyproject.toml").write_text(stub_deployment_toml())
        (project / "tracer.py").write_text(TRACER)
        (project / "test_perf.py").write_text(PERF_TEST)
        out = project / "modules.json"
        # First record a baseline, so the measured run is judged against one as a gate would be.
        recorded = _run(project, out, "--kimiperf-update-baselines")
        if recorded.returncode != 0:
            raise SystemExit(f"recording the baseline failed:\n{recorded.stdout[-3000:]}{recorded.stderr[-2000:]}")
        run = _run(project, out)
        if run.returncode != 0:
            raise SystemExit(f"the perf test failed:\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
        return list(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the modules as JSON")
    args = parser.parse_args()
    modules = crossed()
    if args.json:
        print(json.dumps({"count": len(modules), "modules": modules}, indent=1))
        return
    by_package: dict[str, list[str]] = {}
    for name in modules:
        parts = name.split(".")
        by_package.setdefault(parts[1] if len(parts) > 2 else "(top)", []).append(parts[-1])
    print(f"{len(modules)} modules from perf.measure to the terminal summary")
    for package, names in sorted(by_package.items()):
        print(f"  {package} ({len(names)}): {', '.join(names)}")


if __name__ == "__main__":
    main()
