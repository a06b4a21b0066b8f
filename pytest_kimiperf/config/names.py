"""Names the user gives (profiles, deployments): checked before they become parts of file paths,
and the closest known name suggested when one is misspelled."""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Iterable, Sequence

from pytest_kimiperf.errors import ConfigError

# What a fact reads when nothing could read it (a fingerprint's, a server's).
UNKNOWN = "unknown"

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_safe_name(kind: str, name: object, *, source: str = "") -> str:
    """Return ``name`` if it can be used as a file-name part, else raise ConfigError."""
    where = f" (from {source})" if source else ""
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise ConfigError(f"invalid {kind} name {name!r}{where}: use 1-64 characters of letters, digits, "
                          "'.', '_' and '-', starting with a letter or digit")
    return name


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices`` to ``word``, or ``""`` if none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_placeholders(parts: Sequence[str], allowed: Sequence[str], *, what: str, where: str) -> None:
    """ConfigError unless every ``{name}`` in ``parts`` (``what`` says whose: "command part")
    is one of ``allowed``, naming the part, the placeholder and the allowed ones."""
    for part in parts:
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(part) if f is not None]
        except ValueError as exc:
            raise ConfigError(f"{where}: {what} {part!r} is not a valid template: {exc}") from None
        for name in names:
            if name not in allowed:
                raise ConfigError(f"{where}: {what} {part!r} uses unknown placeholder {{{name}}}; "
                                  f"allowed: {', '.join('{' + p + '}' for p in allowed)}")
