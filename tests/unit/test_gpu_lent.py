"""ci/gpu-lent.sh runs to its end here, on the CPU (DRY_RUN): one timed line a step, the orphan a
killed run leaves swept by the next, the reports back under $OUT, and a budget that says what it
did not start. The bare check's own steps are skipped (tests/unit/test_bare_check.py runs them)
and one boot a profile is enough for the plumbing (the GPU run takes two).

The lent machine has the repository on PYTHONPATH and the plugin not installed, so no pytest11
entry point: the whole dry run runs with it blocked (PYTEST_ADDOPTS="-p no:kimiperf"), so that
nothing in it leans on this virtualenv's editable install; the budget test runs with it present,
where the suite's explicit registration must not clash with it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "ci" / "gpu-lent.sh"
SUITE = ROOT / "ci" / "lent_tests"
# What the lent machine lacks: the plugin's pytest11 entry point (pyproject.toml names it kimiperf).
NO_ENTRY_POINT = "-p no:kimiperf"
LINE = re.compile(r"^lent: (OK|FAIL|INFO) (?P<step>[a-z0-9-]+) \((?P<s>\d+) s\): .+$")


def _has_entry_point() -> bool:
    return any(ep.name == "kimiperf" for ep in metadata.entry_points(group="pytest11"))


def lent(tmp_path: Path, entry_point: bool, **env: str) -> subprocess.CompletedProcess[str]:
    bare_steps = lent_bare_steps()
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
                               "TMPDIR": str(tmp_path), "BARE_SKIP": bare_steps, "LENT_BOOTS": "1",
                               "PYTEST_ADDOPTS": "" if entry_point else NO_ENTRY_POINT, **env})


def _torch_servers(tmp_path: Path) -> set[int]:
    """The torch servers this test's runs started (their launch records are under ``tmp_path``)."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        if any(part.startswith("pytest_kimiperf.server.torch_") for part in process.info["cmdline"] or []):
            try:
                if process.environ().get("KIMIPERF_STATE_DIR", "").startswith(str(tmp_path)):
                    found.add(process.pid)
            except psutil.Error:
                pass
    return found


@pytest.mark.parametrize("entry_point", [False, True], ids=["entry-point-blocked", "entry-point-present"])
def test_the_lent_suite_registers_the_plugin_itself(entry_point: bool) -> None:
    # Reproduced before the suite named the plugin: "unrecognized arguments: --kimiperf-deployment".
    if entry_point and not _has_entry_point():
        pytest.skip("the plugin is not installed here: no entry point to run beside")
    done = subprocess.run([sys.executable, "-m", "pytest", "--kimiperf-deployment", "lent-cpu", "--co", "-q"],
                          cwd=SUITE, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "PYTEST_ADDOPTS": "" if entry_point else NO_ENTRY_POINT})
    assert done.returncode == 0 and "4 tests collected" in done.stdout, done.stdout + done.stderr


def test_the_dry_run_runs_every_step_and_sweeps_the_orphan_it_made(tmp_path: Path) -> None:
    done = lent(tmp_path, entry_point=False)
    lines = done.stdout.splitlines()
    steps = [m.group("step") if (m := LINE.match(line)) else line for line in lines[:-2]]
    # What matters most first: the orphan and the plugin end to end; the bare check in what is left.
    assert steps == ["preflight", "orphan", "e2e", "report", "cleanup", "bare-check", "pack"], done.stdout + done.stderr
    verdicts = dict(zip(steps, (line.split()[1] for line in lines)))
    assert verdicts == {"preflight": "INFO", "orphan": "OK", "e2e": "OK", "report": "OK", "cleanup": "INFO",
                        "bare-check": "INFO", "pack": "INFO"}, done.stdout
    assert lines[4].endswith("nothing left running")
    assert re.fullmatch(r"lent: OK all \(\d+ s of the 330 s budget\)", lines[-2])
    # The rerun: what passed, the bare check's steps by name since on the CPU it is INFO as a whole.
    assert lines[-1] == f"SKIP=orphan,e2e,report BARE_SKIP={lent_bare_steps()}"
    assert "CPU mode (DRY_RUN: torch " in lines[0] and "lent-cpu (tiny-torch-cpu) stands in for tiny-gpu-torch" in lines[0]
    assert re.search(r"; pytest [\d.]+, pytest-benchmark [\d.]+, psutil [\d.]+, matplotlib ([\d.]+|none); ", lines[0])
    assert re.search(r"engine core \[\d+\] left running, GPU memory not checked \(CPU mode\)", lines[1]), lines[1]
    orphan = re.search(r"engine core \[(\d+)\]", lines[1])
    assert orphan and "swept: 2 line(s)" in lines[3], lines[3]
    assert "2 boots accounted" in lines[3] and "4 of 4 test results measured" in lines[3]
    assert done.returncode == 0
    out = tmp_path / "out"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert {"lent.txt", "report.json", "report.md", "logs.tgz", "bare/checks.txt"} <= set(files) and len(files) <= 8
    assert (out / "lent.txt").read_text().splitlines() == lines
    assert not psutil.pid_exists(int(orphan.group(1))) and not _torch_servers(tmp_path)
    assert not list(tmp_path.glob("kimiperf-lent.*"))  # the work folder is removed


