"""A small stand-in for a vLLM server, for faults a real one cannot show on demand.

Used only where the real CPU engine cannot be made to misbehave on cue: hanging at boot,
crashing during boot, crashing mid-stream, an engine that dies under a running API server, a slow load that
prints vLLM-format progress lines,
and counting boots for the parametrization tests. Its log lines copy vLLM 0.32's real formats
(see tests/data/nccl_logs/vllm_cpu_tp1_gloo.log for a recorded boot).

Usage: python stub_vllm.py --model NAME --host H --port P [--mode MODE] [--boot-count FILE]
         [--load-seconds S] [--tok-per-s R] [--ttft-ms T] [--nccl-lines] [--nccl-log-value VAR=VALUE ...]
         [--all-reduce-lines NAME] [--prompt-log FILE]
Modes: normal, hang (never ready), crash-boot (exits 3 while loading), crash-stream (dies
after a few tokens of the first streamed request), dead-engine (cuts the first stream after a few
tokens and keeps running, /health answering 503, as vLLM's API server does over a dead
EngineCore until its watchdog stops it), spawn-children (forks two workers that
outlive a SIGKILL of this process, like vLLM's EngineCore and workers), ignore-sigterm (a
server slow to stop: only SIGKILL ends it), stall-first (streams answer their head and never a
token), stall-mid (a few tokens, then nothing, connection open), endless-line (one SSE line that
never ends), html-tokenize (/tokenize answers a proxy's HTML page).

--nccl-lines stands in for a GPU engine under NCCL_DEBUG=INFO: each NCCL_* variable of its
environment is logged the way NCCL's param.cc / tuning.cc log it (tests/data/nccl_logs/README.md
has the formats), and --nccl-log-value VAR=VALUE logs VALUE instead, as when NCCL falls back
to another value than the one set.

--all-reduce-lines NAME prints what vLLM 0.32 logs about its all-reduce path at boot, as the
file tests/data/boot_logs/allreduce/NAME.log holds it (h100_tp8_nvlink, rtx_pro_6000_tp8_pcie, ...;
the README there gives each line's source), each line stamped with the time it is printed.

--engine-metrics serves ``/metrics`` with the engine core's per-request histograms as vLLM 0.32
exports them (queue, prefill and decode time, generated tokens, time per output token: what the
plugin reads as the engine's clock, measure/server_view.py), stamped by the stub's "engine" when
it makes each token, before its API layer writes it. --api-delay-ms MS slows the API layer alone:
each token is written MS later than the one before it would have been (cumulative), as an API
server that falls behind the engine does, while the engine's stamps keep their pace;
--engine-tok-per-s R slows the engine itself (both clocks see it). --slow-if-env NAME=VALUE applies
the two only when the server's environment has NAME=VALUE (one profile of a comparison slowed).

--engine-stamps FILE sets the engine's figures instead of its own clock: FILE holds a JSON list
with one ``{"tpot_ms": T, "ttft_ms": P}`` per boot (the Nth boot that starts takes the Nth entry,
counted in FILE.booted), and every request the engine finishes is recorded with prefill P ms and
decode T ms a token after its first, whatever the host did. A test then holds the engine's clock to
set values no host can move, while the client's clock reads the stub's real pace. An entry's
``api_delay_ms`` and ``engine_tok_per_s`` set that boot's --api-delay-ms and --engine-tok-per-s: the
server changed between two runs while the command the baseline was recorded with did not.

--prompt-log FILE appends one JSON line per completion request, ``{"pid", "request_id",
"prompt"}``, so a test can see exactly which prompts reached the server (prompt isolation).

--sim-gpu-mib MIB runs it on the simulated GPU (tests/fakes/simgpu, ``$SIMGPU_STATE``) as vLLM's
process tree does: the API server starts ``VLLM::EngineCore``, which with --sim-gpus N > 1 starts
``VLLM::Worker_TP<i>`` for each of the first N GPUs CUDA_VISIBLE_DEVICES leaves it (vLLM's
multiproc executor), each holding MIB there; with one GPU the engine holds it itself (the
uniproc executor). The memory is released when a holder ends, or --sim-linger-s seconds later
(a driver slow to tear a context down). While a stream is served the GPUs are under load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def log(line: str, end: str = "\n") -> None:
    sys.stdout.write(line + end)
    sys.stdout.flush()


def vllm_info(source: str, message: str, who: str = "APIServer") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    log(f"({who} pid={os.getpid()}) INFO {stamp} [{source}] {message}")


def nccl_env_lines(overrides: list[str]) -> None:
    """Log the NCCL_* variables of the environment as NCCL does at NCCL_DEBUG=INFO."""
    if os.environ.get("NCCL_DEBUG") != "INFO":
        return  # NCCL prints its INFO lines only at that level
    logged = {var: value for var, value in os.environ.items()
              if var.startswith("NCCL_") and not var.startswith("NCCL_DEBUG")}
    for item in overrides:
        var, _, value = item.partition("=")
        logged[var] = value
    pid = os.getpid()
    log(f"stub-host:{pid}:{pid} [0] NCCL INFO NCCL version 2.27.7+cuda12.9")
    for var, value in sorted(logged.items()):
        # Integer parameters end with a period ("%s set by environment to %lld."), strings do not.
        end = "." if value.lstrip("-").isdigit() else ""
        log(f"(Worker_TP0 pid={pid}) stub-host:{pid}:{pid} [0] NCCL INFO {var} set by environment to {value}{end}")


ALL_REDUCE_LOGS = Path(__file__).resolve().parents[1] / "data" / "boot_logs" / "allreduce"
# vLLM's "LEVEL MM-DD HH:MM:SS" (logging_utils/formatter.py): the recorded time is replaced by now,
# so a boot account placing its phases by these stamps sees this boot's.
_STAMP = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d")


def all_reduce_lines(name: str) -> None:
    """Log the all-reduce lines of a recorded or built vLLM boot, stamped now."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    for line in (ALL_REDUCE_LOGS / f"{name}.log").read_text(encoding="utf-8").splitlines():
        log(_STAMP.sub(lambda m: f"{m.group(1)} {stamp}", line, count=1))


