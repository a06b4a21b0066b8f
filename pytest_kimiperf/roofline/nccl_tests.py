"""The collective ceiling measured on the target: nccl-tests' ``all_reduce_perf`` at the size a
decode step sends, where it is installed.

The roofline's communication term is collectives x one allreduce's latency; its default (30 us
on PCIe, ceiling.py) is a guide. Where ``all_reduce_perf`` is on PATH, one run at the decode
size replaces it: ``-b N -e N`` (that size only), ``-d bfloat16`` (vLLM's hidden state),
``-G 100`` (each iteration a CUDA graph of 100 launches, as vLLM decodes under CUDA graphs, which
removes the launch overhead a plain run adds), ``-c 0`` (no correctness check). Its output
(NVIDIA/nccl-tests ``src/util.cu`` ``writeResultHeader`` / ``writeResultFooter`` and
``src/common.cu``: ``"%12li  %12li  %8s  %6s  %6s"`` size, count, type, redop, root, then per
placement ``"  %7s  %6s  %6s  %6g"`` time (us), algbw, busbw (GB/s), #wrong, out-of-place first)
is parsed by :func:`parse_all_reduce_perf`.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["AllReduceRow", "latency_us_at", "measure_allreduce_latency", "parse_all_reduce_perf"]

MEASURE_TIMEOUT_S = 120.0


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
        done = run(argv, capture_output=True, text=True, timeout=MEASURE_TIMEOUT_S, check=False)
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
