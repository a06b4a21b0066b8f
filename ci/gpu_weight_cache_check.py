"""The weight cache on a real GPU: what the CPU tests can only check with a stand-in daemon.

On one CUDA GPU, through the plugin's own server manager: the tiny model at TP=1, its
`vllm preload` daemon started once, then two engine boots with different NCCL profiles
(default, ring-ll), both with --load-format ipc_cache. Prints each boot's account and the second
boot's weight phase; fails unless both engines mapped their weights from the daemon and nothing
of the daemon or engines is left running. Run by ci/gpu-weight-cache-check.sh, which says how.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_kimiperf.config.options import script_settings  # noqa: E402
from pytest_kimiperf.server.manager import ServerManager  # noqa: E402
from pytest_kimiperf.server.zombies import load_launches, processes_of  # noqa: E402

# The engine: CUDA vLLM 0.32 by default; the tests put a stand-in `vllm` (serve: the stub
# engine, preload: the stub daemons) here to run this script to its end on the simulated GPU.
VLLM = os.environ.get("WEIGHT_CACHE_VLLM", "")


def deployment_table() -> dict[str, object]:
    """The tiny model on one CUDA GPU, its weights served by the daemons (weight_cache = auto)."""
    vllm = VLLM.split() if VLLM else ["{python}", "-m", "vllm.entrypoints.cli.main"]
    return {
        "extends": "tiny-cpu", "description": "the tiny model on one CUDA GPU", "gpu_count": 1,
        "command": [*vllm, "serve", "{model}", "--served-model-name", "{served_model_name}", "--host", "{host}",
                    "--port", "{port}", "--tensor-parallel-size", "{tp}", "--max-model-len", "2048",
                    "--dtype", "bfloat16", "--gpu-memory-utilization", "0.5"],
        "env": {"HF_HUB_OFFLINE": "1"},
        "health_deadline_s": float(os.environ.get("WEIGHT_CACHE_BOOT_DEADLINE_S", "900")),
        "weight_cache": "auto",
    }


def main(out: Path) -> int:
    """Boot both profiles from one daemon and judge what their boots say; the exit status."""
    settings = script_settings("tiny-gpu-wc", rootpath=ROOT, profiles="default,ring-ll",
                               source="ci/gpu-weight-cache-check.sh", grace="30",
                               extra_deployments={"tiny-gpu-wc": deployment_table()})
    state = os.environ.get("KIMIPERF_STATE_DIR") or tempfile.mkdtemp(prefix="kimiperf-wc-state-")
    manager = ServerManager(settings, log_dir=out, state_dir=Path(state), announce=print, on_progress=lambda *a: None)

    def on_term(signum: int, _frame: FrameType | None) -> None:
        # The manager absorbs a signal during a stop; otherwise leave through the finally below.
        if not manager.on_signal():
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    launches: set[str] = set()  # every launch of this run, daemons and engines: none may outlive it
    try:
        for profile in settings.profiles:
            manager.acquire(profile)
            launches |= {record.launch_id for record in load_launches(state).records}
            manager.release()
    finally:
        manager.close()

    plan = manager.weight_cache
    accounts = [manager.records[p.name].accounts[0] for p in settings.profiles]
    for account in accounts:
        print(account.summary())
        print("  phases:", ", ".join(f"{p.phase} {p.seconds:.0f} s" for p in account.phases))
        print("  environments:", {k: sorted(v) for k, v in account.environments.items()})
    problems = []
    if plan is None or not plan.enabled:
        problems.append(f"the weight cache was not used: {plan.fallback_reason if plan else 'no plan was made'}")
    problems += [f"boot of {a.profile} loaded its weights from {a.weights_source}, not the weight cache"
                 for a in accounts if a.weights_source != "weight cache"]
    left = [p for launch in sorted(launches) for p in processes_of(launch, uid=os.getuid(), trusted_pgid=None)]
    problems += [f"left running: pid {p.pid} ({' '.join(p.cmdline())[:120]})" for p in left]
    second = accounts[1]
    print(f"second boot ({second.profile}): weight phase {second.phase_s('loading weights') or 0:.1f} s "
          f"of {second.total_s:.0f} s")
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        return 1
    print("OK: both engines mapped their weights from the daemon; nothing left running")
    return 0


if __name__ == "__main__":
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "weight-cache-check")
    directory.mkdir(parents=True, exist_ok=True)
    sys.exit(main(directory.resolve()))
