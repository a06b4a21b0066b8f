"""The weight cache: `vllm preload` daemons that hold the weights between engine boots.

Every NCCL profile needs a fresh engine, and a Kimi-K2.5 boot is a 20-36 minute load of 547 GB.
vLLM 0.32's ``vllm preload`` starts one daemon per GPU that loads the post-quantized, TP-sharded
weights once and hands CUDA IPC handles to engines started with ``--load-format ipc_cache``
(vllm/entrypoints/cli/preload.py), so a later engine maps the weights instead of reading them.
Here: whether a deployment can use it, the daemons' command and environment and the engine's
arguments; manager.py runs the daemons as a managed process.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kimiperf.errors import HardwareMissingError

# The engine's arguments that are the API server's, not the engine's: `vllm preload` parses
# EngineArgs only (preload.py add_cli_args) and rejects these.
_FRONTEND_ARGS_WITH_VALUE = frozenset({
    "--host", "--port", "--api-key", "--served-model-name", "--uds", "--root-path",
    "--chat-template", "--ssl-keyfile", "--ssl-certfile", "--allowed-origins",
    "--tool-call-parser", "--reasoning-parser", "--load-format", "--model-loader-extra-config",
})
_FRONTEND_FLAGS = frozenset({"--enable-auto-tool-choice", "--disable-log-requests", "--disable-uvicorn-access-log"})

# vLLM's own start-up failures that mean "this deployment cannot use the weight cache": the
# daemon exits with one of these in its log (weight_cache/protocol.py:64-69), and the session
# loads from disk instead. The traceback's last line is "<module>.<Error>: <message>"; the
# "raise UnsupportedQuantForIPCError(" line above it names the error but says nothing.
_UNSUPPORTED_MESSAGE = re.compile(r"(Unsupported\w+ForIPCError): (.+)$")

# The daemons hand the engine post-processed weights, so every layer's quantization method must
# declare ``supports_pre_processed_weights``; vLLM 0.32 checks it after building the model and
# before reading a weight (model_loader/weight_cache/daemon.py:327, protocol.py:93-112) and the
# default is False (layers/quantization/base_config.py:36). In 0.32 only the unquantized methods
# (layers/linear.py:168, vocab_parallel_embedding.py:42, fused_moe/unquantized_fused_moe_method.py:60),
# fp8's (quantization/fp8.py:239, 478), the KV-cache method (kv_cache.py:55) and some of mxfp4's,
# modelopt's and the mxfp8 kernels' declare True. The methods of the quantizations below derive
# from LinearMethodBase / FusedMoEMethodBase directly and never set it, so their daemons cannot
# serve: Kimi-K2.5's INT4 experts run CompressedTensorsWNA16MoEMethod
# (compressed_tensors_moe/compressed_tensors_moe_wna16.py:52). Any other method is tried, with
# the daemons' own error as the fallback reason.
IPC_QUANT_UNSUPPORTED = frozenset({
    "compressed-tensors", "awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq",
    "moe_wna16", "fbgemm_fp8", "fp_quant", "humming", "torchao",
})
# vLLM 0.32's names of the quantization methods (layers/quantization/__init__.py
# QUANTIZATION_METHODS), longest first so "gptq_marlin" is not read as "gptq" in a deployment's
# free-text field.
_KNOWN_QUANT_METHODS = tuple(sorted((
    "awq", "auto_awq", "fp8", "fbgemm_fp8", "fp_quant", "modelopt", "modelopt_fp4", "modelopt_mxfp8",
    "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin", "awq_marlin", "humming", "compressed-tensors",
    "experts_int8", "quark", "moe_wna16", "torchao", "inc", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8",
    "online", "fp8_per_tensor", "fp8_per_block", "fp8_per_channel", "int8_per_channel_weight_only",
    "nvfp4_per_token", "mxfp8",
), key=len, reverse=True))


# The serve arguments (argparse dests) that feed vLLM 0.32's WeightCacheKey, the fingerprint a
# daemon's weights must match (weight_cache/protocol.py:282-303): checkpoint <- model, revision;
# model_arch and quant_config_hash <- hf_overrides, quantization; dtype; tp/pp/dp sizes;
# is_draft <- speculative_config. A profile that sets one would be handed other weights than
# it asks for (or fall back to disk with a warning), so its engines load from disk; so do a
# profile's own --load-format and loader config, which replace the cache's.
WEIGHT_KEY_DESTS = frozenset({
    "model", "revision", "code_revision", "hf_overrides", "quantization", "dtype",
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "speculative_config",
    "load_format", "model_loader_extra_config",
})


def profile_cache_reason(profile: str, dests: frozenset[str]) -> str | None:
    """Why a profile's engines cannot boot from the daemons' weights, or None when they can:
    its arguments change what the weights are (WEIGHT_KEY_DESTS)."""
    changed = sorted(dests & WEIGHT_KEY_DESTS)
    if not changed:
        return None
    return (f"profile {profile} sets {', '.join('--' + d.replace('_', '-') for d in changed)}, which "
            "changes the weights the daemons hold (vLLM's WeightCacheKey): its engines load from disk")


@dataclass(frozen=True)
class WeightCachePlan:
    """Whether the session boots its engines from the weight cache, and how; ``fallback_reason``
    is the line the header shows when "auto" loads from disk instead."""

    enabled: bool
    fallback_reason: str | None = None
    socket_dir: str | None = None
    health_port: int | None = None

    def engine_args(self) -> list[str]:
        """Arguments added to each engine's command line while the daemons serve; with ``fallback``
        a daemon that does not answer means a disk load (ipc_loader.py), never a failed boot."""
        if not self.enabled:
            return []
        extra = {"socket_dir": self.socket_dir, "fallback": True}
        return ["--load-format", "ipc_cache", "--model-loader-extra-config", json.dumps(extra, sort_keys=True)]

def quant_method_of(model_config: Mapping[str, object]) -> str | None:
    """vLLM's name of a model's quantization method, from its config.json (None: unquantized).

    A multimodal wrapper (Kimi-K2.5's ``kimi_k25``) may carry it in ``text_config`` only."""
    for config in (model_config, model_config.get("text_config")):
        quant = config.get("quantization_config") if isinstance(config, Mapping) else None
        if isinstance(quant, Mapping) and isinstance(quant.get("quant_method"), str):
            return str(quant["quant_method"]).lower()
    return None


def declared_quant_method(quantization: str | None) -> str | None:
    """The vLLM method a deployment's free-text ``quantization`` names ("int4 (compressed-tensors)")."""
    text = (quantization or "").lower()
    return next((m for m in _KNOWN_QUANT_METHODS if re.search(rf"(?<![\w-]){re.escape(m)}(?![\w-])", text)), None)


def _model_config(model: str) -> dict[str, object] | None:
    for folder in _model_folders(model):
        try:
            data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def quant_reason(*, model: str | None, quantization: str | None) -> str | None:
    """Why the daemons cannot serve this model's quantization, or None when they can (or may): from
    the model's config.json where it is on this host, else the deployment's ``quantization``."""
    config = _model_config(model) if model else None
    if config is not None:
        method, source = quant_method_of(config), f"{model}'s config.json"
    else:
        method, source = declared_quant_method(quantization), f"the deployment's quantization {quantization!r}"
    if method not in IPC_QUANT_UNSUPPORTED:
        return None
    return (f"quantization {method!r} (from {source}) has no pre-processed weight support in vLLM 0.32 "
            "(supports_pre_processed_weights, quantization/base_config.py:36), so each `vllm preload` "
            "daemon would stop with UnsupportedQuantForIPCError (weight_cache/daemon.py:327); loading from disk")


def why_not_used(*, setting: str, gpu_count: int, command: Sequence[str], model: str | None = None,
                 quantization: str | None = None, nodes: int = 1, control: bool = False) -> str | None:
    """Why the deployment's engines will load from disk, or None when they boot from the cache:
    decided before any daemon starts (the header shows it); a daemon that still fails to start is
    a later fallback with its own error as the reason."""
    if setting == "off":
        return "the deployment sets weight_cache = \"off\""
    if control:
        # The control serves another build, and the daemons' copy of the weights would shrink its
        # free GPU memory: the two sides load alike, from disk.
        return ("--kimiperf-control: both sides load from disk alike (the control serves the recorded build, and "
                "the daemons' copy of the weights would take its GPU memory)")
    if gpu_count == 0:
        return ("CPU engine: vLLM's weight cache shares CUDA IPC handles "
                "(UnsupportedPlatformForIPCError on CPU); loading from disk")
    if nodes > 1:
        # CUDA IPC handles are valid on one host only: a daemon on the head cannot serve the
        # ranks of the other nodes, and the plugin starts daemons nowhere else.
        return (f"a deployment across {nodes} nodes: `vllm preload` daemons run on the head only and CUDA "
                "IPC handles do not cross hosts, so the other nodes' engines would find no cache; "
                "loading from disk")
    if _serve_at(list(command)) is None:
        return "the command is not `vllm serve`: no `vllm preload` to pair it with"
    return quant_reason(model=model, quantization=quantization)


def plan_weight_cache(*, setting: str, gpu_count: int, command: Sequence[str],
                      socket_dir: str, health_port: int, model: str | None = None,
                      quantization: str | None = None, nodes: int = 1, control: bool = False) -> WeightCachePlan:
    """The session's plan: the cache with its socket folder and health port, or the reason not."""
    reason = why_not_used(setting=setting, gpu_count=gpu_count, command=command, model=model,
                          quantization=quantization, nodes=nodes, control=control)
    if reason is not None:
        return WeightCachePlan(False, reason)
    return WeightCachePlan(True, socket_dir=socket_dir, health_port=health_port)


def _serve_at(command: Sequence[str]) -> int | None:
    """Where ``serve`` stands in a vLLM CLI command: ``vllm serve MODEL ...`` or
    ``PYTHON -m vllm.entrypoints.cli.main serve MODEL ...`` (the GPU deployment's form); None
    for any other command (the CPU engine's deprecated api_server module has no ``preload``)."""
    if len(command) >= 3 and os.path.basename(command[0]) == "vllm" and command[1] == "serve":
        return 1
    if len(command) >= 5 and command[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]:
        return 3
    return None


def daemon_argv(engine_argv: Sequence[str], plan: WeightCachePlan) -> list[str]:
    """`vllm preload` with every engine argument (the daemons' weights must match the engine's
    WeightCacheKey, protocol.py), the API server's left out; its /health answers 200 once every rank
    serves (preload.py _HealthState)."""
    assert plan.enabled and plan.socket_dir is not None and plan.health_port is not None
    at = _serve_at(list(engine_argv))
    assert at is not None, "plan_weight_cache enables the cache for vLLM CLI commands only"
    program, model, rest = list(engine_argv[:at]), engine_argv[at + 1], engine_argv[at + 2:]
    kept: list[str] = []
    skip = False
    for arg in rest:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _FRONTEND_ARGS_WITH_VALUE:
            skip = "=" not in arg
            continue
        if name in _FRONTEND_FLAGS:
            continue
        kept.append(arg)
    return [*program, "preload", "--model", model, *kept,
            "--weight-cache-socket-dir", plan.socket_dir,
            "--weight-cache-health-host", "127.0.0.1", "--weight-cache-health-port", str(plan.health_port)]


def daemon_env(shell_env: Mapping[str, str], deployment_env: Mapping[str, str]) -> dict[str, str]:
    """The daemons' environment: the shell's and the deployment's, never a profile's (the daemons
    form their own NCCL group, preload.py, that no measured request crosses, and outlive every
    profile)."""
    return {**shell_env, **deployment_env}


def unsupported_reason(log_text: str) -> str | None:
    """What a daemon's log says about why the deployment cannot use the cache, if it says so:
    ``UnsupportedQuantForIPCError: layer ...: ... does not support loading from pre-processed
    weights.`` (the error's message, not the traceback's ``raise`` line)."""
    for line in log_text.splitlines():
        match = _UNSUPPORTED_MESSAGE.search(line)
        if match:
            return f"{match.group(1)}: {match.group(2).strip()}"[:300]
    return None


@dataclass(frozen=True)
class MemoryFit:
    """What the daemons hold per GPU against what the engine is allowed, in GiB."""

    daemon_gib_per_gpu: float
    gpu_total_gib: float
    gpu_memory_utilization: float
    min_engine_gib: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def engine_left_gib(self) -> float:
        """The engine's budget less the mapped weights, which it counts inside its own
        ``gpu_memory_utilization`` (v1/worker/utils.py:728 request_memory, fed by ipc_loader.py
        get_external_weight_memory): what is left for activations and KV."""
        return self.gpu_total_gib * self.gpu_memory_utilization - self.daemon_gib_per_gpu

    def describe(self) -> str:
        """``daemons hold 68.4 GiB per GPU of 95.0; the engine keeps 17.1 GiB for KV cache``."""
        return (f"daemons hold {self.daemon_gib_per_gpu:.1f} GiB per GPU of {self.gpu_total_gib:.1f}; "
                f"the engine keeps {self.engine_left_gib:.1f} GiB for activations and KV cache")


def check_fit(fit: MemoryFit) -> None:
    """HardwareMissingError, before any boot, when daemons and engine cannot share a GPU."""
    if fit.engine_left_gib < fit.min_engine_gib:
        raise HardwareMissingError(
            f"the weight cache does not fit: {fit.describe()}, under the {fit.min_engine_gib:.1f} GiB "
            "an engine needs; use GPUs with more memory or set weight_cache = \"off\" in the deployment"
        )


def _estimate_daemon_gib(checkpoint_bytes: int, tensor_parallel_size: int) -> float:
    """Weights per GPU held by the daemons: the checkpoint's size (post-quantized weights are
    about as large; INT4 stays INT4) over the TP ranks."""
    return checkpoint_bytes / max(1, tensor_parallel_size) / 1024**3


def _model_folders(model: str) -> list[Path]:
    """Where a model's files may be on this host: its folder, or its Hugging Face cache snapshots."""
    candidates = [Path(model)]
    if "/" in model and not Path(model).exists():
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME") or
                   Path.home() / ".cache" / "huggingface") / "hub")
        candidates = sorted((hub / f"models--{model.replace('/', '--')}" / "snapshots").glob("*"))
    return candidates


