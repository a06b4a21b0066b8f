# Records vLLM's /metrics around three batches of requests on the tiny CPU engine, for
# tests/plugin/test_prompt_isolation.py: unique completions prompts, the same prompts sent again, and
# unique chat prompts. Run it alone on the machine (it boots a server):
#   flock /tmp/kimiperf-engine.lock .venv/bin/python tests/data/server_metrics/record_metrics.py
import subprocess, sys, time
from pathlib import Path

import httpx

from pytest_kimiperf.server.process import pick_free_port
from pytest_kimiperf.server.tiny_model import ensure_tiny_model
from pytest_kimiperf.measure.workload import build_prompts

OUT = Path(__file__).resolve().parent
MODEL = "tiny-llama"
port = pick_free_port("127.0.0.1")
base = f"http://127.0.0.1:{port}"
log = open(OUT / "record_metrics.server.log", "w")
server = subprocess.Popen(
    [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ensure_tiny_model()),
     "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
     "--tensor-parallel-size", "1", "--max-model-len", "2048", "--dtype", "bfloat16"],
    stdout=log, stderr=subprocess.STDOUT,
    env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
)
try:
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("server did not become ready; see record_metrics.server.log")
        time.sleep(1)

    def scrape(name: str) -> None:
        (OUT / name).write_text(httpx.get(base + "/metrics", timeout=10).text)

    def send(prompts: list[str], chat: bool) -> None:
        for prompt in prompts:
            if chat:
                body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                        "max_completion_tokens": 4, "ignore_eos": True}
                path = "/v1/chat/completions"
            else:
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
                path = "/v1/completions"
            httpx.post(base + path, json=body, timeout=120).raise_for_status()

    completions = build_prompts(base, MODEL, prompt_tokens=300, count=8, seed=1)
    chat = build_prompts(base, MODEL, prompt_tokens=300, count=8, seed=2, endpoint="chat")
    scrape("vllm_cpu_0.32_start.txt")
    send(completions, chat=False)
    scrape("vllm_cpu_0.32_after_8_unique_completions.txt")
    send(completions, chat=False)
    scrape("vllm_cpu_0.32_after_8_repeated_completions.txt")
    send(chat, chat=True)
    scrape("vllm_cpu_0.32_after_8_unique_chat.txt")
finally:
    server.terminate()
    server.wait(timeout=60)
