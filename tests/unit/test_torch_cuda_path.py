"""tiny-gpu-torch's CUDA path, run on the CPU: ``torch_model.load`` as it runs on a GPU (vLLM's
free-memory check, the KV cache sized from what the share leaves after the weights and allocated
whole, bf16 weights and a warm-up step), with only the driver's readings stood in for
(``DeviceMemory``). What only a GPU runs is listed in ci/README.md.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pytest_kimiperf.server import torch_model  # noqa: E402  (needs torch)
from pytest_kimiperf.server.torch_engine import TinySpec  # noqa: E402

MIB = 2**20


class Log:
    """The engine's logger, kept: each line in vLLM's words, %-formatted."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str, *args: object) -> None:
        self.lines.append(text % args)

    warning = error = info


class StandInMemory:
    """A GPU's memory as the driver would report it: ``free_mib`` at start, then less by what the
    weights took, as torch.cuda.mem_get_info reads after they are on the device."""

    def __init__(self, free_mib: int, total_mib: int) -> None:
        self.free, self.total = free_mib * MIB, total_mib * MIB
        self.readings = 0
        self.synchronized = False

    def free_and_total(self) -> tuple[int, int]:
        self.readings += 1
        weights = sum(math.prod(shape) * 2 for shape in torch_model.weight_shapes(TinySpec()).values())
        return (self.free if self.readings == 1 else self.free - weights), self.total

    def synchronize(self) -> None:
        self.synchronized = True


def args(**changes: object) -> argparse.Namespace:
    """The engine core's flags as tiny-gpu-torch's server passes them (CPU tensors here)."""
    base = {"model": "kimiperf:tiny-torch", "device": "cpu", "dtype": "bfloat16", "max_model_len": 256,
            "max_num_seqs": 4, "seed": 0, "gpu_memory_utilization": 0.9}
    return argparse.Namespace(**{**base, **changes})


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMIPERF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_the_kv_cache_takes_what_the_share_leaves_after_the_weights_and_the_model_warms_up_in_bf16() -> None:
    memory, log = StandInMemory(free_mib=1000, total_mib=1024), Log()
    model, info = torch_model.load(args(), log, memory=memory)
    weights = sum(math.prod(shape) * 2 for shape in torch_model.weight_shapes(TinySpec()).values())
    share = math.ceil(1024 * MIB * 0.9)
    assert info == {"device": "cpu", "dtype": "bfloat16",
                    "kv_bytes": share - weights - torch_model.ACTIVATION_HEADROOM_BYTES}
    assert f"Available KV cache memory: {round(info['kv_bytes'] / 2**30, 2)} GiB" in log.lines
    spec = TinySpec()
    assert model.cache.dtype == torch.bfloat16 and model.cache.shape == (
        spec.num_hidden_layers, 2, 4, spec.num_attention_heads, 256, spec.hidden_size // spec.num_attention_heads)
    # Allocated whole, as vLLM takes its share: the slots are a view of the first part of it.
    assert model.cache.untyped_storage().nbytes() == info["kv_bytes"]
    assert all(t.dtype == torch.bfloat16 for t in model.w.values())
    assert memory.readings == 2 and memory.synchronized
    assert model.step([[1, 2, 3]], [0], [1], [False])[0] in range(spec.vocab_size)


def test_too_little_free_memory_at_start_is_vllms_own_error() -> None:
    with pytest.raises(SystemExit) as stopped:
        torch_model.load(args(), Log(), memory=StandInMemory(free_mib=900, total_mib=1024))
    assert stopped.value.code == (
        "Free memory on device cpu (0.88/1.00 GiB) on startup is less than desired GPU memory utilization (0.9, "
        "0.90 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")


def test_a_share_too_small_for_the_slots_says_what_they_need_and_what_it_leaves() -> None:
    with pytest.raises(SystemExit) as stopped:
        torch_model.load(args(max_num_seqs=64, max_model_len=2048), Log(), memory=StandInMemory(600, 600))
    assert stopped.value.code == ("--max-num-seqs 64 at --max-model-len 2048 need 0.50 GiB of KV cache; "
                                  "--gpu-memory-utilization 0.9 leaves 0.27 GiB")
