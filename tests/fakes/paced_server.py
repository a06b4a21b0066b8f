"""A local OpenAI-compatible streaming server that writes tokens on a set pace and records when.

It is the ground truth for the client-accuracy benchmark and the stub server for the client
tests. Each streamed request gets its first token ``ttft_ms`` after the request's bytes reached
the server's socket and one more every ``itl_ms`` after that (absolute schedule, no drift). For
every chunk it records the ``perf_counter_ns()`` just before the ``send()`` that put the chunk's
last byte in the kernel: that is the truth a client's arrival timestamps are compared with.

Why it is built the way it is:

* One thread, a hand-written loop over ``epoll`` and ``select``. asyncio and uvloop round timer
  waits to whole milliseconds (epoll_wait takes ms; libuv timers are ms), which would make the
  pace itself jitter by up to 1 ms; ``select()`` takes a microsecond timeout, and the process
  timer slack is cut to 1 us with ``prctl(PR_SET_TIMERSLACK)`` (man 2 prctl) so sleeps end on
  time. ``select()`` is only used for the last stretch before a due write.
* The request's arrival time is the kernel's receive timestamp (``SO_TIMESTAMPNS``, socket(7)),
  converted from CLOCK_REALTIME to CLOCK_MONOTONIC (what ``perf_counter_ns`` reads on Linux). So
  a server that notices a request late does not shorten the true TTFT it reports.
* Chunk bytes are pre-built per request; the hot path is a heap pop, one ``send()`` and one
  list append.

Also served, so tests can use it as a whole fake vLLM: ``/tokenize`` and ``/detokenize`` (one
token per whitespace-separated word, BOS when ``add_special_tokens``), ``/v1/models``,
``/health``, ``/metrics`` (vLLM's Prometheus names, from the server's own truth) and
``/paced/truth`` (GET: the recorded timeline as JSON; POST ``/paced/reset`` clears it).

A request can ask for faults through a ``"paced"`` object in its JSON body: ``tokens_per_chunk``,
``break_after_chunks`` (close the socket mid-stream), ``completion_tokens_delta`` (lie in usage),
``error_after_chunks`` (send a vLLM-style ``{"error": ...}`` event), ``status`` (answer with
that HTTP status), ``ttft_ms`` / ``itl_ms`` (override the pace), ``close_idle_after_ms`` (close
the keep-alive connection that long after the stream ended, as uvicorn's keep-alive timeout does).

Server-wide faults: ``burst_every`` (``--burst-every N``) holds back every Nth stream the server
starts and writes it whole in one ``send()`` at its last chunk's due time, as an API server
starved of the CPU or a buffering proxy does. Its truth records that one send as the write of
every chunk (``"burst": true``). ``stall_every`` with ``stall_ms`` (``--stall-every N
--stall-ms MS``) writes every Nth stream's first chunk on time, then stalls: the rest go in one
``send()`` ``stall_ms`` after the last chunk's due time, so the user waits that much longer for
every answer (``"stall": true``). A burst or stalled stream carries no break or error fault.
``--tokens-per-chunk K`` puts K tokens in every chunk at the same token pace (a chunk every K
token gaps), as vLLM's ``--stream-interval K`` does.

Where a request asks for ``stream_options.continuous_usage_stats`` (with ``include_usage``), every
chunk carries the running ``usage``, as vLLM's does.

Run it: ``python tests/fakes/paced_server.py --port 8123 --ttft-ms 20 --itl-ms 5``; it prints
``PACED_SERVER_READY port=<port>`` on stdout when it accepts connections.
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import math
import os
import select
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

_PR_SET_TIMERSLACK = 29
# Not every Python build exposes the constant; the value is fixed by the Linux ABI.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_SCM_TIMESTAMPNS = _SO_TIMESTAMPNS
_BOS_ID = 1
_FINE_WAIT_NS = 1_500_000
_HISTOGRAM_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)


@dataclass(frozen=True)
class PacedServerConfig:
    """How the server paces its streams."""

    host: str = "127.0.0.1"
    port: int = 0
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    model: str = "paced-model"
    # Emit on a global step grid (every itl_ms for all streams at once), as a continuous-batching
    # engine does, instead of each stream on its own phase.
    batched: bool = False
    # Like vLLM's --api-key: /v1 routes then need "Authorization: Bearer <key>".
    api_key: str | None = None
    # Serve /tokenize and /detokenize (off: an OpenAI-compatible server that is not vLLM).
    tokenizer: bool = True
    # Every Nth stream (counting every generation request, warm-up included) is written whole in
    # one send at its last chunk's due time (0: none).
    burst_every: int = 0
    # Every Nth stream writes its first chunk on time and the rest in one send stall_ms after the
    # last chunk's due time (0: none).
    stall_every: int = 0
    stall_ms: float = 100.0
    # Tokens in every chunk (a chunk every this many token gaps): vLLM's --stream-interval.
    tokens_per_chunk: int = 1


@dataclass
class _Stream:
    request_id: str
    conn: _Connection
    chat: bool
    include_usage: bool
    prompt_tokens: int
    output_tokens: int
    tokens_per_chunk: int
    completion_tokens_delta: int
    break_after_chunks: int | None
    error_after_chunks: int | None
    close_idle_after_ms: float | None
    t_arrival_ns: int
    first_due_ns: int
    itl_ns: int
    chunk_bytes: bytes
    last_chunk_bytes: bytes
    first_prefix: bytes
    tail_bytes: bytes
    chunks_total: int
    burst: bool = False
    stall_ns: int | None = None
    # The chunk's JSON with the running usage to fill in (continuous_usage_stats), else None.
    usage_each: tuple[dict[str, Any], dict[str, Any]] | None = None
    chunks_sent: int = 0
    write_ns: list[int] = field(default_factory=list)
    due_ns: list[int] = field(default_factory=list)
    t_end_ns: int = 0
    outcome: str = "streaming"


@dataclass
class _Connection:
    sock: socket.socket
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)
    last_rx_ns: int = 0
    streaming: bool = False
    close_after_flush: bool = False
    # (stream, end of its bytes in outbuf, how many chunks those bytes complete)
    pending_truth: list[tuple[_Stream, int, int]] = field(default_factory=list)


def _set_timer_slack_ns(slack_ns: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_TIMERSLACK, slack_ns, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # Not Linux: waits are coarser, the recorded truth stays exact.


def _realtime_to_monotonic_ns(realtime_ns: int) -> int:
    offset_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.perf_counter_ns()
    return realtime_ns - offset_ns


def _words(text: str) -> list[str]:
    return text.split()


class PacedServer:
    """The server: ``start()`` in a thread (tests) or ``serve_forever()`` (benchmark process)."""

    def __init__(self, config: PacedServerConfig) -> None:
        self.config = config
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((config.host, config.port))
        self._listener.listen(1024)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._epoll = select.epoll()
        self._epoll.register(self._listener.fileno(), select.EPOLLIN)
        self._conns: dict[int, _Connection] = {}
        self._heap: list[tuple[int, int, _Stream | _Connection]] = []
        self.connections_accepted = 0
        self._seq = 0
        self._streams: list[_Stream] = []
        self._vocab: dict[str, int] = {"<s>": _BOS_ID}
        self._words_by_id: dict[int, str] = {_BOS_ID: "<s>"}
        self._stop_r, self._stop_w = os.pipe()
        self._epoll.register(self._stop_r, select.EPOLLIN)
        self._running = False
        self._thread: threading.Thread | None = None
        self._counter = 0
        self._grid_origin_ns = time.perf_counter_ns()

    # ----------------------------------------------------------------- lifecycle

    @property
    def base_url(self) -> str:
        """The URL a client uses, e.g. ``http://127.0.0.1:8123``."""
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> Self:
        """Serve from a daemon thread (for tests); returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="paced-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every socket."""
        self._running = False
        try:
            os.write(self._stop_w, b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Run the loop until ``stop()``."""
        _set_timer_slack_ns(1000)
        self._running = True
        try:
            while self._running:
                self._fire_due()
                self._wait_and_handle_io()
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            self._epoll.close()
            self._listener.close()
            os.close(self._stop_r)
            os.close(self._stop_w)

    # ----------------------------------------------------------------- the loop

    def _wait_and_handle_io(self) -> None:
        if self._heap:
            wait_ns = self._heap[0][0] - time.perf_counter_ns()
        else:
            wait_ns = 200_000_000
        if wait_ns <= _FINE_WAIT_NS:
            events = self._epoll.poll(0)
            if not events and wait_ns > 0:
                # The last stretch before a due write: sleep() ends within microseconds (timer
                # slack 1 us) where epoll_wait would round up to a whole ms. A request arriving
                # meanwhile keeps its kernel arrival stamp, so reading it a bit later is harmless.
                time.sleep(wait_ns / 1e9)
                return
        else:
            # epoll rounds its timeout up to whole ms: wake early, finish with sleep().
            events = self._epoll.poll(math.floor((wait_ns - _FINE_WAIT_NS) / 1e6) / 1e3)
        for fd, mask in events:
            if fd == self._listener.fileno():
                self._accept()
            elif fd == self._stop_r:
                self._running = False
            else:
                conn = self._conns.get(fd)
                if conn is None:
                    continue
                if mask & select.EPOLLOUT:
                    self._flush(conn)
                if mask & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    self._read(conn)

    def _fire_due(self) -> None:
        heap = self._heap
        while heap and heap[0][0] <= time.perf_counter_ns():
            _, _, item = heapq.heappop(heap)
            if isinstance(item, _Connection):
                self._close(item)  # an idle keep-alive connection timing out
            elif item.outcome == "streaming":
                self._send_chunk(item)

    def _send_chunk(self, stream: _Stream) -> None:
        conn = stream.conn
        index = stream.chunks_sent
        if stream.break_after_chunks is not None and index >= stream.break_after_chunks:
            stream.outcome = "broken"
            stream.t_end_ns = time.perf_counter_ns()
            # RST instead of FIN: the client sees the connection die mid-stream.
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._close(conn)
            return
        if stream.error_after_chunks is not None and index >= stream.error_after_chunks:
            stream.outcome = "error"
            error = {"error": {"message": "paced server: injected error", "type": "InternalServerError",
                               "param": None, "code": 500}}
            # vLLM formats mid-stream errors with json.dumps (spaces after separators).
            payload = _sse(json.dumps(error).encode()) + _sse(b"[DONE]")
            self._queue(conn, _chunked(payload) + b"0\r\n\r\n", None)
            stream.t_end_ns = time.perf_counter_ns()
            conn.streaming = False
            return
        if stream.burst or (stream.stall_ns is not None and index > 0):
            # The rest of the stream in one send: every chunk's truth is that send.
            body = b"".join(self._chunk_bytes(stream, i) for i in range(index, stream.chunks_total))
            body = (stream.first_prefix if index == 0 else b"") + body + stream.tail_bytes
            chunks = stream.chunks_total - index
            last = True
        else:
            last = index == stream.chunks_total - 1
            body = self._chunk_bytes(stream, index)
            if index == 0:
                body = stream.first_prefix + body
            if last:
                body = body + stream.tail_bytes
            chunks = 1
        stream.chunks_sent += chunks
        self._queue(conn, body, stream, chunks)
        if last:
            stream.outcome = "done"
            stream.t_end_ns = stream.write_ns[-1] if stream.write_ns else time.perf_counter_ns()
            conn.streaming = False
            if stream.close_idle_after_ms is not None:
                self._seq += 1
                due_ns = time.perf_counter_ns() + int(stream.close_idle_after_ms * 1e6)
                heapq.heappush(self._heap, (due_ns, self._seq, conn))
        elif stream.stall_ns is not None:
            # Each later chunk's due time stays in the truth; the one write waits past the last's.
            last_due_ns = stream.first_due_ns + (stream.chunks_total - 1) * stream.itl_ns
            stream.due_ns.extend(stream.first_due_ns + i * stream.itl_ns for i in range(1, stream.chunks_total - 1))
            self._schedule(stream, last_due_ns + stream.stall_ns)
        else:
            self._schedule(stream, stream.first_due_ns + stream.chunks_sent * stream.itl_ns)

    @staticmethod
    def _chunk_bytes(stream: _Stream, index: int) -> bytes:
        """Chunk ``index``'s bytes: pre-built, or with the running usage where it is asked for."""
        last = index == stream.chunks_total - 1
        if stream.usage_each is None:
            return stream.last_chunk_bytes if last else stream.chunk_bytes
        chunk, usage = stream.usage_each[1 if last else 0], dict(stream.usage_each[0]["usage"])
        completion = stream.output_tokens if last else (index + 1) * stream.tokens_per_chunk
        usage.update(completion_tokens=completion, total_tokens=usage["prompt_tokens"] + completion)
        return _chunked(_sse(_compact({**chunk, "usage": usage})))

    def _schedule(self, stream: _Stream, due_ns: int) -> None:
        self._seq += 1
        stream.due_ns.append(due_ns)
        heapq.heappush(self._heap, (due_ns, self._seq, stream))

    def _queue(self, conn: _Connection, data: bytes, stream: _Stream | None, chunks: int = 1) -> None:
        if not conn.outbuf:
            # Fast path: nothing queued, so one send() usually takes the whole chunk.
            t_ns = time.perf_counter_ns()
            try:
                sent = conn.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._close(conn)
                return
            if sent == len(data):
                if stream is not None:
                    stream.write_ns.extend([t_ns] * chunks)
                if conn.close_after_flush:
                    self._close(conn)
                return
            data = data[sent:]
        conn.outbuf += data
        if stream is not None:
            conn.pending_truth.append((stream, len(conn.outbuf), chunks))
        self._flush(conn)

    def _flush(self, conn: _Connection) -> None:
        if conn.sock.fileno() < 0:
            return
        while conn.outbuf:
            t_ns = time.perf_counter_ns()
            try:
                sent = conn.sock.send(conn.outbuf)
            except BlockingIOError:
                self._epoll.modify(conn.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
                return
            except OSError:
                self._close(conn)
                return
            del conn.outbuf[:sent]
            # A chunk's truth is the send() that wrote its last byte.
            while conn.pending_truth and conn.pending_truth[0][1] <= sent:
                stream, _, chunks = conn.pending_truth.pop(0)
                stream.write_ns.extend([t_ns] * chunks)
            conn.pending_truth = [(s, end - sent, n) for s, end, n in conn.pending_truth]
        if not conn.outbuf:
            if conn.close_after_flush:
                self._close(conn)
                return
            try:
                self._epoll.modify(conn.sock.fileno(), select.EPOLLIN)
            except (OSError, ValueError):
                pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            self.connections_accepted += 1
            conn = _Connection(sock=sock)
            self._conns[sock.fileno()] = conn
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def _close(self, conn: _Connection) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass
            conn.sock.close()
        for stream in self._streams:
            if stream.conn is conn and stream.outcome == "streaming":
                stream.outcome = "client-closed"
                stream.t_end_ns = time.perf_counter_ns()

    def _read(self, conn: _Connection) -> None:
        while True:
            try:
                data, ancdata, _, _ = conn.sock.recvmsg(65536, 64)
            except BlockingIOError:
                break
            except OSError:
                self._close(conn)
                return
            if not data:
                self._close(conn)
                return
            rx_ns = 0
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == _SCM_TIMESTAMPNS and len(payload) >= 16:
                    sec, nsec = struct.unpack("qq", payload[:16])
                    rx_ns = _realtime_to_monotonic_ns(sec * 1_000_000_000 + nsec)
            conn.last_rx_ns = rx_ns or time.perf_counter_ns()
            conn.inbuf += data
        while not conn.streaming and conn.sock.fileno() >= 0:
            request = _parse_request(conn.inbuf)
            if request is None:
                return
            method, path, headers, body, consumed = request
            del conn.inbuf[:consumed]
            self._handle(conn, method, path, headers, body)

    # ----------------------------------------------------------------- requests

    def _handle(self, conn: _Connection, method: str, path: str, headers: dict[str, str],
                body: bytes) -> None:
        path = path.split("?", 1)[0]
        try:
            payload: Any = json.loads(body) if body else {}
        except ValueError:
            self._respond_json(conn, 400, _error("body is not JSON"))
            return
        key = self.config.api_key
        if key and path.startswith("/v1/") and headers.get("authorization") != f"Bearer {key}":
            self._respond_json(conn, 401, _error("invalid API key"))
            return
        if not self.config.tokenizer and path in ("/tokenize", "/detokenize"):
            self._respond_json(conn, 404, _error(f"no route {method} {path}"))
            return
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            self._start_generation(conn, path.endswith("chat/completions"), headers, payload)
        elif method == "POST" and path == "/tokenize":
            self._respond_json(conn, 200, self._tokenize(payload))
        elif method == "POST" and path == "/detokenize":
            tokens = payload.get("tokens", [])
            text = " ".join(self._words_by_id.get(t, f"w{t}") for t in tokens if t != _BOS_ID)
            self._respond_json(conn, 200, {"prompt": text})
        elif method == "GET" and path == "/v1/models":
            self._respond_json(conn, 200, {"object": "list", "data": [
                {"id": self.config.model, "object": "model", "owned_by": "paced"}]})
        elif method == "GET" and path == "/health":
            self._respond(conn, 200, b"", b"text/plain")
        elif method == "GET" and path == "/metrics":
            self._respond(conn, 200, self._metrics_text().encode(), b"text/plain; version=0.0.4")
        elif method == "GET" and path == "/paced/truth":
            self._respond_json(conn, 200, {"streams": [_truth(s) for s in self._streams],
                                           "connections_accepted": self.connections_accepted})
        elif method == "POST" and path == "/paced/reset":
            self._streams = [s for s in self._streams if s.outcome == "streaming"]
            self._respond_json(conn, 200, {"ok": True})
        else:
            self._respond_json(conn, 404, _error(f"no route {method} {path}"))

    def _token_id(self, word: str) -> int:
        token_id = self._vocab.get(word)
        if token_id is None:
            token_id = len(self._vocab) + 100
            self._vocab[word] = token_id
            self._words_by_id[token_id] = word
        return token_id

    def _prompt_token_ids(self, payload: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            # A toy chat template: BOS, then "<|role|>" + content words per message, then
            # "<|assistant|>" as the generation prompt.
            ids = [_BOS_ID]
            for message in payload.get("messages", []):
                ids.append(self._token_id(f"<|{message.get('role', 'user')}|>"))
                content = message.get("content", "")
                if isinstance(content, list):
                    content = " ".join(part.get("text", "") for part in content)
                ids.extend(self._token_id(w) for w in _words(str(content)))
            if payload.get("add_generation_prompt", True):
                ids.append(self._token_id("<|assistant|>"))
            return ids
        prompt = payload.get("prompt", "")
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        ids = [_BOS_ID] if payload.get("add_special_tokens", True) else []
        ids.extend(self._token_id(w) for w in _words(str(prompt)))
        return ids

    def _tokenize(self, payload: dict[str, Any]) -> dict[str, Any]:
        ids = self._prompt_token_ids(payload, chat="messages" in payload)
        return {"count": len(ids), "max_model_len": 1_000_000, "tokens": ids, "token_strs": None}

    def _start_generation(self, conn: _Connection, chat: bool, headers: dict[str, str],
                          payload: dict[str, Any]) -> None:
        faults = payload.get("paced") or {}
        status = int(faults.get("status", 200))
        if status != 200:
            self._respond_json(conn, status, _error(f"paced server: injected status {status}"))
            return
        max_tokens = payload.get("max_completion_tokens" if chat else "max_tokens")
        if max_tokens is None:
            max_tokens = payload.get("max_tokens", 16)
        min_tokens = payload.get("min_tokens", 0) or 0
        if not isinstance(max_tokens, int) or max_tokens < 1 or min_tokens > max_tokens:
            self._respond_json(conn, 400, _error(
                f"max_tokens must be a positive int >= min_tokens, got {max_tokens!r}"))
            return
        self._counter += 1
        request_id = headers.get("x-request-id") or f"paced-{self._counter}"
        prompt_tokens = len(self._prompt_token_ids(payload, chat))
        server_chunk = self.config.tokens_per_chunk
        tokens_per_chunk = max(1, int(faults.get("tokens_per_chunk", server_chunk)))
        ttft_ns = int(float(faults.get("ttft_ms", self.config.ttft_ms)) * 1e6)
        # A server-wide chunk of K tokens keeps the token pace: a chunk every K gaps.
        itl_ns = int(float(faults.get("itl_ms", self.config.itl_ms * server_chunk)) * 1e6)
        stream_options = payload.get("stream_options") or {}
        include_usage = bool(stream_options.get("include_usage"))
        usage_each = include_usage and bool(stream_options.get("continuous_usage_stats"))
        model = str(payload.get("model", self.config.model))
        t_arrival_ns = conn.last_rx_ns
        first_due_ns = t_arrival_ns + ttft_ns
        if self.config.batched and itl_ns > 0:
            # Next step of a global grid, like one engine step serving the whole batch.
            steps = -(-(first_due_ns - self._grid_origin_ns) // itl_ns)
            first_due_ns = self._grid_origin_ns + steps * itl_ns
        chunks_total = -(-max_tokens // tokens_per_chunk)
        burst = self.config.burst_every > 0 and self._counter % self.config.burst_every == 0
        stall = (not burst and chunks_total > 1 and self.config.stall_every > 0
                 and self._counter % self.config.stall_every == 0)
        created = int(time.time())
        word = " tok"
        if chat:
            head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk",
                    "created": created, "model": model}
            text = word * tokens_per_chunk
            chunk = {**head, "choices": [{"index": 0, "delta": {"content": text},
                                          "logprobs": None, "finish_reason": None}]}
            last_text = word * (max_tokens - (chunks_total - 1) * tokens_per_chunk)
            last = {**head, "choices": [{"index": 0, "delta": {"content": last_text},
                                         "logprobs": None, "finish_reason": "length"}]}
            role = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}
            first_prefix = _chunked(_sse(_compact(role)))
        else:
            head = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": created,
                    "model": model}
            text = word * tokens_per_chunk
            chunk = {**head, "choices": [{"index": 0, "text": text, "logprobs": None,
                                          "finish_reason": None, "stop_reason": None}]}
            last_text = word * (max_tokens - (chunks_total - 1) * tokens_per_chunk)
            last = {**head, "choices": [{"index": 0, "text": last_text, "logprobs": None,
                                         "finish_reason": "length", "stop_reason": None}]}
            first_prefix = b""
        tail = b""
        if include_usage:
            completion_tokens = max_tokens + int(faults.get("completion_tokens_delta", 0))
            usage = {**head, "choices": [], "usage": {
                "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                "completion_tokens": completion_tokens}}
            tail += _chunked(_sse(_compact(usage)))
        tail += _chunked(_sse(b"[DONE]")) + b"0\r\n\r\n"
        stream = _Stream(
            request_id=request_id, conn=conn, chat=chat, include_usage=include_usage,
            prompt_tokens=prompt_tokens, output_tokens=max_tokens,
            tokens_per_chunk=tokens_per_chunk,
            completion_tokens_delta=int(faults.get("completion_tokens_delta", 0)),
            break_after_chunks=None if burst or stall else faults.get("break_after_chunks"),
            error_after_chunks=None if burst or stall else faults.get("error_after_chunks"),
            close_idle_after_ms=faults.get("close_idle_after_ms"),
            t_arrival_ns=t_arrival_ns, first_due_ns=first_due_ns, itl_ns=itl_ns,
            chunk_bytes=_chunked(_sse(_compact(chunk))),
            last_chunk_bytes=_chunked(_sse(_compact(last))),
            first_prefix=first_prefix, tail_bytes=tail, chunks_total=chunks_total, burst=burst,
            stall_ns=int(self.config.stall_ms * 1e6) if stall else None,
            usage_each=({**chunk, "usage": {"prompt_tokens": prompt_tokens}}, last) if usage_each else None,
        )
        self._streams.append(stream)
        conn.streaming = True
        self._queue(conn, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                          b"transfer-encoding: chunked\r\n\r\n", None)
        if burst:
            # Each chunk's due time stays in the truth; the one write waits for the last.
            stream.due_ns.extend(first_due_ns + i * itl_ns for i in range(chunks_total - 1))
            self._schedule(stream, first_due_ns + (chunks_total - 1) * itl_ns)
        else:
            self._schedule(stream, first_due_ns)

    def _respond_json(self, conn: _Connection, status: int, obj: Any) -> None:
        self._respond(conn, status, json.dumps(obj).encode(), b"application/json")

    def _respond(self, conn: _Connection, status: int, body: bytes, content_type: bytes) -> None:
        reason = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found"}.get(status, b"Error")
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
                % (status, reason, content_type, len(body)))
        self._queue(conn, head + body, None)

    # ----------------------------------------------------------------- /metrics

    def _metrics_text(self) -> str:
        ttft_s: list[float] = []
        itl_s: list[float] = []
        tokens = 0
        for s in self._streams:
            if not s.write_ns:
                continue
            ttft_s.append((s.write_ns[0] - s.t_arrival_ns) / 1e9)
            itl_s.extend((b - a) / 1e9 for a, b in zip(s.write_ns, s.write_ns[1:]))
            tokens += min(len(s.write_ns) * s.tokens_per_chunk, s.output_tokens)
        labels = f'engine="0",model_name="{self.config.model}"'
        lines = [
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {float(tokens)}",
        ]
        for name, values in (("vllm:time_to_first_token_seconds", ttft_s),
                             ("vllm:inter_token_latency_seconds", itl_s)):
            lines.append(f"# TYPE {name} histogram")
            lines.append(f"{name}_sum{{{labels}}} {math.fsum(values)!r}")
            for le in _HISTOGRAM_BUCKETS_S:
                count = sum(1 for v in values if v <= le)
                lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="{self.config.model}"}}'
                             f" {float(count)}")
            lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="{self.config.model}"}}'
                         f" {float(len(values))}")
            lines.append(f"{name}_count{{{labels}}} {float(len(values))}")
        return "\n".join(lines) + "\n"


