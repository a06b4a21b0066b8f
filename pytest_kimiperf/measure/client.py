"""The streaming client: sends a generation request and timestamps every chunk of its stream.

Every verdict is only as good as these timestamps, so they are taken where the bytes are: a
chunk's arrival is the kernel's receive stamp of its bytes, taken before any parsing
(connection.py), and the send is ``perf_counter_ns()`` right before the request's one ``send()``,
so TTFT is "request on the wire -> first token chunk in the socket", without the client's own
request-building time.

Why not httpx for the stream: measured against the paced server (tests/fakes/paced_server.py),
httpx + httpcore + h11 cost ~30 us of CPU per chunk and one task wake-up per chunk; 128 streams at
200 tok/s (25,600 chunks/s) then needed 0.8 of a core and arrivals waited 6-50 ms in the loop
before being stamped, and httpcore's pool scans every connection for every queued request
(``_assign_requests_to_connections``), 1.3 s of a 2.4 s profile for 64 streams starting together.
vLLM's ``bench serve`` stamps after aiohttp and ``json.loads`` (vllm/benchmarks/lib/
endpoint_request_func.py), in a task that waits its turn. httpx stays for the non-streaming calls.

The API key goes in the Authorization header and nowhere else (not in ``repr``, not in errors). A
wedged server must not stall the suite: besides the whole-request timeout, each request has a
first-token deadline and an inter-chunk idle deadline (:meth:`StreamingClient._until_done`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from pytest_kimiperf.config.server_url import ENDPOINT_PATHS, check_endpoint, parse_base_url
from pytest_kimiperf.measure.connection import Exchange, Pool
from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.measure.sse import SSEReader


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: prompt, exact output length, and what usage must report back."""

    prompt: str
    output_tokens: int
    # When set, usage.prompt_tokens must equal it (workload built the prompt to this length).
    prompt_tokens: int | None = None
    request_id: str = ""


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
            from pytest_kimiperf.measure.connection import TlsPool

            self._pool: Pool = TlsPool(self._address, max(1, max_connections))
        else:
            self._pool = Pool(self._address, max(1, max_connections))

    def __repr__(self) -> str:
        # Never the request head: it holds the API key.
        return f"StreamingClient({self._address.base_url}{self._path!s}, model={self._model!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every pooled connection (over TLS, wait for the sockets to be closed)."""
        await self._pool.aclose()

    async def _until_done(self, exchange: Exchange, t_send_ns: int) -> str:
        """Wait for the exchange to end; '' when it did, else why it stalled.

        Deadlines are checked only when one falls due (a timer, no per-chunk cost): before the
        first token chunk, ``first_token_deadline_s`` after the send; after it,
        ``idle_deadline_s`` after the latest token chunk.
        """
        chunks = exchange.reader.chunk_ns
        while not exchange.done.done():
            if chunks:
                if (limit_ns := self._idle_ns) is None:
                    break
                due_ns = chunks[-1] + limit_ns
            else:
                if (limit_ns := self._first_token_ns) is None:
                    break
                due_ns = t_send_ns + limit_ns
            now_ns = time.perf_counter_ns()
            if now_ns >= due_ns:
                if not chunks:
                    return (f"stalled: no token within the {limit_ns / 1e9:g} s first-token "
                            f"deadline ({exchange.bytes_received} bytes of response, status "
                            f"{exchange.status or 'none yet'})")
                return (f"stalled: no token for {(now_ns - chunks[-1]) / 1e9:.1f} s (inter-chunk deadline "
                        f"{limit_ns / 1e9:g} s) after {len(chunks)} token chunks; the last came "
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
        fields = request_body(self._model, self._endpoint, spec, self._extra_body)
        body = json.dumps(fields, separators=(",", ":")).encode()
        request = b"%sx-request-id: %s\r\nContent-Length: %d\r\n\r\n%s" % (
            self._head, request_id.encode("latin-1"), len(body), body,
        )
        reader = SSEReader(self._endpoint == "chat")
        t_send_ns = t_start_ns
        send_done_ns = 0
        failure = ""
        stalled = False
        status = 0
        error_body = b""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._request_timeout_s):
                for attempt in (1, 2):
                    connection = await self._pool.acquire(fresh=attempt == 2)
                    reused = connection.used
                    exchange = Exchange(reader, loop.create_future())
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
                        reader = SSEReader(self._endpoint == "chat")
                        continue
                    failure, status, error_body = exchange.failure, exchange.status, bytes(exchange.error_body)
                    send_done_ns = exchange.sent_ns
                    stalled = bool(stall)
                    break
        except TimeoutError:
            failure, stalled = f"request timed out after {self._request_timeout_s:g} s", False
        except OSError as exc:
            failure, stalled = f"cannot connect to {self._address.base_url}: {exc}", False
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
            send_done_ns=send_done_ns,
            chunk_read_ns=tuple(reader.chunk_read_ns),
            chunk_tokens=() if -1 in reader.chunk_tokens else tuple(reader.chunk_tokens),
            followed=tuple(reader.followed),
            scheduled_send_ns=scheduled_send_ns,
            request_id=request_id,
            t_start_ns=t_start_ns,
            stalled=stalled,
        )


def request_body(model: str, endpoint: str, spec: RequestSpec, extra_body: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body sent for ``spec``: the fields vLLM 0.32's ``bench serve`` sends, usage in
    the stream (in every chunk), the output length fixed by ``ignore_eos`` with ``max_tokens``."""
    # The same fields as bench serve (vllm/benchmarks/lib/endpoint_request_func.py,
    # async_request_openai_completions and ..._chat_completions with --ignore-eos), so the server
    # does for this client what it does for vLLM's own. No min_tokens: ignore_eos already keeps
    # EOS from ending a stream (sampling_params.py), and min_tokens runs MinTokensLogitsProcessor on
    # every decode step (v1/sample/logits_processor/builtin.py), measured in docs/explanation/
    # measurement.md, "What the client sends".
    body: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        body["max_completion_tokens"] = spec.output_tokens
    else:
        body["prompt"] = spec.prompt
        body["repetition_penalty"] = 1.0
        body["max_tokens"] = spec.output_tokens
        body["logprobs"] = None
    body["stream"] = True
    # continuous_usage_stats puts the running token count in every chunk (vLLM's
    # should_include_usage, entrypoints/serve/utils/api_utils.py), so a chunk of several tokens
    # (--stream-interval, an API server that merged outputs) moves no token's position: decode
    # and TPOT rest on exact counts. bench serve does not ask for it; a server that ignores it
    # leaves the counts unknown and the figures as bench serve reads them.
    body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body["ignore_eos"] = True
    body.update(extra_body)
    return body


def _stream_problem(reader: SSEReader, spec: RequestSpec) -> str:
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
            "(ignore_eos not honoured, or the stream was cut short)"
        )
    prompt_tokens = reader.usage.get("prompt_tokens")
    if spec.prompt_tokens is not None and prompt_tokens != spec.prompt_tokens:
        return f"usage.prompt_tokens={prompt_tokens} but the prompt was built to {spec.prompt_tokens} tokens"
    return ""
