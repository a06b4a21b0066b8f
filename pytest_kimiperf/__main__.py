"""``python -m pytest_kimiperf {compare,merge-driver} ...``: the package's commands that run
without pytest (the ``kimiperf`` console script is the same)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

_COMMANDS = ("compare", "merge-driver")


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the command named first."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in _COMMANDS:
        print(f"usage: kimiperf {{{','.join(_COMMANDS)}}} ... (kimiperf compare --help)", file=sys.stderr)
        return 4
    if args[0] == "merge-driver":
        from pytest_kimiperf.storage.baseline_merge import main as merge_driver

        return merge_driver(args[1:])
    from pytest_kimiperf.compare.cli import main as compare

    return compare(args[1:])


if __name__ == "__main__":
    sys.exit(main())
