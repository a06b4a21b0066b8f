"""``python -m pytest_kimiperf compare ...``: the package's commands that run without pytest
(``kimiperf compare`` is the same, as a console script)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

_COMMANDS = ("compare",)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the command named first."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in _COMMANDS:
        print(f"usage: kimiperf {{{','.join(_COMMANDS)}}} ... (kimiperf compare --help)", file=sys.stderr)
        return 4
    from pytest_kimiperf.compare.cli import main as compare

    return compare(args[1:])


if __name__ == "__main__":
    sys.exit(main())
