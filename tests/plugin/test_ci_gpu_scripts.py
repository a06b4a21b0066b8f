"""Every GPU script in ci/ runs to its end in `make test`, on the simulated GPU (tests/fakes/simgpu)
with stand-ins where a real GPU's software is missing here: a script that has never run is a stub.
What each proves only on a real GPU is said in ci/README.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, STUB_PRELOAD, STUB_SERVER

pytestmark = pytest.mark.usefixtures("isolated_state")


def stand_in_vllm(directory: Path) -> Path:
    """A ``vllm`` executable: ``serve`` runs the stub engine, ``preload`` the stand-in daemons."""
    exe = directory / "vllm"
    directory.mkdir(parents=True, exist_ok=True)
    exe.write_text(
        "#!/bin/sh\n"
        "cmd=$1; shift\n"
        f'if [ "$cmd" = serve ]; then model=$1; shift; exec {sys.executable} {STUB_SERVER} --model "$model" '
        '--load-seconds 0.2 "$@"; fi\n'
        f'exec {sys.executable} {STUB_PRELOAD} "$@"\n')
    exe.chmod(0o755)
    return exe


def test_the_weight_cache_check_runs_to_its_end(simulated_gpus, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "WEIGHT_CACHE_OUT": str(tmp_path / "out"),
           "WEIGHT_CACHE_VLLM": str(stand_in_vllm(tmp_path / "bin")), "WEIGHT_CACHE_BOOT_DEADLINE_S": "60"}
    done = subprocess.run(["bash", "ci/gpu-weight-cache-check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: both engines mapped their weights from the daemon; nothing left running" in done.stdout
    assert "second boot (ring-ll): weight phase" in done.stdout


HOLD = ROOT / "tests" / "fakes" / "simgpu" / "hold.py"


def test_the_first_run_check_runs_to_its_end(simulated_gpus, tmp_path: Path) -> None:
    """Every check prints its line and the run ends with its SKIP= list. On the simulated GPU with a
    stand-in engine two checks fail, for what only a real host has: the stub writes NCCL's
    variables but no collective's choice (nccl-debug), and a node behind a launch template starts
    with a clean environment, so the simulated GPU (an environment variable) does not reach it."""
    vllm = tmp_path / "bin" / "vllm"
    vllm.parent.mkdir()
    vllm.write_text(
        "#!/bin/sh\ncmd=$1; shift\n"
        f'if [ "$cmd" = serve ]; then model=$1; shift; exec {sys.executable} {STUB_SERVER} --model "$model" '
        '--load-seconds 0.2 --sim-gpu-mib 2048 --nccl-lines "$@"; fi\n'
        f'exec {sys.executable} {STUB_PRELOAD} "$@"\n')
    vllm.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "FIRST_RUN_OUT": str(out), "FIRST_RUN_VLLM": str(vllm),
           "FIRST_RUN_HOLDER": f"{sys.executable} {HOLD} hold --mib 1024", "BOOT_DEADLINE_S": "60"}
    done = subprocess.run(["bash", "ci/gpu-first-run.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and lines[-1] == "SKIP=vllm-contract,facts,sweep-gpu-memory,weight-cache", \
        done.stdout + done.stderr
    verdicts = {}
    for line in lines[:-1]:
        check, _, rest = line.removeprefix("first-run: ").partition(": ")
        verdicts.setdefault(check, set()).add(rest.split()[0].rstrip(":"))
    assert verdicts == {
        "vllm-contract": {"vllm-contract"}, "nvml": {"OK"}, "counters": {"OK"}, "pid-namespace": {"OK"},
        "sweep-gpu-memory": {"OK"}, "boot": {"OK"}, "spt-noenv": {"OK"}, "sweep-gpu-memory-vllm": {"OK"},
        "nccl-debug": {"FAIL"}, "weight-cache": {"OK"}, "nodes": {"FAIL"}}, done.stdout
    assert "vllm-contract: OK" in done.stdout and "nodes: FAIL node agent facts through a template: gpu.count 0" \
        in done.stdout


GPU_MEMORY_STEP = """
import json, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from ci.gpu_bare_check import step_gpu_memory
print(json.dumps(step_gpu_memory(Path({out!r}))))
"""


@pytest.mark.parametrize("pid_mode", ["local", "foreign"])
def test_the_bare_checks_gpu_memory_step_accounts_per_gpu_where_nvml_names_no_process_here(
    simulated_gpus, tmp_path: Path, pid_mode: str
) -> None:
    """NVML naming our holder: OK. In a pid namespace whose driver names the host's pids (none is a
    process here): INFO with device-level accounting, as the plugin itself does, never FAIL."""
    import json

    if pid_mode == "foreign":
        if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
            pytest.skip("this host refuses a pid namespace (unshare --pid --mount-proc)")
        simulated_gpus.update(pid_mode="foreign")
    wrap = ["unshare", "--pid", "--fork", "--mount-proc"] if pid_mode == "foreign" else []
    env = {**os.environ, "BARE_HOLDER": f"{sys.executable} {HOLD}"}
    done = subprocess.run([*wrap, sys.executable, "-c", GPU_MEMORY_STEP.format(root=str(ROOT), out=str(tmp_path))],
                          capture_output=True, text=True, env=env, timeout=120)
    verdict, text = json.loads(done.stdout.strip().splitlines()[-1])
    if pid_mode == "local":
        assert verdict == "OK" and "seen with 2048 MiB; freed" in text, text
    else:
        assert verdict == "INFO", text
        assert text.startswith("NVML names no process here (") and "device-level accounting saw +2048 MiB" in text
