"""The ``tiny-gpu-torch`` server: an OpenAI-compatible front end over a torch engine, no vLLM.

It lets the plugin's GPU flow (hardware check, sweep, launch, memory-freed wait, NVML telemetry,
report) run end to end where torch and a GPU are but vLLM is not, and in CI on the CPU: vLLM
0.32's endpoints and log lines over a seeded tiny model (``torch_model.py``). Like vLLM it is two
processes, this API server (standard library only) and an engine core child that holds the model
and KV cache, so a run killed with its launcher leaves a real orphan holding real GPU memory.
Completions stream as vLLM's ``completion_stream_generator`` does; decoding is greedy whatever
``temperature`` says (a step's cost does not depend on the token it picks); the tokenizer is
byte-level (BOS 256, EOS 257), so a prompt's length in tokens is exact.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import logging
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from pytest_kimiperf.paths import built_model_dir, spec_key
from pytest_kimiperf.version import __version__

BOS_ID, EOS_ID, VOCAB_SIZE = 256, 257, 258
_ENGINE_MODULE = "pytest_kimiperf.server.torch_model"
# Bump when the weights' recipe (torch_model.build_checkpoint) changes in a way TinySpec does not capture.
_RECIPE_VERSION = 1
# vLLM's histogram buckets (vllm/v1/metrics/loggers.py), as its /metrics shows them.
_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
# vLLM's request_generation_tokens buckets (build_1_2_5_buckets up to its max_model_len).
_GENERATION_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)
_ROUTES = (("/health", "GET"), ("/v1/models", "GET"), ("/version", "GET"), ("/metrics", "GET"),
          ("/tokenize", "POST"), ("/detokenize", "POST"), ("/v1/completions", "POST"))


@dataclass(frozen=True)
class TinySpec:
    """Everything that shapes the weights; its hash names the checkpoint's folder."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    seed: int = 0

    def key(self) -> str:
        """Short stable hash of the spec and the recipe version (the fingerprint's revision too)."""
        return spec_key(self, _RECIPE_VERSION)

    def folder(self, cache_dir: Path | None = None) -> Path:
        """Where the checkpoint of this spec lives (built or not)."""
        return built_model_dir("tiny-torch", self, _RECIPE_VERSION, cache_dir)


def vllm_logger(who: str) -> logging.Logger:
    """A logger that writes vLLM's line format to stdout: ``(who pid=N) INFO 11-30 18:34:11
    [file.py:501] message`` (vllm/logger.py _FORMAT and _DATE_FORMAT, the process prefix of its
    multiprocessing), which the plugin's boot account reads by its stamps."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"({who} pid=%(process)d) %(levelname)s %(asctime)s "
                                           "[%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S"))
    logger = logging.getLogger(f"kimiperf.torch_engine.{who}")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def encode(text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of ``text``: one per UTF-8 byte, after BOS where special tokens are added."""
    return ([BOS_ID] if add_special_tokens else []) + list(text.encode("utf-8"))


def decode(token_ids: Sequence[int]) -> str:
    """Text of ``token_ids``, special tokens left out."""
    return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", "replace")


class Histogram:
    """A Prometheus histogram: cumulative bucket counts, sum and count."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        self.counts[index] += 1
        self.total += value

    def lines(self, name: str, labels: str) -> list[str]:
        """The exposition lines of this histogram."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts):
            running += count
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(running)}')
        return [*out, f"{name}_count{{{labels}}} {float(running)}", f"{name}_sum{{{labels}}} {self.total}"]


@dataclass
class Stream:
    """One request in flight: its tokens as the engine sends them, and its timings."""

    prompt_tokens: int
    arrived_s: float
    tokens: queue.Queue[tuple[int, str | None]] = field(default_factory=queue.Queue)
    first_token_s: float | None = None
    last_token_s: float | None = None
    generated: int = 0


