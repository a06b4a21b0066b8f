"""A corpus of real boots, and the noise levels it shows: request, boot, session, host.

The gate's promises must rest on real boots, not only on a simulation of them. This study boots
the identical server ``--boots`` times in one *session* (one run of this script: one spawn
history, one stretch of the host's day), measures on each boot exactly what the perf suite
gates (single-stream decode, TTFT, output throughput at 8, 32 and 64 streams), summarizes each
boot as the gate does (``judge.boots``), and appends one JSON line per boot to
``benchmarks/data/noise/<host>-<session>.jsonl``: the summaries, the session id, the host id
(machine id and kernel boot id: hosts of one family differ 2x under one fingerprint), the time,
the host canary (``measure.canary``, taken at the session's start and again at its end, so its
own noise is measured too), what else used the host (foreign CPU) and the variant measured.

Each developer session adds a session from its own machine: the machines differ, which gives
the host level for free. ``--analyze`` reads the whole corpus and prints the levels it finds,
with their 90% intervals (``noise_corpus.estimate_levels``, over the gate's own estimator).

Variants (``--variant``), for cutting the CPU engine's spread at its source:
  default       tiny-cpu as shipped
  pin-reserved  the API server's threads and this client on core 1 (the worker's OpenMP
                threads are bound to core 0 and core 1 is "reserved" by VLLM_CPU_OMP_THREADS_BIND)
  tcmalloc      LD_PRELOAD of libtcmalloc_minimal (vLLM warns that it is not preloaded)
  long-warmup   4x the warm-up requests of every scenario

Run (about 90 s a boot; it takes /tmp/kimiperf-engine.lock so it never measures beside another
server): ``python benchmarks/noise_study.py --boots 6 [--variant default]`` and
``python benchmarks/noise_study.py --analyze``.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from perf_tests.workloads import SINGLE_STREAM_DECODE, TTFT, throughput_at  # noqa: E402

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS  # noqa: E402
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES  # noqa: E402
from pytest_kimiperf.config.options import OPTIONS  # noqa: E402
from pytest_kimiperf.config.settings import RawOption, build_settings  # noqa: E402
from pytest_kimiperf.judge.stats import BootLedger  # noqa: E402
from noise_corpus import CorpusBoot, estimate_levels, level_text, load_corpus, request_cv_text  # noqa: E402
from pytest_kimiperf.judge.verdicts import MetricResult  # noqa: E402
from pytest_kimiperf.config.metric_specs import metric_spec  # noqa: E402
from pytest_kimiperf.reports.sentences import say_invalid  # noqa: E402
from pytest_kimiperf.measure.canary import host_canary, host_identity  # noqa: E402
from pytest_kimiperf.recorder import PerfCase, PerfRecorder, RecorderHooks  # noqa: E402
from pytest_kimiperf.server.manager import ServerManager  # noqa: E402

CORPUS = ROOT / "benchmarks" / "data" / "noise"
# The perf suite's tests and the metrics each gates (perf_tests/test_*.py).
CASES = (
    ("decode", SINGLE_STREAM_DECODE, ("decode_tok_s", "itl_ms", "tpot_ms", "p99_itl_ms")),
    ("ttft", TTFT, ("ttft_ms", "p90_ttft_ms")),
    *((f"throughput-{c}", throughput_at(c), ("output_throughput", "request_throughput")) for c in (8, 32, 64)),
)
VARIANTS = ("default", "pin-reserved", "tcmalloc", "long-warmup")
RESERVED_CORE = 1
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def _settings(deployment: str, env: dict[str, str], max_foreign_cpu: float):  # type: ignore[no-untyped-def]
    raw = {opt.name: RawOption(opt.default, "benchmark") for opt in OPTIONS}
    raw["deployment"] = RawOption(deployment, "benchmark")
    settings = build_settings(raw, rootpath=Path(tempfile.mkdtemp()))
    dep = dataclasses.replace(settings.deployment, env={**settings.deployment.env, **env},
                              host_bounds={**settings.deployment.host_bounds, "max_foreign_cpu_share": max_foreign_cpu})
    return dataclasses.replace(settings, deployment=dep)


def _threads(pid: int) -> Iterator[int]:
    try:
        yield from (int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return


def _pin_api_server(pid: int | None) -> str:
    """Every thread of the API server process onto the reserved core (its children, EngineCore
    and the worker, keep theirs: the worker binds its own OpenMP threads)."""
    if pid is None:
        return "no server pid"
    pinned = 0
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, {RESERVED_CORE})
            pinned += 1
        except OSError:
            continue
    return f"{pinned} API-server threads on core {RESERVED_CORE}"


def _git_commit() -> str | None:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or None


def _measure_boot(settings, log_dir: Path, boot: int, variant: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    manager = ServerManager(settings, log_dir=log_dir, state_dir=log_dir / "launches",
                            announce=lambda line: None, on_progress=lambda *a: None)
    metrics: dict[str, dict[str, object]] = {}
    notes: list[str] = []
    foreign: list[float] = []
    invalid: list[str] = []
    start = time.monotonic()
    try:
        handle = manager.acquire(BUILTIN_PROFILES["default"])
        boot_s = time.monotonic() - start
        if variant == "pin-reserved":
            # After the boot: a server launched from a pinned client would inherit the mask, and
            # the worker's OpenMP binding (VLLM_CPU_OMP_THREADS_BIND=auto) would see core 1 only.
            notes.append(_pin_api_server(handle.pid))
            os.sched_setaffinity(0, {RESERVED_CORE})
        for test, scenario, names in CASES:
            if variant == "long-warmup":
                scenario = dataclasses.replace(scenario, warmup_requests=4 * (scenario.warmup_requests or 1))
            run_of = SimpleNamespace(settings=settings, ledger=BootLedger, origin=lambda: None, baselines=lambda: None,
                                     family=lambda: None)
            recorder = PerfRecorder(run_of, PerfCase(nodeid=f"noise::{test}", test=test, server=handle, boot=boot),
                                    RecorderHooks(ensure_alive=manager.ensure_alive, publish=lambda result: None,
                                                  fail=lambda message: (_ for _ in ()).throw(RuntimeError(message))))
            run = recorder.measure(scenario)
            if (why := run.invalid or recorder.watched.busy) is not None:
                invalid.append(f"{test}: {say_invalid(why)}")
            foreign.extend(r.foreign_cpu_share for r in recorder.watched.readings)
            for name in names:
                spec = metric_spec(name)
                samples = [float(x) for x in run.samples(name)]
                summary = MetricResult(name, spec.unit, spec.direction.value, 0.1, samples).boot_summary()
                finite = [x for x in samples if math.isfinite(x) and x > 0]
                cv = statistics.pstdev(finite) / statistics.mean(finite) if len(finite) > 1 else None
                metrics[f"{test}|{name}"] = {**summary.to_json(), "cv": None if cv is None else round(cv, 5)}
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        manager.close()
    return {"boot_s": round(boot_s, 1), "metrics": metrics, "foreign_cpu": [round(f, 4) for f in foreign],
            "invalid": invalid, "notes": notes}


def record(args: argparse.Namespace) -> int:
    env: dict[str, str] = {}
    if args.variant == "tcmalloc":
        if not Path(TCMALLOC).exists():
            print(f"variant tcmalloc: {TCMALLOC} is missing (apt-get install libtcmalloc-minimal4)", file=sys.stderr)
            return 2
        env["LD_PRELOAD"] = TCMALLOC
    settings = _settings(args.deployment, env, args.max_foreign_cpu)
    session = uuid.uuid4().hex[:12]
    host = host_identity()
    CORPUS.mkdir(parents=True, exist_ok=True)
    out = CORPUS / f"{datetime.now(UTC):%Y%m%d}-{host['host'][:8]}-{session}.jsonl"
    with open("/tmp/kimiperf-engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        canary = host_canary()
        for index in range(args.boots):
            started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            t0 = time.monotonic()
            measured = _measure_boot(settings, Path(tempfile.mkdtemp(prefix=f"noise-{index}-")), index + 1, args.variant)
            line = {"schema": 1, "session": session, **host, "deployment": args.deployment, "variant": args.variant,
                    "env": env, "boot": index + 1, "started_at": started, "git_commit": _git_commit(),
                    "canary": canary.to_json(), **measured}
            with out.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, sort_keys=True) + "\n")
            decode = measured["metrics"].get("decode|decode_tok_s", {})  # type: ignore[union-attr]
            print(f"boot {index + 1}/{args.boots}: {time.monotonic() - t0:.0f}s, decode "
                  f"{decode.get('median', float('nan')):.4g} tok/s, foreign CPU max "
                  f"{max(measured['foreign_cpu'] or [0]):.0%}{'; INVALID ' + str(measured['invalid']) if measured['invalid'] else ''}",
                  flush=True)
        end_canary = host_canary()
    # The canary twice per session: its drift over a session is its own noise, as the gate sees it.
    with out.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"schema": 1, "session": session, **host, "canary_end": end_canary.to_json(),
                             "canary": canary.to_json()}, sort_keys=True) + "\n")
    print(f"appended {args.boots} boots to {out.relative_to(ROOT)}")
    return 0


def analyze(args: argparse.Namespace) -> int:
    boots: list[CorpusBoot] = load_corpus(sorted(CORPUS.glob("*.jsonl")), variant=args.variant,
                                          max_foreign_cpu=args.max_foreign_cpu)
    if not boots:
        print(f"no boots of variant {args.variant!r} in {CORPUS}")
        return 1
    sessions = {b.session for b in boots}
    hosts = {b.host for b in boots}
    print(f"corpus: {len(boots)} boots, {len(sessions)} sessions, {len(hosts)} hosts (variant {args.variant})")
    print(f"{'metric':<36}{'request CV':>11}  {'boot (in session)':<28}{'session':<28}{'host':<28}")
    report = {}
    for key in sorted({k for b in boots for k in b.metrics}):
        levels = estimate_levels([b for b in boots if key in b.metrics], key)
        report[key] = levels.to_json()
        print(f"{key:<36}{request_cv_text(levels):>11}  {level_text(levels.boot):<28}"
              f"{level_text(levels.session):<28}{level_text(levels.host):<28}")
    report["canary"] = canary_noise(sorted(CORPUS.glob("*.jsonl")))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0


def canary_noise(paths: list[Path]) -> dict[str, object]:
    """The canary's own noise: its drift from a session's start to its end, and its spread
    between sessions of one host (what judge/canary_check.CANARY_MOVED_LOG must stay clear of)."""
    drift: dict[str, list[float]] = {}
    starts: dict[tuple[str, str], list[float]] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            data = json.loads(line)
            if "canary_end" not in data:
                continue
            start, end = data["canary"]["scores"], data["canary_end"]["scores"]
            for probe in start.keys() & end.keys():
                drift.setdefault(probe, []).append(abs(math.log(end[probe] / start[probe])))
                starts.setdefault((probe, data["host"]), []).append(math.log(start[probe]))
    out: dict[str, object] = {}
    for probe, values in sorted(drift.items()):
        between = [statistics.stdev(v) for (p, _), v in starts.items() if p == probe and len(v) >= 2]
        out[probe] = {"sessions": len(values), "max_drift_in_session": max(values),
                      "sd_between_sessions": max(between) if between else None}
        print(f"canary {probe}: {len(values)} sessions; start-to-end drift up to {math.expm1(max(values)) * 100:.1f}%"
              + (f"; SD between sessions of one host {math.expm1(max(between)) * 100:.1f}%" if between else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=6)
    parser.add_argument("--deployment", default="tiny-cpu", choices=sorted(BUILTIN_DEPLOYMENTS))
    parser.add_argument("--variant", default="default", choices=VARIANTS)
    parser.add_argument("--analyze", action="store_true", help="print the levels of the corpus; boots nothing")
    parser.add_argument("--max-foreign-cpu", type=float, default=0.10,
                        help="the host watch's bound while recording (a boot measured beside more foreign CPU "
                             "is INVALID and measured again), and --analyze's: boots beside more are left out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.boots < 2 and not args.analyze:
        parser.error(f"--boots {args.boots}: a session needs at least 2 boots to show its within-session spread")
    return analyze(args) if args.analyze else record(args)


if __name__ == "__main__":
    raise SystemExit(main())
