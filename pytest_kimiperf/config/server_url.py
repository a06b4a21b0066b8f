"""The server a run talks to, as the user gives it: its root URL and the endpoint, checked once."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pytest_kimiperf.errors import ConfigError

ENDPOINT_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


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
        raise ConfigError(f"invalid server URL {base_url!r} (from {source}): drop the trailing /v1, the "
                          f"client adds {ENDPOINT_PATHS['completions']} itself")
    return ServerAddress(parts.hostname, port, prefix, parts.scheme)


def check_endpoint(endpoint: object, *, source: str = "endpoint") -> str:
    """Return ``endpoint`` if it is one the client speaks, else raise ConfigError."""
    if not isinstance(endpoint, str) or endpoint not in ENDPOINT_PATHS:
        raise ConfigError(f"unknown endpoint {endpoint!r} (from {source}); use one of: "
                          f"{', '.join(sorted(ENDPOINT_PATHS))}")
    return endpoint
