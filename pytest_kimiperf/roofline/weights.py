"""Weight accounting: the bytes one decoded token reads, per tensor class, total and per GPU.

The model's ``config.json`` is looked for where the deployment, the tiny model's build, a local
model directory or the Hugging Face hub cache has it (:func:`find_model_config` says why when none
does). The bytes each Linear module takes (which modules a scheme skips, which scales and zero
points decode reads with the weights) and each tensor's shard under tensor parallelism follow how
vLLM loads the checkpoint's format (compressed-tensors, GPTQ, AWQ, FP8), cited where it matters.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimiperf.config.deployments import TINY_MODEL
from pytest_kimiperf.errors import ConfigError


# The model's config.json: where it is on this host and what it says.

@dataclass(frozen=True)
class ModelConfigLookup:
    """Where the model's config.json was found (``path``), or why it was not (``reason``)."""

    path: Path | None
    source: str
    reason: str | None = None


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else the XDG/home default.

    The order huggingface_hub resolves it in (constants.py; "Hub Local Cache" in the hub docs).
    """
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def _hub_snapshot(repo_id: str, revision: str | None, cache: Path) -> tuple[Path | None, str]:
    """The snapshot directory of ``repo_id`` in the hub cache, or None with what was looked at.

    Layout: ``models--ORG--NAME/refs/<branch or tag>`` holds a commit hash, and
    ``snapshots/<commit>/`` holds the files (links into ``blobs/``).
    """
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        return None, f"{repo_id} is not in the Hugging Face cache ({repo_dir} does not exist)"
    wanted = revision or "main"
    ref = repo_dir / "refs" / wanted
    commit: str | None = None
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    elif (repo_dir / "snapshots" / wanted).is_dir():
        commit = wanted
    if commit is not None:
        snapshot = repo_dir / "snapshots" / commit
        if (snapshot / "config.json").is_file():
            return snapshot, f"Hugging Face cache, {wanted} -> {commit[:12]}"
        return None, f"{snapshot / 'config.json'} is not in the Hugging Face cache"
    if revision is not None:
        return None, f"revision {revision!r} of {repo_id} is not in the Hugging Face cache ({repo_dir})"
    snapshots = sorted(
        (p for p in (repo_dir / "snapshots").glob("*") if (p / "config.json").is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    if not snapshots:
        return None, f"{repo_id} has no snapshot with a config.json in the Hugging Face cache ({repo_dir})"
    # No refs/main (a download by commit hash): the newest snapshot, named in the source.
    return snapshots[-1], f"Hugging Face cache, newest snapshot {snapshots[-1].name[:12]} (no refs/{wanted})"


def find_model_config(
    deployment: Any,
    *,
    rootpath: Path | None = None,
    environ: Mapping[str, str] | None = None,
    tiny_model_dir: Path | None = None,
) -> ModelConfigLookup:
    """Where the deployment's model config.json is on this host, or why it was not found."""
    env = os.environ if environ is None else environ
    where = f"deployment {deployment.name}"
    if deployment.model_config is not None:
        path = Path(deployment.model_config).expanduser()
        if not path.is_absolute():
            path = (rootpath or Path.cwd()) / path
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return ModelConfigLookup(path, f"model_config of {where}")
        return ModelConfigLookup(None, f"model_config of {where}",
                                 f"model_config {deployment.model_config!r} of {where}: {path} does not exist")
    if deployment.model == TINY_MODEL:
        if tiny_model_dir is None:
            from pytest_kimiperf.server.tiny_model import tiny_model_dir as default_dir

            tiny_model_dir = default_dir()
        path = tiny_model_dir / "config.json"
        if path.is_file():
            return ModelConfigLookup(path, "the tiny model's build")
        return ModelConfigLookup(None, "the tiny model's build",
                                 f"the tiny model is not built yet ({path} does not exist)")
    local = Path(deployment.model).expanduser()
    if local.is_dir():
        path = local / "config.json"
        if path.is_file():
            return ModelConfigLookup(path, "the local model directory")
        return ModelConfigLookup(None, "the local model directory", f"{path} does not exist")
    if local.is_absolute() or deployment.model.startswith((".", "~")) or deployment.model.count("/") > 1:
        return ModelConfigLookup(None, "the local model directory",
                                 f"model {deployment.model!r} of {where} is not a directory on this host; "
                                 "set model_config in the deployment")
    snapshot, source = _hub_snapshot(deployment.model, deployment.revision, hub_cache_dir(env))
    if snapshot is None:
        return ModelConfigLookup(None, "Hugging Face cache",
                                 f"{source}; set model_config in the deployment to its config.json")
    return ModelConfigLookup(snapshot / "config.json", source)