def boot(args: argparse.Namespace) -> None:
    vllm_info("api_utils.py:286", f"non-default args: {{'model': '{args.model}', 'port': {args.port}}}")
    vllm_info("model.py:733", "Resolved architecture: LlamaForCausalLM")
    vllm_info("core.py:133", "Initializing a V1 LLM engine (v0.32.0) with config: ...", "EngineCore")
    if args.nccl_lines:
        nccl_env_lines(args.nccl_log_value)
    if args.all_reduce_lines:
        all_reduce_lines(args.all_reduce_lines)
    if args.mode == "hang":
        while True:
            time.sleep(1)
    if args.load_format == "ipc_cache":
        # weight_cache/ipc_loader.py:284: the weights are mapped from a `vllm preload` daemon
        vllm_info("cpu_model_runner.py:68", f"Starting to load model {args.model}...", "Worker")
        vllm_info("ipc_loader.py:284", "Mapped 24 tensors from the weight cache daemon (zero_copy mode)", "Worker")
        vllm_info("kv_cache_utils.py:2327", "CPU KV cache size: 2,097,152 tokens", "EngineCore")
        return
    shards = 8
    for done in range(shards + 1):
        pct = done * 100 // shards
        log(f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {done}/{shards} "
            f"[00:0{done}<00:00,  1.00it/s]", end="\r")
        if args.mode == "crash-boot" and done == shards // 2:
            log("")
            log("RuntimeError: simulated crash while loading shard 5")
            sys.exit(3)
        time.sleep(args.load_seconds / shards)
    log("")
    vllm_info("default_loader.py:501", "Loading weights took 0.01 seconds", "Worker")
    vllm_info("kv_cache_utils.py:2327", "CPU KV cache size: 2,097,152 tokens", "EngineCore")


