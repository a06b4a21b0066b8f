"""Roofline arithmetic: every expected number below is derived by hand in the comment above it."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.roofline.ceiling import (
    BOUND_BY_ALLREDUCE,
    BOUND_BY_BANDWIDTH,
    default_allreduce_latency_us,
    estimate,
    gpu_bandwidth_gbs,
    measure_cpu_copy_bandwidth_gbs,
)
from pytest_kimiperf.roofline.weights import read_model_config
from pytest_kimiperf.roofline.weights import QuantScheme, WeightFormat
from pytest_kimiperf.roofline.weights import tp_collectives_per_token, weight_bytes_per_token, weight_tensors
from tests import helpers

CONFIGS = helpers.DATA / "model_configs"


@pytest.fixture(scope="module")
def kimi() -> dict[str, Any]:
    return read_model_config(CONFIGS / "kimi-k2.5")


@pytest.fixture(scope="module")
def tiny_llama() -> dict[str, Any]:
    return read_model_config(CONFIGS / "tiny-llama")


def tiny_moe(**overrides: Any) -> dict[str, Any]:
    """DeepSeek-style MoE, plain MHA: layer 0 dense, layer 1 MoE (8 experts, 2 active, 1 shared)."""
    config: dict[str, Any] = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "intermediate_size": 256,
        "vocab_size": 100,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    config.update(overrides)
    return config


def tiny_mla(**overrides: Any) -> dict[str, Any]:
    """One dense layer with DeepSeek MLA attention."""
    config: dict[str, Any] = {
        "num_hidden_layers": 1,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "q_lora_rank": 16,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "intermediate_size": 128,
        "vocab_size": 50,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


# --- the tiny CPU model -----------------------------------------------------------------------


def test_tiny_llama_tensors_are_exactly_the_checkpoints(tiny_llama: dict[str, Any]) -> None:
    # The enumeration must name and shape every tensor the way the real safetensors file does,
    # or quantization patterns and byte counts would address tensors that do not exist.
    header = json.loads((CONFIGS / "tiny-llama" / "safetensors_header.json").read_text())
    listed = {f"{t.name}.weight": list(t.shape) for t in weight_tensors(tiny_llama)}
    assert listed == {name: entry["shape"] for name, entry in header.items()}
    assert {entry["dtype"] for entry in header.values()} == {"BF16"}


def test_tiny_llama_bytes_per_token(tiny_llama: dict[str, Any]) -> None:
    # hidden 128, heads 4 x head_dim 32, kv heads 2, intermediate 256, vocab 320, bf16 (2 B):
    #   per layer: q 128x128x2 = 32,768; k, v 64x128x2 = 16,384 each; o 32,768;
    #              gate, up 256x128x2 = 65,536 each; down 65,536; 2 norms 128x2 = 256 each
    #              = 32,768 + 32,768 + 32,768 + 196,608 + 512 = 295,424
    #   2 layers 590,848 + lm_head 320x128x2 = 81,920 + final norm 256 + one embedding row 256
    #   = 673,280
    wb = weight_bytes_per_token(tiny_llama, tp=1)
    assert wb.total_bytes == wb.per_gpu_bytes == 673_280
    # Cross-check with the checkpoint: everything but the embedding matrix, plus one row of it.
    header = json.loads((CONFIGS / "tiny-llama" / "safetensors_header.json").read_text())
    stored = sum(2 * math.prod(entry["shape"]) for entry in header.values())
    assert wb.total_bytes == stored - 320 * 128 * 2 + 128 * 2


def test_tiny_llama_gqa_shards_and_replicates_kv_heads(tiny_llama: dict[str, Any]) -> None:
    # tp=2: 2 q heads, 1 kv head, half the MLP and lm_head per rank:
    #   q 64x128x2 = 16,384; k, v 32x128x2 = 8,192 each; o 128x64x2 = 16,384;
    #   gate, up 128x128x2 = 32,768 each; down 128x128x2 = 32,768; norms 512
    #   per layer 147,968 x 2 = 295,936 + lm_head 160x128x2 = 40,960 + 256 + 256 = 337,408
    assert weight_bytes_per_token(tiny_llama, tp=2).per_gpu_bytes == 337_408
    # tp=4: 1 q head, but 2 kv heads over 4 ranks means each rank keeps a whole kv head:
    #   q 32x128x2 = 8,192; k, v 32x128x2 = 8,192 each (not 4,096); o 128x32x2 = 8,192;
    #   gate, up 64x128x2 = 16,384 each; down 16,384; norms 512 -> 82,432 x 2 = 164,864
    #   + lm_head 80x128x2 = 20,480 + 256 + 256 = 185,856
    assert weight_bytes_per_token(tiny_llama, tp=4).per_gpu_bytes == 185_856
    # The distinct weights read do not depend on how they are split.
    assert weight_bytes_per_token(tiny_llama, tp=4).total_bytes == 673_280


def test_tiny_llama_has_no_collectives_alone_and_four_per_two_layers_with_tp(
    tiny_llama: dict[str, Any],
) -> None:
    # 2 allreduces per layer (attention, MLP) + embedding allreduce + logits gather.
    assert tp_collectives_per_token(tiny_llama, tp=1) == 0
    assert tp_collectives_per_token(tiny_llama, tp=2) == 2 * 2 + 2


# --- MoE, MLA -------------------------------------------------------------------------------


def test_tiny_moe_reads_only_active_experts() -> None:
    # hidden 64, bf16. Attention per layer: q, k, v, o 64x64x2 = 8,192 each = 32,768; norms 256.
    #   layer 0 dense MLP: 3 x 256x64x2 = 98,304
    #   layer 1 MoE: router 8x64x2 = 1,024; one expert 3 x 32x64x2 = 12,288, 2 active = 24,576;
    #                shared expert (32 wide) 12,288
    #   lm_head 100x64x2 = 12,800; final norm 128; embedding row 128
    #   = 2 x 33,024 + 98,304 + 1,024 + 24,576 + 12,288 + 12,800 + 128 + 128 = 215,296
    wb = weight_bytes_per_token(tiny_moe(), tp=1)
    assert wb.total_bytes == 215_296
    assert wb.breakdown["routed_experts"].total_bytes == 24_576
    assert wb.breakdown["router"].total_bytes == 1_024
    # tp=2: the router stays whole on each rank, everything else halves:
    #   (215,296 - 1,024 router - 2 x 256 layer norms - 128 final norm - 128 row) / 2
    #   + 1,024 + 512 + 128 + 128 = 213,504 / 2 + 1,792 = 108,544
    assert weight_bytes_per_token(tiny_moe(), tp=2).per_gpu_bytes == 108_544


def test_tiny_moe_int4_experts_count_their_scales() -> None:
    # Kimi's scheme on the tiny MoE: only routed experts in int4, group 32, bf16 scales.
    #   gate/up expert (32x64): 32x64x4/8 = 1,024 B packed + 32 x (64/32) x 2 = 128 B scales
    #   down (64x32): 1,024 + 64 x 1 x 2 = 128  -> 3 x 1,152 = 3,456 per expert, x2 = 6,912
    #   total 215,296 - 24,576 + 6,912 = 197,632
    kimi_config = json.loads((CONFIGS / "kimi-k2.5" / "config.json").read_text())
    kimi_like = kimi_config["quantization_config"]
    wb = weight_bytes_per_token(tiny_moe(quantization_config=kimi_like), tp=1)
    assert wb.breakdown["routed_experts"].total_bytes == 6_912
    assert wb.total_bytes == 197_632


def test_moe_layer_frequency_picks_moe_layers() -> None:
    # moe_layer_freq 2 with first_k_dense_replace 0 on 2 layers: layer 0 MoE, layer 1 dense.
    names = [t.name for t in weight_tensors(tiny_moe(first_k_dense_replace=0, moe_layer_freq=2))]
    assert "model.layers.0.mlp.experts.0.up_proj" in names
    assert "model.layers.1.mlp.up_proj" in names
    assert "model.layers.1.mlp.experts.0.up_proj" not in names


def test_tiny_mla_replicates_the_low_rank_projections() -> None:
    # 4 heads, q_lora 16, kv_lora 8, nope 8 + rope 4 = 12 per q head, v 8, hidden 64, bf16:
    #   q_a 16x64x2 = 2,048 (replicated); q_a_layernorm 16x2 = 32 (replicated)
    #   q_b (4x12)x16x2 = 1,536; kv_a (8+4)x64x2 = 1,536 (replicated); kv_a_layernorm 16
    #   kv_b (4x(8+8))x8x2 = 1,024; o 64x(4x8)x2 = 4,096
    #   attention 10,288 + layer norms 256 + MLP 3 x 128x64x2 = 49,152 + lm_head 50x64x2 = 6,400
    #   + final norm 128 + embedding row 128 = 66,352
    assert weight_bytes_per_token(tiny_mla(), tp=1).total_bytes == 66_352
    # tp=2: replicated q_a + kv_a + their norms 2,048 + 1,536 + 32 + 16 = 3,632;
    #   halved q_b 768 + kv_b 512 + o 2,048 = 3,328; norms 256; MLP 24,576;
    #   lm_head 25x64x2 = 3,200; 128 + 128 -> 35,248
    wb = weight_bytes_per_token(tiny_mla(), tp=2)
    assert wb.per_gpu_bytes == 35_248
    assert wb.breakdown["attention_replicated"].per_gpu_bytes == 2_048 + 1_536


def test_mla_without_q_lora_uses_a_sharded_q_proj() -> None:
    # q_lora_rank null (DeepSeek-V2-Lite): q_proj (4x12)x64x2 = 6,144 replaces
    #   q_a 2,048 + q_a_layernorm 32 + q_b 1,536 = 3,616 -> 66,352 - 3,616 + 6,144 = 68,880
    config = tiny_mla(q_lora_rank=None)
    assert weight_bytes_per_token(config, tp=1).total_bytes == 68_880
    assert "model.layers.0.self_attn.q_proj" in [t.name for t in weight_tensors(config)]


def test_tied_embeddings_read_the_embedding_matrix_as_lm_head(tiny_llama: dict[str, Any]) -> None:
    tied = dict(tiny_llama, tie_word_embeddings=True)
    lm = [t for t in weight_tensors(tied) if t.tensor_class == "lm_head"]
    assert [t.name for t in lm] == ["model.embed_tokens"]
    assert weight_bytes_per_token(tied, tp=1).total_bytes == 673_280


# --- Kimi-K2.5, the production target ---------------------------------------------------------


def test_kimi_k25_bytes_per_token_at_tp8(kimi: dict[str, Any]) -> None:
    # Kimi-K2.5 text_config: 61 layers (layer 0 dense), hidden 7168, 64 heads, MLA q_lora 1536,
    # kv_lora 512, nope 128, rope 64, v 128; 384 experts, 8 active + 1 shared, expert width 2048,
    # dense width 18432, vocab 163840. Routed experts int4 group 32 with bf16 scales, the rest
    # bf16 (ignore list: lm_head, self_attn, shared_experts, dense mlp).
    #
    # Attention per layer, bf16:
    #   replicated: q_a 1536x7168x2 = 22,020,096; kv_a_proj_with_mqa 576x7168x2 = 8,257,536
    #     x 61 = 1,846,935,552 (on every GPU)
    #   sharded: q_b 12288x1536x2 = 37,748,736; kv_b 16384x512x2 = 16,777,216;
    #     o 7168x8192x2 = 117,440,512 -> 171,966,464 x 61 = 10,489,954,304, / 8 = 1,311,244,288
    # Norms: (2 x 7168 + 1536 + 512) x 2 = 32,768 per layer x 61 + final 14,336 = 2,013,184
    # Dense layer 0 MLP: 3 x 18432x7168x2 = 792,723,456, / 8 = 99,090,432
    # MoE, 60 layers:
    #   router 384x7168x2 = 5,505,024 + e_score_correction_bias 384x4 = 1,536 -> 5,506,560
    #     x 60 = 330,393,600, replicated
    #   one expert: 3 x (2048x7168x4/8 = 7,340,032 packed + 2048x224x2 = 917,504 scales)
    #     = 24,772,608; matches the checkpoint's weight_packed int32 [2048, 896] = 7,340,032 B and
    #     weight_scale bf16 [2048, 224] = 917,504 B; x 8 active x 60 = 11,890,851,840, / 8
    #     = 1,486,356,480
    #   shared: 3 x 2048x7168x2 = 88,080,384 x 60 = 5,284,823,040, / 8 = 660,602,880
    # lm_head 163840x7168x2 = 2,348,810,240, / 8 = 293,601,280; embedding row 7168x2 = 14,336
    #
    # Per GPU: 14,336 + 1,846,935,552 + 1,311,244,288 + 2,013,184 + 99,090,432 + 330,393,600
    #   + 1,486,356,480 + 660,602,880 + 293,601,280 = 6,030,252,032 (~6.0 GB)
    wb = weight_bytes_per_token(kimi, tp=8)
    assert wb.per_gpu_bytes == 6_030_252_032
    expected_per_gpu = {
        "embedding": 14_336,
        "attention_replicated": 1_846_935_552,
        "attention_sharded": 1_311_244_288,
        "norm": 2_013_184,
        "dense_mlp": 99_090_432,
        "router": 330_393_600,
        "routed_experts": 1_486_356_480,
        "shared_experts": 660_602_880,
        "lm_head": 293_601_280,
    }
    assert {k: v.per_gpu_bytes for k, v in wb.breakdown.items()} == expected_per_gpu
    # Whole model per token: 14,336 + 1,846,935,552 + 10,489,954,304 + 2,013,184 + 792,723,456
    #   + 330,393,600 + 11,890,851,840 + 5,284,823,040 + 2,348,810,240 = 32,986,519,552
    assert wb.total_bytes == 32_986_519_552
    assert weight_bytes_per_token(kimi, tp=1).per_gpu_bytes == 32_986_519_552


def test_kimi_k25_formats_follow_the_ignore_list(kimi: dict[str, Any]) -> None:
    scheme = QuantScheme.from_config(kimi)
    assert scheme.format_for("model.layers.5.mlp.experts.0.down_proj").label == "int4 g32"
    for dense in (
        "lm_head",
        "model.layers.5.self_attn.q_a_proj",
        "model.layers.5.mlp.shared_experts.up_proj",
        "model.layers.0.mlp.gate_proj",
    ):
        assert scheme.format_for(dense) == scheme.dense, dense
    assert scheme.dense.bits == 16


def test_kimi_k25_ceilings_on_rtx_pro_6000(kimi: dict[str, Any]) -> None:
    bandwidth = gpu_bandwidth_gbs("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert bandwidth == 1792.0
    # Bandwidth ceiling: 1792e9 / 6,030,252,032 = 297.17 tok/s (3.3651 ms per token).
    # Collectives: 2 x 61 layers + embedding allreduce + logits gather = 124.
    # 124 x 30 us = 3.72 ms -> 1 / (3.3651 + 3.72) ms = 141.14 tok/s, communication dominates.
    roof = estimate(kimi, tp=8, bandwidth_gbs=bandwidth, allreduce_latency_us=30)
    assert roof.collectives_per_token == 124
    assert roof.bandwidth_ceiling_tok_s == pytest.approx(297.17, abs=0.01)
    assert roof.ceiling_tok_s == pytest.approx(141.14, abs=0.01)
    assert roof.binding_term == BOUND_BY_ALLREDUCE
    # The hand-measured 81.4-81.9 tok/s sits at 58% of that ceiling.
    assert roof.describe(81.9) == (
        "81.9 tok/s = 28% of the 297 tok/s bandwidth ceiling, 58% of the 141 tok/s ceiling "
        "with 124 collectives x 30 us; bound by allreduce latency"
    )
    # Latency range 25-48 us: 1 / (3.3651 + 3.10) ms = 154.68; 1 / (3.3651 + 5.952) ms = 107.33
    low = estimate(kimi, tp=8, bandwidth_gbs=bandwidth, allreduce_latency_us=48)
    high = estimate(kimi, tp=8, bandwidth_gbs=bandwidth, allreduce_latency_us=25)
    assert low.ceiling_tok_s == pytest.approx(107.33, abs=0.01)
    assert high.ceiling_tok_s == pytest.approx(154.68, abs=0.01)
    # Below 27.14 us per collective (3.3651 ms / 124) memory is the larger term.
    near = estimate(kimi, tp=8, bandwidth_gbs=bandwidth, allreduce_latency_us=27.0)
    assert near.binding_term == BOUND_BY_BANDWIDTH


def test_kimi_text_config_alone_gives_the_same_bytes(kimi: dict[str, Any]) -> None:
    # The wrapper's top-level quantization_config applies when the text config lacks one.
    text_only = copy.deepcopy(kimi["text_config"])
    wrapped_without_inner_quant = copy.deepcopy(kimi)
    del wrapped_without_inner_quant["text_config"]["quantization_config"]
    expected = 6_030_252_032
    assert weight_bytes_per_token(text_only, tp=8).per_gpu_bytes == expected
    assert weight_bytes_per_token(wrapped_without_inner_quant, tp=8).per_gpu_bytes == expected


def test_explicit_quant_overrides_the_config(kimi: dict[str, Any]) -> None:
    # All-bf16 Kimi: each routed expert becomes 3 x 2048x7168x2 = 88,080,384 B instead of
    # 24,772,608 -> per GPU + 8 x 60 x (88,080,384 - 24,772,608) / 8 = + 3,798,466,560
    #   = 9,828,718,592
    wb = weight_bytes_per_token(kimi, tp=8, quant=QuantScheme.unquantized("bfloat16"))
    assert wb.per_gpu_bytes == 9_828_718_592


# --- quantization formats ---------------------------------------------------------------------


def test_weight_format_byte_counts() -> None:
    # 256 x 512 matrix.
    # int4 group 128, fp16 scales, 4-bit zero points: 65,536 + 256x4x2 = 2,048 + 1,024/2 = 512
    assert WeightFormat("awq", 4, "group", group_size=128, scale_bytes=2, zero_point_bits=4) \
        .matrix_bytes(256, 512) == 65_536 + 2_048 + 512
    # fp8 block 128x128 with fp32 scales: 131,072 + 2x4 blocks x 4 = 32
    assert WeightFormat("fp8", 8, "block", block=(128, 128), scale_bytes=4) \
        .matrix_bytes(256, 512) == 131_072 + 32
    # per-channel int8 with bf16 scales: 131,072 + 256 x 2
    assert WeightFormat("w8", 8, "channel", scale_bytes=2).matrix_bytes(256, 512) == 131_072 + 512


def test_weight_format_refuses_incomplete_descriptions() -> None:
    with pytest.raises(ConfigError, match="unknown strategy 'rows'"):
        WeightFormat("x", 4, "rows")
    with pytest.raises(ConfigError, match="group strategy needs group_size"):
        WeightFormat("x", 4, "group")


def test_gptq_awq_fp8_schemes_from_config() -> None:
    base = tiny_mla()
    gptq = QuantScheme.from_config(dict(base, quantization_config={
        "quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": True,
    }))
    fmt = gptq.format_for("model.layers.0.self_attn.o_proj")
    # act-order adds an int32 index per input column; symmetric needs no zero points.
    assert (fmt.bits, fmt.group_size, fmt.zero_point_bits) == (4, 128, 0)
    assert fmt.index_bytes_per_input == 4
    assert gptq.format_for("lm_head") == gptq.dense

    awq = QuantScheme.from_config(dict(base, quantization_config={
        "quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
        "modules_to_not_convert": ["kv_a_proj"],
    }))
    assert awq.format_for("model.layers.0.mlp.up_proj").zero_point_bits == 4
    assert awq.format_for("model.layers.0.self_attn.kv_a_proj_with_mqa") == awq.dense

    fp8 = QuantScheme.from_config(dict(base, quantization_config={
        "quant_method": "fp8", "weight_block_size": [128, 128],
    }))
    assert fp8.format_for("model.layers.0.mlp.down_proj").block == (128, 128)


def test_unknown_quant_method_is_named() -> None:
    config = dict(tiny_mla(), quantization_config={"quant_method": "bitsandbytes"})
    with pytest.raises(ConfigError, match=r"unsupported quant_method 'bitsandbytes' in cfg\.json"):
        QuantScheme.from_config(config, source="cfg.json")


def test_bad_compressed_tensors_group_is_named(kimi: dict[str, Any]) -> None:
    broken = copy.deepcopy(kimi)
    broken["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 0
    del broken["text_config"]["quantization_config"]
    with pytest.raises(ConfigError, match=r"weights\.group_size .*config_groups\.group_0.* got 0"):
        weight_bytes_per_token(broken, tp=8)


def test_unknown_dtype_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown dtype 'float7'"):
        weight_bytes_per_token(tiny_mla(torch_dtype="float7"), tp=1)


# --- config errors ----------------------------------------------------------------------------


def test_missing_field_names_field_and_source() -> None:
    config = tiny_mla()
    del config["hidden_size"]
    with pytest.raises(ConfigError, match=r"my/config\.json lacks 'hidden_size'"):
        weight_bytes_per_token(config, tp=1, source="my/config.json")


def test_heads_not_divisible_by_tp(kimi: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"num_attention_heads 64 .* not divisible by tp=3"):
        weight_bytes_per_token(kimi, tp=3)


@pytest.mark.parametrize("tp", [0, -1, 2.0, True])
def test_bad_tp(tiny_llama: dict[str, Any], tp: object) -> None:
    with pytest.raises(ConfigError, match="tensor-parallel size tp"):
        weight_bytes_per_token(tiny_llama, tp=tp)  # type: ignore[arg-type]


def test_other_moe_layouts_are_refused_not_miscounted() -> None:
    mixtral_like = {**tiny_mla(), "num_local_experts": 8, "model_type": "mixtral"}
    with pytest.raises(ConfigError, match=r"'num_local_experts' \(model_type 'mixtral'\)"):
        weight_bytes_per_token(mixtral_like, tp=1)


def test_read_model_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_model_config(tmp_path / "nope.json")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        read_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not readable JSON"):
        read_model_config(tmp_path)


# --- hardware ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nvml_name", "gbs"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 1792.0),
        ("NVIDIA H100 80GB HBM3", 3350.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA H100 NVL", 3900.0),
        ("NVIDIA H200", 4800.0),
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100 80GB PCIe", 1935.0),
        ("NVIDIA A100-SXM4-40GB", 1555.0),
        ("NVIDIA L40S", 864.0),
        ("NVIDIA L4", 300.0),
        ("NVIDIA GeForce RTX 4090", 1008.0),
        ("NVIDIA B200", 8000.0),
    ],
)
def test_gpu_bandwidth_by_nvml_name(nvml_name: str, gbs: float) -> None:
    assert gpu_bandwidth_gbs(nvml_name) == gbs


def test_gpu_bandwidth_override_and_unknown() -> None:
    assert gpu_bandwidth_gbs("NVIDIA H200", overrides={"nvidia h200": 4000}) == 4000.0
    assert gpu_bandwidth_gbs("Tesla X9", overrides={"Tesla X9": 123.5}) == 123.5
    with pytest.raises(ConfigError, match=r"bandwidth known for GPU 'Tesla X9'.*overrides="):
        gpu_bandwidth_gbs("Tesla X9")
    with pytest.raises(ConfigError, match="positive number of GB/s"):
        gpu_bandwidth_gbs("Tesla X9", overrides={"Tesla X9": -1})


def test_default_allreduce_latency() -> None:
    assert default_allreduce_latency_us("pcie") == 30.0
    with pytest.raises(ConfigError, match="pass allreduce_latency_us measured"):
        default_allreduce_latency_us("cpu")
    with pytest.raises(ConfigError, match="unknown interconnect 'infiniband'"):
        default_allreduce_latency_us("infiniband")


def test_cpu_copy_bandwidth_is_a_plausible_rate() -> None:
    # Any host that runs this suite copies DRAM faster than 0.5 GB/s and slower than 2 TB/s;
    # a unit slip (bytes vs GB, read-only vs read+write by 1000x) lands outside.
    gbs = measure_cpu_copy_bandwidth_gbs(duration_s=0.2, buffer_mib=64)
    assert 0.5 < gbs < 2000


@pytest.mark.parametrize("duration_s", [0, -1, float("nan"), 120])
def test_cpu_copy_bandwidth_rejects_bad_duration(duration_s: float) -> None:
    with pytest.raises(ConfigError, match="duration_s"):
        measure_cpu_copy_bandwidth_gbs(duration_s=duration_s)


# --- the estimate and its sentence ------------------------------------------------------------


def test_single_gpu_has_no_communication_term(tiny_llama: dict[str, Any]) -> None:
    # 10 GB/s / 673,280 B = 14,852.7 tok/s
    roof = estimate(tiny_llama, tp=1, bandwidth_gbs=10, allreduce_latency_us=30)
    assert roof.collectives_per_token == 0
    assert roof.ceiling_tok_s == roof.bandwidth_ceiling_tok_s == pytest.approx(14_852.7, abs=0.1)
    assert roof.describe(50) == (
        "50.0 tok/s = 0.34% of the 14,853 tok/s bandwidth ceiling; bound by memory bandwidth"
    )


def test_latency_unknown_leaves_comm_out_but_says_so(kimi: dict[str, Any]) -> None:
    roof = estimate(kimi, tp=8, bandwidth_gbs=1792, allreduce_latency_us=None)
    assert roof.ceiling_tok_s == roof.bandwidth_ceiling_tok_s
    assert "124 collectives not counted: no latency given" in roof.describe(81.9)


def test_measured_above_the_ceiling_is_flagged(tiny_llama: dict[str, Any]) -> None:
    roof = estimate(tiny_llama, tp=1, bandwidth_gbs=10, allreduce_latency_us=None)
    assert "above the ceiling" in roof.describe(20_000)
    assert "above the ceiling" not in roof.describe(14_000)


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan")])
def test_describe_rejects_bad_rates(tiny_llama: dict[str, Any], bad: float) -> None:
    roof = estimate(tiny_llama, tp=1, bandwidth_gbs=10, allreduce_latency_us=None)
    with pytest.raises(ConfigError, match="measured decode rate"):
        roof.describe(bad)


def test_estimate_rejects_bad_hardware_inputs(tiny_llama: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="memory bandwidth 0"):
        estimate(tiny_llama, tp=1, bandwidth_gbs=0, allreduce_latency_us=None)
    with pytest.raises(ConfigError, match="allreduce_latency_us"):
        estimate(tiny_llama, tp=2, bandwidth_gbs=10, allreduce_latency_us=-1)
