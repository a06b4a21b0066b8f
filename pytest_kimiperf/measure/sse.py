"""Server-sent events of a generation stream: split as they arrive, token chunks timed.

The hot path asks one cheap byte question per SSE event: does it carry a non-empty
``"choices"`` array? JSON is parsed only for events without choices (the final usage chunk,
errors). Token counts come from ``usage``, never from counting chunks, because one chunk may
carry several tokens (vLLM ``--stream-interval``, speculative decoding). An event that grows
past ``MAX_SSE_EVENT_BYTES`` (an endless line) fails the request instead of growing memory.
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


class SSEReader:
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