def text_config(config: Mapping[str, Any], *, source: str) -> Mapping[str, Any]:
    """The language model's part of ``config``: its ``text_config`` when it has one, else itself."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"{source} must be a JSON object (config.json), got {type(config).__name__}"
        )
    # Multimodal wrappers (Kimi-K2.5, Llava, Qwen-VL) keep the language model in text_config.
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, Mapping):
        raise ConfigError(f"text_config in {source} must be an object, got {text!r}")
    return text


def first_present(*configs: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The first of ``keys`` set (not None) in the first of ``configs`` that has one, else None."""
    for cfg in configs:
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
    return None


def positive_int_field(value: object, *, name: str, where: str) -> int:
    """``value`` if it is an integer >= 1 (not a bool); else a ConfigError naming the field and its source."""
    # Not numbers.positive_int: a config field has a name and a file it came from, and the
    # message says "<name> in <file> must be ...", which that rule's "<what>=<value>" cannot.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} in {where} must be a positive integer, got {value!r}")
    return value


def read_model_config(path: str | Path) -> dict[str, Any]:
    """Load a model's config.json (the file or its directory) as a dict for the tensor and quantization readers."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"model config {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model config {str(p)!r} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"model config {str(p)!r} must hold a JSON object, got {type(data).__name__}"
        )
    return data


# Weight formats and quantization schemes: the bytes each Linear module of a checkpoint takes.
_DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
    "int8": 1,
}

_WEIGHT_STRATEGIES = ("group", "tensor_group", "channel", "tensor", "block")


def _dtype_bytes(name: object, *, where: str) -> int:
    """Bytes per element of a dtype named as in config.json ("bfloat16", "torch.float16")."""
    if isinstance(name, str):
        key = name.removeprefix("torch.")
        if key in _DTYPE_BYTES:
            return _DTYPE_BYTES[key]
    raise ConfigError(
        f"unknown dtype {name!r} in {where}; known: {', '.join(sorted(_DTYPE_BYTES))}"
    )


@dataclass(frozen=True)
class WeightFormat:
    """How one weight matrix is stored: bits per element plus the scales (and zero points)
    that quantization adds, which decode reads too."""

    label: str
    bits: int
    # "none" (plain dtype), "group" (one scale per group_size inputs of a row), "channel" (one
    # per row), "tensor" (one per matrix), "block" (one per block[0] x block[1] tile).
    strategy: str = "none"
    group_size: int | None = None
    block: tuple[int, int] | None = None
    scale_bytes: int = 0
    zero_point_bits: int = 0
    # GPTQ with act-order keeps an int32 group index per input column (g_idx).
    index_bytes_per_input: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in ("none", "group", "channel", "tensor", "block"):
            raise ConfigError(
                f"weight format {self.label!r}: unknown strategy {self.strategy!r}; "
                "use none, group, channel, tensor or block"
            )
        if self.strategy == "group" and not (self.group_size and self.group_size > 0):
            raise ConfigError(f"weight format {self.label!r}: group strategy needs group_size > 0")
        if self.strategy == "block" and self.block is None:
            raise ConfigError(
                f"weight format {self.label!r}: block strategy needs block=(rows, cols)"
            )

    def matrix_bytes(self, rows: int, cols: int) -> int:
        """Bytes of a ``rows x cols`` matrix in this format, scales and zero points included."""
        data = math.ceil(rows * cols * self.bits / 8)
        if self.strategy == "none":
            n_scales = 0
        elif self.strategy == "group":
            assert self.group_size is not None
            n_scales = rows * math.ceil(cols / self.group_size)
        elif self.strategy == "channel":
            n_scales = rows
        elif self.strategy == "tensor":
            n_scales = 1
        elif self.strategy == "block":
            assert self.block is not None
            n_scales = math.ceil(rows / self.block[0]) * math.ceil(cols / self.block[1])
        else:  # refused by __post_init__
            raise AssertionError(self.strategy)
        zero_points = math.ceil(n_scales * self.zero_point_bits / 8)
        return data + n_scales * self.scale_bytes + zero_points + cols * self.index_bytes_per_input

    def vector_bytes(self, n: int) -> int:
        """Bytes of a 1-D tensor (norm weights, biases): never quantized, so plain elements."""
        return math.ceil(n * self.bits / 8)


@dataclass(frozen=True)
class QuantRule:
    """One compressed-tensors config group: which Linear modules it targets, in which format."""

    targets: tuple[str, ...]
    weight: WeightFormat


@dataclass(frozen=True)
class QuantScheme:
    """Which format each Linear module of a checkpoint is in, read from ``quantization_config``.

    ``dense`` is the format of everything not quantized (the checkpoint's dtype, bf16 by default).
    """

    method: str
    dense: WeightFormat
    rules: tuple[QuantRule, ...] = ()
    ignore: tuple[str, ...] = ()
    # "regex": compressed-tensors ignore entries ("re:<pattern>" matched with re.match, else the
    # exact module name). "substring": AWQ/GPTQ/FP8 modules_to_not_convert, which vLLM matches
    # as substrings of the module name (quantization/awq.py is_layer_skipped_awq).
    ignore_style: str = "regex"
    quantize_lm_head: bool = False

    @classmethod
    def unquantized(cls, dtype: str = "bfloat16") -> QuantScheme:
        """Every weight in ``dtype``: the scheme of a checkpoint without quantization_config."""
        nbytes = _dtype_bytes(dtype, where="QuantScheme.unquantized")
        return cls(method="none", dense=WeightFormat(label=dtype, bits=8 * nbytes))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, source: str = "model config") -> QuantScheme:
        """Read a HF config.json dict's ``quantization_config`` (compressed-tensors, gptq, awq,
        fp8); no quantization_config means every weight in the config's dtype (bf16 default)."""
        text = text_config(config, source=source)
        dtype_name = first_present(text, config, keys=("torch_dtype", "dtype")) or "bfloat16"
        dense_bytes = _dtype_bytes(dtype_name, where=f"{source} torch_dtype/dtype")
        dense = WeightFormat(label=str(dtype_name).removeprefix("torch."), bits=8 * dense_bytes)
        qcfg = first_present(config, text, keys=("quantization_config",))
        if qcfg is None:
            return cls(method="none", dense=dense)
        if not isinstance(qcfg, Mapping):
            raise ConfigError(f"quantization_config in {source} must be an object, got {qcfg!r}")
        method = qcfg.get("quant_method")
        where = f"{source} quantization_config"
        if method == "compressed-tensors":
            return _compressed_tensors_scheme(qcfg, dense, dense_bytes, where=where)
        if method == "gptq":
            return _gptq_scheme(qcfg, dense, where=where)
        if method == "awq":
            return _awq_scheme(qcfg, dense, where=where)
        if method == "fp8":
            return _fp8_scheme(qcfg, dense, where=where)
        raise ConfigError(
            f"unsupported quant_method {method!r} in {where}; supported: compressed-tensors, "
            "gptq, awq, fp8 (pass quant=QuantScheme(...) to describe another format)"
        )

    def format_for(self, module_name: str) -> WeightFormat:
        """Format of the Linear module ``module_name``, a HF module name such as
        "model.layers.3.mlp.experts.0.up_proj"."""
        if module_name == "lm_head" and not self.quantize_lm_head:
            return self.dense
        if self._ignored(module_name):
            return self.dense
        if self.ignore_style == "substring":
            # AWQ/GPTQ/FP8 quantize every Linear that is not listed as skipped.
            return self.rules[0].weight if self.rules else self.dense
        for rule in self.rules:
            if any(_target_matches(target, module_name) for target in rule.targets):
                return rule.weight
        return self.dense

    def _ignored(self, module_name: str) -> bool:
        if self.ignore_style == "substring":
            return any(entry in module_name for entry in self.ignore)
        return any(_target_matches(entry, module_name) for entry in self.ignore)