def _checkpoint_bytes(model: str) -> int | None:
    """Size of a model's weight files, for a local folder or a Hugging Face cache snapshot;
    None when they are not on this host yet (the fit is then checked once the daemons report)."""
    for folder in _model_folders(model):
        files = [f for f in folder.glob("*.safetensors") if f.is_file()] if folder.is_dir() else []
        if files:
            return sum(f.stat().st_size for f in files)  # stat follows the hub's symlinks
    return None


# weight_cache/daemon.py load_model: "Weight cache target daemon rank 0 loaded model
# (68.41 GiB allocated, 70.00 GiB reserved)"
_LOADED = re.compile(r"daemon rank (\d+) loaded model \(([\d.]+) GiB allocated, ([\d.]+) GiB reserved\)")


def held_gib_per_rank(log_text: str) -> dict[int, float]:
    """GiB each daemon rank reserved on its GPU, as the daemons' log says once loaded."""
    return {int(m.group(1)): float(m.group(3)) for m in _LOADED.finditer(log_text)}


# vLLM's default (config/cache.py CacheConfig.gpu_memory_utilization).
_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Declared, not measured: activations, NCCL buffers and a useful KV cache of a 32k context.
_MIN_ENGINE_GIB = 4.0


def memory_fit(model: str, tensor_parallel_size: int, command: Sequence[str],
               gpu_total_mib: int) -> MemoryFit | None:
    """The daemons' expected hold against one GPU; None when the checkpoint is not on this host."""
    size = _checkpoint_bytes(model)
    if size is None:
        return None
    return MemoryFit(_estimate_daemon_gib(size, tensor_parallel_size), gpu_total_mib / 1024,
                     gpu_memory_utilization(command), _MIN_ENGINE_GIB)


