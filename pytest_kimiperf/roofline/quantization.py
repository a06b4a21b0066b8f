"""Weight formats and quantization schemes: how many bytes each Linear module of a checkpoint
takes, read from its ``quantization_config`` (compressed-tensors, GPTQ, AWQ, FP8).

Each rule follows how vLLM loads the format (cited where it matters): which modules a scheme
skips, which scales and zero points decode reads with the weights.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.roofline.model_config import first_present, positive_int_field, text_config

__all__ = ["QuantRule", "QuantScheme", "WeightFormat"]

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


def _dense_format(dtype_bytes: int, label: str) -> WeightFormat:
    return WeightFormat(label=label, bits=8 * dtype_bytes)


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
        return cls(method="none", dense=_dense_format(nbytes, dtype))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, source: str = "model config") -> QuantScheme:
        """Read a HF config.json dict's ``quantization_config`` (compressed-tensors, gptq, awq,
        fp8); no quantization_config means every weight in the config's dtype (bf16 default)."""
        text = text_config(config, source=source)
        dtype_name = first_present(text, config, keys=("torch_dtype", "dtype")) or "bfloat16"
        dense_bytes = _dtype_bytes(dtype_name, where=f"{source} torch_dtype/dtype")
        dense = _dense_format(dense_bytes, str(dtype_name).removeprefix("torch."))
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
        block = weights.get("block_structure")
        if (
            not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise ConfigError(
                f"weights.block_structure in {where} must be [rows, cols], got {block!r}"
            )
        return WeightFormat(
            label=f"{kind}{bits} block{block[0]}x{block[1]}", bits=bits, strategy="block",
            block=(block[0], block[1]), scale_bytes=scale_bytes, zero_point_bits=zero_point_bits,
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
    if group_size == -1:
        return WeightFormat(label=label, bits=bits, strategy="channel", scale_bytes=2,
                            zero_point_bits=zero_point_bits,
                            index_bytes_per_input=index_bytes_per_input)
    return WeightFormat(label=label, bits=bits, strategy="group", group_size=group_size,
                        scale_bytes=2, zero_point_bits=zero_point_bits,
                        index_bytes_per_input=index_bytes_per_input)


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
    block = qcfg.get("weight_block_size")
    # DeepSeek-V3 style block FP8 stores one fp32 scale (weight_scale_inv) per block; plain FP8
    # one fp32 scale per tensor.
    if block is None:
        fmt = WeightFormat(label="fp8 per-tensor", bits=8, strategy="tensor", scale_bytes=4)
    elif (
        isinstance(block, list) and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        fmt = WeightFormat(label=f"fp8 block{block[0]}x{block[1]}", bits=8, strategy="block",
                           block=(block[0], block[1]), scale_bytes=4)
    else:
        raise ConfigError(f"weight_block_size in {where} must be [rows, cols], got {block!r}")
    return QuantScheme(
        method="fp8", dense=dense, rules=(QuantRule(("Linear",), fmt),),
        ignore=_skip_list(qcfg, ("ignored_layers", "modules_to_not_convert"), where=where),
        ignore_style="substring",
    )