def lent_bare_steps() -> str:
    plan = subprocess.run([sys.executable, str(ROOT / "ci" / "gpu_bare_check.py"), "--plan"], capture_output=True,
                          text=True, check=True, cwd=ROOT).stdout
    return ",".join(line.split()[0] for line in plan.splitlines())


def test_steps_that_do_not_fit_the_budget_say_so_and_what_they_leave_is_ended_all_the_same(tmp_path: Path) -> None:
    # 150 s: the preflight and the orphan fit, the end-to-end run (150 s) does not; the orphan is
    # then swept by the cleanup, and the bare check runs in what is left. With the plugin's entry
    # point present: the suite's explicit registration must not clash with it.
    if not _has_entry_point():
        pytest.skip("the plugin is not installed here: no entry point to run beside")
    done = lent(tmp_path, entry_point=True, LENT_BUDGET_S="150")
    lines = done.stdout.splitlines()
    assert LINE.match(lines[0]) and " preflight (" in lines[0]
    assert LINE.match(lines[1]) and lines[1].startswith("lent: OK orphan ("), lines
    orphan = re.search(r"engine core \[(\d+)\] left running", lines[1])
    assert re.fullmatch(r"lent: INFO e2e \(0 s\): not run: \d+ s of the 150 s budget left, it may take 150 s", lines[2])
    assert lines[3].startswith("lent: FAIL report (") and "no report.json (FileNotFoundError)" in lines[3]
    assert orphan and lines[4].startswith("lent: FAIL cleanup (") and f"ended pid {orphan.group(1)} " in lines[4]
    assert lines[5].startswith("lent: INFO bare-check (")
    assert re.fullmatch(r"lent: FAIL all \(\d+ s of the 150 s budget\)", lines[-2]) and done.returncode == 1
    # The orphan passed but e2e and report did not: the three rerun together.
    assert lines[-1] == f"SKIP= BARE_SKIP={lent_bare_steps()}"
    assert not _torch_servers(tmp_path)


