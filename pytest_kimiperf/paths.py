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
