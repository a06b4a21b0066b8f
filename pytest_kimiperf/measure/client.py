"""The streaming client: sends a generation request and timestamps every chunk of its stream.

Every verdict is only as good as these timestamps, so they are taken where the bytes are:

* Arrival: the kernel's receive timestamp of the bytes (``SO_TIMESTAMPNS``, read with
  ``recvmsg``), moved onto ``perf_counter_ns``'s clock; where the kernel gives none,
  ``perf_counter_ns()`` right after ``recvmsg`` returned. Either way the stamp is taken before
  any parsing, and with the kernel stamp it does not depend on when this process got a CPU.
  The HTTP/1.1 chunked framing and the SSE events are split in the same reader callback, ~2 us
  of Python per chunk and no task switch; the request's task only wakes when the stream ends.
* Send: ``perf_counter_ns()`` right before the request bytes are written to the socket (one
  ``send()``), so TTFT is "request on the wire -> first token chunk in the socket", without
  the client's own request-building time.

Why not httpx for the stream (the plan was httpx): measured against the paced server
(tests/fakes/paced_server.py), httpx + httpcore + h11 cost ~30 us of CPU per chunk and one task
wake-up per chunk; 128 streams at 200 tok/s (25,600 chunks/s) then needed 0.8 of a core and
arrivals waited 6-50 ms in the loop before being stamped. httpcore's pool also scans every
connection for every queued request (``_assign_requests_to_connections``), 1.3 s of a 2.4 s
profile for 64 streams starting together. vLLM's ``bench serve`` stamps after aiohttp parsed the
message and after ``json.loads`` (vllm/benchmarks/lib/endpoint_request_func.py), in a task that
waits its turn. httpx stays for the non-streaming calls (workload.py, server_metrics.py).

The hot path asks one cheap byte question per SSE event: does it carry a non-empty
``"choices"`` array? JSON is parsed only for events without choices (the final usage chunk,
errors). Token counts come from ``usage``, never from counting chunks, because one chunk may
carry several tokens (vLLM ``--stream-interval``, speculative decoding).

Connections are kept alive and reused (one pool per client, sized to the concurrency). The API
key goes in the Authorization header and nowhere else (not in ``repr``, not in errors).

A wedged server must not stall the suite: besides the whole-request timeout, each request has a
first-token deadline (send to first token chunk) and an inter-chunk idle deadline (no token
chunk for that long), and a response head or an SSE event that grows past a cap (an endless
line) fails the request instead of growing memory without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.measure.results import RequestRecord

ENDPOINT_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}

# vLLM's chat stream opens with a role-only delta sent in the same engine iteration as the first
# token (vllm/entrypoints/openai/chat_completion/serving.py, "first_iteration"); it carries no
# token, so it is not a token chunk. Matched in vLLM's compact pydantic serialization only.
_CHAT_ROLE_ONLY_DELTA = b'"delta":{"role":"assistant","content":""}'
_CHOICES_KEY = b'"choices":'
_USAGE_OBJECT = b'"usage":{'
_WHITESPACE = b" \t\r\n"
# A non-200 answer's body is kept for the error message, up to this much.
_MAX_ERROR_BODY = 2048
# Caps on what may be buffered before it parses: a response head (uvicorn's are < 1 KiB), one
# chunk-size line, and one SSE event (vLLM's largest are chunks with logprobs of a few KiB;
# 4 MiB leaves room for top-k logprobs of long chunks while bounding a server that never ends
# its line).
MAX_HEAD_BYTES = 64 * 1024
MAX_SSE_EVENT_BYTES = 4 * 1024 * 1024
_MAX_CHUNK_SIZE_LINE = 1024
_RECV_BYTES = 64 * 1024
# Linux's SO_TIMESTAMPNS (asm-generic/socket.h); not every Python build names it.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
# A kernel stamp older than this is taken for a clock step, and the read time used instead.
_MAX_KERNEL_STAMP_AGE_NS = 10_000_000_000

# HTTP/1.1 response parser states.
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _TRAILERS, _LENGTH, _UNTIL_CLOSE, _DONE = range(7)


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: prompt, exact output length, and what usage must report back."""

    prompt: str
    output_tokens: int
    # When set, usage.prompt_tokens must equal it (workload built the prompt to this length).
    prompt_tokens: int | None = None
    request_id: str = ""


