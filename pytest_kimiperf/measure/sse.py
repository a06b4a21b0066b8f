"""Server-sent events of a generation stream: split as they arrive, token chunks timed.

The hot path asks one cheap byte question per SSE event: does it carry a non-empty
``"choices"`` array? JSON is parsed only for events without choices (the final usage chunk,
errors). Token counts come from ``usage``, never from counting chunks, as one chunk may carry
several tokens (docs/explanation/measurement.md, "Tokens in each chunk"); the running count of
``stream_options.continuous_usage_stats`` is read with a byte search, not a JSON parse. Each token
chunk also keeps which read brought it and whether later bytes shared that read (``followed``),
for measure/coverage.py to judge its stamp.
"""

from __future__ import annotations

import json
from typing import Any

# vLLM's chat stream opens with a role-only delta sent in the same engine iteration as the first
# token (vllm/entrypoints/openai/chat_completion/serving.py, "first_iteration"); it carries no
# token, so it is not a token chunk. Matched in vLLM's compact pydantic serialization only.
_CHAT_ROLE_ONLY_DELTA = b'"delta":{"role":"assistant","content":""}'
_CHOICES_KEY = b'"choices":'
_USAGE_OBJECT = b'"usage":{'
_COMPLETION_TOKENS = b'"completion_tokens":'
_PROMPT_TOKENS = b'"prompt_tokens":'
_WHITESPACE = b" \t\r\n"
# One SSE event's cap: vLLM's largest are chunks with logprobs of a few KiB; 4 MiB leaves room
# for top-k logprobs of long chunks while bounding a server that never ends its line.
MAX_SSE_EVENT_BYTES = 4 * 1024 * 1024


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


def _int_after(payload: bytes, key: bytes, start: int) -> int | None:
    """The non-negative integer that follows ``key`` at or after ``start`` (None: none there)."""
    index = payload.find(key, start)
    if index < 0:
        return None
    index += len(key)
    while index < len(payload) and payload[index] in _WHITESPACE:
        index += 1
    end = index
    while end < len(payload) and 0x30 <= payload[end] <= 0x39:
        end += 1
    return int(payload[index:end]) if end > index else None


class SSEReader:
    """Splits SSE events out of the body and keeps, for each token chunk, its arrival time, the
    read that brought it, and the server's running token count where it gives one."""

    __slots__ = ("buffer", "chat", "chunk_ns", "chunk_read_ns", "chunk_tokens", "done_marker", "error",
                 "followed", "usage")

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.buffer = b""
        self.chunk_ns: list[int] = []
        # The user-space time of the read that brought each token chunk (one value a read).
        self.chunk_read_ns: list[int] = []
        # usage.completion_tokens as each token chunk carried it (-1: it carried none).
        self.chunk_tokens: list[int] = []
        # Token chunks whose read went on to bring later bytes (their stamp is those bytes').
        self.followed: list[int] = []
        self.done_marker = False
        self.error = ""
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes, arrival_ns: int, read_ns: int | None = None) -> None:
        """Take the bytes of one read (or of one HTTP chunk of it), stamped ``arrival_ns``;
        ``read_ns`` names the read (default: the stamp)."""
        read = arrival_ns if read_ns is None else read_ns
        buffer = self.buffer + data if self.buffer else data
        if b"\r" in buffer:
            # SSE allows CRLF line ends (WHATWG HTML, "event stream interpretation").
            buffer = buffer.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            self._event(buffer[start:end], arrival_ns, read)
            start = end + 2
        self.buffer = buffer[start:]
        if self.buffer.strip():
            self._follow(read)  # the next event began in this read
        if len(self.buffer) > MAX_SSE_EVENT_BYTES:
            self.buffer = b""
            raise ValueError(f"an SSE event grew past {MAX_SSE_EVENT_BYTES // 1024} KiB without ending "
                             "(an endless line)")

    def _follow(self, read: int) -> None:
        """Later bytes came in ``read``: the last token chunk's stamp is theirs if it came in it too."""
        last = len(self.chunk_ns) - 1
        if last >= 0 and self.chunk_read_ns[last] == read and (not self.followed or self.followed[-1] != last):
            self.followed.append(last)

    def _event(self, event: bytes, arrival_ns: int, read: int) -> None:
        if event.startswith(b"data: ") and b"\n" not in event:
            payload = event[6:]
        else:
            lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if not lines:
                self._follow(read)
                return  # comment, keep-alive ping, or an event without data
            payload = b"\n".join(lines)
        self._follow(read)
        if _has_choices(payload):
            usage_at = payload.find(_USAGE_OBJECT)
            completion = _int_after(payload, _COMPLETION_TOKENS, usage_at) if usage_at >= 0 else None
            if not (self.chat and _CHAT_ROLE_ONLY_DELTA in payload):
                self.chunk_ns.append(arrival_ns)
                self.chunk_read_ns.append(read)
                self.chunk_tokens.append(-1 if completion is None else completion)
            if completion is not None:
                # Usage riding on a token chunk: continuous_usage_stats (the running count), or a
                # server that puts its final usage there; a trailing usage chunk overrides it.
                prompt = _int_after(payload, _PROMPT_TOKENS, usage_at)
                self.usage = {"completion_tokens": completion, **({} if prompt is None else {"prompt_tokens": prompt})}
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