def _target_matches(target: str, module_name: str) -> bool:
    # compressed-tensors' own rule (utils/match.py): "re:" prefix = regex with re.match, a class
    # name matches every module of that class, anything else is an exact module name. Only Linear
    # modules are ever asked about here.
    if target.startswith("re:"):
        return re.match(target[3:], module_name) is not None
    return target == "Linear" or target == module_name


def _compressed_tensors_scheme(
    qcfg: Mapping[str, Any], dense: WeightFormat, dense_bytes: int, *, where: str
) -> QuantScheme:
    groups = qcfg.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ConfigError(f"{where} (compressed-tensors) has no config_groups object")
    rules: list[QuantRule] = []
    for group_name, group in groups.items():
        group_where = f"{where} config_groups.{group_name}"
        if not isinstance(group, Mapping):
            raise ConfigError(f"{group_where} must be an object, got {group!r}")
        weights = group.get("weights")
        if weights is None:  # activation-only group: weights stay dense
            continue
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ConfigError(f"{group_where}.targets must be a list of strings, got {targets!r}")
        rules.append(
            QuantRule(
                targets=tuple(targets),
                weight=_weight_format_from_compressed_tensors(
                    weights, dense_bytes, where=group_where
                ),
            )
        )
    ignore = qcfg.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(e, str) for e in ignore):
        raise ConfigError(f"{where}.ignore must be a list of strings, got {ignore!r}")
    return QuantScheme(
        method="compressed-tensors", dense=dense, rules=tuple(rules), ignore=tuple(ignore),
        ignore_style="regex",
    )