@dataclass(frozen=True)
class ServerAddress:
    """Where the server is, split once from its base URL."""

    host: str
    port: int
    path_prefix: str
    scheme: str = "http"

    @property
    def base_url(self) -> str:
        """The base URL again, normalized."""
        return f"{self.scheme}://{self.host}:{self.port}{self.path_prefix}"


def parse_base_url(base_url: object, *, source: str = "base_url") -> ServerAddress:
    """Split an ``http(s)://HOST:PORT`` server root URL, or raise ConfigError saying what is allowed."""
    allowed = "use the server root as http://HOST:PORT or https://HOST[:PORT] (no /v1 suffix)"
    if not isinstance(base_url, str):
        raise ConfigError(f"invalid server URL {base_url!r} (from {source}): {allowed}")
    parts = urlsplit(base_url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = -1
    if (parts.scheme not in ("http", "https") or not parts.hostname or port < 1 or parts.query
            or parts.fragment):
        raise ConfigError(f"invalid server URL {base_url!r} (from {source}): {allowed}")
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1"):
        raise ConfigError(
            f"invalid server URL {base_url!r} (from {source}): drop the trailing /v1, the "
            f"client adds {ENDPOINT_PATHS['completions']} itself"
        )
    return ServerAddress(parts.hostname, port, prefix, parts.scheme)


def check_endpoint(endpoint: object, *, source: str = "endpoint") -> str:
    """Return ``endpoint`` if it is one the client speaks, else raise ConfigError."""
    if not isinstance(endpoint, str) or endpoint not in ENDPOINT_PATHS:
        raise ConfigError(
            f"unknown endpoint {endpoint!r} (from {source}); use one of: "
            f"{', '.join(sorted(ENDPOINT_PATHS))}"
        )
    return endpoint


# --------------------------------------------------------------------------- per-chunk hot path


def _has_choices(payload: bytes) -> bool:
    """True when the event's ``"choices"`` array is non-empty (a token chunk)."""
    index = payload.find(_CHOICES_KEY)
    if index < 0:
        return False
    index += len(_CHOICES_KEY)
    size = len(payload)
    while index < size and payload[index] in _WHITESPACE:
        index += 1
    if index >= size or payload[index] != 0x5B:  # "["
        return False
    index += 1
    while index < size and payload[index] in _WHITESPACE:
        index += 1
    return index < size and payload[index] != 0x5D  # "]"


class _SSEReader:
    """Splits SSE events out of the body and keeps the arrival time of each token chunk."""

    __slots__ = ("buffer", "chat", "chunk_ns", "done_marker", "error", "usage")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.buffer = b""
        self.chunk_ns: list[int] = []
        self.done_marker = False
        self.error = ""
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes, arrival_ns: int) -> None:
        buffer = self.buffer + data if self.buffer else data
        if b"\r" in buffer:
            # SSE allows CRLF line ends (WHATWG HTML, "event stream interpretation").
            buffer = buffer.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            self._event(buffer[start:end], arrival_ns)
            start = end + 2
        self.buffer = buffer[start:]
        if len(self.buffer) > MAX_SSE_EVENT_BYTES:
            self.buffer = b""
            raise ValueError(f"an SSE event grew past {MAX_SSE_EVENT_BYTES // 1024} KiB without ending "
                             "(an endless line)")

    def _event(self, event: bytes, arrival_ns: int) -> None:
        if event.startswith(b"data: ") and b"\n" not in event:
            payload = event[6:]
        else:
            lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if not lines:
                return  # comment, keep-alive ping, or an event without data
            payload = b"\n".join(lines)
        if _has_choices(payload):
            if not (self.chat and _CHAT_ROLE_ONLY_DELTA in payload):
                self.chunk_ns.append(arrival_ns)
            if _USAGE_OBJECT in payload:
                self._parse(payload)  # usage riding on a token chunk (not vLLM's way, but legal)
            return
        if payload == b"[DONE]":
            self.done_marker = True
            return
        self._parse(payload)

    def _parse(self, payload: bytes) -> None:
        try:
            message = json.loads(payload)
        except ValueError:
            self.error = self.error or f"unparseable event: {payload[:120]!r}"
            return
        if not isinstance(message, dict):
            return
        if "error" in message:
            detail = message["error"]
            if isinstance(detail, dict):
                detail = detail.get("message", detail)
            self.error = self.error or f"server error event: {detail}"
        usage = message.get("usage")
        if isinstance(usage, dict):
            self.usage = usage