class Frontend:
    """What the HTTP handlers share: the engine's pipe, the streams in flight and the metrics."""

    def __init__(self, args: argparse.Namespace, engine: Connection, engine_info: dict[str, Any]) -> None:
        self.args = args
        self.engine = engine
        self.engine_info = engine_info
        # State and the pipe's sending end have locks of their own: the thread that drains the
        # engine's output never waits for a sender, so neither side's buffer can fill for good.
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.streams: dict[str, Stream] = {}
        self.stopping = False
        self.ttft = Histogram(_TTFT_BUCKETS_S)
        self.itl = Histogram(_ITL_BUCKETS_S)
        # The engine's per-request phases as vLLM's stat logger observes them at each finish
        # (measure/server_view.py reads them as the engine's clock): no queue of its own here
        # (a request is scheduled as it arrives), prefill to the first token, decode to the last.
        self.queue_time = Histogram(_TTFT_BUCKETS_S)
        self.prefill_time = Histogram(_TTFT_BUCKETS_S)
        self.decode_time = Histogram(_TTFT_BUCKETS_S)
        self.generation_per_request = Histogram(_GENERATION_BUCKETS)
        self.counters = {"prompt": 0, "generation": 0, "length": 0, "stop": 0, "abort": 0}
        self.running = self.waiting = 0

    def submit(self, key: str, prompt_ids: list[int], max_tokens: int, min_tokens: int, ignore_eos: bool) -> Stream:
        """Hand one request to the engine; its tokens arrive on the returned stream."""
        stream = Stream(len(prompt_ids), time.monotonic())
        with self.lock:
            self.streams[key] = stream
            self.counters["prompt"] += len(prompt_ids)
        with self.send_lock:
            self.engine.send(("add", key, prompt_ids, max_tokens, min_tokens, ignore_eos))
        return stream

    def abort(self, key: str) -> None:
        """The client went away: the engine frees the request's slot."""
        with self.lock:
            if self.streams.pop(key, None) is None:
                return
            self.counters["abort"] += 1
        with self.send_lock:
            self.engine.send(("abort", key))

    def receive(self, log: logging.Logger) -> None:
        """The engine's steps, passed to their streams (a thread for the server's life)."""
        while True:
            try:
                _, outputs, running, waiting = self.engine.recv()
            except (EOFError, OSError):
                if not self.stopping:
                    log.error("EngineCore died: its pipe closed. Shutting down the API server.")
                    logging.shutdown()
                    sys.stdout.flush()
                    # As vLLM's API server over a dead engine: the process ends, and the plugin
                    # reports the death with this log's tail.
                    os._exit(1)
                return
            now = time.monotonic()
            with self.lock:
                self.running, self.waiting = running, waiting
                for key, token, finish in outputs:
                    stream = self.streams.get(key)
                    if stream is None:
                        continue  # aborted
                    if stream.last_token_s is None:
                        self.ttft.observe(now - stream.arrived_s)
                        stream.first_token_s = now
                    else:
                        self.itl.observe(now - stream.last_token_s)
                    stream.last_token_s = now
                    stream.generated += 1
                    self.counters["generation"] += 1
                    if finish is not None:
                        self.counters[finish] += 1
                        del self.streams[key]
                        first = stream.first_token_s if stream.first_token_s is not None else now
                        self.queue_time.observe(0.0)
                        self.prefill_time.observe(first - stream.arrived_s)
                        self.decode_time.observe(now - first)
                        self.generation_per_request.observe(float(stream.generated))
                    stream.tokens.put((token, finish))

    def metrics_text(self) -> str:
        """The Prometheus exposition of what this server did (vLLM's names and labels)."""
        labels = f'engine="0",model_name="{self.args.served_model_name}"'
        info = self.engine_info
        cache = (f'block_size="{self.args.max_model_len}",cache_dtype="auto",enable_prefix_caching="False",'
                 f'engine="0",gpu_memory_utilization="{self.args.gpu_memory_utilization}",'
                 f'kv_cache_memory_bytes="{info.get("kv_bytes", 0)}",num_gpu_blocks="{self.args.max_num_seqs}"')
        with self.lock:
            c = dict(self.counters)
            lines = [
                "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {float(self.running)}",
                "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}",
                # No prefix cache: nothing is looked up in one, and nothing is found.
                "# TYPE vllm:prefix_cache_queries_total counter", f"vllm:prefix_cache_queries_total{{{labels}}} 0.0",
                "# TYPE vllm:prefix_cache_hits_total counter", f"vllm:prefix_cache_hits_total{{{labels}}} 0.0",
                "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{labels}}} {float(c['prompt'])}",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{labels}}} {float(c['generation'])}",
                "# TYPE vllm:request_success_total counter",
                *(f'vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name='
                  f'"{self.args.served_model_name}"}} {float(c[reason])}' for reason in ("stop", "length", "abort")),
                *(line for name, hist in (("vllm:time_to_first_token_seconds", self.ttft),
                                          ("vllm:inter_token_latency_seconds", self.itl),
                                          ("vllm:request_queue_time_seconds", self.queue_time),
                                          ("vllm:request_prefill_time_seconds", self.prefill_time),
                                          ("vllm:request_decode_time_seconds", self.decode_time),
                                          ("vllm:request_generation_tokens", self.generation_per_request))
                  for line in (f"# TYPE {name} histogram", *hist.lines(name, labels))),
            ]
        return "\n".join([*lines, "# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{cache}}} 1.0", ""])


