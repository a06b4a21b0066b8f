"""The streaming client's HTTP/1.1 keep-alive connections, each chunk stamped when it arrives.

Over plain HTTP a :class:`Connection` reads its socket itself and stamps each read with the
kernel's receive time; the chunked framing and the SSE events (``sse``) are split in the same
reader callback, ~2 us of Python per chunk and no task switch. A :class:`Pool` keeps connections
alive and reused, sized to the concurrency. A response head or a chunk-size line that grows past
its cap fails the request instead of growing memory without bound.

**HTTPS.** Through TLS the bytes on the socket are ciphertext: chunk boundaries exist only after
OpenSSL decrypted them. So over HTTPS a chunk's arrival is ``perf_counter_ns()`` when asyncio's
SSL transport hands the decrypted bytes to the protocol (``data_received``): *timed in the event
loop, not by the kernel*. Every run measured this way says so in its notes, and
benchmarks/client_accuracy.py ``--modes https`` measures what it costs. Everything else is the
plain client's (``_TlsConnection`` is a :class:`Connection` fed by a protocol instead of
``recvmsg``). Why not httpx here either: through the same TLS gateway on this 2-core host, httpx
(anyio's TLS stream over ``ssl.MemoryBIO``, h11, httpcore's pool) was client-bound at 32 streams of
200 tok/s (82% of a core, chunk delivery p50 38 ms, TTFT error +274 ms), where vLLM's aiohttp
client stayed within +0.6 ms ITL p99.

Certificates are verified against the system's CAs; a private CA is trusted through
``SSL_CERT_FILE`` (OpenSSL's default verify paths read it, as httpx does for the other calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from dataclasses import dataclass, field
from typing import Final

from pytest_kimiperf.config.server_url import ServerAddress
from pytest_kimiperf.measure.sse import MAX_SSE_EVENT_BYTES, SSEReader

# Plain HTTP: the socket read directly, each chunk stamped with the kernel's receive time.

# A non-200 answer's body is kept for the error message, up to this much.
_MAX_ERROR_BODY = 2048
# Caps on what may be buffered before it parses: a response head (uvicorn's are < 1 KiB) and
# one chunk-size line (an SSE event's cap is sse.MAX_SSE_EVENT_BYTES).
_MAX_HEAD_BYTES = 64 * 1024
_MAX_CHUNK_SIZE_LINE = 1024
_RECV_BYTES = 64 * 1024
# Linux's SO_TIMESTAMPNS (asm-generic/socket.h); not every Python build names it.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ll")
_ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
# Two monotonic reads this close bracket a realtime read well enough to convert a kernel stamp.
_CLOCK_PAIR_NS = 20_000
# A kernel stamp older than this is taken for a clock step, and the read time used instead.
_MAX_KERNEL_STAMP_AGE_NS = 10_000_000_000

# HTTP/1.1 response parser states.
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _TRAILERS, _LENGTH, _UNTIL_CLOSE, _DONE = range(7)


def _realtime_offset_ns() -> int:
    """CLOCK_REALTIME less CLOCK_MONOTONIC (``perf_counter_ns``), read between two monotonic
    reads close together: a process preempted between a lone pair of reads would move every
    kernel stamp it converts by the preemption (a chunk would seem to arrive before it was sent)."""
    best_width, best_offset = -1, 0
    for _ in range(3):
        before = time.perf_counter_ns()
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = time.perf_counter_ns()
        if best_width < 0 or after - before < best_width:
            best_width, best_offset = after - before, real - (before + after) // 2
        if best_width < _CLOCK_PAIR_NS:
            break
    return best_offset


@dataclass(slots=True)
class Exchange:
    """One request/response on a connection."""

    reader: SSEReader
    done: asyncio.Future[None]
    status: int = 0
    error_body: bytearray = field(default_factory=bytearray)
    failure: str = ""
    bytes_received: int = 0
    # When the call that put the request's first bytes in the kernel returned (0: not yet):
    # the send went out between the stamp and this, whatever held the client.
    sent_ns: int = 0


class Connection:
    """One keep-alive HTTP/1.1 connection; parses the response as its bytes arrive.

    It reads its socket itself (``add_reader`` + ``recvmsg``) to get the kernel's receive
    timestamp of the bytes (``SO_TIMESTAMPNS``, socket(7); TCP reports the time of the last
    segment a read returns), so a stamp does not grow stale while this process waits for a
    CPU or its loop is busy elsewhere. The kernel stamps CLOCK_REALTIME; it is moved onto
    ``perf_counter_ns``'s CLOCK_MONOTONIC with the two clocks' offset read at that moment.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._start(loop)
        self.sock = sock
        self._fd = sock.fileno()
        self._rx = memoryview(bytearray(_RECV_BYTES))
        loop.add_reader(self._fd, self._readable)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The state a connection starts in, whatever carries its bytes: open, idle."""
        self._loop = loop
        self.closed = False
        self.keep_alive = True
        self.exchange: Exchange | None = None
        self.used = False
        self._buf = bytearray()
        self._state = _DONE
        self._remaining = 0
        self._read_ns = 0

    def close(self) -> None:
        """Close the connection; an exchange still in flight fails."""
        if self.closed:
            return
        self.closed = True
        self.keep_alive = False
        self._close_transport()
        exchange = self.exchange
        if exchange is not None:
            self._fail(exchange, "connection closed by the client")

    def _close_transport(self) -> None:
        self._loop.remove_reader(self._fd)
        self.sock.close()

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
                kernel_ns = seconds * 1_000_000_000 + nanoseconds - _realtime_offset_ns()
                # Trust it only if it is plausible (a clock step would move it by seconds).
                if read_ns - _MAX_KERNEL_STAMP_AGE_NS <= kernel_ns <= read_ns:
                    arrival_ns = kernel_ns
        self.received(self._rx[:size], arrival_ns, read_ns)

    def received(self, data: bytes | memoryview, arrival_ns: int, read_ns: int | None = None) -> None:
        """Parse the bytes of one read, which arrived at ``arrival_ns`` and were read at
        ``read_ns`` (default: ``arrival_ns``, a stamp taken at read time, as over TLS); a stamp
        equal to its read time is a fallback, and measure/coverage.py judges it as one."""
        self._read_ns = arrival_ns if read_ns is None else read_ns
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

    def _take(self, exchange: Exchange, *, closing: bool = False) -> bool:
        """Make ``exchange`` the one in flight, its response read from the start; False (and the
        exchange failed) where the connection closed, or is ``closing``, before the request went."""
        if self.closed or closing:
            exchange.failure = "connection closed before the request was sent"
            exchange.done.set_result(None)
            return False
        self.exchange = exchange
        self.used = True
        self._state = _HEAD
        self._buf.clear()
        return True

    async def start(self, exchange: Exchange, request: bytes) -> int:
        """Send ``request`` and return when its first byte went to the socket (perf_counter_ns)."""
        if not self._take(exchange):
            return time.perf_counter_ns()
        t_send_ns = time.perf_counter_ns()
        try:
            sent = self.sock.send(request)
            exchange.sent_ns = time.perf_counter_ns()
            if sent < len(request):
                await self._loop.sock_sendall(self.sock, request[sent:])
        except BlockingIOError:
            await self._loop.sock_sendall(self.sock, request)
            exchange.sent_ns = time.perf_counter_ns()
        except OSError as exc:
            # Not a single byte reached the server: the caller may retry on a fresh connection.
            self._lost(exc)
        return t_send_ns

    @property
    def reusable(self) -> bool:
        """True when idle, open and keep-alive."""
        return self.exchange is None and not self.closed and self.keep_alive

    # parsing ----------------------------------------------------------

    def _parse(self, exchange: Exchange, arrival_ns: int) -> None:
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
                    if size - pos > _MAX_HEAD_BYTES:
                        raise ValueError(f"a response head longer than {_MAX_HEAD_BYTES // 1024} KiB")
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
                        if size - pos > _MAX_HEAD_BYTES:
                            raise ValueError(f"trailers longer than {_MAX_HEAD_BYTES // 1024} KiB")
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

    def _head(self, exchange: Exchange, head: bytes) -> None:
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

    def _body(self, exchange: Exchange, data: bytes, arrival_ns: int) -> None:
        if exchange.status == 200:
            exchange.reader.feed(data, arrival_ns, self._read_ns)
        elif len(exchange.error_body) < _MAX_ERROR_BODY:
            exchange.error_body += data[: _MAX_ERROR_BODY - len(exchange.error_body)]

    def _finish(self, exchange: Exchange) -> None:
        self._state = _DONE
        self.exchange = None
        if not exchange.done.done():
            exchange.done.set_result(None)

    def _fail(self, exchange: Exchange, reason: str) -> None:
        exchange.failure = exchange.failure or reason
        self.keep_alive = False
        self.exchange = None
        if not exchange.done.done():
            exchange.done.set_result(None)


class Pool:
    """Keep-alive connections to one server, at most ``max_connections`` in use at once."""

    def __init__(self, address: ServerAddress, max_connections: int) -> None:
        self._address = address
        self._max_connections = max_connections
        self._idle: list[Connection] = []
        self._semaphore: asyncio.Semaphore | None = None

    async def acquire(self, *, fresh: bool = False) -> Connection:
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

    async def _connect(self) -> Connection:
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
            with contextlib.suppress(OSError):  # not Linux: stamps fall back to perf_counter_ns() at read time
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return Connection(loop, sock)

    def release(self, connection: Connection) -> None:
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

    async def aclose(self) -> None:
        """Close the pool; a plain socket is closed at once, so nothing is left to wait for."""
        self.close()


# HTTPS: the same connection fed by asyncio's TLS transport, each chunk stamped in the event loop.
EVENT_LOOP_TIMING = ("timed in the event loop, not by the kernel: HTTPS chunks are stamped when "
                     "the TLS transport hands the decrypted bytes to the client (benchmarks/"
                     "client_accuracy.py --modes https measures the cost)")

# How long closing the pool waits for the peer's close_notify before it drops the socket. A TLS
# transport's close() only starts the shutdown; a loop that ends first (asyncio.run returning)
# would leave the socket open until garbage collection (ResourceWarning: unclosed transport).
_TLS_SHUTDOWN_WAIT_S: Final = 1.0


class _TlsConnection(Connection):
    """A keep-alive HTTP/1.1 connection over asyncio's SSL transport."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        # Not Connection.__init__: there is no socket of ours to read.
        self._start(loop)
        self._transport = transport
        self.lost: asyncio.Future[None] = loop.create_future()

    def _close_transport(self) -> None:
        self._transport.close()

    async def start(self, exchange: Exchange, request: bytes) -> int:
        """Hand ``request`` to the TLS transport; returns the time it did (perf_counter_ns)."""
        if not self._take(exchange, closing=self._transport.is_closing()):
            return time.perf_counter_ns()
        t_send_ns = time.perf_counter_ns()
        self._transport.write(request)
        exchange.sent_ns = time.perf_counter_ns()
        return t_send_ns


