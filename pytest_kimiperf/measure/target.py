"""What a run is aimed at: the server, the model it serves, and how requests reach it.

One frozen :class:`Target` travels through ``runner.run_scenario``, ``run_sweep``, ``extend``
and ``run_scenario_async`` instead of the same six arguments each time; the recorder builds
one per measurement from the session's server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.server_url import check_endpoint, parse_base_url


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server to measure, checked when built.

    ``base_url`` is the server root (``http://HOST:PORT``, no ``/v1``); ``server_metrics=False``
    skips the ``/metrics`` reads before and after the rounds.
    """

    base_url: str
    model: str
    _: KW_ONLY
    # Out of the repr (assertion messages, tracebacks), as in the client.
    api_key: str | None = field(default=None, repr=False)
    endpoint: str = "completions"
    extra_body: Mapping[str, Any] | None = None
    server_metrics: bool = True

    def __post_init__(self) -> None:
        parse_base_url(self.base_url)
        check_endpoint(self.endpoint)
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"model={self.model!r}: must be the served model's name")
