"""The host's own speed, measured by a short fixed piece of work: the canary beside every boot.

Two machines of one family ran the tiny-cpu server 2x apart under one fingerprint (same CPU
model string, same core count), and a baseline recorded on one would convict the other. The
fingerprint cannot see that; a fixed workload timed on the host can. :func:`cpu_canary` times a
fixed interpreter loop (one core's compute, as vLLM's Python processes see it) and a fixed copy of a buffer larger than the caches
(memory) a few times each and keeps the best round of each (a neighbour only slows fixed work),
plus the spread of its faster rounds (its noise, so a comparison knows what "moved" means). On a GPU host with torch and CUDA,
:func:`gpu_canary` adds a fixed device-to-device copy, and the GPUs' lowest power limit
(:func:`_gpu_power_limit`) is a probe too. Taken once per session before the first
boot, stored with the session's boots in the baseline history (judge/noise.py compares them).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kimiperf.errors import KimiperfError

# Both probes are single-threaded: a probe that spreads over every core (a BLAS product) reads
# whatever a neighbour leaves of the other cores, not the host's speed (seen here: 15-37 GFLOP/s
# for one host within a minute). 300k loop iterations take ~30 ms, a 64 MiB copy (above L3 size)
# ~5 ms a pass; the whole canary costs well under a second on these hosts.
_PYTHON_LOOP = 300_000
_COPY_MIB = 64
_COPY_REPEATS = 5
ROUNDS = 9


@dataclass(frozen=True)
class Canary:
    """The host's speed on fixed work: ``scores`` maps a probe (``python_mops``, ``copy_gbs``,
    ``gpu_copy_gbs``) to its best round, higher is faster; ``noise`` maps it to the
    SD of the log of its rounds (its own repeatability, as a fraction)."""

    scores: Mapping[str, float]
    noise: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """JSON-ready form (stored with boots in baselines and the noise corpus)."""
        return {"scores": {k: _sig(v) for k, v in sorted(self.scores.items())},
                "noise": {k: _sig(v) for k, v in sorted(self.noise.items())},
                "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: object) -> Canary | None:
        """Inverse of :meth:`to_json`; None for a missing canary, ValueError for a malformed one."""
        if data is None:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("scores"), dict):
            raise ValueError(f"canary {data!r}: expected an object with a 'scores' object")
        scores = {str(k): float(v) for k, v in data["scores"].items()}
        noise = {str(k): float(v) for k, v in (data.get("noise") or {}).items()}
        bad = [k for k, v in scores.items() if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"canary score {bad[0]}={scores[bad[0]]!r}: expected a positive number")
        return cls(scores=scores, noise=noise, notes=tuple(str(n) for n in data.get("notes") or ()))


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _rounds(probe: Callable[[], float], rounds: int) -> tuple[float, float]:
    """The best of ``rounds`` (neighbours on a shared host only ever slow fixed work, so the
    best round is the host's own speed) and the SD of the log of the faster half of them."""
    values = sorted((probe() for _ in range(rounds)), reverse=True)
    top = [math.log(v) for v in values[: max(2, (rounds + 1) // 2)] if v > 0]
    noise = statistics.stdev(top) if len(top) >= 2 else math.nan
    return values[0], noise


def _python_mops() -> float:
    """Millions of interpreter loop iterations per second: one core's speed as the API server,
    scheduler and client (all single-threaded Python) see it."""
    start = time.perf_counter()
    total = 0
    for i in range(_PYTHON_LOOP):
        total += i * i & 0xFF
    elapsed = time.perf_counter() - start
    return _PYTHON_LOOP / elapsed / 1e6


def _copy_gbs() -> float:
    import numpy as np  # imported here: the GPU canary and the rest of this module run without it

    n = _COPY_MIB * 1024 * 1024
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # faults dst's pages in; not timed
    start = time.perf_counter()
    for _ in range(_COPY_REPEATS):
        np.copyto(dst, src)
    elapsed = time.perf_counter() - start
    return 2.0 * n * _COPY_REPEATS / elapsed / 1e9  # bytes read + written


def cpu_canary(rounds: int = ROUNDS) -> Canary:
    """Time the fixed compute and memory work ``rounds`` times each: about a second in all.

    The best rounds are the scores; each probe's noise is the SD of its faster log-rounds.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 3:
        raise ValueError(f"rounds={rounds!r}: use an integer >= 3 (a noise estimate needs repeats)")
    mops, mops_noise = _rounds(_python_mops, rounds)
    copy, copy_noise = _rounds(_copy_gbs, rounds)
    return Canary(scores={"python_mops": mops, "copy_gbs": copy},
                  noise={"python_mops": mops_noise, "copy_gbs": copy_noise})


# The child that runs the GPU probe: its CUDA context (hundreds of MiB) and the probe's 512 MiB
# of buffers on the first visible GPU go when it exits. In this process they would stay for the
# whole session (torch keeps a context until the process ends), leaving that GPU less room for
# the server's KV cache than the others of a tensor-parallel group.
_GPU_CHILD = (
    "import json, sys\n"
    "from pytest_kimiperf.measure.canary import gpu_canary_here\n"
    "canary = gpu_canary_here(int(sys.argv[1]))\n"
    "print(json.dumps(None if canary is None else canary.to_json()), flush=True)\n"
)
_GPU_CANARY_TIMEOUT_S = 180.0


def gpu_canary(rounds: int = ROUNDS, *, timeout_s: float = _GPU_CANARY_TIMEOUT_S) -> Canary | None:
    """A fixed 256 MiB device-to-device copy on the first visible GPU, timed in a child process
    (see ``_GPU_CHILD``); None where torch with CUDA is not there (the CPU engine, a client host).
    Raises KimiperfError, with the child's last words, if the child fails or hangs."""
    if importlib.util.find_spec("torch") is None:
        return None  # no child needed to know there is no GPU probe
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    try:
        done = subprocess.run([sys.executable, "-c", _GPU_CHILD, str(rounds)], capture_output=True, text=True,
                              timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise KimiperfError(f"the GPU copy canary did not finish within {timeout_s:g} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise KimiperfError(f"the GPU copy canary's child exited with {done.returncode}: {last}")
    return Canary.from_json(json.loads(lines[-1]))


def gpu_canary_here(rounds: int = ROUNDS) -> Canary | None:
    """:func:`gpu_canary`'s probe in this process (the child runs this); None without CUDA torch."""
    try:
        import torch  # noqa: PLC0415  (optional: only GPU hosts have CUDA torch)
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    n = 256 * 1024 * 1024
    src = torch.ones(n, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()

    def probe() -> float:
        start = time.perf_counter()
        for _ in range(_COPY_REPEATS):
            dst.copy_(src)
        torch.cuda.synchronize()
        return 2.0 * n * _COPY_REPEATS / (time.perf_counter() - start) / 1e9

    best, noise = _rounds(probe, rounds)
    return Canary(scores={"gpu_copy_gbs": best}, noise={"gpu_copy_gbs": noise})


_POWER_LIMIT_QUERY = ("--query-gpu=power.limit", "--format=csv,noheader,nounits")


def parse_power_limits(text: str) -> float | None:
    """The lowest enforced power limit in W from ``nvidia-smi --query-gpu=power.limit,...
    --format=csv,noheader,nounits`` (the first column), None when no GPU reports one ("[N/A]").
    A host whose GPUs are capped lower is slower at the same clocks: a canary probe with no
    noise of its own."""
    limits = []
    for line in text.splitlines():
        first = line.split(",")[0].strip()
        try:
            value = float(first)
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            limits.append(value)
    return min(limits) if limits else None


def _gpu_power_limit(timeout_s: float = 10.0) -> float | None:
    """This host's lowest GPU power limit (nvidia-smi), None without nvidia-smi or GPUs."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi, *_POWER_LIMIT_QUERY], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_power_limits(proc.stdout) if proc.returncode == 0 else None


def host_canary(rounds: int = ROUNDS, *, gpus: bool = False) -> Canary:
    """The canary this host can take: the CPU probes, and on a GPU deployment (``gpus``) the
    GPUs' lowest power limit and, where torch with CUDA is here, the device copy."""
    cpu = cpu_canary(rounds)
    if not gpus:
        return cpu
    scores, noise, notes = dict(cpu.scores), dict(cpu.noise), []
    limit = _gpu_power_limit()
    if limit is not None:
        scores["gpu_power_limit_w"], noise["gpu_power_limit_w"] = limit, 0.0
    try:
        gpu = gpu_canary(rounds)
    except Exception as exc:  # noqa: BLE001  (a broken CUDA stack must not stop the session)
        gpu = None
        notes.append(f"GPU copy canary failed: {type(exc).__name__}: {exc}")
    if gpu is not None:
        scores.update(gpu.scores)
        noise.update(gpu.noise)
    return Canary(scores, noise, tuple(notes))


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


# Where the DMI product UUID lives: set per VM by the hypervisor (a clone of a VM image gets its
# own), kept across reboots; readable by root only on most distributions.
PRODUCT_UUID = "/sys/class/dmi/id/product_uuid"
_HOST_BASES = ("declared", "machine-id+product-uuid", "machine-id+boot-id")


def host_identity(declared: str | None = None, *, read: Callable[[str], str] = _read) -> dict[str, str]:
    """Which host this is, beyond its fingerprint: ``host`` (the id that tells sessions of one
    host from sessions of another, judge/noise.py), the ids it was made of, and ``basis``.

    A reboot is a session of the same host, not another host: every fresh CI VM and every reboot
    counted as a new host made each run add the declared host spread twice. So the host is,
    in order: the ``declared`` id (--kimiperf-host-id: a runner's name); a hash of the machine
    id and the DMI product UUID (stable across reboots, and a clone of a VM image has its own
    UUID though it shares the machine id); and where the UUID cannot be read (not root, no DMI),
    the machine id and the kernel's boot id as before. The machines of this project's own CI are
    clones that share one machine id, and are different hosts: without the UUID a reboot cannot
    be told from another clone, and is counted as another host. Same fingerprint, other host:
    the canary decides."""
    machine = read("/etc/machine-id") or read("/var/lib/dbus/machine-id")
    boot = read("/proc/sys/kernel/random/boot_id")
    uuid = read(PRODUCT_UUID).lower()
    ids = {"machine_id": machine[:12], "kernel_boot_id": boot[:12]}
    if declared:
        return {"host": declared, "basis": _HOST_BASES[0], **ids}
    if uuid and machine:
        digest = hashlib.sha256(f"{machine}|uuid:{uuid}".encode()).hexdigest()[:16]
        return {"host": digest, "basis": _HOST_BASES[1], **ids}
    digest = hashlib.sha256(f"{machine}|{boot}".encode()).hexdigest()[:16]
    return {"host": digest, "basis": _HOST_BASES[2], **ids}