class _TlsProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.connection: _TlsConnection | None = None

    def data_received(self, data: bytes) -> None:
        arrival_ns = time.perf_counter_ns()
        if self.connection is not None:
            self.connection.received(data, arrival_ns)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        connection = self.connection
        if connection is None:
            return
        if not connection.lost.done():
            connection.lost.set_result(None)
        if not connection.closed:
            connection._lost(exc if isinstance(exc, OSError) or exc is None else OSError(str(exc)))


class TlsPool(Pool):
    """The plain client's pool, opening TLS connections (certificates verified)."""

    def __init__(self, address: ServerAddress, max_connections: int) -> None:
        super().__init__(address, max_connections)
        self._context = ssl.create_default_context()
        self._opened: list[_TlsConnection] = []

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(
            _TlsProtocol, self._address.host, self._address.port, ssl=self._context,
            server_hostname=self._address.host,
        )
        connection = _TlsConnection(loop, transport)
        protocol.connection = connection
        self._opened = [c for c in self._opened if not c.lost.done()] + [connection]
        return connection

    async def aclose(self) -> None:
        """Close every connection and wait until its socket is closed: the TLS shutdown for at
        most _TLS_SHUTDOWN_WAIT_S, then the socket is dropped (``abort``)."""
        self.close()
        for connection in self._opened:
            connection.close()
        pending = [c for c in self._opened if not c.lost.done()]
        if pending:
            await asyncio.wait([c.lost for c in pending], timeout=_TLS_SHUTDOWN_WAIT_S)
        stuck = [c for c in pending if not c.lost.done()]
        for connection in stuck:
            connection._transport.abort()
        if stuck:  # abort schedules connection_lost, which closes the socket, on the next turns
            await asyncio.wait([c.lost for c in stuck], timeout=_TLS_SHUTDOWN_WAIT_S)
        self._opened = []
