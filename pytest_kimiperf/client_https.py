"""The streaming client for HTTPS servers (a gateway in front of vLLM): httpx, timed in the event loop.

The plain-HTTP client (client.py) stamps each chunk with the kernel's receive time, read from
the socket before any parsing. Through TLS the bytes on the socket are ciphertext: the chunk
boundaries exist only after OpenSSL decrypted them, inside whatever library owns the socket. So
over HTTPS a chunk's arrival is ``perf_counter_ns()`` when httpx hands the decrypted bytes to
this loop: *timed in the event loop, not by the kernel*. Every run measured this way says so
in its notes, and benchmarks/client_accuracy.py ``--modes https`` measures what it costs.

The request body, the SSE splitting, the role-only chat chunk rule, the token counts from
``usage`` and the validity checks are the plain client's (client._SSEReader, _stream_problem),
so both clients count the same chunks as tokens. Deadlines (first token, inter-chunk idle,
whole request) are the same as there.

Certificates are verified; a private CA is trusted through ``SSL_CERT_FILE`` (httpx reads it).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import httpx

from pytest_kimiperf.client import (
    ENDPOINT_PATHS,
    RequestSpec,
    _SSEReader,
    _stream_problem,
    check_endpoint,
    parse_base_url,
    request_body,
)
from pytest_kimiperf.metrics import RequestRecord

EVENT_LOOP_TIMING = ("timed in the event loop, not by the kernel: HTTPS chunks are stamped when "
                     "httpx hands the decrypted bytes to the loop (benchmarks/client_accuracy.py "
                     "--modes https measures the cost)")
_MAX_ERROR_BODY = 2048


class HttpsStreamingClient:
    """``StreamingClient``'s interface over httpx, for ``https://`` servers."""

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
        self._endpoint = check_endpoint(endpoint)
        self._url = self._address.base_url + ENDPOINT_PATHS[self._endpoint]
        self._model = model
        self._request_timeout_s = request_timeout_s
        self._first_token_s = first_token_deadline_s
        self._idle_s = idle_deadline_s
        self._extra_body = dict(extra_body or {})
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        pool = max(1, max_connections)
        self._http = httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(request_timeout_s),
            limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool),
        )

    def __repr__(self) -> str:
        return f"HttpsStreamingClient({self._url}, model={self._model!r})"  # never the headers

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._http.aclose()

    def request_body(self, spec: RequestSpec) -> dict[str, Any]:
        """The same body the plain client sends."""
        return request_body(self._model, self._endpoint, spec, self._extra_body)

    async def stream(self, spec: RequestSpec, *, scheduled_send_ns: int | None = None) -> RequestRecord:
        """Send ``spec``, read its stream to the end, and return its timeline (valid or not)."""
        t_start_ns = time.perf_counter_ns()
        request_id = spec.request_id or uuid.uuid4().hex
        body = json.dumps(self.request_body(spec), separators=(",", ":")).encode()
        reader = _SSEReader(self._endpoint == "chat")
        request = self._http.build_request("POST", self._url, content=body,
                                           headers={"x-request-id": request_id})
        failure = ""
        status = 0
        error_body = bytearray()
        loop = asyncio.get_running_loop()
        t_send_ns = time.perf_counter_ns()
        # Inside the whole-request timeout, one more that is moved on with every token chunk:
        # the first-token deadline until the first, then the inter-chunk idle deadline.
        deadline = asyncio.timeout(None)
        try:
            async with asyncio.timeout(self._request_timeout_s):
                async with deadline:
                    if self._first_token_s is not None:
                        deadline.reschedule(loop.time() + self._first_token_s)
                    # The nearest the loop gets to the send: httpx writes the request next.
                    t_send_ns = time.perf_counter_ns()
                    response = await self._http.send(request, stream=True)
                    try:
                        status = response.status_code
                        chunks = reader.chunk_ns
                        async for data in response.aiter_raw():
                            arrival_ns = time.perf_counter_ns()
                            if status != 200:
                                error_body += data[: _MAX_ERROR_BODY - len(error_body)]
                                continue
                            seen = len(chunks)
                            reader.feed(data, arrival_ns)
                            if self._idle_s is not None and len(chunks) > seen:
                                deadline.reschedule(loop.time() + self._idle_s)
                    finally:
                        await response.aclose()
        except TimeoutError:
            failure = (self._stall_message(reader.chunk_ns, t_send_ns, status) if deadline.expired()
                       else f"request timed out after {self._request_timeout_s:g} s")
        except ValueError as exc:  # an endless SSE line (client._SSEReader's cap)
            failure = str(exc)
        except httpx.HTTPError as exc:
            failure = f"cannot stream from {self._address.base_url}: {type(exc).__name__}: {exc}"
        t_done_ns = time.perf_counter_ns()
        if not failure and status != 200:
            failure = f"HTTP {status}: {bytes(error_body[:300]).decode('utf-8', 'replace')}"
        reason = failure or _stream_problem(reader, spec)
        usage = reader.usage or {}
        return RequestRecord(
            ok=not reason, error=reason,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
            t_send_ns=t_send_ns, chunk_ns=tuple(reader.chunk_ns), t_done_ns=t_done_ns,
            scheduled_send_ns=scheduled_send_ns, request_id=request_id, t_start_ns=t_start_ns,
        )

    def _stall_message(self, chunks: list[int], t_send_ns: int, status: int) -> str:
        # Worded as the plain client's, so scenarios.py counts the stalls alike.
        if not chunks:
            return (f"stalled: no token within the {self._first_token_s:g} s first-token deadline "
                    f"(status {status or 'none yet'})")
        now_ns = time.perf_counter_ns()
        return (f"stalled: no token for {(now_ns - chunks[-1]) / 1e9:.1f} s (inter-chunk deadline "
                f"{self._idle_s:g} s) after {len(chunks)} token chunks; the last came "
                f"{(chunks[-1] - t_send_ns) / 1e9:.1f} s after the send")