def gpu_memory_utilization(command: Sequence[str]) -> float:
    """The share of each GPU the engine asks for at startup: the command's last
    ``--gpu-memory-utilization``, else vLLM's default."""
    utilization = _DEFAULT_GPU_MEMORY_UTILIZATION
    for i, arg in enumerate(command):
        if arg == "--gpu-memory-utilization" and i + 1 < len(command):
            utilization = float(command[i + 1])
        elif arg.startswith("--gpu-memory-utilization="):
            utilization = float(arg.split("=", 1)[1])
    return utilization


def _host_ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def page_cache_line(checkpoint_size: int, ram_bytes: int | None) -> str:
    """Whether the host's RAM can keep the checkpoint in the page cache between boots: where it
    can, every boot after the first reads its weights from memory; where not, from disk."""
    size_gb = checkpoint_size / 1e9
    if ram_bytes is None:
        return f"page cache: the checkpoint is {size_gb:.0f} GB; this host's RAM is not known"
    ram_gb = ram_bytes / 1e9
    if ram_bytes > checkpoint_size:
        return (f"page cache: host RAM {ram_gb:.0f} GB holds the {size_gb:.0f} GB checkpoint: boots after "
                "the first can read the weights from memory")
    return (f"page cache: host RAM {ram_gb:.0f} GB is below the {size_gb:.0f} GB checkpoint: every boot "
            "reads the weights from disk")


