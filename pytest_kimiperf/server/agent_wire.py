"""How the node agent's answer travels back: one marked line of JSON, the last one it prints.

A launch template may merge the node's stderr into stdout (``ssh -tt`` allocates a terminal,
which has one stream) and a remote shell may print a banner first, so the answer is the last
line that starts with the mark, not the whole output.
"""

from __future__ import annotations

from pytest_kimiperf.errors import KimiperfError

AGENT_MARK = "KIMIPERF-AGENT "


def agent_payload(text: str, *, where: str) -> str:
    """The JSON of the last marked line of ``text``; KimiperfError naming ``where`` if none."""
    for line in reversed(text.splitlines()):
        line = line.strip("\r")
        if line.startswith(AGENT_MARK):
            return line[len(AGENT_MARK):]
    raise KimiperfError(f"{where}: the node agent printed no answer (a line starting {AGENT_MARK.strip()!r}); "
                        f"it printed: {text.strip()[-300:]!r}")
