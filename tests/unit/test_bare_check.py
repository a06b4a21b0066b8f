"""ci/gpu-bare-check.sh on a host without a GPU: one check line a step, what a rerun may skip, the
recordings packed under $OUT after every step, and a time budget that leaves a rerun room in a
10-minute command.

nvidia-smi is a stand-in that answers with recorded outputs (tests/data/gpu), including gVisor's
failed `topo -m`; NVML cannot load here and torch has no CUDA, so the preflight says so in one
line and the steps that need a GPU are not started.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.helpers import DATA, ROOT

SCRIPT = ROOT / "ci" / "gpu-bare-check.sh"
LINE = re.compile(r"^check: (OK|FAIL|INFO) (?P<step>[a-z-]+): .+$")
BUDGET_S = 330  # a whole run and a rerun of what failed fit the device's 10-minute command
GPU_STEPS = ("load-window", "canary", "gpu-memory", "server", "nccl", "ipc", "pid-ns")


def plan() -> list[tuple[str, int]]:
    done = subprocess.run([sys.executable, str(ROOT / "ci" / "gpu_bare_check.py"), "--plan"], capture_output=True,
                          text=True, check=True, timeout=60, cwd=ROOT)
    rows = [line.split() for line in done.stdout.splitlines()]
    assert sorted(name for name, _, needs in rows if needs == "gpu") == sorted(GPU_STEPS)
    return [(name, int(limit)) for name, limit, _ in rows]


def fake_nvidia_smi(directory: Path) -> Path:
    """nvidia-smi answering each query the bare check makes with a recorded output."""
    gpu = DATA / "gpu"
    script = directory / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f'  "") cat {gpu}/smi_header_535.txt ;;\n'
        "  --query-gpu=power.limit) echo 600.00 ;;\n"
        f"  --query-gpu=*) cat {gpu}/query_gpu_8x_rtx_pro_6000.csv ;;\n"
        f"  topo) cat {gpu}/topo_8x_gvisor_failed.txt; exit 255 ;;\n"
        f"  --query-compute-apps=*) cat {gpu}/compute_apps_vllm_enginecore.csv ;;\n"
        f"  -q) cat {gpu}/smi_q_cuda_not_found.txt ;;\n"
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def bare_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake_nvidia_smi(bin_dir)
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=BUDGET_S + 60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
                               "OUT": str(tmp_path / "out"), "TMPDIR": str(tmp_path), **env})


def test_the_steps_fit_the_budget_even_when_each_runs_to_its_limit() -> None:
    steps = plan()
    assert [name for name, _ in steps][:4] == ["preflight", "runtime", "smi", "nvml"]
    assert sum(limit for _, limit in steps) <= BUDGET_S
    assert f"BUDGET=${{BARE_BUDGET_S:-{BUDGET_S}}}" in SCRIPT.read_text()


def test_without_a_gpu_every_step_says_one_line_and_the_recordings_come_back(tmp_path: Path) -> None:
    done = bare_check(tmp_path, SKIP="unit-tests")  # the unit tests are this suite's own
    lines = done.stdout.splitlines()
    checks = [LINE.match(line) for line in lines[:-1]]
    assert all(checks), lines
    assert [m.group("step") for m in checks if m] == [name for name, _ in plan()]
    verdicts = {m.group("step"): m.group(1) for m in checks if m}
    assert verdicts["smi"] == "OK" and verdicts["nvml"] == "FAIL" and verdicts["unit-tests"] == "INFO"
    assert "topo -m exit 255 unparsed" in next(line for line in lines if " smi: " in line)
    # No CUDA: the preflight's one line says why, and no step that needs a GPU is started.
    preflight = next(line for line in lines if " preflight: " in line)
    assert re.match(r"check: FAIL preflight: torch \S+ \(a CPU build\) sees no GPU: the steps that need a GPU are "
                    r"not run; python 3\.", preflight), preflight
    assert "NVML: NVML Shared Library Not Found" in preflight
    for step in GPU_STEPS:
        assert f"check: INFO {step}: not run: torch " in "\n".join(lines) and verdicts[step] == "INFO"
    assert done.returncode == 1
    # A rerun skips what passed or was skipped, never a step that was not run.
    passed = [step for step, verdict in verdicts.items() if verdict != "FAIL" and step not in GPU_STEPS]
    assert lines[-1] == f"SKIP={','.join(passed)}"
    out = tmp_path / "out"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["checks.txt", "recordings.tgz"]  # at most 8 files come back from a device
    assert (out / "checks.txt").read_text().splitlines() == lines
    with tarfile.open(out / "recordings.tgz") as tar:
        names = set(tar.getnames())
        topo = tar.extractfile("./smi/topo_m.txt")
        assert topo is not None and topo.read().decode() == (DATA / "gpu" / "topo_8x_gvisor_failed.txt").read_text()
    assert {"./runtime/stat", "./runtime/facts.json", "./smi/exit_codes.json", "./nvml.log",
            "./preflight/preflight.json", "./preflight.blocked"} <= names
    assert not list(tmp_path.glob("kimiperf-bare.*"))  # the work folder is removed


def test_a_step_that_does_not_fit_what_is_left_of_the_budget_is_not_started(tmp_path: Path) -> None:
    rest = ",".join(name for name, _ in plan() if name not in ("runtime", "smi"))
    done = bare_check(tmp_path, SKIP=rest, BARE_BUDGET_S="25")  # runtime (10 s) fits, smi (30 s) does not
    lines = done.stdout.splitlines()
    assert lines[1].startswith("check: INFO runtime: kernel ")
    assert re.fullmatch(r"check: INFO smi: not run: \d+ s of the 25 s budget left, it may take 30 s", lines[2])
    assert lines[0] == "check: INFO preflight: skipped (SKIP)"
    assert lines[-1] == "SKIP=" + ",".join(name for name, _ in plan() if name != "smi") and done.returncode == 0


def test_the_unit_tests_step_ends_its_pytest_in_its_limit_and_keeps_what_a_cut_run_printed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ci import gpu_bare_steps

    limit = dict(plan())["unit-tests"]
    assert gpu_bare_steps.UNIT_TESTS_TIMEOUT_S + 5 <= limit  # the shell's kill grace, and time to say so
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_quick():\n    pass\n\ndef test_slow():\n    time.sleep(60)\n")
    monkeypatch.setattr(gpu_bare_steps, "GPU_TESTS", (str(slow),))
    monkeypatch.setattr(gpu_bare_steps, "UNIT_TESTS_TIMEOUT_S", 8)
    log = tmp_path / "unit-tests" / "pytest.txt"

    class TimedOutAfterTheFirstTest(subprocess.Popen):  # type: ignore[type-arg]
        """The limit runs out once test_quick's dot is printed, however long this host took to
        start pytest: the step's handling of a cut run is the subject, not this host's speed."""

        def wait(self, timeout: float | None = None) -> int:
            if timeout is None:
                return super().wait()
            while not log.read_text().startswith(".") and self.poll() is None:
                time.sleep(0.05)
            raise subprocess.TimeoutExpired(self.args, timeout)

    monkeypatch.setattr(gpu_bare_steps.subprocess, "Popen", TimedOutAfterTheFirstTest)
    verdict, text = gpu_bare_steps.step_unit_tests(tmp_path / "unit-tests")
    assert verdict == "FAIL" and text.startswith("cut off after 8 s; what it printed is in unit-tests/pytest.txt")
    assert (tmp_path / "unit-tests" / "pytest.txt").read_text().splitlines()[0].startswith(".")  # test_quick's dot


@pytest.mark.parametrize("entry_point", ["blocked", "present"])
def test_the_unit_tests_step_registers_the_plugin_itself_as_the_lent_machine_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_point: str) -> None:
    # The lent machine has the repository on PYTHONPATH and no installed package: no entry point.
    # Blocking it here stands for that; present, the explicit registration must not clash with it.
    from ci import gpu_bare_steps

    probe = tmp_path / "test_registered.py"
    probe.write_text("def test_registered(pytestconfig):\n"
                     "    assert pytestconfig.pluginmanager.hasplugin('pytest_kimiperf.plugin')\n"
                     "    pytestconfig.getoption('kimiperf_deployment')  # ValueError where no plugin added it\n")
    monkeypatch.setattr(gpu_bare_steps, "GPU_TESTS", (str(probe),))
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:kimiperf" if entry_point == "blocked" else "")
    # The registration is the subject, not the step's limit: a loaded host may start pytest slowly.
    monkeypatch.setattr(gpu_bare_steps, "UNIT_TESTS_TIMEOUT_S", 600)
    verdict, text = gpu_bare_steps.step_unit_tests(tmp_path / "unit-tests")
    assert verdict == "OK" and re.fullmatch(r"exit 0: 1 passed in [\d.]+s", text), text


def test_preflight_names_a_python_too_old_or_other_than_the_one_the_carried_deps_were_built_for(tmp_path: Path) -> None:
    from ci.gpu_bare_preflight import python_problem

    assert python_problem(tmp_path, (3, 10, 12)) == (
        "Python 3.10.12 is older than pytest-kimiperf allows (requires-python >= 3.11): run with PYTHON=python3.12")
    assert python_problem(tmp_path, (3, 12, 3)) is None  # no .bare-deps: nothing carried to mismatch
    (tmp_path / ".bare-deps").mkdir()
    (tmp_path / ".bare-deps" / "BUILT_FOR").write_text("cp312\n")
    assert python_problem(tmp_path, (3, 12, 3)) is None
    assert python_problem(tmp_path, (3, 11, 7)) == (
        ".bare-deps was built for CPython 3.12 (cp312), this is CPython 3.11.7: rebuild it with "
        "BARE_PYTHON_VERSION=3.11 ci/gpu-bare-deps.sh, or run the Python it was built for")


def test_on_the_simulated_gpu_the_driver_steps_pass_and_the_cuda_steps_say_why_not(simulated_gpus,
                                                                                   tmp_path: Path) -> None:
    """The bare check on the simulated GPU (tests/fakes/simgpu): nvidia-smi and NVML answer as on
    the production host, so their steps pass through the plugin's own readers; torch (a CPU build)
    sees no CUDA device, so the preflight says so and the steps that need one are not started."""
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=BUDGET_S + 60,
                          env={**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
                               "TMPDIR": str(tmp_path), "SKIP": "unit-tests"})
    lines = done.stdout.splitlines()
    verdicts = {m.group("step"): m.group(1) for line in lines[:-1] if (m := LINE.match(line))}
    assert [name for name, _ in plan()] == list(verdicts), done.stdout + done.stderr
    assert verdicts["smi"] == "OK" and verdicts["nvml"] == "OK", done.stdout
    assert "NVML NVML 8 GPU(s), nvidia-smi nvidia-smi; fingerprint keys equal" in done.stdout
    assert verdicts["preflight"] == "FAIL" and all(verdicts[step] == "INFO" for step in GPU_STEPS)
    assert lines[-1].startswith("SKIP=") and "smi" in lines[-1] and "nvml" in lines[-1]