def header_lines(*, setting: str, gpu_count: int, command: Sequence[str], model: str,
                 tensor_parallel_size: int, quantization: str | None = None, nodes: int = 1,
                 control: bool = False) -> list[str]:
    """What the report header says before any boot: on, or off with the reason; and what
    the daemons will hold per GPU where the checkpoint is already on this host."""
    reason = why_not_used(setting=setting, gpu_count=gpu_count, command=command, model=model,
                          quantization=quantization, nodes=nodes, control=control)
    size = _checkpoint_bytes(model) if gpu_count else None
    page_cache = [page_cache_line(size, _host_ram_bytes())] if size is not None else []
    if reason is not None:
        return [f"weight cache: off ({reason})", *page_cache]
    lines = ["weight cache: on: `vllm preload` daemons load the weights once; each profile's engine "
             "boots with --load-format ipc_cache; the daemons run with the shell's and deployment's "
             "environment, never a profile's", *page_cache]
    if size is None:
        lines.append("weight cache: the daemons' GPU memory is stated once they have loaded "
                     "(the checkpoint is not on this host yet)")
    else:
        lines.append(f"weight cache: the daemons will hold about "
                     f"{_estimate_daemon_gib(size, tensor_parallel_size):.1f} GiB per GPU (checkpoint / TP)")
    return lines


