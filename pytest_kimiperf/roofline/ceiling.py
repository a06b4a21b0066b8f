"""The ceiling a model and its hardware set on single-stream decode, and how far a run is from it.

What the two ceilings are, and why: docs/explanation/measurement.md, "The decode ceiling". The
bytes come from ``weights``; the hardware's side, bandwidth and allreduce latency, is here.
:func:`parse_all_reduce_perf` reads ``all_reduce_perf``'s output as nccl-tests writes it
(``src/util.cu`` ``writeResultHeader`` / ``writeResultFooter`` and ``src/common.cu``: size,
count, type, redop, root, then per placement time (us), algbw, busbw (GB/s), #wrong,
out-of-place first).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.numbers import fmt_share, is_real
from pytest_kimiperf.roofline.weights import QuantScheme, WeightBytes, tp_collectives_per_token, weight_bytes_per_token

# Hardware.

# Peak DRAM bandwidth per device, GB/s (10**9 bytes/s), from NVIDIA's product datasheets.
# Patterns match the NVML device name lower-cased with the "nvidia " prefix removed; the first
# match wins, so more specific names come first.
_GPU_BANDWIDTH: tuple[tuple[str, str, float], ...] = (
    # (pattern, label, GB/s)
    (r"rtx pro 6000 blackwell", "RTX PRO 6000 Blackwell (GDDR7, 512-bit)", 1792.0),
    (r"rtx 6000 ada", "RTX 6000 Ada Generation", 960.0),
    (r"\bgb200\b", "GB200 (per B200 GPU)", 8000.0),
    (r"\bb200\b", "B200", 8000.0),
    (r"\bh200\b", "H200 (SXM and NVL)", 4800.0),
    (r"\bh100 nvl\b", "H100 NVL", 3900.0),
    (r"\bh100 pcie\b", "H100 PCIe", 2000.0),
    (r"\bh100\b", "H100 SXM (NVML: 'H100 80GB HBM3')", 3350.0),
    (r"\ba100\b.*80gb.*pcie", "A100 80GB PCIe", 1935.0),
    (r"\ba100\b.*80gb", "A100 80GB SXM", 2039.0),
    (r"\ba100\b", "A100 40GB", 1555.0),
    (r"\bl40s\b", "L40S", 864.0),
    (r"\bl40\b", "L40", 864.0),
    (r"\bl4\b", "L4", 300.0),
    (r"\ba10\b", "A10", 600.0),
    (r"rtx 5090", "GeForce RTX 5090", 1792.0),
    (r"rtx 4090", "GeForce RTX 4090", 1008.0),
    (r"rtx 3090 ti", "GeForce RTX 3090 Ti", 1008.0),
    (r"rtx 3090", "GeForce RTX 3090", 936.0),
)


def _normalize_gpu_name(name: str) -> str:
    return " ".join(name.lower().removeprefix("nvidia ").split())


def _check_bandwidth(value: object, *, where: str) -> float:
    if not (is_real(value, finite=True) and value > 0):
        raise ConfigError(
            f"memory bandwidth {value!r} from {where} must be a positive number of GB/s"
        )
    return float(value)


def known_gpus() -> dict[str, float]:
    """The built-in table: GPU label -> peak memory bandwidth in GB/s."""
    return {label: gbs for _, label, gbs in _GPU_BANDWIDTH}


def gpu_bandwidth_gbs(nvml_name: str, *, overrides: Mapping[str, float] | None = None) -> float:
    """Peak memory bandwidth (GB/s) of the GPU NVML calls ``nvml_name``.

    ``overrides`` maps NVML names (case-insensitive) to GB/s and wins over the built-in table.
    """
    if not isinstance(nvml_name, str) or not nvml_name.strip():
        raise ConfigError(
            f"GPU name must be a non-empty string (the NVML device name), got {nvml_name!r}"
        )
    wanted = _normalize_gpu_name(nvml_name)
    for name, gbs in (overrides or {}).items():
        if _normalize_gpu_name(name) == wanted:
            return _check_bandwidth(gbs, where=f"the bandwidth override for {name!r}")
    for pattern, _, gbs in _GPU_BANDWIDTH:
        if re.search(pattern, wanted):
            return gbs
    raise ConfigError(
        f"no memory bandwidth known for GPU {nvml_name!r}; known: "
        f"{', '.join(known_gpus())}. Pass overrides={{{nvml_name!r}: <GB/s>}} with the "
        "datasheet figure"
    )


# Default per-call latency of one small allreduce (a decode step's hidden state: 2 x hidden bytes,
# 14 KB for Kimi), by interconnect. Guides, not measurements of the target: measure with
# nccl-tests `all_reduce_perf -b 16K -e 16K -G 100` (CUDA graph, as vLLM decodes) and pass it.
# PCIe: nccl-tests on 8 PCIe-only GPUs report 42.6 us (8x RTX 4090, NVIDIA/nccl#1530) and 54 us
# (8x RTX 3090, NVIDIA/nccl#1439) at 8 bytes without CUDA graphs, which add launch overhead that
# vLLM's graphs remove; vLLM's custom allreduce is off on more than two PCIe-only GPUs, so NCCL
# carries them. NVLink: ~6 us with NVLS on 2 H100s (NVIDIA/nccl#1259), more with 8.
_DEFAULT_ALLREDUCE_LATENCY_US: dict[str, float] = {"pcie": 30.0, "nvlink": 10.0}


def default_allreduce_latency_us(interconnect: str) -> float:
    """A starting guess for one decode-sized allreduce on ``interconnect`` ("pcie", "nvlink")."""
    if interconnect in _DEFAULT_ALLREDUCE_LATENCY_US:
        return _DEFAULT_ALLREDUCE_LATENCY_US[interconnect]
    if interconnect in ("cpu", "gloo"):
        raise ConfigError(
            f"no default allreduce latency for interconnect {interconnect!r}: gloo on CPU varies "
            "too much with the host; pass allreduce_latency_us measured on it"
        )
    raise ConfigError(
        f"unknown interconnect {interconnect!r}; known: "
        f"{', '.join(sorted(_DEFAULT_ALLREDUCE_LATENCY_US))}, cpu (needs a measured latency)"
    )


def measure_cpu_copy_bandwidth_gbs(duration_s: float = 0.5, *, buffer_mib: int = 256) -> float:
    """Memory bandwidth of this host in GB/s, from copying a buffer far larger than the caches.

    Counts read + written bytes per copy (2 x buffer) and returns the best copy in
    ``duration_s``: the ceiling, not the average, since neighbours on a shared host only slow it.
    """
    if not (is_real(duration_s, finite=True) and 0 < duration_s <= 60):
        raise ConfigError(f"duration_s must be a number of seconds in (0, 60], got {duration_s!r}")
    if isinstance(buffer_mib, bool) or not isinstance(buffer_mib, int) or buffer_mib < 64:
        # Server L3 caches reach 32-64 MiB per socket; smaller buffers would measure the cache.
        raise ConfigError(
            f"buffer_mib must be an integer >= 64 (above L3 size), got {buffer_mib!r}"
        )
    n = buffer_mib * 1024 * 1024
    src = np.ones(n, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch faults dst's pages in; not timed
    best_gbs = 0.0
    deadline = time.perf_counter() + duration_s
    while True:
        start = time.perf_counter()
        np.copyto(dst, src)
        elapsed = time.perf_counter() - start
        if elapsed > 0:
            best_gbs = max(best_gbs, 2 * n / elapsed / 1e9)
        if time.perf_counter() >= deadline:
            return best_gbs


# The estimate.

BOUND_BY_BANDWIDTH = "memory bandwidth"
BOUND_BY_ALLREDUCE = "allreduce latency"


def _fmt_rate(tok_s: float) -> str:
    if tok_s >= 100:
        return f"{tok_s:,.0f}"
    if tok_s >= 10:
        return f"{tok_s:.1f}"
    return f"{tok_s:.2f}"


@dataclass(frozen=True)
class Roofline:
    """Single-stream decode ceilings for one model on one hardware setup."""

    weight_bytes: WeightBytes
    bandwidth_gbs: float
    allreduce_latency_us: float | None
    collectives_per_token: int
    bandwidth_ceiling_tok_s: float
    # With the communication term; equals bandwidth_ceiling_tok_s when there is none.
    ceiling_tok_s: float
    binding_term: str

    @property
    def has_comm_term(self) -> bool:
        """Whether a communication term (tp > 1 and a latency) lowers the ceiling."""
        return self.collectives_per_token > 0 and self.allreduce_latency_us is not None

    @property
    def comm_term_known(self) -> bool:
        """Whether the ceiling with communication is known (no collectives, or a latency for them)."""
        return self.collectives_per_token == 0 or self.allreduce_latency_us is not None

    def describe(self, measured_tok_s: float) -> str:
        """One line placing a measured decode rate against the ceilings, naming the binding term."""
        if not (is_real(measured_tok_s, finite=True) and measured_tok_s > 0):
            raise ConfigError(
                f"measured decode rate must be a positive number of tok/s, got {measured_tok_s!r}"
            )
        text = (
            f"{measured_tok_s:.1f} tok/s = "
            f"{fmt_share(measured_tok_s / self.bandwidth_ceiling_tok_s)} of the "
            f"{_fmt_rate(self.bandwidth_ceiling_tok_s)} tok/s bandwidth ceiling"
        )
        if self.has_comm_term:
            assert self.allreduce_latency_us is not None
            text += (
                f", {fmt_share(measured_tok_s / self.ceiling_tok_s)} of the "
                f"{_fmt_rate(self.ceiling_tok_s)} tok/s ceiling with "
                f"{self.collectives_per_token} collectives x "
                f"{self.allreduce_latency_us:g} us"
            )
        elif self.collectives_per_token > 0:
            text += f" ({self.collectives_per_token} collectives not counted: no latency given)"
        text += f"; bound by {self.binding_term}"
        if measured_tok_s > self.ceiling_tok_s * 1.02:
            text += " (above the ceiling: check bandwidth, latency and quantization inputs)"
        return text


def estimate(
    config: Mapping[str, Any],
    *,
    tp: int,
    bandwidth_gbs: float,
    allreduce_latency_us: float | None,
    quant: QuantScheme | None = None,
    source: str = "model config",
) -> Roofline:
    """Decode ceilings for a HF config.json at tensor-parallel size ``tp`` on devices with
    ``bandwidth_gbs`` each; ``allreduce_latency_us`` None leaves the communication term out."""
    bandwidth = _check_bandwidth(bandwidth_gbs, where="estimate(bandwidth_gbs=...)")
    if allreduce_latency_us is not None and not (is_real(allreduce_latency_us, finite=True)
                                                 and allreduce_latency_us >= 0):
        raise ConfigError(
            f"allreduce_latency_us must be a non-negative number of microseconds or None, "
            f"got {allreduce_latency_us!r}"
        )
    wb = weight_bytes_per_token(config, tp=tp, quant=quant, source=source)
    collectives = tp_collectives_per_token(config, tp=tp, source=source)
    memory_s = wb.per_gpu_bytes / (bandwidth * 1e9)
    comm_s = collectives * allreduce_latency_us * 1e-6 if allreduce_latency_us is not None else 0.0
    return Roofline(
        weight_bytes=wb,
        bandwidth_gbs=bandwidth,
        allreduce_latency_us=None if allreduce_latency_us is None else float(allreduce_latency_us),
        collectives_per_token=collectives,
        bandwidth_ceiling_tok_s=1 / memory_s,
        ceiling_tok_s=1 / (memory_s + comm_s),
        binding_term=BOUND_BY_ALLREDUCE if comm_s > memory_s else BOUND_BY_BANDWIDTH,
    )


# The measured allreduce: nccl-tests' all_reduce_perf at the size a decode step sends.
_MEASURE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class AllReduceRow:
    """One size of an ``all_reduce_perf`` run: out-of-place time and bus bandwidth, in-place time."""

    size_bytes: int
    count: int
    datatype: str
    time_us: float
    busbw_gbs: float
    wrong: int | None  # None where the run did not check (N/A) or -c 0 printed 0
    in_place_time_us: float | None


def _float(text: str, what: str, line: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"all_reduce_perf {what}: expected a number, got {text!r} in {line!r}") from None


def parse_all_reduce_perf(text: str) -> list[AllReduceRow]:
    """The result rows of an ``all_reduce_perf`` output (``#`` lines and others are skipped);
    ValueError naming the line where a row has the wrong shape."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or line.lstrip().startswith("#") or not fields[0].isdigit() or len(fields) < 9:
            continue
        if len(fields) not in (9, 13):  # out-of-place only, or both placements
            raise ValueError(f"all_reduce_perf row with {len(fields)} fields (9 or 13 expected): {line!r}")
        wrong = None if fields[8] == "N/A" else int(_float(fields[8], "#wrong", line))
        rows.append(AllReduceRow(
            size_bytes=int(fields[0]), count=int(fields[1]), datatype=fields[2],
            time_us=_float(fields[5], "time", line), busbw_gbs=_float(fields[7], "busbw", line), wrong=wrong,
            in_place_time_us=_float(fields[9], "in-place time", line) if len(fields) == 13 else None))
    return rows


def latency_us_at(rows: Sequence[AllReduceRow], nbytes: int) -> tuple[float, int] | None:
    """The out-of-place time of the smallest size at or above ``nbytes``, and that size; None
    where the run stopped below it."""
    above = sorted((row for row in rows if row.size_bytes >= nbytes), key=lambda row: row.size_bytes)
    return (above[0].time_us, above[0].size_bytes) if above else None


def measure_allreduce_latency(
    nbytes: int, gpus: int, *, exe: str | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> tuple[float, str] | None:
    """One allreduce of ``nbytes`` over ``gpus`` GPUs of this host, in us, with how it was
    measured; None where ``all_reduce_perf`` is not on PATH. A run that fails or prints no row
    of that size is said in the source, with the value None."""
    exe = exe or shutil.which("all_reduce_perf")
    if exe is None:
        return None
    argv = [exe, "-b", str(nbytes), "-e", str(nbytes), "-g", str(gpus), "-d", "bfloat16", "-G", "100",
            "-n", "20", "-w", "5", "-c", "0"]
    command = " ".join(argv[1:])
    try:
        done = run(argv, capture_output=True, text=True, timeout=_MEASURE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None if isinstance(error, FileNotFoundError) else _failed(command, str(error))
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()
        return _failed(command, f"exit {done.returncode}: {last[-1] if last else 'no output'}")
    try:
        found = latency_us_at(parse_all_reduce_perf(done.stdout), nbytes)
    except ValueError as error:
        return _failed(command, str(error))
    if found is None:
        return _failed(command, f"no row of {nbytes} B in its output")
    return found[0], f"measured: all_reduce_perf {command} (out-of-place, {found[1]} B)"


def _failed(command: str, why: str) -> tuple[float, str]:
    return float("nan"), f"all_reduce_perf {command} failed ({why})"

__all__ = [
    "AllReduceRow", "BOUND_BY_ALLREDUCE", "BOUND_BY_BANDWIDTH", "Roofline", "default_allreduce_latency_us",
    "estimate", "gpu_bandwidth_gbs", "known_gpus", "latency_us_at", "measure_allreduce_latency",
    "measure_cpu_copy_bandwidth_gbs", "parse_all_reduce_perf",
]
