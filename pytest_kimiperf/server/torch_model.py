"""The engine core of ``tiny-gpu-torch``: a seeded tiny Llama decoded by torch on CUDA or the CPU.

``torch_engine.py`` starts it as its child, as vLLM's API server starts its EngineCore, over a
pipe: requests in, one message of new tokens per step out. The Llama-shaped model (Hugging Face's
key names) has seeded random weights, built on first use into the plugin's cache. Each step
prefills the requests just admitted within a token budget, then decodes every running request in
one batch over a KV cache of one slot per sequence. On CUDA it takes memory as vLLM does
(``--gpu-memory-utilization`` of the device must be free, and the KV cache gets what that share
leaves), and like vLLM 0.32's EngineCore, which watches no parent (v1/executor/
multiproc_executor.py), it outlives an API server killed with SIGKILL and keeps its memory until
signalled: the leftover the plugin's sweep exists for.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from pytest_kimiperf.config.deployments import TINY_TORCH_MODEL
from pytest_kimiperf.paths import build_once
from pytest_kimiperf.server.torch_engine import BOS_ID, EOS_ID, TinySpec, vllm_logger
from pytest_kimiperf.version import __version__

# Prompt tokens prefilled in one step before the running requests decode again (vLLM's
# max_num_batched_tokens for online serving on small GPUs).
_PREFILL_BUDGET_TOKENS = 2048
# Room kept beside weights and KV cache for a step's activations (vLLM measures its peak; a
# step of this model at 64 sequences needs a few MiB).
ACTIVATION_HEADROOM_BYTES = 256 * 2**20
GIB = 2**30


def weight_shapes(spec: TinySpec) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint by its Hugging Face Llama name."""
    h, i = spec.hidden_size, spec.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   **{p + f"self_attn.{n}_proj.weight": (h, h) for n in "qkvo"},
                   p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i)}
    return shapes | {"model.norm.weight": (h,), "lm_head.weight": (spec.vocab_size, h)}


def build_checkpoint(folder: Path, spec: TinySpec) -> bool:
    """Write the seeded weights (``model.pt``) and ``config.json`` into ``folder``, whole or not at
    all (``paths.build_once``); True when built now, False when another process had built it."""
    return build_once(folder, lambda staging: _write_checkpoint(staging, spec))


def _write_checkpoint(staging: Path, spec: TinySpec) -> None:
    generator = torch.Generator().manual_seed(spec.seed)
    weights = {name: torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=generator) * 0.02
               for name, shape in weight_shapes(spec).items()}  # 0.02: Llama's initializer_range
    torch.save(weights, staging / "model.pt")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
              "num_key_value_heads": spec.num_attention_heads, "hidden_act": "silu", "tie_word_embeddings": False,
              "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, **asdict(spec)}
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def resolve_checkpoint(model: str, seed: int) -> tuple[Path, TinySpec, bool]:
    """The checkpoint's folder and spec for ``--model``, and whether it was built now."""
    if model == TINY_TORCH_MODEL:
        spec = TinySpec(seed=seed)
        folder = spec.folder()
        return folder, spec, build_checkpoint(folder, spec)
    folder = Path(model)
    try:
        config = json.loads((folder / "config.json").read_text())
        spec = TinySpec(**{k: config[k] for k in TinySpec.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"--model {model!r}: not {TINY_TORCH_MODEL} nor a folder this engine built ({error})") from None
    return folder, spec, False


def pick_device(requested: str) -> torch.device:
    """``cuda`` where asked (an error where torch sees none), the CPU where asked, else what there is."""
    if requested == "cuda" and not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else f"a CUDA {torch.version.cuda} build that sees no device"
        raise SystemExit(f"--device cuda: torch {torch.__version__} is {why}; run on a GPU host or pass --device cpu")
    return torch.device("cuda" if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()) else "cpu")


class DeviceMemory(Protocol):
    """What ``load`` asks of a GPU's memory: the only calls of its CUDA path that need a GPU."""

    def free_and_total(self) -> tuple[int, int]:
        """Bytes free and in all on the device, as the driver says now."""

    def synchronize(self) -> None:
        """Wait for the device's queued work."""