@dataclass(frozen=True)
class WeightCacheFacts:
    """What the session's weight cache did, for the reports: used or not (and why not), the
    daemons' start-up time, log, what they held, the environment they ran with, leftovers."""

    used: bool
    reason: str | None = None
    boot_s: float | None = None
    log_path: str | None = None
    held_gib_per_rank: dict[int, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    leftovers: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for the terminal summary and the Markdown."""
        if not self.used:
            return f"weight cache: off ({self.reason})" if self.reason else "weight cache: off"
        held = ", ".join(f"rank {r} {gib:.1f} GiB" for r, gib in sorted(self.held_gib_per_rank.items()))
        ready = f"ready after {self.boot_s:.0f} s" if self.boot_s is not None else "started"
        return (f"weight cache: daemons {ready}" + (f", holding {held}" if held else "")
                + (f"; log: {self.log_path}" if self.log_path else ""))

    def to_json(self) -> dict[str, object]:
        """JSON-able form (the JSON report's ``weight_cache``)."""
        return {"used": self.used, "reason": self.reason, "boot_s": self.boot_s, "log_path": self.log_path,
                "held_gib_per_rank": {str(r): g for r, g in sorted(self.held_gib_per_rank.items())},
                "env": dict(self.env), "leftovers": list(self.leftovers)}
