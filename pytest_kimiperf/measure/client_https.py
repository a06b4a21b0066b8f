"""HTTPS for the streaming client (a gateway in front of vLLM): timed in the event loop.

The plain-HTTP connection (connection.Connection) stamps each chunk with the kernel's receive time,
read from the socket before any parsing. Through TLS the bytes on the socket are ciphertext:
chunk boundaries exist only after OpenSSL decrypted them. So over HTTPS a chunk's arrival is
``perf_counter_ns()`` when asyncio's SSL transport hands the decrypted bytes to the protocol
(``data_received``): *timed in the event loop, not by the kernel*. Every run measured this way
says so in its notes, and benchmarks/client_accuracy.py ``--modes https`` measures what it costs.

Only the transport differs: HTTP/1.1 framing, SSE splitting, the role-only chat chunk rule,
token counts from ``usage``, deadlines and the keep-alive retry are the plain client's
(``_TlsConnection`` is a ``connection.Connection`` fed by a protocol instead of ``recvmsg``).

Why not httpx, the first plan: measured with client_accuracy.py through the same TLS gateway on
this 2-core host, httpx (anyio's TLS stream over ``ssl.MemoryBIO``, h11, httpcore's pool) was
client-bound at 32 streams of 200 tok/s (82% of a core, chunk delivery p50 38 ms, TTFT error
+274 ms), where vLLM's aiohttp client stayed within +0.6 ms ITL p99.

Certificates are verified against the system's CAs; a private CA is trusted through
``SSL_CERT_FILE`` (OpenSSL's default verify paths read it, as httpx does for the other calls).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Final

from pytest_kimiperf.config.server_url import ServerAddress
from pytest_kimiperf.measure.connection import _DONE, _HEAD, Connection, Exchange, Pool

EVENT_LOOP_TIMING = ("timed in the event loop, not by the kernel: HTTPS chunks are stamped when "
                     "the TLS transport hands the decrypted bytes to the client (benchmarks/"
                     "client_accuracy.py --modes https measures the cost)")

# How long closing the pool waits for the peer's close_notify before it drops the socket. A TLS
# transport's close() only starts the shutdown; a loop that ends first (asyncio.run returning)
# would leave the socket open until garbage collection (ResourceWarning: unclosed transport).
TLS_SHUTDOWN_WAIT_S: Final = 1.0


class _TlsConnection(Connection):
    """A keep-alive HTTP/1.1 connection over asyncio's SSL transport."""

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        # Not Connection.__init__: there is no socket of ours to read.
        self._loop = loop
        self._transport = transport
        self.closed = False
        self.keep_alive = True
        self.exchange: Exchange | None = None
        self.used = False
        self._buf = bytearray()
        self._state = _DONE
        self._remaining = 0
        self.lost: asyncio.Future[None] = loop.create_future()

    def close(self) -> None:
        """Close the transport; an exchange still in flight fails."""
        if self.closed:
            return
        self.closed = True
        self.keep_alive = False
        self._transport.close()
        exchange = self.exchange
        if exchange is not None:
            self._fail(exchange, "connection closed by the client")

    async def start(self, exchange: Exchange, request: bytes) -> int:
        """Hand ``request`` to the TLS transport; returns the time it did (perf_counter_ns)."""
        if self.closed or self._transport.is_closing():
            exchange.failure = "connection closed before the request was sent"
            exchange.done.set_result(None)
            return time.perf_counter_ns()
        self.exchange = exchange
        self.used = True
        self._state = _HEAD
        self._buf.clear()
        t_send_ns = time.perf_counter_ns()
        self._transport.write(request)
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
        most TLS_SHUTDOWN_WAIT_S, then the socket is dropped (``abort``)."""
        self.close()
        for connection in self._opened:
            connection.close()
        pending = [c for c in self._opened if not c.lost.done()]
        if pending:
            await asyncio.wait([c.lost for c in pending], timeout=TLS_SHUTDOWN_WAIT_S)
        stuck = [c for c in pending if not c.lost.done()]
        for connection in stuck:
            connection._transport.abort()
        if stuck:  # abort schedules connection_lost, which closes the socket, on the next turns
            await asyncio.wait([c.lost for c in stuck], timeout=TLS_SHUTDOWN_WAIT_S)
        self._opened = []
