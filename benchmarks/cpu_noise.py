"""How noisy is the tiny-cpu deployment? Measured, so its tolerances are not guessed.

Boots the real tiny-cpu server ``--boots`` times in a row (one at a time) and runs the perf
suite's single-stream decode and TTFT scenarios on each. Reports, per metric:

* within-boot noise: the coefficient of variation of per-request samples inside one boot;
* between-boot noise: the spread of the per-boot medians (what a baseline recorded on one boot
  and compared on the next one sees even when nothing changed);
* what the gate says of each boot against the others as its history (the false-alarm check:
  on the identical server every verdict should be non-directional).

``--env NAME=VALUE`` adds server environment (thread binding, LD_PRELOAD of an allocator) to
measure what cuts the spread at its source.

Run: ``python benchmarks/cpu_noise.py --boots 4 [--json out.json]`` (about a minute per boot).
It takes /tmp/kimiperf-engine.lock so that it never measures next to another server, and the
host watch reports (and invalidates) boots measured beside other work.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import math
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf_tests.workloads import SINGLE_STREAM_DECODE, TTFT  # noqa: E402  (the perf suite's own)

from pytest_kimiperf.judge.boots import BootLedger  # noqa: E402
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS  # noqa: E402
from pytest_kimiperf.config.metric_specs import METRICS  # noqa: E402
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES  # noqa: E402
from pytest_kimiperf.config.options import OPTIONS  # noqa: E402
from pytest_kimiperf.recorder import PerfRecorder  # noqa: E402
from pytest_kimiperf.server.manager import ServerManager  # noqa: E402
from pytest_kimiperf.config.settings import RawOption, build_settings  # noqa: E402
from pytest_kimiperf.judge.boot_summary import summarize_boot  # noqa: E402
from pytest_kimiperf.judge.stats import compare_boots  # noqa: E402

CASES = (("decode", SINGLE_STREAM_DECODE, ("decode_tok_s", "itl_ms")), ("ttft", TTFT, ("ttft_ms",)))


def _settings(deployment: str, env: dict[str, str]):  # type: ignore[no-untyped-def]
    raw = {opt.name: RawOption(opt.default, "benchmark") for opt in OPTIONS}
    raw["deployment"] = RawOption(deployment, "benchmark")
    settings = build_settings(raw, rootpath=Path(tempfile.mkdtemp()))
    if env:
        dep = dataclasses.replace(settings.deployment, env={**settings.deployment.env, **env})
        settings = dataclasses.replace(settings, deployment=dep)
    return settings


def _measure_boot(settings, log_dir: Path, boot: int) -> dict[str, dict[str, list[float]]]:  # type: ignore[no-untyped-def]
    manager = ServerManager(settings, log_dir=log_dir, state_dir=log_dir / "launches",
                            say=lambda line: None, on_progress=lambda *a: None)
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        handle = manager.acquire(BUILTIN_PROFILES["default"])
        recorder = PerfRecorder(
            nodeid="bench", test="bench", server=handle, settings=settings, profile_env={}, view=None,
            ensure_alive=manager.ensure_alive, publish=lambda result: None,
            fail=lambda message: (_ for _ in ()).throw(RuntimeError(message)), boot=boot, ledger=BootLedger(),
        )
        for name, scenario, metrics in CASES:
            run = recorder.measure(scenario)
            samples[name] = {m: [float(x) for x in run.samples(m)] for m in metrics}
            invalid = run.invalid_reason if not run.valid else recorder.host_busy
            samples[name]["_invalid"] = [invalid] if invalid else []  # type: ignore[list-item]
            reading = recorder.host_readings[-1] if recorder.host_readings else None
            samples[name]["_foreign_cpu"] = [reading.foreign_cpu_share] if reading else []
    finally:
        manager.close()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=4)
    parser.add_argument("--deployment", default="tiny-cpu", choices=sorted(BUILTIN_DEPLOYMENTS))
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra server environment, e.g. VLLM_CPU_OMP_THREADS_BIND=0 (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--env {item!r}: use NAME=VALUE")
        env[name] = value
    settings = _settings(args.deployment, env)
    boots = []
    with open("/tmp/kimiperf-engine.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for index in range(args.boots):
            start = time.monotonic()
            boots.append(_measure_boot(settings, Path(tempfile.mkdtemp(prefix=f"cpu-noise-{index}-")), index + 1))
            print(f"boot {index + 1}/{args.boots} measured in {time.monotonic() - start:.0f}s", flush=True)

    report: dict[str, object] = {"deployment": args.deployment, "boots": args.boots, "env": env, "metrics": {}}
    print(f"\n{'metric':<14}{'within-boot CV':>15}{'boot medians':>40}{'boot SD':>9}  each boot vs the others")
    for name, _, metrics in CASES:
        for metric in metrics:
            per_boot = [b[name][metric] for b in boots]
            summaries = [summarize_boot(s, f"boot {i + 1}") for i, s in enumerate(per_boot)]
            medians = [b.median for b in summaries if b.n]
            logs = [math.log(m) for m in medians]
            sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
            cvs = [statistics.pstdev(s) / statistics.mean(s) for s in per_boot if len(s) > 1]
            spec = METRICS[metric]
            dep = BUILTIN_DEPLOYMENTS[args.deployment]
            # Leave one out: each boot against the others as its history, as the gate would.
            comparisons = [
                compare_boots([summaries[i]], summaries[:i] + summaries[i + 1:], direction=spec.direction,
                              tolerance=dep.tolerance(metric), prior_spread=dep.boot_spread, metric=metric)
                for i in range(len(summaries))
            ] if len(summaries) > 1 else []
            verdicts = [c.verdict.value for c in comparisons]
            invalid = [b[name]["_invalid"] for b in boots if b[name]["_invalid"]]
            print(f"{metric:<14}{statistics.median(cvs) * 100:>14.1f}%"
                  f"{' '.join(f'{m:.4g}' for m in medians):>40}{math.expm1(sd) * 100:>8.1f}%  {', '.join(verdicts)}"
                  + (f"  ({len(invalid)} invalid runs)" if invalid else ""))
            report["metrics"][metric] = {  # type: ignore[index]
                "within_boot_cv": cvs, "boot_medians": medians, "boot_sd_log": sd,
                "verdicts_leave_one_out": verdicts, "invalid": invalid,
                "foreign_cpu_share": [b[name]["_foreign_cpu"] for b in boots],
                "comparisons_leave_one_out": [c.message() for c in comparisons], "samples": per_boot,
            }
    print()
    for metric, data in report["metrics"].items():  # type: ignore[union-attr]
        for line in data["comparisons_leave_one_out"]:
            print(f"  {line}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