def _weight_format_from_compressed_tensors(
    weights: Any, dense_bytes: int, *, where: str
) -> WeightFormat:
    if not isinstance(weights, Mapping):
        raise ConfigError(f"{where}.weights must be an object, got {weights!r}")
    bits = positive_int_field(weights.get("num_bits"), name="weights.num_bits", where=where)
    strategy = weights.get("strategy", "tensor")
    kind = weights.get("type", "int")
    # Scales are stored in the checkpoint's dtype unless the group says otherwise (MXFP4
    # checkpoints declare "scale_dtype": "torch.uint8").
    scale_dtype = weights.get("scale_dtype")
    scale_bytes = dense_bytes if scale_dtype is None else _dtype_bytes(scale_dtype, where=where)
    zero_point_bits = 0 if weights.get("symmetric", True) else bits
    if strategy in ("group", "tensor_group"):
        # tensor_group (NVFP4) adds one global scale per tensor: a few bytes, left out.
        group_size = positive_int_field(
            weights.get("group_size"), name="weights.group_size", where=where
        )
        return WeightFormat(
            label=f"{kind}{bits} g{group_size}", bits=bits, strategy="group",
            group_size=group_size, scale_bytes=scale_bytes, zero_point_bits=zero_point_bits,
        )
    if strategy == "block":
        block = _block_shape(raw := weights.get("block_structure"))
        if block is None:
            raise ConfigError(f"weights.block_structure in {where} must be [rows, cols], got {raw!r}")
        return WeightFormat(
            label=f"{kind}{bits} block{block[0]}x{block[1]}", bits=bits, strategy="block",
            block=block, scale_bytes=scale_bytes, zero_point_bits=zero_point_bits,
        )
    if strategy in ("channel", "tensor"):
        return WeightFormat(
            label=f"{kind}{bits} per-{strategy}", bits=bits, strategy=strategy,
            scale_bytes=scale_bytes, zero_point_bits=zero_point_bits,
        )
    raise ConfigError(
        f"unsupported weights.strategy {strategy!r} in {where}; supported: "
        f"{', '.join(_WEIGHT_STRATEGIES)}"
    )


def _block_shape(value: object) -> tuple[int, int] | None:
    """``[rows, cols]`` of positive integers as a tuple; None for anything else."""
    if isinstance(value, list) and len(value) == 2 and all(isinstance(b, int) and b > 0 for b in value):
        return value[0], value[1]
    return None


def _skip_list(qcfg: Mapping[str, Any], keys: tuple[str, ...], *, where: str) -> tuple[str, ...]:
    for key in keys:
        value = qcfg.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key} in {where} must be a list of strings, got {value!r}")
        return tuple(value)
    return ()


def _group_format(bits: int, group_size: int, *, label: str, zero_point_bits: int,
                  index_bytes_per_input: int = 0) -> WeightFormat:
    # GPTQ/AWQ keep fp16 scales; group_size -1 means one scale per output row.
    strategy, size = ("channel", None) if group_size == -1 else ("group", group_size)
    return WeightFormat(label=label, bits=bits, strategy=strategy, group_size=size, scale_bytes=2,
                        zero_point_bits=zero_point_bits, index_bytes_per_input=index_bytes_per_input)


def _group_size(value: object, *, where: str) -> int:
    if value == -1:
        return -1
    return positive_int_field(value, name="group_size", where=where)


def _gptq_scheme(qcfg: Mapping[str, Any], dense: WeightFormat, *, where: str) -> QuantScheme:
    if qcfg.get("dynamic"):
        raise ConfigError(
            f"per-module GPTQ overrides ('dynamic') in {where} are not supported; "
            "pass quant=QuantScheme(...) describing the formats instead"
        )
    bits = positive_int_field(qcfg.get("bits"), name="bits", where=where)
    group_size = _group_size(qcfg.get("group_size", 128), where=where)
    sym = bool(qcfg.get("sym", True))
    desc_act = bool(qcfg.get("desc_act", False))
    # vLLM's GPTQ Marlin kernel reads zero points only for asymmetric checkpoints and the group
    # index only with act-order (desc_act).
    fmt = _group_format(
        bits, group_size, label=f"gptq int{bits} g{group_size}",
        zero_point_bits=0 if sym else bits, index_bytes_per_input=4 if desc_act else 0,
    )
    return QuantScheme(
        method="gptq", dense=dense, rules=(QuantRule(("Linear",), fmt),),
        ignore=_skip_list(qcfg, ("modules_to_not_convert",), where=where),
        ignore_style="substring", quantize_lm_head=bool(qcfg.get("lm_head", False)),
    )


def _awq_scheme(qcfg: Mapping[str, Any], dense: WeightFormat, *, where: str) -> QuantScheme:
    bits = positive_int_field(qcfg.get("bits", qcfg.get("w_bit")), name="bits (w_bit)", where=where)
    group_size = _group_size(qcfg.get("group_size", qcfg.get("q_group_size")), where=where)
    zero_point = bool(qcfg.get("zero_point", True))
    fmt = _group_format(bits, group_size, label=f"awq int{bits} g{group_size}",
                        zero_point_bits=bits if zero_point else 0)
    return QuantScheme(
        method="awq", dense=dense, rules=(QuantRule(("Linear",), fmt),),
        ignore=_skip_list(qcfg, ("modules_to_not_convert",), where=where), ignore_style="substring",
    )


