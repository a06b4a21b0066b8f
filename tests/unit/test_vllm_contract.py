"""The vLLM the plugin was read from: its log formats and flags, checked on the installed engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ci import vllm_contract
from tests.helpers import ROOT


def test_the_installed_vllm_writes_every_line_the_plugin_reads() -> None:
    version, folder = vllm_contract.installed_vllm()
    if folder is None:
        pytest.skip("no vLLM installed")
    assert version == vllm_contract.VERIFIED_VLLM
    assert vllm_contract.check_log_formats(folder) == []


def test_a_format_vllm_no_longer_writes_is_named_with_its_reader(tmp_path: Path) -> None:
    _, folder = vllm_contract.installed_vllm()
    if folder is None:
        pytest.skip("no vLLM installed")
    fmt = next(f for f in vllm_contract.LOG_FORMATS if f.path.endswith("default_loader.py"))
    changed = tmp_path / fmt.path
    changed.parent.mkdir(parents=True)
    # The real file with the wording changed, as a later release might.
    changed.write_text((folder / fmt.path).read_text().replace("Loading weights took", "Loaded weights in"))
    assert vllm_contract.check_log_formats(tmp_path, (fmt,)) == [
        f"{fmt.path} no longer contains {fmt.text!r}; boot_account: weights_s reads it"]
    gone = vllm_contract.LogFormat("model_executor/nowhere.py", "x", "someone")
    assert vllm_contract.check_log_formats(tmp_path, (gone,)) == [
        "model_executor/nowhere.py is missing; someone reads 'x' from it"]


def test_the_contract_check_passes_on_the_installed_engine_and_the_gpu_pin_is_the_verified_version() -> None:
    pytest.importorskip("vllm")
    done = subprocess.run([sys.executable, "ci/vllm_contract.py"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"vllm-contract: OK vLLM {vllm_contract.VERIFIED_VLLM} ")
    pins = (ROOT / "ci" / "gpu-constraints.txt").read_text().splitlines()
    assert f"vllm=={vllm_contract.VERIFIED_VLLM}" in pins
    assert "ci/vllm_contract.py" in (ROOT / "ci" / "gpu-venv.sh").read_text()


def _bench_serve_body(request_func_name: str, **fields: object) -> dict[str, object]:
    """The JSON body vLLM's own bench serve request function posts, caught at session.post."""
    import asyncio

    endpoint_request_func = pytest.importorskip("vllm.benchmarks.lib.endpoint_request_func")
    sent: dict[str, object] = {}

    class Session:
        def post(self, *, url: str, json: dict[str, object], headers: dict[str, str]) -> object:
            sent.update(json)
            raise ConnectionError("caught")  # the request function records it as a failed request

    request = endpoint_request_func.RequestFuncInput(ignore_eos=True, request_id="r-1", **fields)
    asyncio.run(getattr(endpoint_request_func, request_func_name)(request_func_input=request, session=Session()))
    return sent


def test_the_client_sends_the_body_bench_serve_sends() -> None:
    from pytest_kimiperf.measure.client import RequestSpec, request_body

    spec = RequestSpec(prompt="a b c", output_tokens=64)
    theirs = _bench_serve_body("async_request_openai_completions", prompt="a b c",
                               api_url="http://h/v1/completions", prompt_len=3, output_len=64, model="m")
    ours = request_body("m", "completions", spec, {})
    # One difference on purpose: the running token count in every chunk (continuous_usage_stats),
    # so a chunk of several tokens moves no token's position (measure/client.py).
    assert ours["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert {**ours, "stream_options": theirs["stream_options"]} == theirs
    assert "min_tokens" not in theirs
    chat = _bench_serve_body("async_request_openai_chat_completions", prompt="a b c",
                             api_url="http://h/v1/chat/completions", prompt_len=3, output_len=64, model="m")
    ours = request_body("m", "chat", spec, {})
    # Besides the running count: the message's text as a plain string where bench serve sends a
    # list of content parts. The prompt is built to its exact length by /tokenize of that
    # plain-string message (measure/workload.py), and usage.prompt_tokens is checked against it.
    assert ({k: v for k, v in ours.items() if k not in ("messages", "stream_options")}
            == {k: v for k, v in chat.items() if k not in ("messages", "stream_options")})
    assert ours["messages"] == [{"role": "user", "content": "a b c"}]