# --------------------------------------------------------------------------- connection


class _Exchange:
    """One request/response on a connection."""

    __slots__ = ("bytes_received", "done", "error_body", "failure", "reader", "status")

    def __init__(self, reader: _SSEReader, done: asyncio.Future[None]) -> None:
        self.reader = reader
        self.status = 0
        self.error_body = bytearray()
        self.done = done
        self.failure = ""
        self.bytes_received = 0


def _enable_kernel_rx_stamps(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        pass  # not Linux: stamps fall back to perf_counter_ns() at read time


class _Connection:
    """One keep-alive HTTP/1.1 connection; parses the response as its bytes arrive.

    It reads its socket itself (``add_reader`` + ``recvmsg``) to get the kernel's receive
    timestamp of the bytes (``SO_TIMESTAMPNS``, socket(7); TCP reports the time of the last
    segment a read returns), so a stamp does not grow stale while this process waits for a
    CPU or its loop is busy elsewhere. The kernel stamps CLOCK_REALTIME; it is moved onto
    ``perf_counter_ns``'s CLOCK_MONOTONIC with the two clocks' offset read at that moment.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._loop = loop
        self.sock = sock
        self.closed = False
        self.keep_alive = True
        self.exchange: _Exchange | None = None
        self.used = False
        self._buf = bytearray()
        self._state = _DONE
        self._remaining = 0
        self._fd = sock.fileno()
        self._rx = memoryview(bytearray(_RECV_BYTES))
        loop.add_reader(self._fd, self._readable)

    def close(self) -> None:
        """Close the socket; an exchange still in flight fails."""
        if self.closed:
            return
        self.closed = True
        self.keep_alive = False
        self._loop.remove_reader(self._fd)
        self.sock.close()
        exchange = self.exchange
        if exchange is not None:
            self._fail(exchange, "connection closed by the client")

    # reading ----------------------------------------------------------

    def _readable(self) -> None:
        try:
            # Into a buffer kept per connection: recvmsg(n) would allocate n bytes per call,
            # which cost 13 us per chunk at n = 256 KiB (an mmap for every read).
            size, ancdata, _, _ = self.sock.recvmsg_into([self._rx], _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        read_ns = time.perf_counter_ns()
        if not size:
            self._lost(None)
            return
        arrival_ns = read_ns
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                offset_ns = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.perf_counter_ns()
                kernel_ns = seconds * 1_000_000_000 + nanoseconds - offset_ns
                # Trust it only if it is plausible (a clock step would move it by seconds).
                if read_ns - _MAX_KERNEL_STAMP_AGE_NS <= kernel_ns <= read_ns:
                    arrival_ns = kernel_ns
        self.received(self._rx[:size], arrival_ns)

    def received(self, data: bytes | memoryview, arrival_ns: int) -> None:
        """Parse bytes that arrived at ``arrival_ns`` (the TLS connection calls this too)."""
        exchange = self.exchange
        if exchange is None:
            # Bytes while idle: the server broke the protocol; never reuse this connection.
            self.close()
            return
        exchange.bytes_received += len(data)
        self._buf += data
        try:
            self._parse(exchange, arrival_ns)
        except ValueError as exc:
            self._fail(exchange, f"malformed HTTP response: {exc}")
            self.close()

    def _lost(self, exc: OSError | None) -> None:
        exchange = self.exchange
        self.exchange = None
        if exchange is not None and self._state == _UNTIL_CLOSE:
            self._finish(exchange)  # a body delimited by the server closing the connection
            exchange = None
        self.close()
        if exchange is not None:
            chunks = len(exchange.reader.chunk_ns)
            cause = f": {exc}" if exc else ""
            self._fail(exchange, f"connection closed after {chunks} token chunks{cause}")

    # request ----------------------------------------------------------

    async def start(self, exchange: _Exchange, request: bytes) -> int:
        """Send ``request`` and return when its first byte went to the socket (perf_counter_ns)."""
        if self.closed:
            exchange.failure = "connection closed before the request was sent"
            exchange.done.set_result(None)
            return time.perf_counter_ns()
        self.exchange = exchange
        self.used = True
        self._state = _HEAD
        self._buf.clear()
        t_send_ns = time.perf_counter_ns()
        try:
            sent = self.sock.send(request)
            if sent < len(request):
                await self._loop.sock_sendall(self.sock, request[sent:])
        except BlockingIOError:
            await self._loop.sock_sendall(self.sock, request)
        except OSError as exc:
            # Not a single byte reached the server: the caller may retry on a fresh connection.
            self._lost(exc)
        return t_send_ns

    @property
    def reusable(self) -> bool:
        """True when idle, open and keep-alive."""
        return self.exchange is None and not self.closed and self.keep_alive

    # parsing ----------------------------------------------------------

    def _parse(self, exchange: _Exchange, arrival_ns: int) -> None:
        buf = self._buf
        pos = 0
        size = len(buf)
        while pos < size:
            state = self._state
            if state == _CHUNK_SIZE:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    if size - pos > _MAX_CHUNK_SIZE_LINE:
                        raise ValueError(f"a chunk-size line longer than {_MAX_CHUNK_SIZE_LINE} bytes")
                    break
                chunk_size = int(bytes(buf[pos:line_end]).split(b";", 1)[0], 16)
                if chunk_size > MAX_SSE_EVENT_BYTES:
                    raise ValueError(f"a chunk of {chunk_size} bytes (more than the "
                                     f"{MAX_SSE_EVENT_BYTES // 1024} KiB cap)")
                pos = line_end + 2
                if chunk_size == 0:
                    self._state = _TRAILERS
                    continue
                self._remaining = chunk_size
                self._state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                need = self._remaining
                if size - pos < need + 2:
                    break
                data = bytes(buf[pos:pos + need])
                if buf[pos + need:pos + need + 2] != b"\r\n":
                    raise ValueError("chunk data not followed by CRLF")
                pos += need + 2
                self._state = _CHUNK_SIZE
                self._body(exchange, data, arrival_ns)
            elif state == _HEAD:
                head_end = buf.find(b"\r\n\r\n", pos)
                if head_end < 0:
                    if size - pos > MAX_HEAD_BYTES:
                        raise ValueError(f"a response head longer than {MAX_HEAD_BYTES // 1024} KiB")
                    break
                head = bytes(buf[pos:head_end])
                pos = head_end + 4
                self._head(exchange, head)
            elif state == _TRAILERS:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                else:
                    trailers_end = buf.find(b"\r\n\r\n", pos)
                    if trailers_end < 0:
                        if size - pos > MAX_HEAD_BYTES:
                            raise ValueError(f"trailers longer than {MAX_HEAD_BYTES // 1024} KiB")
                        break
                    pos = trailers_end + 4
                self._finish(exchange)
            elif state == _LENGTH:
                take = min(self._remaining, size - pos)
                self._body(exchange, bytes(buf[pos:pos + take]), arrival_ns)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._finish(exchange)
            elif state == _UNTIL_CLOSE:
                self._body(exchange, bytes(buf[pos:]), arrival_ns)
                pos = size
            else:  # _DONE: bytes after the response ended
                self.keep_alive = False
                pos = size
        del buf[:pos]

    def _head(self, exchange: _Exchange, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return  # interim response; the real head follows
        exchange.status = status
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if parts[0] == b"HTTP/1.0" or headers.get(b"connection") == b"close":
            self.keep_alive = False
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self._state = _CHUNK_SIZE
        elif b"content-length" in headers:
            self._remaining = int(headers[b"content-length"])
            self._state = _LENGTH
            if self._remaining == 0:
                self._finish(exchange)
        else:
            self._state = _UNTIL_CLOSE
            self.keep_alive = False

    def _body(self, exchange: _Exchange, data: bytes, arrival_ns: int) -> None:
        if exchange.status == 200:
            exchange.reader.feed(data, arrival_ns)
        elif len(exchange.error_body) < _MAX_ERROR_BODY:
            exchange.error_body += data[: _MAX_ERROR_BODY - len(exchange.error_body)]

    def _finish(self, exchange: _Exchange) -> None:
        self._state = _DONE
        self.exchange = None
        if not exchange.done.done():
            exchange.done.set_result(None)

    def _fail(self, exchange: _Exchange, reason: str) -> None:
        exchange.failure = exchange.failure or reason
        self.keep_alive = False
        self.exchange = None
        if not exchange.done.done():
            exchange.done.set_result(None)


class _Pool:
    """Keep-alive connections to one server, at most ``max_connections`` in use at once."""

    def __init__(self, address: ServerAddress, max_connections: int) -> None:
        self._address = address
        self._max_connections = max_connections
        self._idle: list[_Connection] = []
        self._semaphore: asyncio.Semaphore | None = None

    async def acquire(self, *, fresh: bool = False) -> _Connection:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self._max_connections)
        await self._semaphore.acquire()
        try:
            while self._idle and not fresh:
                connection = self._idle.pop()
                if connection.reusable:
                    return connection
                connection.close()
            return await self._connect()
        except BaseException:
            self._semaphore.release()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port = self._address.host, self._address.port
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        if not infos:
            raise OSError(f"no address for {host}")
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _enable_kernel_rx_stamps(sock)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return _Connection(loop, sock)

    def release(self, connection: _Connection) -> None:
        if connection.reusable:
            self._idle.append(connection)
        else:
            connection.close()
        assert self._semaphore is not None
        self._semaphore.release()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


# --------------------------------------------------------------------------- the client


class StreamingClient:
    """A keep-alive connection pool to one server; ``stream()`` sends a request and times it."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        endpoint: str = "completions",
        api_key: str | None = None,
        max_connections: int = 1,
        request_timeout_s: float = 600.0,
        extra_body: Mapping[str, Any] | None = None,
        first_token_deadline_s: float | None = None,
        idle_deadline_s: float | None = None,
    ) -> None:
        self._address = parse_base_url(base_url)
        # None: no deadline of that kind (the whole-request timeout still holds).
        self._first_token_ns = None if first_token_deadline_s is None else int(first_token_deadline_s * 1e9)
        self._idle_ns = None if idle_deadline_s is None else int(idle_deadline_s * 1e9)
        self._endpoint = check_endpoint(endpoint)
        self._path = self._address.path_prefix + ENDPOINT_PATHS[self._endpoint]
        self._model = model
        self._request_timeout_s = request_timeout_s
        self._extra_body = dict(extra_body or {})
        head = (
            f"POST {self._path} HTTP/1.1\r\n"
            f"Host: {self._address.host}:{self._address.port}\r\n"
            "Content-Type: application/json\r\n"
            "Accept: text/event-stream\r\n"
        )
        if api_key:
            head += f"Authorization: Bearer {api_key}\r\n"
        self._head = head.encode("latin-1")
        if self._address.scheme == "https":
            from pytest_kimiperf.measure.client_https import TlsPool

            self._pool: _Pool = TlsPool(self._address, max(1, max_connections))
        else:
            self._pool = _Pool(self._address, max(1, max_connections))

    def __repr__(self) -> str:
        # Never the request head: it holds the API key.
        return f"StreamingClient({self._address.base_url}{self._path!s}, model={self._model!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def request_body(self, spec: RequestSpec) -> dict[str, Any]:
        """The JSON body sent for ``spec``: exact output length via ignore_eos and min/max tokens."""
        return request_body(self._model, self._endpoint, spec, self._extra_body)

    async def _until_done(self, exchange: _Exchange, t_send_ns: int) -> str:
        """Wait for the exchange to end; '' when it did, else why it stalled.

        Deadlines are checked only when one falls due (a timer, no per-chunk cost): before the
        first token chunk, ``first_token_deadline_s`` after the send; after it,
        ``idle_deadline_s`` after the latest token chunk.
        """
        chunks = exchange.reader.chunk_ns
        while not exchange.done.done():
            if chunks:
                if self._idle_ns is None:
                    break
                due_ns = chunks[-1] + self._idle_ns
            else:
                if self._first_token_ns is None:
                    break
                due_ns = t_send_ns + self._first_token_ns
            now_ns = time.perf_counter_ns()
            if now_ns >= due_ns:
                if not chunks:
                    return (f"stalled: no token within the {self._first_token_ns / 1e9:g} s first-token "
                            f"deadline ({exchange.bytes_received} bytes of response, status "
                            f"{exchange.status or 'none yet'})")
                return (f"stalled: no token for {(now_ns - chunks[-1]) / 1e9:.1f} s (inter-chunk deadline "
                        f"{self._idle_ns / 1e9:g} s) after {len(chunks)} token chunks; the last came "
                        f"{(chunks[-1] - t_send_ns) / 1e9:.1f} s after the send")
            wait_ns = due_ns - now_ns
            if not chunks and self._idle_ns is not None:
                # Wake at least every idle period: once tokens flow, the idle deadline applies,
                # so a stall is noticed within one to two idle periods of the last chunk.
                wait_ns = min(wait_ns, self._idle_ns)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(exchange.done), wait_ns / 1e9)
        await exchange.done
        return ""

    async def stream(self, spec: RequestSpec, *, scheduled_send_ns: int | None = None) -> RequestRecord:
        """Send ``spec``, read its stream to the end, and return its timeline (valid or not)."""
        t_start_ns = time.perf_counter_ns()
        request_id = spec.request_id or uuid.uuid4().hex
        body = json.dumps(self.request_body(spec), separators=(",", ":")).encode()
        request = b"%sx-request-id: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            self._head, request_id.encode("latin-1"), len(body), body,
        )
        reader = _SSEReader(self._endpoint == "chat")
        t_send_ns = t_start_ns
        failure = ""
        status = 0
        error_body = b""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._request_timeout_s):
                for attempt in (1, 2):
                    connection = await self._pool.acquire(fresh=attempt == 2)
                    reused = connection.used
                    exchange = _Exchange(reader, loop.create_future())
                    try:
                        t_send_ns = await connection.start(exchange, request)
                        stall = await self._until_done(exchange, t_send_ns)
                        if stall:
                            exchange.failure = stall
                    finally:
                        if connection.exchange is exchange:  # cancelled or timed out mid-way
                            connection.keep_alive = False
                            connection.exchange = None
                        self._pool.release(connection)
                    # An idle keep-alive connection the server had already closed fails before
                    # a single byte comes back; the request never reached the server: retry once.
                    if exchange.failure and reused and exchange.bytes_received == 0 and attempt == 1:
                        reader = _SSEReader(self._endpoint == "chat")
                        continue
                    failure, status, error_body = exchange.failure, exchange.status, bytes(exchange.error_body)
                    break
        except TimeoutError:
            failure = f"request timed out after {self._request_timeout_s:g} s"
        except OSError as exc:
            failure = f"cannot connect to {self._address.base_url}: {exc}"
        t_done_ns = time.perf_counter_ns()
        if not failure and status != 200:
            failure = f"HTTP {status}: {error_body[:300].decode('utf-8', 'replace')}"
        reason = failure or _stream_problem(reader, spec)
        usage = reader.usage or {}
        return RequestRecord(
            ok=not reason,
            error=reason,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            t_send_ns=t_send_ns,
            chunk_ns=tuple(reader.chunk_ns),
            t_done_ns=t_done_ns,
            scheduled_send_ns=scheduled_send_ns,
            request_id=request_id,
            t_start_ns=t_start_ns,
        )


