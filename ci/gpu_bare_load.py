"""The GPU work the bare check (ci/gpu_bare_check.py) measures the plugin against, one program a
mode, each run as its own process so its CUDA context goes with it:

  hold --mib N                 hold N MiB on the first visible GPU, print "ready <pid>", sleep
  window --phase-s S           idle, bf16 GEMM, HBM copy, decode-like GEMV, idle: S seconds each,
                               one JSON line at each phase's start and end (the parent watches)
  nccl                         a one-rank all-reduce through torch.distributed's NCCL backend
  ipc                          a CUDA tensor shared with a second process (CUDA IPC, what the
                               weight cache rests on): the child's sum against the parent's
  serve --mib N -- ARGV...     start a `hold` child, then exec ARGV (a stand-in server whose
                               process group holds GPU memory, as vLLM's workers do)

Needs torch with CUDA; exits 3 with one line saying so where there is none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        print("no torch here", flush=True)
        sys.exit(3)
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device", flush=True)
        sys.exit(3)
    return torch


def hold(mib: int) -> None:
    """Hold ``mib`` MiB on the first visible GPU until killed."""
    torch = _torch()
    block = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    print(f"ready {os.getpid()}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


def _run_for(seconds: float, step: Callable[[], None], torch: Any) -> int:
    """Repeat ``step`` for ``seconds`` of wall time (synchronised every 20 steps); the count."""
    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for _ in range(20):
            step()
        count += 20
        torch.cuda.synchronize()
    return count


def window(phase_s: float) -> None:
    """The load window: each phase's start and end as a JSON line on stdout, with its rate."""
    torch = _torch()
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda:0")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda:0")
    v = torch.randn(n, 1, dtype=torch.bfloat16, device="cuda:0")
    src = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty_like(src)
    torch.cuda.synchronize()

    def say(phase: str, event: str, **extra: object) -> None:
        print(json.dumps({"phase": phase, "event": event, "t": time.time(), **extra}), flush=True)

    phases: Sequence[tuple[str, Callable[[], None] | None, float]] = (
        ("idle_before", None, 0.0),
        ("gemm_bf16", lambda: torch.mm(a, b), 2.0 * n**3),  # FLOP a step
        ("hbm_copy", lambda: dst.copy_(src), 2.0 * src.numel()),  # bytes read + written a step
        ("gemv_decode", lambda: torch.mm(a, v), 2.0 * n * n),  # the weights read once a step: bytes
        ("idle_after", None, 0.0),
    )
    for name, step, work in phases:
        say(name, "start")
        started = time.monotonic()
        if step is None:
            time.sleep(phase_s)
            say(name, "end")
            continue
        count = _run_for(phase_s, step, torch)
        rate = count * work / (time.monotonic() - started)
        say(name, "end", rate=rate, unit="FLOP/s" if name == "gemm_bf16" else "B/s")


def nccl() -> None:
    """One rank, one all-reduce: enough for NCCL to read its environment and write its debug file."""
    torch = _torch()
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as rendezvous:
        dist.init_process_group("nccl", init_method=f"file://{rendezvous}/store", rank=0, world_size=1)
        try:
            tensor = torch.ones(1 << 20, device="cuda:0")
            dist.all_reduce(tensor)
            torch.cuda.synchronize()
            print(json.dumps({"sum": float(tensor.sum().item()), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}),
                  flush=True)
        finally:
            dist.destroy_process_group()


def _ipc_child(queue: Any, answer: Any) -> None:
    tensor = queue.get()  # rebuilt from the parent's CUDA IPC handle, no copy
    answer.put(float(tensor.sum().item()))


def ipc() -> None:
    """Share a CUDA tensor with a second process through torch.multiprocessing (CUDA IPC)."""
    torch = _torch()
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    queue, answer = context.Queue(), context.Queue()
    tensor = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    child = context.Process(target=_ipc_child, args=(queue, answer))
    child.start()
    queue.put(tensor)
    got = answer.get(timeout=60)
    child.join(timeout=30)
    print(json.dumps({"parent_sum": float(tensor.sum().item()), "child_sum": got, "child_exit": child.exitcode}),
          flush=True)


def serve(mib: int, argv: Sequence[str]) -> None:
    """Start a holder in this process group, wait until it holds its memory, then become ARGV."""
    holder = subprocess.Popen([sys.executable, __file__, "hold", "--mib", str(mib)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if not line.startswith("ready"):
        print(f"the GPU memory holder did not start: {line.strip() or 'no output'}", flush=True)
        sys.exit(3)
    os.execv(argv[0], list(argv))


def main(args: Sequence[str]) -> None:
    """Run one mode (see the module docstring)."""
    mode, rest = args[0], list(args[1:])
    if mode == "hold":
        hold(int(rest[rest.index("--mib") + 1]))
    elif mode == "window":
        window(float(rest[rest.index("--phase-s") + 1]))
    elif mode == "nccl":
        nccl()
    elif mode == "ipc":
        ipc()
    elif mode == "serve":
        serve(int(rest[rest.index("--mib") + 1]), rest[rest.index("--") + 1 :])
    else:
        raise SystemExit(f"unknown mode {mode!r}: use hold, window, nccl, ipc or serve")


if __name__ == "__main__":
    main(sys.argv[1:])