@dataclass(frozen=True)
class CudaMemory:
    """The CUDA device's memory as torch reads it (``torch.cuda.init`` before the first reading)."""

    device: torch.device

    def free_and_total(self) -> tuple[int, int]:
        """``torch.cuda.mem_get_info``: the driver's free and total bytes."""
        free, total = torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def synchronize(self) -> None:
        """``torch.cuda.synchronize``."""
        torch.cuda.synchronize(self.device)


class TinyLlama:
    """The model's weights and KV cache on one device, and its two passes."""

    def __init__(self, spec: TinySpec, weights: dict[str, torch.Tensor], kv_cache: torch.Tensor) -> None:
        self.spec = spec
        self.w = weights
        self.cache = kv_cache  # [layers, 2 (k, v), slots, heads, max_model_len, head_dim]
        self.heads = spec.num_attention_heads
        self.head_dim = spec.hidden_size // self.heads
        device, dtype = kv_cache.device, kv_cache.dtype
        inv = 1.0 / spec.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim)
        angles = torch.outer(torch.arange(kv_cache.shape[4], device=device).float(), inv)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.spec.rms_norm_eps) * self.w[name]

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [B, 1, T, D/2]
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    @torch.inference_mode()
    def step(self, tokens: list[list[int]], starts: list[int], slots: list[int], ban_eos: list[bool]) -> list[int]:
        """The next token of each sequence: one prefill (one sequence, its whole prompt) or one
        decode step (many sequences, one token each at position ``starts``)."""
        device = self.cache.device
        batch, length = len(tokens), len(tokens[0])
        ids = torch.tensor(tokens, device=device)
        positions = torch.tensor([[s + t for t in range(length)] for s in starts], device=device)
        slot_ids = torch.tensor(slots, device=device)
        span = max(starts) + length  # the longest sequence's cached positions, this one included
        visible = (torch.arange(span, device=device)[None, :] <= positions[:, -1:])[:, None, None, :]
        x = self.w["model.embed_tokens.weight"][ids]
        for layer in range(self.spec.num_hidden_layers):
            p = f"model.layers.{layer}."
            h = self._norm(x, p + "input_layernorm.weight")
            q, k, v = ((h @ self.w[p + f"self_attn.{n}_proj.weight"].T).view(batch, length, self.heads, self.head_dim)
                       .transpose(1, 2) for n in "qkv")
            q, k = self._rotate(q, positions), self._rotate(k, positions)
            keys, values = self.cache[layer, 0], self.cache[layer, 1]
            if length > 1:  # prefill of one prompt from position 0: causal attention over itself
                keys[slots[0], :, :length], values[slots[0], :, :length] = k[0], v[0]
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                keys[slot_ids, :, positions[:, 0]], values[slot_ids, :, positions[:, 0]] = k[:, :, 0], v[:, :, 0]
                out = F.scaled_dot_product_attention(q, keys[slot_ids, :, :span], values[slot_ids, :, :span],
                                                     attn_mask=visible)
            x = x + out.transpose(1, 2).reshape(batch, length, -1) @ self.w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, p + "post_attention_layernorm.weight")
            gate, up = (h @ self.w[p + f"mlp.{n}_proj.weight"].T for n in ("gate", "up"))
            x = x + (F.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        logits = self._norm(x[:, -1], "model.norm.weight") @ self.w["lm_head.weight"].T
        if any(ban_eos):  # min_tokens: EOS cannot come before it (vLLM's MinTokensLogitsProcessor)
            logits[torch.tensor(ban_eos, device=device), EOS_ID] = -math.inf
        return [int(t) for t in logits.argmax(-1).tolist()]


@dataclass
class EngineRequest:
    """One request inside the engine."""

    key: str
    prompt: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    slot: int = -1
    generated: int = 0
    last: int = 0


def load(args: argparse.Namespace, log: Any, memory: DeviceMemory | None = None) -> tuple[TinyLlama, dict[str, Any]]:
    """Resolve or build the checkpoint, load it onto the device, size and allocate the KV cache,
    warm up, each phase logged in vLLM's words; returns what /metrics reports. On CUDA memory is
    read through ``memory`` (a test's stand-in lets this path run on the CPU)."""
    device = pick_device(args.device)
    dtype = torch.bfloat16 if (args.dtype == "bfloat16" or (args.dtype == "auto" and device.type == "cuda")) \
        else torch.float32
    if memory is None and device.type == "cuda":
        torch.cuda.init()
        memory = CudaMemory(device)
    started = time.monotonic()
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > 1:
        # One thread decodes this model faster than two that contend with the API server and the
        # client on a small host (measured on a 2-core host: 9 ms a step against 12-70 ms).
        log.info("Reducing Torch threads from %d to 1 for serving. Set OMP_NUM_THREADS in the external environment "
                 "to override.", torch.get_num_threads())
        torch.set_num_threads(1)
    total = free_at_start = 0
    if memory is not None:
        free_at_start, total = memory.free_and_total()
        requested = math.ceil(total * args.gpu_memory_utilization)
        if free_at_start < requested:  # vllm/v1/worker/utils.py request_memory
            raise SystemExit(f"Free memory on device {device} ({free_at_start / GIB:.2f}/{total / GIB:.2f} GiB) on "
                             f"startup is less than desired GPU memory utilization ({args.gpu_memory_utilization}, "
                             f"{requested / GIB:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used "
                             "by other processes.")
    dtype_name = str(dtype).removeprefix("torch.")
    log.info("Initializing a V1 LLM engine (v%s kimiperf torch engine) with config: model=%r, device=%s, dtype=%s, "
             "max_seq_len=%d, max_num_seqs=%d, seed=%d", __version__, args.model, device, dtype_name,
             args.max_model_len, args.max_num_seqs, args.seed)
    folder, spec, built = resolve_checkpoint(args.model, args.seed)
    if built:
        log.info("Built the tiny random-weight checkpoint into %s (first use)", folder)
    if args.max_model_len > spec.max_position_embeddings:
        raise SystemExit(f"--max-model-len {args.max_model_len} is above the model's {spec.max_position_embeddings}")
    log.info("Starting to load model %s...", folder)
    loading = time.monotonic()
    weights = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    log.info("Loading weights took %.2f seconds", time.monotonic() - loading)
    weights = {name: tensor.to(device=device, dtype=dtype) for name, tensor in weights.items()}
    weight_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    log.info("Model loading took %s GiB memory and %.6f seconds", round(weight_bytes / GIB, 2), time.monotonic() - loading)
    head_dim = spec.hidden_size // spec.num_attention_heads
    shape = (spec.num_hidden_layers, 2, args.max_num_seqs, spec.num_attention_heads, args.max_model_len, head_dim)
    token_bytes = spec.num_hidden_layers * 2 * spec.hidden_size * dtype.itemsize
    slots_bytes = token_bytes * args.max_num_seqs * args.max_model_len
    if memory is not None:
        used = free_at_start - memory.free_and_total()[0]
        kv_bytes = math.ceil(total * args.gpu_memory_utilization) - used - ACTIVATION_HEADROOM_BYTES
        if kv_bytes < slots_bytes:
            raise SystemExit(f"--max-num-seqs {args.max_num_seqs} at --max-model-len {args.max_model_len} need "
                             f"{slots_bytes / GIB:.2f} GiB of KV cache; --gpu-memory-utilization "
                             f"{args.gpu_memory_utilization} leaves {max(kv_bytes, 0) / GIB:.2f} GiB")
        log.info("Available KV cache memory: %s GiB", round(kv_bytes / GIB, 2))
        # The whole share, as vLLM allocates its blocks; the slots use the first part of it.
        cache = torch.empty(kv_bytes, dtype=torch.uint8, device=device)[:slots_bytes].view(dtype).view(shape)
    else:
        kv_bytes = slots_bytes
        cache = torch.empty(shape, dtype=dtype)  # pages are touched only as sequences fill them
    tokens = kv_bytes // token_bytes
    log.info("%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
             "GPU" if device.type == "cuda" else "CPU", f"{tokens:,}", f"{args.max_model_len:,}",
             tokens / args.max_model_len)
    model = TinyLlama(spec, weights, cache)
    cache[:, :, 0].zero_()
    model.step([[BOS_ID] * 16], [0], [0], [False])  # warm-up on slot 0: a prefill, then a decode step
    model.step([[BOS_ID]], [16], [0], [False])
    if memory is not None:
        memory.synchronize()
    log.info("init engine (profile, create kv cache, warmup model) took %.2f s", time.monotonic() - started)
    return model, {"device": str(device), "dtype": dtype_name, "kv_bytes": kv_bytes}


def serve(model: TinyLlama, pipe: Connection, max_num_seqs: int, log: Any) -> None:
    """Take requests and send each step's new tokens until told to stop."""
    waiting: deque[EngineRequest] = deque()
    running: dict[str, EngineRequest] = {}
    free_slots = list(range(max_num_seqs - 1, -1, -1))
    # The cache is allocated uninitialized (on the CPU its pages are touched only as slots are
    # used); a slot is zeroed at its first use, since garbage a mask hides still turns into NaN
    # in attention (0 x NaN).
    never_used = set(free_slots)
    while True:
        try:
            while pipe.poll(0 if running or waiting else None):
                message = pipe.recv()
                if message[0] == "stop":
                    return
                if message[0] == "add":
                    waiting.append(EngineRequest(*message[1:]))
                else:  # abort
                    gone = running.pop(message[1], None)
                    free_slots += [gone.slot] if gone is not None else []
                    waiting = deque(s for s in waiting if s.key != message[1])
        except (EOFError, OSError):
            log.warning("The API server is gone (its pipe closed); this EngineCore keeps its memory until it is "
                        "signalled, as vLLM's does.")
            while True:
                signal.pause()
        outputs: list[tuple[str, int, str | None]] = []
        budget = _PREFILL_BUDGET_TOKENS
        while waiting and free_slots and (budget == _PREFILL_BUDGET_TOKENS or len(waiting[0].prompt) <= budget):
            seq = waiting.popleft()
            seq.slot = free_slots.pop()
            if seq.slot in never_used:
                model.cache[:, :, seq.slot].zero_()
                never_used.discard(seq.slot)
            budget -= len(seq.prompt)
            (token,) = model.step([seq.prompt], [0], [seq.slot], [seq.min_tokens > 0])
            _advance(seq, token, running, free_slots, outputs)
        prefilled = {key for key, _, _ in outputs}  # they decode from the next step on
        decoding = [s for s in running.values() if s.key not in prefilled]
        if decoding:
            tokens = model.step([[s.last] for s in decoding], [len(s.prompt) + s.generated - 1 for s in decoding],
                                [s.slot for s in decoding], [s.generated < s.min_tokens for s in decoding])
            for seq, token in zip(decoding, tokens):
                _advance(seq, token, running, free_slots, outputs)
        pipe.send(("step", outputs, len(running), len(waiting)))


def _advance(seq: EngineRequest, token: int, running: dict[str, EngineRequest], free_slots: list[int],
             outputs: list[tuple[str, int, str | None]]) -> None:
    seq.generated += 1
    seq.last = token
    finish = "length" if seq.generated >= seq.max_tokens else (
        "stop" if token == EOS_ID and not seq.ignore_eos else None)
    outputs.append((seq.key, token, finish))
    if finish is None:
        running[seq.key] = seq
    else:
        running.pop(seq.key, None)
        free_slots.append(seq.slot)


def main(argv: Sequence[str] | None = None) -> int:
    """The engine core: load, say ready over the pipe ``--fd``, serve."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--fd", type=int, required=True)
    for flag in ("--model", "--device", "--dtype"):
        parser.add_argument(flag, required=True)
    for flag in ("--max-model-len", "--max-num-seqs", "--seed"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    args = parser.parse_args(argv)
    log = vllm_logger("EngineCore")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    pipe = Connection(args.fd)
    try:
        model, info = load(args, log)
    except SystemExit as error:
        if not isinstance(error.code, str):
            return 0  # SIGTERM while booting
        log.error("EngineCore failed to start: %s", error.code)
        return 1
    pipe.send(("ready", info))
    serve(model, pipe, args.max_num_seqs, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
