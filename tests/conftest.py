"""Shared helpers of the plugin's own tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

STUB_SERVER = Path(__file__).with_name("stub_vllm.py")


def stub_deployment_toml(
    name: str = "stub",
    *,
    mode: str = "normal",
    boot_count: Path | None = None,
    health_deadline_s: float = 30,
    load_seconds: float = 0.4,
    floor: float = 1.0,
    target: float = 2.0,
    extra_args: tuple[str, ...] = (),
) -> str:
    """A ``[tool.kimiperf.deployments.<name>]`` table that boots tests/stub_vllm.py."""
    command = [
        sys.executable, str(STUB_SERVER), "--model", "{served_model_name}",
        "--host", "{host}", "--port", "{port}", "--mode", mode,
        "--load-seconds", str(load_seconds), *extra_args,
    ]
    if boot_count is not None:
        command += ["--boot-count", str(boot_count)]
    return (
        f"[tool.kimiperf.deployments.{name}]\n"
        f"model = \"stub-model\"\n"
        f"served_model_name = \"stub-model\"\n"
        f"command = {json.dumps(command)}\n"
        f"health_deadline_s = {health_deadline_s}\n"
        f"decode_floor_tok_s = {floor}\n"
        f"decode_target_tok_s = {target}\n"
    )


@pytest.fixture
def stub_project(pytester: pytest.Pytester):
    """Write a pyproject.toml with stub deployments into the pytester directory."""

    def make(*tables: str, ini: str = "") -> Path:
        text = "\n".join(tables)
        if ini:
            text += "\n[tool.pytest.ini_options]\n" + ini + "\n"
        return pytester.makepyprojecttoml(text)

    return make


@pytest.fixture
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private launch-record dir so tests never sweep each other's servers."""
    state = tmp_path / "kimiperf-launches"
    monkeypatch.setenv("KIMIPERF_STATE_DIR", str(state))
    return state
