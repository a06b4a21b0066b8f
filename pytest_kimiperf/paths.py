"""Where the plugin keeps files that outlive one pytest run (built models, launch records)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$KIMIPERF_CACHE_DIR, else $XDG_CACHE_HOME/pytest-kimiperf, else ~/.cache/pytest-kimiperf."""
    explicit = os.environ.get("KIMIPERF_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-kimiperf"


def launch_state_dir(cache_dir: Path | None = None) -> Path:
    """Directory of launch records, read by the zombie sweep of a later run.

    $KIMIPERF_STATE_DIR overrides it (the plugin's own tests keep their launches apart).
    """
    explicit = os.environ.get("KIMIPERF_STATE_DIR")
    if explicit:
        return Path(explicit)
    return (cache_dir or default_cache_dir()) / "launches"


def compile_cache_env(cache_dir: Path | None = None) -> dict[str, str]:
    """Where a server keeps its compile caches, next to the tiny model, so they survive sessions.

    vLLM keys its torch.compile cache by model, config and source hashes under $VLLM_CACHE_ROOT
    (vllm/envs.py, default ~/.cache/vllm; compilation/backends.py), and Inductor's FX-graph
    cache lives under $TORCHINDUCTOR_CACHE_DIR (default /tmp/torchinductor_$USER, lost with
    /tmp). Both go under the plugin's cache folder; a value set in the shell or the deployment
    wins (the caller applies these as defaults).
    """
    root = cache_dir or default_cache_dir()
    return {"VLLM_CACHE_ROOT": str(root / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor")}