def _fp8_scheme(qcfg: Mapping[str, Any], dense: WeightFormat, *, where: str) -> QuantScheme:
    # DeepSeek-V3 style block FP8 stores one fp32 scale (weight_scale_inv) per block; plain FP8
    # one fp32 scale per tensor.
    raw = qcfg.get("weight_block_size")
    block = _block_shape(raw)
    if raw is None:
        fmt = WeightFormat(label="fp8 per-tensor", bits=8, strategy="tensor", scale_bytes=4)
    elif block is not None:
        fmt = WeightFormat(label=f"fp8 block{block[0]}x{block[1]}", bits=8, strategy="block", block=block,
                           scale_bytes=4)
    else:
        raise ConfigError(f"weight_block_size in {where} must be [rows, cols], got {raw!r}")
    return QuantScheme(
        method="fp8", dense=dense, rules=(QuantRule(("Linear",), fmt),),
        ignore=_skip_list(qcfg, ("ignored_layers", "modules_to_not_convert"), where=where),
        ignore_style="substring",
    )


# The model's tensors, as vLLM shards them.

# Breakdown keys, in the order a decoded token meets them.
TENSOR_CLASSES: tuple[str, ...] = (
    "embedding",
    "attention_replicated",
    "attention_sharded",
    "norm",
    "dense_mlp",
    "router",
    "routed_experts",
    "shared_experts",
    "lm_head",
)


@dataclass(frozen=True)
class WeightTensor:
    """One weight (or a set of identical ones, e.g. a layer's routed experts) as decode sees it."""

    name: str  # HF module name, the one quantization_config patterns are written against
    tensor_class: str  # one of TENSOR_CLASSES
    kind: str  # "linear", "embedding", "norm", "router" (vLLM never quantizes the router), "bias"
    shape: tuple[int, ...]  # full tensor: (out, in) for matrices, (n,) for vectors
    rank_shape: tuple[int, ...]  # the part one tensor-parallel rank holds
    copies: int = 1  # identical tensors this entry stands for (routed experts of a layer)
    read_per_token: int = 1  # how many of the copies one decoded token reads (active experts)


class _Reader:
    """Reads integer fields of a text config, naming the field and source when one is bad."""

    def __init__(self, text: Mapping[str, Any], source: str) -> None:
        self.text = text
        self.source = source

    def required(self, key: str, default: int | None = None) -> int:
        value = self.text.get(key)
        if value is None:
            if default is not None:
                return default
            raise ConfigError(f"{self.source} lacks {key!r}, needed for the roofline estimate")
        return positive_int_field(value, name=repr(key), where=self.source)

    def optional(self, key: str) -> int | None:
        if self.text.get(key) is None:
            return None
        return self.required(key)

    def count(self, key: str, default: int = 0) -> int:
        """A non-negative count (first_k_dense_replace may be 0)."""
        value = self.text.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(
                f"{key!r} in {self.source} must be a non-negative integer, got {value!r}"
            )
        return value


def _split(n: int, tp: int) -> int:
    return math.ceil(n / tp)


def _check_tp(tp: object) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor-parallel size tp must be an integer >= 1, got {tp!r}")
    return tp


@dataclass(frozen=True)
class _ModelDims:
    """The sizes every layout has: layers, hidden width, attention heads, vocabulary."""

    layers: int
    hidden: int
    heads: int
    vocab: int


@dataclass(frozen=True)
class _MlaDims:
    """DeepSeek-V2/V3/Kimi multi-head latent attention: the low ranks and per-head widths."""

    q_lora: int | None
    kv_lora: int
    nope: int
    rope: int
    v_dim: int


@dataclass(frozen=True)
class _GqaDims:
    """Llama-style MHA/GQA: the width of a head and how many KV heads there are."""

    head_dim: int
    kv_heads: int


@dataclass(frozen=True)
class _Experts:
    """A DeepSeek-style MoE block: routed experts (``top_k`` active per token) and shared ones."""

    n_routed: int
    top_k: int
    moe_inter: int
    n_shared: int
    correction_bias: bool  # topk_method noaux_tc: the router carries an fp32 score bias


@dataclass(frozen=True)
class _MoeLayout:
    """Which layers hold a MoE block (``experts`` None: none does)."""

    experts: _Experts | None
    every: int
    first_dense: int

    def is_moe_layer(self, i: int) -> bool:
        return self.experts is not None and i >= self.first_dense and i % self.every == 0


