"""Reading a server's JSON answers, with an error that says what came back when it is not JSON.

A proxy in front of the server (an HTML error page), a load balancer's SSE keep-alive, or
another service on the port answer with something else than vLLM's JSON; the user must see the
URL and the first bytes of that answer, not a ``JSONDecodeError`` or ``AttributeError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from pytest_kimiperf.errors import ServerError


def json_answer(response: httpx.Response, url: str,
                expect: Mapping[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """The JSON object ``response`` carries, with ``expect``'s keys of their types, else a
    ServerError naming the URL and what came back (a proxy's HTML page, an SSE stream, ...)."""
    def what_came() -> str:
        kind = response.headers.get("content-type", "no content type")
        return f"{kind}: {response.text[:160]!r}"

    try:
        data = response.json()
    except ValueError:
        raise ServerError(f"{url} answered something that is not JSON ({what_came()}); is it a "
                          "vLLM server, and not a proxy's page?") from None
    if not isinstance(data, dict):
        raise ServerError(f"{url} answered JSON that is not an object ({what_came()})")
    for key, kind in expect.items():
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise ServerError(f"{url} answered JSON without the expected {key!r} ({what_came()})")
    return data


def served_models(response: httpx.Response, url: str) -> list[str]:
    """The model ids a ``/v1/models`` answer lists; ServerError if it is not that answer."""
    data = json_answer(response, url, expect={"data": list})
    ids = [m.get("id") for m in data["data"] if isinstance(m, dict)]
    named = [i for i in ids if isinstance(i, str)]
    if len(named) != len(ids):
        raise ServerError(f"{url} lists models without string ids: {ids!r}")
    return named


def fetch_served_models(url: str, headers: Mapping[str, str]) -> list[str]:
    """The model ids the server at ``url`` lists; [] when it does not answer with that list."""
    try:
        resp = httpx.get(f"{url}/v1/models", headers=dict(headers), timeout=5.0)
        return served_models(resp, f"{url}/v1/models") if resp.status_code == 200 else []
    except (httpx.HTTPError, ServerError):
        return []
