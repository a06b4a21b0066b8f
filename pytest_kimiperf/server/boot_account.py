"""Where one boot's seconds went, phase by phase, read from its whole log once it is ready.

A boot is what a user pays for (a Kimi-K2.5 load is 20-36 minutes): the account keeps its
phases, what vLLM states about the costly ones (the weights' size and load time, whether
compilation came from the cache) and the all-reduce path (``allreduce_path.py``). It reads each
line's own timestamp, so a phase that passed between two polls of the live display still counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pytest_kimiperf.server.allreduce_path import AllReducePath, read_all_reduce_path

# Phase openers in vLLM 0.32's log, each with the file that writes it (paths under vllm/).
# The first timestamped line matching an opener starts that phase; a phase ends where the next
# one starts. Phases are named as the progress display names them.
_OPENERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # entrypoints/openai/api_server.py via serve/utils/api_utils.py
    ("resolving model", re.compile(r"non-default args|Resolved architecture")),
    # v1/engine/core.py:133
    ("initializing engine", re.compile(r"Initializing a V1 LLM engine")),
    # v1/worker/gpu_model_runner.py:5040, cpu_model_runner.py:68
    ("loading weights", re.compile(r"Starting to load model")),
    # v1/worker/gpu_worker.py (memory profiling before the KV cache is sized)
    ("profiling", re.compile(r"Memory profiling|profile_run")),
    # compilation/monitor.py:40, backends.py:399 and :296, decorators.py:333; on the CPU,
    # cpu_model_runner.py:87: its warm-up is where Dynamo and Inductor run (there are no CUDA
    # graphs to capture, so this is also the CPU's stand-in for that phase)
    ("compiling", re.compile(r"Starting torch\.compile|Compiling a graph|Directly load the compiled graph"
                             r"|Directly load AOT compilation|Compiling model again"
                             r"|Warming up model for the compilation")),
    # v1/worker/gpu_worker.py:760, cpu_worker.py:260, v1/core/kv_cache_utils.py
    ("allocating KV cache", re.compile(r"Available KV cache memory|GiB for KV cache|KV cache size")),
    # entrypoints/openai/api_server.py: the engine is up, the HTTP server starts
    ("starting API server", re.compile(r"init engine \(profile, create kv cache|Starting vLLM (?:API )?server on")),
)

# ``INFO 11-30 18:34:11 [file.py:501] message``: vLLM's logger (logging_utils/formatter.py).
_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")
# model_executor/model_loader/default_loader.py:502 and sharded_state_loader.py:248
_WEIGHTS_TOOK = re.compile(r"Loading weights took ([\d.]+) seconds")
# v1/worker/gpu_model_runner.py:5150: the whole load, weights and post-processing
_MODEL_LOADING_TOOK = re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds")
# model_executor/model_loader/weight_utils.py:1108
_CHECKPOINT_SIZE = re.compile(r"Checkpoint size: ([\d.]+) GiB")
# model_executor/model_loader/weight_cache/ipc_loader.py:284
_IPC_MAPPED = re.compile(r"Mapped (\d+) tensors from the weight cache daemon")
# compilation/monitor.py:20 (also "torch.compile and initial profiling/warmup run together took")
_COMPILE_TOOK = re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?took ([\d.]+) s")
# compilation/monitor.py:91: the first dummy run after compile, which the compile phase's
# timestamps cannot separate from compiling
_WARMUP_TOOK = re.compile(r"Initial profiling/warmup run took ([\d.]+) s")
# CUDA graphs: both 0.32 GPU runners show their capture as a tqdm bar ("Capturing CUDA graphs
# (PIECEWISE)", v1/worker/gpu/cudagraph_utils.py CudaGraphManager.capture; "(..., decode)",
# gpu_model_runner.py:6657), which carries no timestamp, and log its end only:
# "Graph capturing finished in %.0f secs, took %.2f GiB" (gpu_model_runner.py:6582; Model Runner
# V2 v1/worker/gpu/model_runner.py:1128). V2 logs it during memory profiling too
# (cudagraph_utils.profile_cudagraph_memory -> capture_model(profile_only=True)), so the last one
# is the capture; the phase is placed from its stamp back by the seconds it states.
_GRAPHS_DONE = re.compile(r"Graph capturing finished in ([\d.]+) secs")
_COMPILE_CACHE_HIT = re.compile(r"Directly load the compiled graph|Directly load AOT compilation")
_COMPILE_CACHE_MISS = re.compile(r"Compiling a graph for|Compiling model again|saved AOT compiled function")

GIB = 1024**3


@dataclass(frozen=True)
class PhaseTime:
    """One phase of a boot and the seconds it took (log timestamps are whole seconds)."""

    phase: str
    seconds: float


@dataclass(frozen=True)
class BootAccount:
    """Where one boot's seconds went; ``first_of_deployment``: the session's first boot of the
    deployment, which builds the compile cache and warms the page cache for all that follow."""

    profile: str
    ordinal: int
    total_s: float
    first_of_deployment: bool
    phases: tuple[PhaseTime, ...] = ()
    weights_s: float | None = None
    weights_bytes: int | None = None
    weights_source: str = "disk"  # or "weight cache" when mapped from `vllm preload` daemons
    compile_s: float | None = None
    compile_cached: bool | None = None  # None: the log says nothing about a compile cache
    log_path: str | None = None
    environments: dict[str, dict[str, str]] = field(default_factory=dict)
    # The all-reduce path vLLM set up (allreduce_path.py): what an NCCL profile could reach
    all_reduce: AllReducePath | None = None

    @property
    def weights_gbs(self) -> float | None:
        """Weight load rate in GB/s (10**9 B/s), where the log gives both size and time."""
        if self.weights_bytes is None or not self.weights_s:
            return None
        return self.weights_bytes / self.weights_s / 1e9

    def phase_s(self, phase: str) -> float | None:
        """Seconds spent in ``phase`` (None when the boot never entered it)."""
        found = [p.seconds for p in self.phases if p.phase == phase]
        return sum(found) if found else None

    def summary(self) -> str:
        """One line: ``boot 2 of ring-ll: 41 s, of which weights 8 s, compile 8 s (cached)``."""
        parts = []
        weights = self.phase_s("loading weights")
        if weights is not None:
            rate = f", {self.weights_gbs:.2f} GB/s" if self.weights_gbs is not None else ""
            source = " from the weight cache" if self.weights_source != "disk" else ""
            parts.append(f"weights {weights:.0f} s{source}{rate}")
        compile_s = self.phase_s("compiling")
        if compile_s is not None:
            cached = {True: " (cached)", False: " (compiled)", None: ""}[self.compile_cached]
            parts.append(f"compile {compile_s:.0f} s{cached}")
        graphs = self.phase_s("capturing CUDA graphs")
        if graphs is not None:
            parts.append(f"CUDA graphs {graphs:.0f} s")
        first = " (first of the deployment)" if self.first_of_deployment else ""
        head = f"boot {self.ordinal} of {self.profile}{first}: {self.total_s:.0f} s"
        return f"{head}, of which {', '.join(parts)}" if parts else head

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (reports, and xdist workers' records)."""
        return {
            "profile": self.profile, "boot": self.ordinal, "total_s": round(self.total_s, 3),
            "first_of_deployment": self.first_of_deployment,
            "phases": [{"phase": p.phase, "seconds": round(p.seconds, 3)} for p in self.phases],
            "weights_s": self.weights_s, "weights_bytes": self.weights_bytes,
            "weights_gbs": None if self.weights_gbs is None else round(self.weights_gbs, 3),
            "weights_source": self.weights_source,
            "compile_s": self.compile_s, "compile_cached": self.compile_cached,
            "log_path": self.log_path, "environments": self.environments,
            "all_reduce": None if self.all_reduce is None else self.all_reduce.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BootAccount:
        """Inverse of :meth:`to_json`."""
        return cls(
            profile=data["profile"], ordinal=int(data["boot"]), total_s=float(data["total_s"]),
            first_of_deployment=bool(data["first_of_deployment"]),
            phases=tuple(PhaseTime(p["phase"], float(p["seconds"])) for p in data.get("phases") or []),
            weights_s=data.get("weights_s"), weights_bytes=data.get("weights_bytes"),
            weights_source=data.get("weights_source", "disk"),
            compile_s=data.get("compile_s"), compile_cached=data.get("compile_cached"),
            log_path=data.get("log_path"), environments=dict(data.get("environments") or {}),
            all_reduce=AllReducePath.from_json(data["all_reduce"]) if data.get("all_reduce") else None,
        )


@dataclass(frozen=True)
class ServerSpan:
    """A stretch of the session's wall clock one server took (measure/time_account.py lays them
    on the session's clock): a boot, from the manager's first step to ready or to its failure,
    or a stop, from the signal to the verified end."""

    kind: str  # "boot" or "stop"
    profile: str
    boot: int  # which boot of the profile
    started_at: float  # epoch seconds (time.time()): one clock for every process of the host
    seconds: float
    launch_s: float | None = None  # a boot: from its start to the server's launch (its log's 0)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (xdist workers' records)."""
        return {"kind": self.kind, "profile": self.profile, "boot": self.boot, "started_at": self.started_at,
                "seconds": self.seconds, "launch_s": self.launch_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerSpan:
        """Inverse of :meth:`to_json`."""
        return cls(kind=str(data["kind"]), profile=str(data["profile"]), boot=int(data["boot"]),
                   started_at=float(data["started_at"]), seconds=float(data["seconds"]),
                   launch_s=None if data.get("launch_s") is None else float(data["launch_s"]))


def account_boot(
    log_text: str,
    *,
    profile: str,
    ordinal: int,
    first_of_deployment: bool,
    started_at: datetime,
    total_s: float,
    log_path: str | None = None,
    environments: dict[str, dict[str, str]] | None = None,
) -> BootAccount:
    """The account of a boot from its log, its local start time and its time to ready: each phase
    from its opener's timestamp to the next opener's (in log order: the CPU runner compiles inside
    its warm-up), "process start" before the first, the last ending at ready."""
    marks: list[tuple[str, float]] = [("process start", 0.0)]
    seen: set[str] = set()
    weights_s = weights_gib = compile_s = warmup_s = None
    mapped = False
    cached: bool | None = None
    graphs: tuple[float, float] | None = None  # the last capture's end and its stated seconds
    last_t = 0.0
    for line in log_text.splitlines():
        stamp = _STAMP.search(line)
        if stamp:
            last_t = max(last_t, _offset_s(stamp, started_at))
        for phase, pattern in _OPENERS:
            if phase not in seen and pattern.search(line):
                seen.add(phase)
                marks.append((phase, min(last_t, total_s)))
                break
        if m := _WEIGHTS_TOOK.search(line):
            weights_s = float(m.group(1))
        elif m := _MODEL_LOADING_TOOK.search(line):
            weights_gib = weights_gib if weights_gib is not None else float(m.group(1))
            weights_s = weights_s if weights_s is not None else float(m.group(2))
        elif m := _CHECKPOINT_SIZE.search(line):
            weights_gib = float(m.group(1))
        elif _IPC_MAPPED.search(line):
            mapped = True
        elif m := _COMPILE_TOOK.search(line):
            compile_s = float(m.group(1))
        elif m := _WARMUP_TOOK.search(line):
            warmup_s = (warmup_s or 0.0) + float(m.group(1))
        if m := _GRAPHS_DONE.search(line):
            graphs = (min(last_t, total_s), float(m.group(1)))
        if _COMPILE_CACHE_HIT.search(line) and cached is None:
            cached = True
        if _COMPILE_CACHE_MISS.search(line):
            cached = False  # a miss anywhere (one failed load, one graph compiled) is a miss
    if graphs is not None:
        start = max(0.0, graphs[0] - graphs[1])
        marks = sorted([*marks, ("capturing CUDA graphs", start)], key=lambda mark: mark[1])
    phases = tuple(
        PhaseTime(name, max(0.0, end - start))
        for (name, start), (_, end) in zip(marks, [*marks[1:], ("ready", total_s)])
    )
    if warmup_s is not None and "compiling" in seen and "profiling" not in seen:
        phases = _split_warmup(phases, warmup_s)
    return BootAccount(
        profile=profile, ordinal=ordinal, total_s=total_s, first_of_deployment=first_of_deployment,
        phases=phases, weights_s=weights_s,
        weights_bytes=None if weights_gib is None or weights_gib == 0 else int(weights_gib * GIB),
        weights_source="weight cache" if mapped else "disk",
        compile_s=compile_s, compile_cached=cached, log_path=log_path,
        environments=dict(environments or {}), all_reduce=read_all_reduce_path(log_text.splitlines()),
    )


def _split_warmup(phases: tuple[PhaseTime, ...], warmup_s: float) -> tuple[PhaseTime, ...]:
    """The compile phase less the warm-up run vLLM states it took, that run as "profiling"."""
    out: list[PhaseTime] = []
    for p in phases:
        if p.phase == "compiling":
            profiling = min(warmup_s, p.seconds)
            out += [PhaseTime("compiling", p.seconds - profiling), PhaseTime("profiling", profiling)]
        else:
            out.append(p)
    return tuple(out)


def _offset_s(stamp: re.Match[str], started_at: datetime) -> float:
    """Seconds from ``started_at`` to a log stamp (vLLM's stamps carry no year: the start's)."""
    month, day, hour, minute, second = (int(g) for g in stamp.groups())
    when = started_at.replace(month=month, day=day, hour=hour, minute=minute, second=second, microsecond=0)
    if when < started_at.replace(microsecond=0) and (started_at - when).days > 180:
        when = when.replace(year=started_at.year + 1)  # a boot across New Year's Eve
    return max(0.0, (when - started_at).total_seconds())