def _sleep_until(deadline: float) -> None:
    """Sleep until ``deadline`` on the monotonic clock (at once when it has passed)."""
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(left)


VOCAB: dict[str, int] = {}
# The engine's finished requests, as vLLM's stat logger observes them: (queue_s, prefill_s,
# decode_s, generated tokens) each.
ENGINE_FINISHED: list[tuple[float, float, float, int]] = []
ENGINE_LOCK = threading.Lock()


# This boot's set engine figures (--engine-stamps): (tpot_s, ttft_s), or None to stamp on its clock.
ENGINE_SET: tuple[float, float] | None = None


def set_engine_stamps(path: str, args: argparse.Namespace) -> tuple[float, float]:
    """This boot's entry of the --engine-stamps file (the boots before it counted in FILE.booted),
    its pace settings applied to ``args``."""
    entries = json.loads(Path(path).read_text())
    booted = Path(path + ".booted")
    with open(booted, "a+") as fh:
        fh.seek(0)
        index = len(fh.read().splitlines())
        fh.write(f"{os.getpid()}\n")
    entry = entries[index % len(entries)]
    args.api_delay_ms = float(entry.get("api_delay_ms", args.api_delay_ms))
    args.engine_tok_per_s = entry.get("engine_tok_per_s", args.engine_tok_per_s)
    return float(entry["tpot_ms"]) / 1000.0, float(entry["ttft_ms"]) / 1000.0


def _slowed(args: argparse.Namespace) -> bool:
    if not args.slow_if_env:
        return True
    name, _, value = args.slow_if_env.partition("=")
    return os.environ.get(name) == value


def engine_metrics_text(model: str) -> str:
    """The engine core's per-request histograms (sum and count, one +Inf bucket), vLLM's names."""
    with ENGINE_LOCK:
        done = list(ENGINE_FINISHED)
    labels = f'engine="0",model_name="{model}"'
    lines = []
    columns = {
        "vllm:request_queue_time_seconds": [q for q, _, _, _ in done],
        "vllm:request_prefill_time_seconds": [p for _, p, _, _ in done],
        "vllm:request_decode_time_seconds": [d for _, _, d, _ in done],
        "vllm:request_generation_tokens": [float(n) for _, _, _, n in done],
        "vllm:request_time_per_output_token_seconds": [d / (n - 1) if n > 1 else 0.0 for _, _, d, n in done],
    }
    for name, values in columns.items():
        lines += [f"# TYPE {name} histogram", f'{name}_bucket{{{labels},le="+Inf"}} {float(len(values))}',
                  f"{name}_count{{{labels}}} {float(len(values))}", f"{name}_sum{{{labels}}} {sum(values)}"]
    return "\n".join(lines) + "\n"