def _truth(s: _Stream) -> dict[str, Any]:
    return {"request_id": s.request_id, "t_arrival_ns": s.t_arrival_ns, "write_ns": s.write_ns,
            "due_ns": s.due_ns[: len(s.write_ns)], "t_end_ns": s.t_end_ns, "outcome": s.outcome,
            "tokens_per_chunk": s.tokens_per_chunk, "output_tokens": s.output_tokens, "burst": s.burst,
            "stall": s.stall_ns is not None}


def _compact(obj: Any) -> bytes:
    # vLLM serializes chunks with pydantic's model_dump_json: no spaces.
    return json.dumps(obj, separators=(",", ":")).encode()


def _sse(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


def _parse_request(buf: bytearray) -> tuple[str, str, dict[str, str], bytes, int] | None:
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).decode("latin-1").split("\r\n")
    method, path, _ = head[0].split(" ", 2)
    headers = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    if len(buf) < end + 4 + length:
        return None
    body = bytes(buf[end + 4:end + 4 + length])
    return method, path, headers, body, end + 4 + length


def main(argv: list[str] | None = None) -> int:
    """Command line: serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=5.0)
    parser.add_argument("--model", default="paced-model")
    parser.add_argument("--batched", action="store_true",
                        help="emit all streams' tokens on one global step grid")
    parser.add_argument("--api-key", default=None, help="require this bearer key on /v1 routes")
    parser.add_argument("--no-tokenizer", action="store_true",
                        help="answer 404 on /tokenize and /detokenize")
    parser.add_argument("--burst-every", type=int, default=0, metavar="N",
                        help="write every Nth stream whole in one send at its last chunk's due time")
    parser.add_argument("--stall-every", type=int, default=0, metavar="N",
                        help="every Nth stream: the first chunk on time, the rest in one send --stall-ms after "
                             "the last chunk's due time")
    parser.add_argument("--stall-ms", type=float, default=100.0, metavar="MS")
    parser.add_argument("--tokens-per-chunk", type=int, default=1, metavar="K",
                        help="K tokens in every chunk, a chunk every K token gaps (vLLM's --stream-interval)")
    args = parser.parse_args(argv)
    if args.burst_every < 0:
        parser.error(f"--burst-every {args.burst_every}: must be 0 (off) or a positive count of streams")
    if args.stall_every < 0 or args.stall_ms < 0:
        parser.error(f"--stall-every {args.stall_every} --stall-ms {args.stall_ms}: must be 0 or more")
    if args.tokens_per_chunk < 1:
        parser.error(f"--tokens-per-chunk {args.tokens_per_chunk}: must be 1 or more")
    server = PacedServer(PacedServerConfig(host=args.host, port=args.port, ttft_ms=args.ttft_ms,
                                           itl_ms=args.itl_ms, model=args.model,
                                           batched=args.batched, api_key=args.api_key,
                                           tokenizer=not args.no_tokenizer,
                                           burst_every=args.burst_every, stall_every=args.stall_every,
                                           stall_ms=args.stall_ms, tokens_per_chunk=args.tokens_per_chunk))
    print(f"PACED_SERVER_READY port={server.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