def _names(path: Path) -> set[str]:
    """The distributions a requirements-style file names, normalized as pip compares them (PEP 503)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {re.sub(r"[-_.]+", "-", re.split(r"[\s<>=!~;\[]", line)[0]).lower() for line in lines if line}


def test_the_carried_dependencies_name_nothing_the_lent_image_already_has() -> None:
    image = _names(ROOT / "ci" / "gpu-image-packages.txt")
    assert {"torch", "pytest", "pytest-benchmark", "py-cpuinfo", "prometheus-client", "psutil"} <= image
    assert not _names(ROOT / "ci" / "gpu-bare-deps.txt") & image


def test_the_bare_deps_script_refuses_what_the_image_has_and_builds_nothing_for_an_empty_list(tmp_path: Path) -> None:
    (tmp_path / "ci").mkdir()
    for name in ("gpu-bare-deps.sh", "gpu-bare-deps.txt", "gpu-image-packages.txt"):
        (tmp_path / "ci" / name).write_bytes((ROOT / "ci" / name).read_bytes())
    (tmp_path / ".bare-deps").mkdir()  # an old build: removed, so nothing stale is carried
    done = subprocess.run(["bash", str(tmp_path / "ci" / "gpu-bare-deps.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "nothing to carry" in done.stdout and not (tmp_path / ".bare-deps").exists()
    with (tmp_path / "ci" / "gpu-bare-deps.txt").open("a") as deps:
        deps.write("Pytest_Benchmark==5.3.1\nprometheus-client>=0.17\n")
    done = subprocess.run(["bash", str(tmp_path / "ci" / "gpu-bare-deps.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip() == (
        "gpu-bare-deps: the image already has prometheus-client pytest-benchmark: a carried copy would shadow it "
        "(ci/gpu-image-packages.txt)")


def test_the_orphans_memory_is_read_by_pid_where_nvml_names_it_and_per_device_where_it_names_none() -> None:
    from ci.gpu_lent import OrphanMemory, account_orphan_memory
    from pytest_kimiperf.server.gpu_memory import GpuHolder, GpuHolders

    before, now = {0: 520}, {0: 520 + 72_000}
    named = GpuHolders((GpuHolder(0, 4242, 4242, 72_000, "python3"), GpuHolder(0, 77, 77, 300, "other")))
    assert account_orphan_memory([4242], named, before, now) == OrphanMemory(72_000, "pid", "NVML names pid 4242")
    # gVisor: NVML's pid is another namespace's (named None here), or NVML lists no process at all.
    other_ns = GpuHolders((GpuHolder(0, None, 91_234, 72_000),), note="the driver reports the host's pids")
    held = account_orphan_memory([4242], other_ns, before, now)
    assert held.mib == 72_000 and held.how == "device"
    assert held.said == ("NVML names none of its pids here (NVML lists 1 process(es), 1 of another pid namespace): "
                         "device-level, +72000 MiB since before its boot")
    assert account_orphan_memory([4242], GpuHolders(), before, now).mib == 72_000
    # The driver's own drift is no orphan's memory: the plugin's tolerance (DEVICE_TOLERANCE_MIB).
    assert account_orphan_memory([4242], GpuHolders(), before, {0: 520 + 200}).mib == 0


def test_the_orphans_memory_nvml_names_without_a_figure_is_read_per_device_not_as_0() -> None:
    from ci.gpu_lent import account_orphan_memory
    from pytest_kimiperf.server.gpu_memory import GpuHolder, GpuHolders

    # NVML_VALUE_NOT_AVAILABLE: the engine core is named, its memory is not (was: 0 MiB, a FAIL).
    unknown = GpuHolders((GpuHolder(0, 4242, 4242, None, "python3"),))
    held = account_orphan_memory([4242], unknown, {0: 520}, {0: 520 + 72_000})
    assert held.mib == 72_000 and held.how == "device"
    assert held.said == "NVML names pid 4242 without a figure for its memory: device-level, +72000 MiB since before its boot"
    # Named without a figure and nothing grew: nothing held, which fails the step on a GPU.
    assert account_orphan_memory([4242], unknown, {0: 520}, {0: 520}).mib == 0


def test_a_zombie_is_gone_and_a_running_process_is_not() -> None:
    from ci.gpu_lent import is_gone

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not is_gone(child.pid)
        child.kill()
        # Killed, not yet reaped: psutil.pid_exists says True, the orphan step must say gone.
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.pid_exists(child.pid) and is_gone(child.pid)
    finally:
        child.kill()
        child.wait()
    assert is_gone(child.pid)


def _window(test: str, profile: str, **fields: object) -> dict[str, object]:
    return {"test": f"test_lent.py::{test}", "profile": profile, "invalid": None, "invalid_cause": None,
            "run": {"rounds": 3}, "failures": [], "metrics": {}, **fields}


MEASURED = [_window(test, profile) for profile in ("default", "ring-ll")
            for test in ("test_single_stream_decode", "test_output_throughput")]
CLIENT_BOUND = ("client-bound: the load generator, not the server, limited this run: a client process used 97% of "
                "a core (bound 90%)")


def test_the_end_to_end_step_passes_with_every_window_measured_or_invalid_with_its_cause() -> None:
    from ci.gpu_lent import judge_e2e

    assert judge_e2e(0, "4 passed in 20s", {"tests": MEASURED}, expected=4) == (
        "OK", "pytest exit 0: 4 passed in 20s; 4 of 4 windows measured, 0 INVALID")
    # An INVALID window is the device's finding (pytest exit 75: every failure INVALID).
    found = [*MEASURED[:3], {**MEASURED[3], "invalid": CLIENT_BOUND, "invalid_cause": "client-held"}]
    assert judge_e2e(75, "1 failed, 3 passed", {"tests": found}, expected=4) == (
        "OK", "pytest exit 75: 1 failed, 3 passed; 3 of 4 windows measured, 1 INVALID")


@pytest.mark.parametrize(("code", "tests", "why"), [
    # A real failure still fails: a measured window that failed its check, beside an INVALID one.
    (1, [{**MEASURED[0], "failures": ["decode_tok_s 80 tok/s is below the floor 100 tok/s"]}, *MEASURED[1:3],
         {**MEASURED[3], "invalid": CLIENT_BOUND, "invalid_cause": "client-held"}],
     "test_single_stream_decode[default]: failed: decode_tok_s 80 tok/s is below the floor 100 tok/s"),
    (75, [*MEASURED[:3], {**MEASURED[3], "invalid": CLIENT_BOUND}],
     f"test_output_throughput[ring-ll]: INVALID without a cause ({CLIENT_BOUND})"),
    (1, MEASURED, "a test failed but no window is INVALID: see e2e-pytest.txt"),
    (0, MEASURED[:3], "3 windows in report.json, not 4"),
    (0, [*MEASURED[:3], {**MEASURED[3], "run": None}], "test_output_throughput[ring-ll]: neither measured nor INVALID"),
    (2, MEASURED, "pytest exit 2: interrupted (the run did not reach its end)"),
    (76, MEASURED, "(the run did not reach its end)"),
])
def test_the_end_to_end_step_fails_on_anything_but_a_measured_or_explained_window(
        code: int, tests: list[dict[str, object]], why: str) -> None:
    from ci.gpu_lent import judge_e2e

    verdict, text = judge_e2e(code, "interrupted", {"tests": tests}, expected=4)
    assert verdict == "FAIL" and why in text, text
    assert judge_e2e(0, "4 passed", None, expected=4) == ("FAIL", "pytest exit 0: 4 passed; no report.json")


def test_a_window_without_a_decode_median_is_left_out_of_the_medians() -> None:
    # Was a TypeError in the report step (sorting None with floats).
    from ci.gpu_lent import decode_medians

    windows = [{"metrics": {"decode_tok_s": {"summary": {"median": 512.0}}}},
               {"metrics": {"decode_tok_s": {"summary": {"median": None}}}},
               {"metrics": {"output_throughput": {"summary": {"median": 9000.0}}}},
               {"metrics": {"decode_tok_s": {"summary": {"median": 463.5}}}}]
    assert decode_medians(windows) == [463.5, 512.0]
    assert decode_medians([]) == []


def test_the_dry_run_finds_the_devices_traps_and_passes_them(tmp_path: Path) -> None:
    # Three traps of a lent machine injected into one dry run, each a green step: a client bound
    # no client meets (every window INVALID: the step passes, the report names the cause), an init
    # that never reaps (the killed launcher and API server stay zombies: gone all the same), and
    # NVML naming the orphan without a figure for its memory (the simulated GPU: NVML_VALUE_NOT_AVAILABLE,
    # so the orphan's memory is read per device and the plugin's sweep says "an unknown amount").
    from tests.fakes.simgpu import SimulatedGpus, state

    sim = SimulatedGpus(tmp_path / "sim", state.h100_host(count=1, process_memory="not-available"))
    try:
        tools = {name: value for name, value in sim.env().items() if name in (state.STATE_ENV, "PATH", "PYTHONPATH")}
        done = lent(tmp_path, entry_point=False, **tools, LENT_DEPLOYMENT="lent-cpu-client-bound", LENT_UNREAPED="1",
                    LENT_SIMULATED_GPU=str(sim.directory))
    finally:
        sim.close()
    lines = done.stdout.splitlines()
    verdicts = {m.group("step"): line.split()[1] for line in lines if (m := LINE.match(line))}
    assert verdicts == {"preflight": "INFO", "orphan": "OK", "e2e": "OK", "report": "OK", "cleanup": "INFO",
                        "bare-check": "INFO", "pack": "INFO"}, done.stdout + done.stderr
    orphan = next(line for line in lines if " orphan (" in line)
    engine = re.search(r"engine core \[(\d+)\] left running", orphan)
    assert "(2 of 2 gone, 2 of them zombies nobody reaped)" in orphan and engine, orphan
    assert (f"holding 4096 MiB (NVML names pid {engine.group(1)} without a figure for its memory: device-level, "
            "+4096 MiB since before its boot") in orphan
    e2e = next(line for line in lines if " e2e (" in line)
    assert re.search(r"pytest exit 75: .*; 0 of 4 windows measured, 4 INVALID$", e2e), e2e
    report = next(line for line in lines if " report (" in line)
    assert f"ended pid {engine.group(1)} " in report and "which held an unknown amount of GPU memory" in report
    assert "0 of 4 test results measured, 4 INVALID: test_single_stream_decode[default] (client-held): " in report
    assert report.count("a client process used") == 4 and "no decode median" in report, report
    assert re.fullmatch(r"lent: OK all \(\d+ s of the 330 s budget\)", lines[-2]) and done.returncode == 0
    assert not psutil.pid_exists(int(engine.group(1))) and not _torch_servers(tmp_path)