class _TensorList:
    """The weights listed so far, each added as vLLM shards it across ``tp`` ranks."""

    def __init__(self, tp: int) -> None:
        self.tp = tp
        self.tensors: list[WeightTensor] = []

    def add(self, name: str, tensor_class: str, kind: str, shape: tuple[int, ...],
            rank_shape: tuple[int, ...], copies: int = 1, read: int = 1) -> None:
        self.tensors.append(WeightTensor(name, tensor_class, kind, shape, rank_shape, copies, read))

    def column(self, name: str, cls: str, rows: int, cols: int, copies: int = 1, read: int = 1) -> None:
        self.add(name, cls, "linear", (rows, cols), (_split(rows, self.tp), cols), copies, read)

    def row(self, name: str, cls: str, rows: int, cols: int, copies: int = 1, read: int = 1) -> None:
        self.add(name, cls, "linear", (rows, cols), (rows, _split(cols, self.tp)), copies, read)

    def replicated(self, name: str, cls: str, rows: int, cols: int) -> None:
        self.add(name, cls, "linear", (rows, cols), (rows, cols))

    def norm(self, name: str, n: int) -> None:
        self.add(name, "norm", "norm", (n,), (n,))


def weight_tensors(
    config: Mapping[str, Any], *, tp: int = 1, source: str = "model config"
) -> tuple[WeightTensor, ...]:
    """List the weights of a HF config.json's language model with what one TP rank holds.

    Supports Llama-style MHA/GQA, DeepSeek-V2/V3/Kimi MLA, and DeepSeek-style MoE
    (n_routed_experts, shared experts, first_k_dense_replace, moe_layer_freq). Biases
    (attention_bias, mlp_bias) are left out: a few KB against MB-sized matrices.
    """
    tp = _check_tp(tp)
    text = text_config(config, source=source)
    where = f"{source} text_config" if text is not config else source
    r = _Reader(text, where)
    _refuse_other_moe_layouts(text, where)
    dims = _model_dims(r, tp, where)
    is_mla = text.get("kv_lora_rank") is not None
    n_routed = r.count("n_routed_experts")
    # A wrapper's text_config knows its own lm_head; the top level answers for plain configs.
    tied = bool(first_present(text, config, keys=("tie_word_embeddings",)))
    out = _TensorList(tp)
    # VocabParallelEmbedding: each rank holds vocab/tp rows, a token reads one row on one rank.
    out.add("model.embed_tokens", "embedding", "embedding", (dims.vocab, dims.hidden),
            (_split(dims.vocab, tp), dims.hidden))
    attention = _mla_dims(r) if is_mla else _gqa_dims(r, dims)
    moe = _moe_layout(r, text, n_routed, where)
    for i in range(dims.layers):
        p = f"model.layers.{i}"
        out.norm(f"{p}.input_layernorm", dims.hidden)
        if isinstance(attention, _MlaDims):
            _add_mla_attention(out, f"{p}.self_attn", dims, attention)
        else:
            _add_gqa_attention(out, f"{p}.self_attn", dims, attention)
        out.norm(f"{p}.post_attention_layernorm", dims.hidden)
        if moe.is_moe_layer(i):
            assert moe.experts is not None
            _add_moe_block(out, f"{p}.mlp", dims.hidden, moe.experts)
        else:
            _add_dense_mlp(out, f"{p}.mlp", dims.hidden, r.required("intermediate_size"))
    out.norm("model.norm", dims.hidden)
    # ParallelLMHead splits the vocabulary across ranks (vLLM pads it to a multiple of 64 per
    # rank, ignored here). A tied lm_head is the embedding matrix, read in full.
    lm_name = "model.embed_tokens" if tied else "lm_head"
    out.add(lm_name, "lm_head", "linear", (dims.vocab, dims.hidden), (_split(dims.vocab, tp), dims.hidden))
    return tuple(out.tensors)


def _refuse_other_moe_layouts(text: Mapping[str, Any], where: str) -> None:
    for other_moe in ("num_local_experts", "num_experts"):
        if text.get(other_moe) and text.get("n_routed_experts") is None:
            raise ConfigError(
                f"{where} describes a MoE through {other_moe!r} (model_type "
                f"{text.get('model_type')!r}); only the DeepSeek-style MoE layout "
                "(n_routed_experts, num_experts_per_tok, moe_intermediate_size) is supported"
            )


def _model_dims(r: _Reader, tp: int, where: str) -> _ModelDims:
    dims = _ModelDims(
        layers=r.required("num_hidden_layers"),
        hidden=r.required("hidden_size"),
        heads=r.required("num_attention_heads"),
        vocab=r.required("vocab_size"),
    )
    if dims.heads % tp:
        # vLLM asserts the same (deepseek_v2.py, llama.py: num_heads % tp_size == 0).
        raise ConfigError(
            f"num_attention_heads {dims.heads} in {where} is not divisible by tp={tp}; vLLM needs "
            "whole heads per rank"
        )
    return dims


def _mla_dims(r: _Reader) -> _MlaDims:
    return _MlaDims(
        q_lora=r.optional("q_lora_rank"),
        kv_lora=r.required("kv_lora_rank"),
        nope=r.required("qk_nope_head_dim"),
        rope=r.required("qk_rope_head_dim"),
        v_dim=r.required("v_head_dim"),
    )


