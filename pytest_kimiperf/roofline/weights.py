"""Weight accounting: the bytes one decoded token reads, per tensor class, total and per GPU.

A decode step of one stream reads every weight the token touches once: active experts only, one
embedding row, the whole lm_head. :func:`weight_tensors` lists a HF config's weights as vLLM
shards them under tensor parallelism (cited where it matters), :func:`weight_bytes_per_token`
prices them in their quantized formats, and :func:`tp_collectives_per_token` counts the small
collectives each step waits for. GB means 10**9 bytes, as in vendor datasheets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.roofline.model_config import first_present, positive_int_field, text_config
from pytest_kimiperf.roofline.quantization import QuantScheme

__all__ = [
    "TENSOR_CLASSES",
    "ClassBytes",
    "WeightBytes",
    "WeightTensor",
    "tp_collectives_per_token",
    "weight_bytes_per_token",
    "weight_tensors",
]

# ---------------------------------------------------------------------------------------------
# The model's tensors, as vLLM shards them
# ---------------------------------------------------------------------------------------------

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
    for other_moe in ("num_local_experts", "num_experts"):
        if text.get(other_moe) and text.get("n_routed_experts") is None:
            raise ConfigError(
                f"{where} describes a MoE through {other_moe!r} (model_type "
                f"{text.get('model_type')!r}); only the DeepSeek-style MoE layout "
                "(n_routed_experts, num_experts_per_tok, moe_intermediate_size) is supported"
            )
    layers = r.required("num_hidden_layers")
    hidden = r.required("hidden_size")
    heads = r.required("num_attention_heads")
    vocab = r.required("vocab_size")
    if heads % tp:
        # vLLM asserts the same (deepseek_v2.py, llama.py: num_heads % tp_size == 0).
        raise ConfigError(
            f"num_attention_heads {heads} in {where} is not divisible by tp={tp}; vLLM needs "
            "whole heads per rank"
        )
    is_mla = text.get("kv_lora_rank") is not None
    n_routed = r.count("n_routed_experts")
    # A wrapper's text_config knows its own lm_head; the top level answers for plain configs.
    tied = bool(first_present(text, config, keys=("tie_word_embeddings",)))

    out: list[WeightTensor] = []

    def add(name: str, tensor_class: str, kind: str, shape: tuple[int, ...],
            rank_shape: tuple[int, ...], copies: int = 1, read: int = 1) -> None:
        out.append(WeightTensor(name, tensor_class, kind, shape, rank_shape, copies, read))

    def column(name: str, cls: str, rows: int, cols: int, copies: int = 1, read: int = 1) -> None:
        add(name, cls, "linear", (rows, cols), (_split(rows, tp), cols), copies, read)

    def row(name: str, cls: str, rows: int, cols: int, copies: int = 1, read: int = 1) -> None:
        add(name, cls, "linear", (rows, cols), (rows, _split(cols, tp)), copies, read)

    def replicated(name: str, cls: str, rows: int, cols: int) -> None:
        add(name, cls, "linear", (rows, cols), (rows, cols))

    def norm(name: str, n: int) -> None:
        add(name, "norm", "norm", (n,), (n,))

    # VocabParallelEmbedding: each rank holds vocab/tp rows, a token reads one row on one rank.
    add("model.embed_tokens", "embedding", "embedding", (vocab, hidden),
        (_split(vocab, tp), hidden))

    if is_mla:
        q_lora = r.optional("q_lora_rank")
        kv_lora = r.required("kv_lora_rank")
        nope = r.required("qk_nope_head_dim")
        rope = r.required("qk_rope_head_dim")
        v_dim = r.required("v_head_dim")
    else:
        head_dim = r.required("head_dim", default=hidden // heads)
        kv_heads = r.required("num_key_value_heads", default=heads)

    moe_every = r.required("moe_layer_freq", default=1)
    first_dense = r.count("first_k_dense_replace")
    if n_routed:
        top_k = r.required("num_experts_per_tok")
        moe_inter = r.required("moe_intermediate_size")
        n_shared = r.count("n_shared_experts")
        if top_k > n_routed:
            raise ConfigError(
                f"num_experts_per_tok {top_k} in {where} exceeds n_routed_experts {n_routed}"
            )

    for i in range(layers):
        p = f"model.layers.{i}"
        norm(f"{p}.input_layernorm", hidden)
        if is_mla:
            # vLLM deepseek_v2.py (DeepseekV2MLAAttention): q_a_proj and kv_a_proj_with_mqa are
            # fused into DeepSeekV2FusedQkvAProjLinear(disable_tp=True), i.e. replicated on every
            # rank (ReplicatedLinear when q_lora_rank is None), as are q_a_layernorm and
            # kv_a_layernorm; q_b_proj/q_proj and kv_b_proj are ColumnParallelLinear over heads and
            # o_proj is RowParallelLinear. Decode's weight absorption splits kv_b_proj into W_UK
            # and W_UV of the same size, so its shard is what is read.
            a = f"{p}.self_attn"
            if q_lora is not None:
                replicated(f"{a}.q_a_proj", "attention_replicated", q_lora, hidden)
                norm(f"{a}.q_a_layernorm", q_lora)
                column(f"{a}.q_b_proj", "attention_sharded", heads * (nope + rope), q_lora)
            else:
                column(f"{a}.q_proj", "attention_sharded", heads * (nope + rope), hidden)
            replicated(f"{a}.kv_a_proj_with_mqa", "attention_replicated", kv_lora + rope, hidden)
            norm(f"{a}.kv_a_layernorm", kv_lora)
            column(f"{a}.kv_b_proj", "attention_sharded", heads * (nope + v_dim), kv_lora)
            row(f"{a}.o_proj", "attention_sharded", hidden, heads * v_dim)
        else:
            a = f"{p}.self_attn"
            column(f"{a}.q_proj", "attention_sharded", heads * head_dim, hidden)
            # QKVParallelLinear: with fewer KV heads than ranks each rank keeps one whole KV head
            # (a replica), so a rank reads max(1, kv_heads / tp) heads.
            kv_rank_rows = max(1, kv_heads // tp) * head_dim
            for proj in ("k_proj", "v_proj"):
                add(f"{a}.{proj}", "attention_sharded", "linear", (kv_heads * head_dim, hidden),
                    (kv_rank_rows, hidden))
            row(f"{a}.o_proj", "attention_sharded", hidden, heads * head_dim)
        norm(f"{p}.post_attention_layernorm", hidden)

        m = f"{p}.mlp"
        if n_routed and i >= first_dense and i % moe_every == 0:
            # vLLM's router is GateLinear(ReplicatedLinear), built without quant_config
            # (fused_moe, deepseek_v2.py DeepseekV2MoE): replicated and never quantized.
            add(f"{m}.gate", "router", "router", (n_routed, hidden), (n_routed, hidden))
            if text.get("topk_method") == "noaux_tc":
                add(f"{m}.gate.e_score_correction_bias", "router", "bias_fp32", (n_routed,),
                    (n_routed,))
            # FusedMoE without expert parallelism splits every expert's intermediate dimension
            # across ranks (w13 column-wise, w2 row-wise), so each rank reads 1/tp of every
            # active expert. The expert index in the name is a representative for the pattern
            # match: quantization configs address experts by module name, not index.
            e = f"{m}.experts.0"
            column(f"{e}.gate_proj", "routed_experts", moe_inter, hidden, n_routed, top_k)
            column(f"{e}.up_proj", "routed_experts", moe_inter, hidden, n_routed, top_k)
            row(f"{e}.down_proj", "routed_experts", hidden, moe_inter, n_routed, top_k)
            if n_shared:
                # DeepseekV2MoE: one DeepseekV2MLP of moe_intermediate_size * n_shared_experts,
                # tensor-parallel like a dense MLP.
                shared_inter = moe_inter * n_shared
                s = f"{m}.shared_experts"
                column(f"{s}.gate_proj", "shared_experts", shared_inter, hidden)
                column(f"{s}.up_proj", "shared_experts", shared_inter, hidden)
                row(f"{s}.down_proj", "shared_experts", hidden, shared_inter)
        else:
            inter = r.required("intermediate_size")
            column(f"{m}.gate_proj", "dense_mlp", inter, hidden)
            column(f"{m}.up_proj", "dense_mlp", inter, hidden)
            row(f"{m}.down_proj", "dense_mlp", hidden, inter)

    norm("model.norm", hidden)
    # ParallelLMHead splits the vocabulary across ranks (vLLM pads it to a multiple of 64 per
    # rank, ignored here). A tied lm_head is the embedding matrix, read in full.
    lm_name = "model.embed_tokens" if tied else "lm_head"
    add(lm_name, "lm_head", "linear", (vocab, hidden), (_split(vocab, tp), hidden))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# Bytes per token
# ---------------------------------------------------------------------------------------------


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
