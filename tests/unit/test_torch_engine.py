"""The tiny-gpu-torch server's pieces: the byte tokenizer, the metrics the plugin reads back, the
model's KV cache against a decode from scratch, the checkpoint built once, and the server itself
on the CPU (vLLM's stream, its errors, SIGTERM, and an engine core that outlives its API server).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS, TINY_GPU_TORCH, TINY_TORCH_CPU
from pytest_kimiperf.measure.server_view import ServerView, snapshot_from_text
from pytest_kimiperf.server.hardware_check import hardware_problem
from pytest_kimiperf.server.gpu import GpuProbe
from pytest_kimiperf.server.tiny_model import built_revision
from pytest_kimiperf.server.torch_engine import (BOS_ID, EOS_ID, Frontend, TinySpec, decode, encode, parse_args)
from tests.helpers import ROOT

torch = pytest.importorskip("torch")

from pytest_kimiperf.server import torch_model  # noqa: E402  (needs torch)

SMALL = TinySpec(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, seed=3)


def test_the_tokenizer_is_one_token_a_byte_after_bos() -> None:
    assert encode("hi é", add_special_tokens=True) == [BOS_ID, 104, 105, 32, 0xC3, 0xA9]
    assert decode(encode("hi é", add_special_tokens=True) + [EOS_ID]) == "hi é"  # special tokens left out
    assert encode("", add_special_tokens=False) == []


def test_metrics_read_back_by_the_plugin_say_what_the_server_did() -> None:
    args = parse_args(["--model", "kimiperf:tiny-torch", "--served-model-name", "tt", "--max-model-len", "512"])
    frontend = Frontend(args, engine=None, engine_info={"kv_bytes": 1024})  # type: ignore[arg-type]
    frontend.ttft.observe(0.03)
    frontend.ttft.observe(3.0)
    frontend.itl.observe(0.002)
    frontend.counters.update(generation=7, prompt=40)
    snap = snapshot_from_text(frontend.metrics_text(), model="tt")
    assert snap.generation_tokens == 7.0 and snap.block_tokens == 512
    assert (snap.prefix_cache_queries, snap.prefix_cache_hits) == (0.0, 0.0)
    assert snap.ttft is not None and snap.ttft.count == 2 and snap.ttft.sum == pytest.approx(3.03)
    assert dict(snap.ttft.buckets)[0.04] == 1 and dict(snap.ttft.buckets)[float("inf")] == 2
    assert snap.itl is not None and snap.itl.count == 1
    # The engine's own clock, as vLLM's stat logger observes each finished request.
    frontend.queue_time.observe(0.0)
    frontend.prefill_time.observe(0.03)
    frontend.decode_time.observe(0.07)
    frontend.generation_per_request.observe(8.0)
    engine = ServerView.between(snapshot_from_text(Frontend(args, engine=None, engine_info={}).metrics_text(), model="tt"),  # type: ignore[arg-type]
                                snapshot_from_text(frontend.metrics_text(), model="tt")).engine_figures()
    assert engine.missing == ("vllm:request_time_per_output_token_seconds",)
    assert engine.tpot_ms == pytest.approx(10.0) and engine.ttft_ms == pytest.approx(30.0) and engine.requests == 1


def test_flags_vllm_would_take_but_this_engine_cannot_honour_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--tensor-parallel-size", "2"])
    assert "--tensor-parallel-size 2: this engine runs on one device; allowed: 1" in capsys.readouterr().err


def _model(spec: TinySpec, slots: int = 4, max_len: int = 64) -> torch_model.TinyLlama:
    generator = torch.Generator().manual_seed(spec.seed)
    weights = {name: torch.randn(shape, generator=generator) * (1.0 if len(shape) == 1 else 0.3)
               for name, shape in torch_model.weight_shapes(spec).items()}
    head_dim = spec.hidden_size // spec.num_attention_heads
    cache = torch.zeros(spec.num_hidden_layers, 2, slots, spec.num_attention_heads, max_len, head_dim)
    return torch_model.TinyLlama(spec, weights, cache)


def _greedy_from_scratch(model: torch_model.TinyLlama, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(n):  # every token by a prefill of everything so far: no cache reused
        tokens += model.step([tokens], [0], [3], [False])
    return tokens[len(prompt):]


def test_decoding_over_the_kv_cache_gives_the_tokens_a_decode_from_scratch_gives() -> None:
    model = _model(SMALL)
    prompts = [[BOS_ID, 10, 20, 30, 40], [BOS_ID, 7]]
    expected = [_greedy_from_scratch(model, p, 6) for p in prompts]
    # Both prompts prefilled into their slots, then decoded together in one batch a step: the
    # shorter one's positions past its own end are masked.
    last = [model.step([p], [0], [slot], [False])[0] for slot, p in enumerate(prompts)]
    got = [[t] for t in last]
    for step in range(5):
        last = model.step([[t] for t in last], [len(p) + step for p in prompts], [0, 1], [False, False])
        for out, token in zip(got, last):
            out.append(token)
    assert got == expected
    assert len(set(map(tuple, expected))) == 2  # the two prompts decode differently: a real check


def test_min_tokens_holds_eos_back_until_it_is_reached() -> None:
    model = _model(SMALL)
    model.w["lm_head.weight"][EOS_ID] = 100.0  # EOS is every step's argmax
    assert model.step([[BOS_ID, 5]], [0], [0], [False]) == [EOS_ID]
    assert model.step([[BOS_ID, 5]], [0], [0], [True]) != [EOS_ID]


def test_the_checkpoint_is_built_once_into_a_folder_named_by_its_spec(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KIMIPERF_CACHE_DIR", str(tmp_path))
    folder, spec, built = torch_model.resolve_checkpoint("kimiperf:tiny-torch", seed=0)
    assert built and folder == TinySpec().folder(tmp_path) and spec == TinySpec()
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == spec.hidden_size
    assert sorted(torch.load(folder / "model.pt", weights_only=True)) == sorted(torch_model.weight_shapes(spec))
    assert torch_model.resolve_checkpoint("kimiperf:tiny-torch", seed=0)[2] is False
    assert torch_model.resolve_checkpoint(str(folder), seed=0)[:2] == (folder, spec)
    assert TinySpec(seed=1).folder(tmp_path) != folder
    # No staging folder left (the lock file beside it is the tiny Llama's too: paths.build_once).
    assert [p.name for p in (tmp_path / "models").iterdir() if p.is_dir()] == [folder.name]
    assert built_revision("kimiperf:tiny-torch") == f"built-{TinySpec().key()}" != built_revision("kimiperf:tiny-llama")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host's torch sees a GPU")
def test_the_gpu_deployment_demands_its_gpu_before_any_boot_and_its_server_refuses_a_cpu_torch() -> None:
    problem = hardware_problem(TINY_GPU_TORCH, probe=lambda: GpuProbe((), "nvidia-smi", ("nvidia-smi not found on PATH",)))
    assert problem is not None and problem.startswith("deployment 'tiny-gpu-torch' needs 1x NVIDIA GPU; found no")
    with pytest.raises(SystemExit, match=r"--device cuda: torch \S+ is a CPU build; run on a GPU host or pass "
                                         r"--device cpu"):
        torch_model.pick_device("cuda")


def test_the_cpu_twin_runs_the_gpu_deployments_command_on_the_cpu() -> None:
    assert BUILTIN_DEPLOYMENTS["tiny-torch-cpu"] is TINY_TORCH_CPU and TINY_TORCH_CPU.gpu_count == 0
    gpu, cpu = list(TINY_GPU_TORCH.command), list(TINY_TORCH_CPU.command)
    assert gpu[-2:] == ["--device", "cuda"] and cpu == [*gpu[:-1], "cpu", "--max-num-seqs", "8"]
    assert hardware_problem(TINY_TORCH_CPU) is None
    argv = TINY_TORCH_CPU.argv(model_path="kimiperf:tiny-torch", host="127.0.0.1", port=1)
    assert parse_args(argv[3:]).device == "cpu"  # every flag the deployment passes is one the server takes


# --------------------------------------------------------------------------- the server itself


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port, log = _free_port(), tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIMIPERF_CACHE_DIR": str(tmp_path / "cache")}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pytest_kimiperf.server.torch_engine", "--model",
                                 "kimiperf:tiny-torch", "--served-model-name", "tt", "--port", str(port),
                                 "--device", "cpu", "--max-num-seqs", "2", "--max-model-len", "256", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            time.sleep(0.2)
    _stop(proc)
    raise AssertionError(f"server not ready (exit {proc.poll()}):\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as the plugin stops it; then SIGKILL for the front end and its engine core both
    (a SIGKILL of the front end alone leaves the engine running, by design)."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children()]
    except psutil.NoSuchProcess:
        family = []
    proc.terminate()
    for process in psutil.wait_procs(family, timeout=30)[1]:
        process.kill()
    proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    proc, url, log = _start(tmp_path_factory.mktemp("torch-engine"))
    yield proc, url, log
    _stop(proc)


def test_the_server_streams_as_vllm_does_and_counts_in_metrics(server: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    _, url, log = server
    body = {"model": "tt", "prompt": "hello", "max_tokens": 4, "min_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    before = snapshot_from_text(httpx.get(url + "/metrics").text)
    reply = httpx.post(url + "/v1/completions", json=body, headers={"x-request-id": "r1"}, timeout=60)
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in reply.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 6
    chunks = [json.loads(e) for e in events[:-1]]
    assert [list(c["choices"][0]) for c in chunks[:4]] == [
        ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"]] * 4
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, None, "length"]
    assert {c["id"] for c in chunks} == {"cmpl-r1"}
    assert chunks[4]["choices"] == [] and chunks[4]["usage"] == {"prompt_tokens": 6, "total_tokens": 10,
                                                                 "completion_tokens": 4}
    after = snapshot_from_text(httpx.get(url + "/metrics").text)
    assert after.generation_tokens - before.generation_tokens == 4
    assert after.ttft.count - before.ttft.count == 1 and after.itl.count - before.itl.count == 3
    tokens = httpx.post(url + "/tokenize", json={"model": "tt", "prompt": "ab", "add_special_tokens": True}).json()
    assert tokens == {"count": 3, "max_model_len": 256, "tokens": [BOS_ID, 97, 98], "token_strs": None}
    assert httpx.post(url + "/detokenize", json={"model": "tt", "tokens": [97, 98]}).json() == {"prompt": "ab"}
    models = httpx.get(url + "/v1/models").json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("tt", 256)]
    text = log.read_text()
    for line in ("] non-default args: {", "] Starting to load model ", "] Loading weights took ",
                 "] Model loading took ", "] CPU KV cache size: 512 tokens, Maximum concurrency for 256 tokens "
                 "per request: 2.00x", "] init engine (profile, create kv cache, warmup model) took ",
                 "INFO:     Application startup complete."):
        assert line in text, line


def test_requests_the_server_cannot_serve_get_vllms_errors(server: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    _, url, _ = server
    wrong = httpx.post(url + "/v1/completions", json={"model": "other", "prompt": "x"})
    assert wrong.status_code == 404 and wrong.json()["error"]["message"] == "The model `other` does not exist."
    long = httpx.post(url + "/v1/completions", json={"model": "tt", "prompt": "x" * 250, "max_tokens": 16})
    assert long.status_code == 400 and long.json()["error"]["message"].startswith(
        "This model's maximum context length is 256 tokens. However, you requested 267 tokens")
    whole = httpx.post(url + "/v1/completions", json={"model": "tt", "prompt": "x", "max_tokens": 3,
                                                      "min_tokens": 3}, timeout=60).json()
    assert whole["usage"]["completion_tokens"] == 3 and whole["choices"][0]["finish_reason"] == "length"


def test_sigterm_ends_the_server_and_its_engine_core(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path)
    [core] = psutil.Process(proc.pid).children()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert psutil.wait_procs([core], timeout=30)[1] == [], log.read_text()


def test_an_engine_core_outlives_its_killed_api_server_holding_on_until_signalled(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path)
    [core] = psutil.Process(proc.pid).children()
    proc.kill()
    proc.wait()
    time.sleep(1.0)
    assert core.is_running() and core.status() != psutil.STATUS_ZOMBIE
    core.send_signal(signal.SIGTERM)
    core.wait(timeout=30)  # its exit code is its new parent's to collect: that it ends is what counts
    assert "The API server is gone (its pipe closed)" in log.read_text()


def test_an_engine_that_cannot_boot_ends_its_api_server_with_the_reason(tmp_path: Path) -> None:
    port = _free_port()
    done = subprocess.run([sys.executable, "-m", "pytest_kimiperf.server.torch_engine", "--model", str(tmp_path),
                           "--port", str(port), "--device", "cpu"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1
    assert f"EngineCore failed to start: --model {str(tmp_path)!r}: not kimiperf:tiny-torch nor a folder this engine " \
           "built" in done.stdout
    assert "EngineCore failed to start (exit code 1)" in done.stdout