class BadRequest(Exception):
    """A request this server refuses, with vLLM's status and error type."""

    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class Handler(BaseHTTPRequestHandler):
    """vLLM's endpoints over HTTP/1.1 keep-alive, token chunks sent as they come (no Nagle, as uvicorn)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    frontend: Frontend

    def log_message(self, format: str, *args: Any) -> None:
        # uvicorn's access log line
        sys.stdout.write(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
                         f"{args[1] if len(args) > 1 else ''}\n")
        sys.stdout.flush()

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: object) -> None:
        self._send(status, json.dumps(payload).encode())

    def do_GET(self) -> None:
        args = self.frontend.args
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": args.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "kimiperf",
                "root": args.model, "parent": None, "max_model_len": args.max_model_len}]})
        elif self.path == "/version":
            self._json(200, {"version": f"kimiperf-torch-engine {__version__}"})
        elif self.path == "/metrics":
            self._send(200, self.frontend.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            self._check_model(body)
            if self.path == "/tokenize":
                if "prompt" not in body:
                    raise BadRequest("this server tokenizes prompts only (no chat template: no 'messages')")
                ids = encode(str(body["prompt"]), bool(body.get("add_special_tokens", True)))
                self._json(200, {"count": len(ids), "max_model_len": self.frontend.args.max_model_len,
                                 "tokens": ids, "token_strs": None})
            elif self.path == "/detokenize":
                self._json(200, {"prompt": decode([int(t) for t in body.get("tokens", [])])})
            elif self.path == "/v1/completions":
                self._complete(body)
            else:
                self._json(404, {"detail": "Not Found"})
        except (BadRequest, ValueError, TypeError) as error:
            bad = error if isinstance(error, BadRequest) else BadRequest(f"invalid request: {error}")
            self._json(bad.status, {"error": {"message": str(bad), "type": bad.kind, "param": None, "code": bad.status}})

    def _check_model(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        if model is not None and model != self.frontend.args.served_model_name:
            raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError")

    def _prompt_ids(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return encode(prompt, bool(body.get("add_special_tokens", True)))
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and 0 <= t < VOCAB_SIZE for t in prompt):
            return list(prompt)
        raise BadRequest("prompt must be one string or one list of token ids (batches are not served)")

    def _complete(self, body: dict[str, Any]) -> None:
        args = self.frontend.args
        ids = self._prompt_ids(body)
        max_tokens = int(body.get("max_tokens") or 16)
        min_tokens = int(body.get("min_tokens") or 0)
        if max_tokens < 1 or not 0 <= min_tokens <= max_tokens:
            raise BadRequest(f"max_tokens={max_tokens} must be >= 1 and min_tokens={min_tokens} from 0 to max_tokens")
        if len(ids) + max_tokens > args.max_model_len:
            raise BadRequest(f"This model's maximum context length is {args.max_model_len} tokens. However, you "
                             f"requested {len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} "
                             "in the completion). Please reduce the length of the messages or completion.")
        request_id = f"cmpl-{self.headers.get('x-request-id') or uuid.uuid4().hex}"
        key = uuid.uuid4().hex
        stream = self.frontend.submit(key, ids, max_tokens, min_tokens, bool(body.get("ignore_eos", False)))
        head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": args.served_model_name}

        def usage(count: int) -> dict[str, int]:
            return {"prompt_tokens": len(ids), "total_tokens": len(ids) + count, "completion_tokens": count}

        try:
            if not body.get("stream"):
                pieces = list(self._pieces(stream))
                self._json(200, {**head, "choices": [{"index": 0, "text": "".join(t for t, _ in pieces), "logprobs": None,
                                                      "finish_reason": pieces[-1][1], "stop_reason": None}],
                                 "usage": usage(len(pieces))})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            count = 0
            options = body.get("stream_options") or {}
            # vLLM's continuous_usage_stats: the running count in every chunk (should_include_usage).
            running_usage = bool(options.get("include_usage") and options.get("continuous_usage_stats"))
            for text, finish in self._pieces(stream):
                count += 1
                # vLLM's chunk (CompletionStreamResponse.model_dump_json(exclude_unset=True)): every
                # choice field is set, so every one is written, null or not.
                chunk = {**head, "choices": [{
                    "index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                    "prompt_token_ids": None, "token_ids": None}]}
                if running_usage:
                    chunk["usage"] = usage(count)
                self._event(json.dumps(chunk, separators=(",", ":")))
            if options.get("include_usage"):
                self._event(json.dumps({**head, "choices": [], "usage": usage(count)}, separators=(",", ":")))
            self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.frontend.abort(key)
            self.close_connection = True

    @staticmethod
    def _pieces(stream: Stream) -> Iterator[tuple[str, str | None]]:
        """Each token's text (bytes that end a character; the rest wait for it) and finish reason."""
        text = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            token, finish = stream.tokens.get()
            yield text.decode(bytes([token]) if token < 256 else b""), finish
            if finish is not None:
                return

    def _event(self, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()


def _build_parser() -> argparse.ArgumentParser:
    """The server's flags: vLLM's names for what it shares with ``vllm serve``."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kimiperf.server.torch_engine")
    parser.add_argument("--model", required=True, help="kimiperf:tiny-torch (built on first use) or its folder")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: CUDA where torch sees a GPU, else the CPU")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                        help="auto: bfloat16 on CUDA, float32 on the CPU")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags, checked: one device, a memory share in (0, 1], room for a token."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.tensor_parallel_size != 1:
        parser.error(f"--tensor-parallel-size {args.tensor_parallel_size}: this engine runs on one device; allowed: 1")
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error(f"--gpu-memory-utilization {args.gpu_memory_utilization}: a share above 0, at most 1")
    if args.max_model_len < 2 or args.max_num_seqs < 1:
        parser.error(f"--max-model-len {args.max_model_len} must be >= 2 and --max-num-seqs {args.max_num_seqs} >= 1")
    args.served_model_name = args.served_model_name or args.model
    return args


def _start_engine(args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], Connection]:
    """The engine core child (``torch_model.py``) and this side of its pipe."""
    ours, theirs = socket.socketpair()
    argv = [sys.executable, "-m", _ENGINE_MODULE, "--fd", str(theirs.fileno()), "--model", args.model,
            "--device", args.device, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
            "--max-num-seqs", str(args.max_num_seqs), "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--seed", str(args.seed)]
    engine = subprocess.Popen(argv, pass_fds=(theirs.fileno(),))
    theirs.close()
    return engine, Connection(ours.detach())


def main(argv: Sequence[str] | None = None) -> int:
    """Boot the engine core, then serve until SIGTERM or SIGINT; 1 when the engine cannot boot."""
    args = parse_args(argv)
    log = vllm_logger("APIServer")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    defaults = _build_parser()
    log.info("non-default args: %s", {k: v for k, v in vars(args).items() if v != defaults.get_default(k)})
    engine, pipe = _start_engine(args)
    frontend: Frontend | None = None
    try:
        try:
            _, info = pipe.recv()  # ("ready", what the engine allocated)
        except EOFError:
            log.error("EngineCore failed to start (exit code %s); see its lines above.", engine.wait())
            return 1
        frontend = Frontend(args, pipe, info)
        Handler.frontend = frontend
        server = ThreadingHTTPServer((args.host, args.port), Handler)
        server.daemon_threads = True
        threading.Thread(target=frontend.receive, args=(log,), name="engine-output", daemon=True).start()
        log.info("Available routes are:")
        for route, method in _ROUTES:
            log.info("Route: %s, Methods: %s", route, method)
        sys.stdout.write(f"INFO:     Started server process [{os.getpid()}]\nINFO:     Waiting for application startup.\n"
                         "INFO:     Application startup complete.\n")
        sys.stdout.flush()
        server.serve_forever()
    except (SystemExit, KeyboardInterrupt):
        log.info("Shutting down the API server and its EngineCore.")
    finally:
        if frontend is not None:
            frontend.stopping = True
        with contextlib.suppress(OSError):
            pipe.send(("stop",))
        try:
            engine.wait(timeout=10)
        except subprocess.TimeoutExpired:
            engine.kill()
            engine.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