# Handler threads append to the prompt log; one line each, never interleaved.
PROMPT_LOG_LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # uvicorn (vLLM's server) sets TCP_NODELAY; without it small chunks coalesce under Nagle.
    disable_nagle_algorithm = True
    args: argparse.Namespace
    streamed = 0
    engine_dead = False

    def log_message(self, format: str, *a: object) -> None:  # noqa: A002 - http.server API
        log(f"INFO:     {self.client_address[0]} - \"{self.requestline}\" {a[1] if len(a) > 1 else ''}")

    def _json(self, code: int, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/version":
            self._json(200, {"version": "0.32.0-stub"})
        elif self.path == "/health":
            self._json(503 if Handler.engine_dead else 200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.args.model, "object": "model"}]})
        elif self.path == "/metrics" and self.args.engine_metrics:
            body = engine_metrics_text(self.args.model).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.args.sim_gpu_mib and self.path == "/v1/completions":
            with _sim_state().busy():
                self._post()
        else:
            self._post()

    def _post(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize" and self.args.mode == "html-tokenize":
            page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if self.path == "/tokenize":
            # One token per whitespace-separated word, as a stable vocabulary.
            tokens = [VOCAB.setdefault(w, len(VOCAB)) for w in str(body.get("prompt", "")).split()]
            self._json(200, {"count": len(tokens), "max_model_len": 2048, "tokens": tokens})
            return
        if self.path == "/detokenize":
            words = {i: w for w, i in VOCAB.items()}
            self._json(200, {"prompt": " ".join(words[t] for t in body.get("tokens", []))})
            return
        if self.path != "/v1/completions":
            self._json(404, {"error": "not found"})
            return
        if self.args.prompt_log:
            line = json.dumps({"pid": os.getpid(), "request_id": self.headers.get("x-request-id"),
                               "prompt": body.get("prompt")})
            with PROMPT_LOG_LOCK, open(self.args.prompt_log, "a") as fh:
                fh.write(line + "\n")
        n = int(body.get("max_tokens", 16))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        Handler.streamed += 1
        arrived = time.monotonic()
        slowed = _slowed(self.args)
        gap = 1.0 / (self.args.engine_tok_per_s if slowed and self.args.engine_tok_per_s else self.args.tok_per_s)
        api_delay = self.args.api_delay_ms / 1000.0 if slowed else 0.0
        # Every token is due at a set time from the request's start (prefill, then one gap
        # each), not a gap after the last write: a late wake-up or a slow write then delays one
        # token, never every later one, so the pace the client measures is the one set on any
        # host that keeps up (sleep-after-write read -40% as -3x% on a slow host).
        start = time.monotonic() + self.args.ttft_ms / 1000.0
        _sleep_until(start)  # prefill: without it TTFT is all host jitter
        if self.args.mode == "stall-first":
            time.sleep(3600)
        if self.args.mode == "endless-line":
            while True:  # an SSE line that never ends: 64 KiB chunks of one "data:" value
                self._chunk("data: " + "x" * 65536)
        # The engine makes token i at start + i * gap and stamps it so; the API layer writes it
        # i * api_delay later (an API server falling behind the engine).
        first_token, last_token = start, start + (n - 1) * gap
        stream_options = body.get("stream_options") or {}
        running_usage = bool(stream_options.get("include_usage") and stream_options.get("continuous_usage_stats"))
        prompt_tokens = len(str(body.get("prompt", "")).split())
        for i in range(n):
            if self.args.mode == "crash-stream" and i == 3:
                log("ERROR simulated engine crash mid-stream")
                os._exit(7)
            if self.args.mode == "stall-mid" and i == 3:
                time.sleep(3600)
            if self.args.mode == "dead-engine" and i == 3:
                log("ERROR EngineCore encountered a fatal error (simulated); engine dead")
                Handler.engine_dead = True
                self.close_connection = True
                return
            chunk = {"id": "cmpl-stub", "object": "text_completion", "model": self.args.model,
                     "choices": [{"index": 0, "text": "x", "finish_reason": None}]}
            if running_usage:  # vLLM's continuous_usage_stats: the running count in every chunk
                chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": i + 1,
                                  "total_tokens": prompt_tokens + i + 1}
            self._chunk(f"data: {json.dumps(chunk)}\n\n")
            _sleep_until(start + (i + 1) * gap + (i + 1) * api_delay)
        with ENGINE_LOCK:
            if ENGINE_SET is not None:  # the test's figures, not this host's clock
                ENGINE_FINISHED.append((0.0, ENGINE_SET[1], ENGINE_SET[0] * (n - 1), n))
            else:
                ENGINE_FINISHED.append((0.0, first_token - arrived, last_token - first_token, n))
        usage = {"id": "cmpl-stub", "choices": [],
                 "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                           "total_tokens": n + prompt_tokens}}
        self._chunk(f"data: {json.dumps(usage)}\n\n")
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _title(name: str) -> None:
    try:
        import setproctitle  # type: ignore[import-not-found]

        setproctitle.setproctitle(name)
    except ImportError:
        pass


def _sim_state():  # noqa: ANN202 - the simulated GPU's state module, imported where it is used
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from simgpu import state

    return state


def spawn_sim_engine(args: argparse.Namespace) -> None:
    """vLLM's engine tree on the simulated GPU: EngineCore and its workers, each holding memory."""
    state = _sim_state()
    gpus = state.visible_gpus(state.read_host())[: args.sim_gpus]
    if len(gpus) < args.sim_gpus:
        log(f"ERROR simulated GPU: {args.sim_gpus} GPU(s) asked, CUDA_VISIBLE_DEVICES leaves {len(gpus)}")
        sys.exit(1)
    if os.fork() != 0:
        return
    _title("VLLM::EngineCore")
    if len(gpus) == 1:
        state.hold({gpus[0]: args.sim_gpu_mib}, linger_s=args.sim_linger_s)
    else:
        for rank, gpu in enumerate(gpus):
            if os.fork() == 0:
                _title(f"VLLM::Worker_TP{rank}")
                state.hold({gpu: args.sim_gpu_mib}, linger_s=args.sim_linger_s)
                break
    while True:
        time.sleep(1)


def spawn_children() -> None:
    """Fork two long-lived workers, as vLLM's API server starts EngineCore and workers."""
    for name in ("EngineCore", "Worker_TP0"):
        if os.fork() == 0:
            try:
                import setproctitle  # type: ignore[import-not-found]

                setproctitle.setproctitle(f"STUB::{name}")
            except ImportError:
                pass
            while True:
                time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", default=None)  # as vLLM's: the name /v1/models lists
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", default="normal",
                        choices=["normal", "hang", "crash-boot", "crash-stream", "dead-engine",
                                 "spawn-children", "ignore-sigterm", "stall-first", "stall-mid",
                                 "endless-line", "html-tokenize"])
    parser.add_argument("--boot-count", default=None)
    parser.add_argument("--load-seconds", type=float, default=0.4)
    # Gaps and a prefill long against a host's scheduling jitter (a few ms, tens on a busy
    # host): at 500 tok/s a 16-token stream spans 30 ms and one late wake-up of 5 ms moved its
    # rate 17%; at 100 tok/s it spans 150 ms. A test that needs another pace sets its own.
    parser.add_argument("--tok-per-s", type=float, default=100.0)
    # A first token after a fixed prefill time, as from a real engine: with none, TTFT is a
    # millisecond or two and two runs of the same stub differ by 30-45% (host jitter).
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--engine-metrics", action="store_true")
    parser.add_argument("--api-delay-ms", type=float, default=0.0)
    parser.add_argument("--engine-tok-per-s", type=float, default=None)
    parser.add_argument("--slow-if-env", default=None)
    parser.add_argument("--engine-stamps", default=None)
    parser.add_argument("--nccl-lines", action="store_true")
    parser.add_argument("--nccl-log-value", action="append", default=[])
    parser.add_argument("--all-reduce-lines", default=None,
                        choices=sorted(p.stem for p in ALL_REDUCE_LOGS.glob("*.log")))
    parser.add_argument("--prompt-log", default=None)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--sim-gpu-mib", type=int, default=0)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--sim-gpus", type=int, default=None)  # default: one per tensor-parallel rank
    parser.add_argument("--sim-linger-s", type=float, default=0.0)
    args, _ = parser.parse_known_args()
    args.model = args.served_model_name or args.model
    args.sim_gpus = args.sim_gpus or args.tensor_parallel_size
    if args.boot_count:
        with open(args.boot_count, "a") as fh:
            fh.write(f"{os.getpid()} {os.environ.get('NCCL_PROTO', '-')} {os.environ.get('NCCL_ALGO', '-')}\n")
    if args.mode == "spawn-children":
        spawn_children()
    if args.sim_gpu_mib:
        spawn_sim_engine(args)
    if args.mode == "ignore-sigterm":
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    boot(args)
    if args.engine_stamps:
        global ENGINE_SET
        ENGINE_SET = set_engine_stamps(args.engine_stamps, args)
    Handler.args = args
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    vllm_info("entry.py:140", f"Starting vLLM server on http://{args.host}:{args.port}")
    log("INFO:     Application startup complete.")
    server.serve_forever()


if __name__ == "__main__":
    main()
