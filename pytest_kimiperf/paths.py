"""Where the plugin keeps files that outlive one pytest run (built models, launch records)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from filelock import FileLock


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


def built_model_dir(name: str, spec: Any, recipe: int, cache_dir: Path | None = None) -> Path:
    """Where a model the plugin builds lives (built or not): ``models/<name>-<key>`` under the cache,
    the key a short stable hash of its spec (a dataclass) and its build recipe's version, so a
    change to either builds a new one beside the old."""
    return (cache_dir or default_cache_dir()) / "models" / f"{name}-{spec_key(spec, recipe)}"


def spec_key(spec: Any, recipe: int) -> str:
    """Short stable hash of a built model's spec (a dataclass) and its recipe version."""
    payload = json.dumps({"recipe": recipe, **asdict(spec)}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def build_once(target: Path, build: Callable[[Path], None]) -> bool:
    """Build ``target`` with ``build(staging)`` unless its ``config.json`` is there; True when built now.

    The build goes into a temporary sibling renamed into place under a file lock, so two
    processes (xdist workers, two engines) never see a half-written model nor build it twice.
    """
    if (target / "config.json").is_file():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").is_file():
            return False
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            build(staging)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return True