def request_body(model: str, endpoint: str, spec: RequestSpec, extra_body: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body either client sends for ``spec``: exact output length via ignore_eos and
    min/max tokens, usage in the stream."""
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "min_tokens": spec.output_tokens,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        body["max_completion_tokens"] = spec.output_tokens
    else:
        body["prompt"] = spec.prompt
        body["max_tokens"] = spec.output_tokens
    body.update(extra_body)
    return body


def _stream_problem(reader: _SSEReader, spec: RequestSpec) -> str:
    """Why a completed stream cannot be counted ('' when it can)."""
    if reader.error:
        return reader.error
    if not reader.chunk_ns:
        return "no chunk carrying tokens arrived"
    if reader.usage is None:
        return "no usage in the stream (the server ignored stream_options.include_usage)"
    completion_tokens = reader.usage.get("completion_tokens")
    if completion_tokens != spec.output_tokens:
        return (
            f"usage.completion_tokens={completion_tokens} but {spec.output_tokens} were asked "
            "(ignore_eos/min_tokens not honoured, or the stream was cut short)"
        )
    prompt_tokens = reader.usage.get("prompt_tokens")
    if spec.prompt_tokens is not None and prompt_tokens != spec.prompt_tokens:
        return f"usage.prompt_tokens={prompt_tokens} but the prompt was built to {spec.prompt_tokens} tokens"
    return ""
