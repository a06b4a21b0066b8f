"""How noisy is the tiny-cpu deployment? Measured, so its tolerances are not guessed.

Boots the real tiny-cpu server ``--boots`` times in a row (one at a time) and runs the perf
suite's single-stream decode and TTFT scenarios on each. Reports, per metric:

* within-boot noise: the coefficient of variation of per-request samples inside one boot;
* between-boot noise: the spread of the per-boot medians (what a baseline recorded on one boot
  and compared on the next one sees even when nothing changed);
* what the gate says comparing every later boot with the first (the false-alarm check).

Run: ``python benchmarks/cpu_noise.py --boots 4 [--json out.json]`` (about a minute per boot).
It takes /tmp/kimiperf-vllm.lock so that it never measures next to another server.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf_tests"))

from scenarios import SINGLE_STREAM_DECODE, TTFT  # noqa: E402  (the perf suite's own workloads)

from pytest_kimiperf.deployments import BUILTIN_DEPLOYMENTS  # noqa: E402
from pytest_kimiperf.metric_specs import METRICS  # noqa: E402
from pytest_kimiperf.nccl import BUILTIN_PROFILES  # noqa: E402
from pytest_kimiperf.recorder import PerfRecorder  # noqa: E402
from pytest_kimiperf.server_manager import ServerManager  # noqa: E402
from pytest_kimiperf.settings import RawOption, build_settings  # noqa: E402
from pytest_kimiperf.stats import compare  # noqa: E402

CASES = (("decode", SINGLE_STREAM_DECODE, ("decode_tok_s", "itl_ms")), ("ttft", TTFT, ("ttft_ms",)))


def _settings(deployment: str):  # type: ignore[no-untyped-def]
    raw = {
        "deployment": RawOption(deployment, "benchmark"), "nccl_profiles": RawOption("default", "benchmark"),
        "nccl_debug": RawOption(False, "benchmark"), "server_url": RawOption(None, "benchmark"),
        "api_key": RawOption(None, "benchmark"), "port": RawOption(None, "benchmark"),
        "update_baselines": RawOption(False, "benchmark"), "baselines_dir": RawOption(None, "benchmark"),
        "perf_strict": RawOption(False, "benchmark"), "perf_json": RawOption(None, "benchmark"),
        "perf_markdown": RawOption(None, "benchmark"), "perf_plots": RawOption(None, "benchmark"),
        "progress_interval": RawOption("30", "benchmark"), "grace": RawOption("30", "benchmark"),
    }
    return build_settings(raw, rootpath=Path(tempfile.mkdtemp()))


def _measure_boot(settings, log_dir: Path) -> dict[str, dict[str, list[float]]]:  # type: ignore[no-untyped-def]
    manager = ServerManager(settings, log_dir=log_dir, state_dir=log_dir / "launches",
                            say=lambda line: None, on_progress=lambda *a: None)
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        handle = manager.acquire(BUILTIN_PROFILES["default"])
        recorder = PerfRecorder(
            nodeid="bench", test="bench", server=handle, settings=settings, profile_env={}, view=None,
            ensure_alive=manager.ensure_alive, publish=lambda result: None,
            fail=lambda message: (_ for _ in ()).throw(RuntimeError(message)),
        )
        for name, scenario, metrics in CASES:
            run = recorder.measure(scenario)
            samples[name] = {m: [float(x) for x in run.samples(m)] for m in metrics}
            samples[name]["_invalid"] = [] if run.valid else [run.invalid_reason]  # type: ignore[list-item]
    finally:
        manager.close()
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=4)
    parser.add_argument("--deployment", default="tiny-cpu", choices=sorted(BUILTIN_DEPLOYMENTS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings = _settings(args.deployment)
    boots = []
    with open("/tmp/kimiperf-vllm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for index in range(args.boots):
            start = time.monotonic()
            boots.append(_measure_boot(settings, Path(tempfile.mkdtemp(prefix=f"cpu-noise-{index}-"))))
            print(f"boot {index + 1}/{args.boots} measured in {time.monotonic() - start:.0f}s", flush=True)

    report: dict[str, object] = {"deployment": args.deployment, "boots": args.boots, "metrics": {}}
    print(f"\n{'metric':<14}{'within-boot CV (median)':>24}{'boot medians':>40}{'spread':>9}  gate vs boot 1")
    for name, _, metrics in CASES:
        for metric in metrics:
            per_boot = [b[name][metric] for b in boots]
            medians = [statistics.median(s) for s in per_boot if s]
            cvs = [statistics.pstdev(s) / statistics.mean(s) for s in per_boot if len(s) > 1]
            spread = (max(medians) - min(medians)) / statistics.median(medians) if medians else float("nan")
            spec = METRICS[metric]
            tolerance = BUILTIN_DEPLOYMENTS[args.deployment].tolerance(metric)
            comparisons = [
                compare(later, per_boot[0], direction=spec.direction, tolerance=tolerance, metric=metric)
                for later in per_boot[1:]
            ]
            verdicts = [c.verdict.value for c in comparisons]
            invalid = [b[name]["_invalid"] for b in boots if b[name]["_invalid"]]
            print(f"{metric:<14}{statistics.median(cvs) * 100:>23.1f}%"
                  f"{' '.join(f'{m:.4g}' for m in medians):>40}{spread * 100:>8.1f}%  {', '.join(verdicts)}"
                  + (f"  ({len(invalid)} invalid runs)" if invalid else ""))
            report["metrics"][metric] = {  # type: ignore[index]
                "within_boot_cv": cvs, "boot_medians": medians, "spread": spread,
                "tolerance": tolerance, "verdicts_vs_first_boot": verdicts, "invalid": invalid,
                "comparisons_vs_first_boot": [c.message() for c in comparisons], "samples": per_boot,
            }
    print()
    for metric, data in report["metrics"].items():  # type: ignore[union-attr]
        for line in data["comparisons_vs_first_boot"]:
            print(f"  {line}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
