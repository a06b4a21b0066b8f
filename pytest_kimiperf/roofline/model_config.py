"""The model's Hugging Face ``config.json``: where it is on this host and what it says.

:func:`find_model_config` looks for it (the deployment's ``model_config``, the tiny model's
build, a local model directory or the Hugging Face hub cache) and says why when it is not
found; :func:`read_model_config` loads it; the helpers below read the language model inside a
multimodal wrapper and the integer fields the roofline needs, naming the field and the file when
one is bad.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimiperf.config.deployments import TINY_MODEL
from pytest_kimiperf.errors import ConfigError

__all__ = [
    "ModelConfigLookup",
    "find_model_config",
    "first_present",
    "hub_cache_dir",
    "positive_int_field",
    "read_model_config",
    "text_config",
]


@dataclass(frozen=True)
class ModelConfigLookup:
    """Where the model's config.json was found (``path``), or why it was not (``reason``)."""

    path: Path | None
    source: str
    reason: str | None = None


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else the XDG/home default.

    The order huggingface_hub resolves it in (constants.py; "Hub Local Cache" in the hub docs).
    """
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def _hub_snapshot(repo_id: str, revision: str | None, cache: Path) -> tuple[Path | None, str]:
    """The snapshot directory of ``repo_id`` in the hub cache, or None with what was looked at.

    Layout: ``models--ORG--NAME/refs/<branch or tag>`` holds a commit hash, and
    ``snapshots/<commit>/`` holds the files (links into ``blobs/``).
    """
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        return None, f"{repo_id} is not in the Hugging Face cache ({repo_dir} does not exist)"
    wanted = revision or "main"
    ref = repo_dir / "refs" / wanted
    commit: str | None = None
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    elif (repo_dir / "snapshots" / wanted).is_dir():
        commit = wanted
    if commit is not None:
        snapshot = repo_dir / "snapshots" / commit
        if (snapshot / "config.json").is_file():
            return snapshot, f"Hugging Face cache, {wanted} -> {commit[:12]}"
        return None, f"{snapshot / 'config.json'} is not in the Hugging Face cache"
    if revision is not None:
        return None, f"revision {revision!r} of {repo_id} is not in the Hugging Face cache ({repo_dir})"
    snapshots = sorted(
        (p for p in (repo_dir / "snapshots").glob("*") if (p / "config.json").is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    if not snapshots:
        return None, f"{repo_id} has no snapshot with a config.json in the Hugging Face cache ({repo_dir})"
    # No refs/main (a download by commit hash): the newest snapshot, named in the source.
    return snapshots[-1], f"Hugging Face cache, newest snapshot {snapshots[-1].name[:12]} (no refs/{wanted})"


def find_model_config(
    deployment: Any,
    *,
    rootpath: Path | None = None,
    environ: Mapping[str, str] | None = None,
    tiny_model_dir: Path | None = None,
) -> ModelConfigLookup:
    """Where the deployment's model config.json is on this host, or why it was not found."""
    env = os.environ if environ is None else environ
    where = f"deployment {deployment.name}"
    if deployment.model_config is not None:
        path = Path(deployment.model_config).expanduser()
        if not path.is_absolute():
            path = (rootpath or Path.cwd()) / path
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return ModelConfigLookup(path, f"model_config of {where}")
        return ModelConfigLookup(None, f"model_config of {where}",
                                 f"model_config {deployment.model_config!r} of {where}: {path} does not exist")
    if deployment.model == TINY_MODEL:
        if tiny_model_dir is None:
            from pytest_kimiperf.server.tiny_model import tiny_model_dir as default_dir

            tiny_model_dir = default_dir()
        path = tiny_model_dir / "config.json"
        if path.is_file():
            return ModelConfigLookup(path, "the tiny model's build")
        return ModelConfigLookup(None, "the tiny model's build",
                                 f"the tiny model is not built yet ({path} does not exist)")
    local = Path(deployment.model).expanduser()
    if local.is_dir():
        path = local / "config.json"
        if path.is_file():
            return ModelConfigLookup(path, "the local model directory")
        return ModelConfigLookup(None, "the local model directory", f"{path} does not exist")
    if local.is_absolute() or deployment.model.startswith((".", "~")) or deployment.model.count("/") > 1:
        return ModelConfigLookup(None, "the local model directory",
                                 f"model {deployment.model!r} of {where} is not a directory on this host; "
                                 "set model_config in the deployment")
    snapshot, source = _hub_snapshot(deployment.model, deployment.revision, hub_cache_dir(env))
    if snapshot is None:
        return ModelConfigLookup(None, "Hugging Face cache",
                                 f"{source}; set model_config in the deployment to its config.json")
    return ModelConfigLookup(snapshot / "config.json", source)


def text_config(config: Mapping[str, Any], *, source: str) -> Mapping[str, Any]:
    """The language model's part of ``config``: its ``text_config`` when it has one, else itself."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"{source} must be a JSON object (config.json), got {type(config).__name__}"
        )
    # Multimodal wrappers (Kimi-K2.5, Llava, Qwen-VL) keep the language model in text_config.
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, Mapping):
        raise ConfigError(f"text_config in {source} must be an object, got {text!r}")
    return text


def first_present(*configs: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The first of ``keys`` set (not None) in the first of ``configs`` that has one, else None."""
    for cfg in configs:
        for key in keys:
            if cfg.get(key) is not None:
                return cfg[key]
    return None


def positive_int_field(value: object, *, name: str, where: str) -> int:
    """``value`` if it is an integer >= 1 (not a bool); else a ConfigError naming the field and its source."""
    # Not numbers.positive_int: a config field has a name and a file it came from, and the
    # message says "<name> in <file> must be ...", which that rule's "<what>=<value>" cannot.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} in {where} must be a positive integer, got {value!r}")
    return value


def read_model_config(path: str | Path) -> dict[str, Any]:
    """Load a model's config.json (the file or its directory) as a dict for ``weights`` and ``quantization``."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"model config {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model config {str(p)!r} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"model config {str(p)!r} must hold a JSON object, got {type(data).__name__}"
        )
    return data