def _gqa_dims(r: _Reader, dims: _ModelDims) -> _GqaDims:
    return _GqaDims(
        head_dim=r.required("head_dim", default=dims.hidden // dims.heads),
        kv_heads=r.required("num_key_value_heads", default=dims.heads),
    )


def _moe_layout(r: _Reader, text: Mapping[str, Any], n_routed: int, where: str) -> _MoeLayout:
    every = r.required("moe_layer_freq", default=1)
    first_dense = r.count("first_k_dense_replace")
    if not n_routed:
        return _MoeLayout(None, every, first_dense)
    top_k = r.required("num_experts_per_tok")
    moe_inter = r.required("moe_intermediate_size")
    n_shared = r.count("n_shared_experts")
    if top_k > n_routed:
        raise ConfigError(
            f"num_experts_per_tok {top_k} in {where} exceeds n_routed_experts {n_routed}"
        )
    experts = _Experts(n_routed, top_k, moe_inter, n_shared,
                       correction_bias=text.get("topk_method") == "noaux_tc")
    return _MoeLayout(experts, every, first_dense)


def _add_mla_attention(out: _TensorList, a: str, dims: _ModelDims, mla: _MlaDims) -> None:
    # vLLM deepseek_v2.py (DeepseekV2MLAAttention): q_a_proj and kv_a_proj_with_mqa are
    # fused into DeepSeekV2FusedQkvAProjLinear(disable_tp=True), i.e. replicated on every
    # rank (ReplicatedLinear when q_lora_rank is None), as are q_a_layernorm and
    # kv_a_layernorm; q_b_proj/q_proj and kv_b_proj are ColumnParallelLinear over heads and
    # o_proj is RowParallelLinear. Decode's weight absorption splits kv_b_proj into W_UK
    # and W_UV of the same size, so its shard is what is read.
    hidden, heads = dims.hidden, dims.heads
    if mla.q_lora is not None:
        out.replicated(f"{a}.q_a_proj", "attention_replicated", mla.q_lora, hidden)
        out.norm(f"{a}.q_a_layernorm", mla.q_lora)
        out.column(f"{a}.q_b_proj", "attention_sharded", heads * (mla.nope + mla.rope), mla.q_lora)
    else:
        out.column(f"{a}.q_proj", "attention_sharded", heads * (mla.nope + mla.rope), hidden)
    out.replicated(f"{a}.kv_a_proj_with_mqa", "attention_replicated", mla.kv_lora + mla.rope, hidden)
    out.norm(f"{a}.kv_a_layernorm", mla.kv_lora)
    out.column(f"{a}.kv_b_proj", "attention_sharded", heads * (mla.nope + mla.v_dim), mla.kv_lora)
    out.row(f"{a}.o_proj", "attention_sharded", hidden, heads * mla.v_dim)


def _add_gqa_attention(out: _TensorList, a: str, dims: _ModelDims, gqa: _GqaDims) -> None:
    hidden, heads, head_dim = dims.hidden, dims.heads, gqa.head_dim
    out.column(f"{a}.q_proj", "attention_sharded", heads * head_dim, hidden)
    # QKVParallelLinear: with fewer KV heads than ranks each rank keeps one whole KV head
    # (a replica), so a rank reads max(1, kv_heads / tp) heads.
    kv_rank_rows = max(1, gqa.kv_heads // out.tp) * head_dim
    for proj in ("k_proj", "v_proj"):
        out.add(f"{a}.{proj}", "attention_sharded", "linear", (gqa.kv_heads * head_dim, hidden),
                (kv_rank_rows, hidden))
    out.row(f"{a}.o_proj", "attention_sharded", hidden, heads * head_dim)


def _add_moe_block(out: _TensorList, m: str, hidden: int, experts: _Experts) -> None:
    n_routed, top_k, moe_inter = experts.n_routed, experts.top_k, experts.moe_inter
    # vLLM's router is GateLinear(ReplicatedLinear), built without quant_config
    # (fused_moe, deepseek_v2.py DeepseekV2MoE): replicated and never quantized.
    out.add(f"{m}.gate", "router", "router", (n_routed, hidden), (n_routed, hidden))
    if experts.correction_bias:
        out.add(f"{m}.gate.e_score_correction_bias", "router", "bias_fp32", (n_routed,), (n_routed,))
    # FusedMoE without expert parallelism splits every expert's intermediate dimension
    # across ranks (w13 column-wise, w2 row-wise), so each rank reads 1/tp of every
    # active expert. The expert index in the name is a representative for the pattern
    # match: quantization configs address experts by module name, not index.
    e = f"{m}.experts.0"
    out.column(f"{e}.gate_proj", "routed_experts", moe_inter, hidden, n_routed, top_k)
    out.column(f"{e}.up_proj", "routed_experts", moe_inter, hidden, n_routed, top_k)
    out.row(f"{e}.down_proj", "routed_experts", hidden, moe_inter, n_routed, top_k)
    if experts.n_shared:
        # DeepseekV2MoE: one DeepseekV2MLP of moe_intermediate_size * n_shared_experts,
        # tensor-parallel like a dense MLP.
        shared_inter = moe_inter * experts.n_shared
        s = f"{m}.shared_experts"
        out.column(f"{s}.gate_proj", "shared_experts", shared_inter, hidden)
        out.column(f"{s}.up_proj", "shared_experts", shared_inter, hidden)
        out.row(f"{s}.down_proj", "shared_experts", hidden, shared_inter)


def _add_dense_mlp(out: _TensorList, m: str, hidden: int, inter: int) -> None:
    out.column(f"{m}.gate_proj", "dense_mlp", inter, hidden)
    out.column(f"{m}.up_proj", "dense_mlp", inter, hidden)
    out.row(f"{m}.down_proj", "dense_mlp", hidden, inter)


# Bytes per token.


@dataclass(frozen=True)
class ClassBytes:
    """Bytes one decoded token reads from one tensor class."""

    total_bytes: int
    per_gpu_bytes: int


@dataclass(frozen=True)
class WeightBytes:
    """Weight bytes one decoded token reads: in the whole model and on one TP rank.

    ``per_gpu_bytes`` counts replicated tensors on every rank; ``total_bytes`` counts each
    distinct weight once, so it does not depend on tp.
    """

    tp: int
    total_bytes: int
    per_gpu_bytes: int
    breakdown: Mapping[str, ClassBytes]

    def table(self) -> str:
        """The breakdown as aligned text lines (class, total bytes, per-GPU bytes), for reports."""
        rows = [("tensor class", "total bytes", f"per GPU bytes (tp={self.tp})")]
        rows += [
            (name, f"{b.total_bytes:,}", f"{b.per_gpu_bytes:,}")
            for name, b in self.breakdown.items()
        ]
        rows.append(("sum", f"{self.total_bytes:,}", f"{self.per_gpu_bytes:,}"))
        return "\n".join(f"{a:<22}{b:>18}{c:>26}" for a, b, c in rows)


def _tensor_bytes(t: WeightTensor, shape: tuple[int, ...], quant: QuantScheme) -> int:
    if t.kind == "embedding":
        return quant.dense.vector_bytes(shape[1])  # one row per token
    if t.kind == "bias_fp32":
        return 4 * shape[0]
    if len(shape) == 1:
        return quant.dense.vector_bytes(shape[0])
    fmt = quant.format_for(t.name) if t.kind == "linear" else quant.dense
    return fmt.matrix_bytes(shape[0], shape[1])


def weight_bytes_per_token(
    config: Mapping[str, Any],
    *,
    tp: int,
    quant: QuantScheme | None = None,
    source: str = "model config",
) -> WeightBytes:
    """Weight bytes a single decode step reads, total and per GPU at tensor-parallel size ``tp``.

    ``config`` is a HF config.json dict; ``quant`` defaults to ``QuantScheme.from_config(config)``.
    """
    tp = _check_tp(tp)
    scheme = quant if quant is not None else QuantScheme.from_config(config, source=source)
    totals = {name: [0, 0] for name in TENSOR_CLASSES}
    for t in weight_tensors(config, tp=tp, source=source):
        totals[t.tensor_class][0] += t.read_per_token * _tensor_bytes(t, t.shape, scheme)
        totals[t.tensor_class][1] += t.read_per_token * _tensor_bytes(t, t.rank_shape, scheme)
    breakdown = {name: ClassBytes(v[0], v[1]) for name, v in totals.items() if v[0]}
    return WeightBytes(
        tp=tp,
        total_bytes=sum(b.total_bytes for b in breakdown.values()),
        per_gpu_bytes=sum(b.per_gpu_bytes for b in breakdown.values()),
        breakdown=breakdown,
    )


def tp_collectives_per_token(
    config: Mapping[str, Any], *, tp: int, source: str = "model config"
) -> int:
    """Collectives one decode step waits for under tensor parallelism (0 when tp == 1).

    Per layer, vLLM all-reduces after attention (o_proj is RowParallelLinear, reduce_results) and
    after the MLP or MoE block (down_proj / FusedMoE reduce_results): 2 per layer. Outside the
    layers, VocabParallelEmbedding.forward all-reduces the looked-up rows and LogitsProcessor
    gathers the vocab-sharded logits: 2 more. Kimi-K2.5 (61 layers): 2 x 61 + 2 = 124.
    """
    tp = _check_tp(tp)
    if tp == 1:
        return 0
    text = text_config(config, source=source)
    layers = _Reader(text, source).required("num_hidden_layers")
    return 2 * layers + 2

__all__ = [
    "ClassBytes", "ModelConfigLookup", "QuantRule", "QuantScheme", "TENSOR_CLASSES", "WeightBytes",
    "WeightFormat", "WeightTensor", "find_model_config", "first_present", "hub_cache_dir",
    "positive_int_field", "read_model_config", "text_config", "tp_collectives_per_token",
    "weight_bytes_per_token", "weight_tensors",
]
