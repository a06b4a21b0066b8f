"""The steps of ci/gpu-lent.sh, one process each: what a lent GPU machine shows of the plugin end to end.

    python ci/gpu_lent.py STEP WORK OUT [ARGS]

Each step prints its details, then one line ``lent: OK|FAIL|INFO STEP: what was seen``, which the
shell times and collects. WORK holds what steps pass on (``mode``: gpu or cpu; ``orphan.json``;
the end-to-end run's output); OUT gets what comes back from the machine. The steps:

* ``preflight``: Python (ci/gpu_bare_preflight.py's check), pyproject's dependencies present at
  the versions it asks, the versions of pytest, pytest-benchmark, psutil and matplotlib the image
  has, and the mode: ``gpu`` where torch sees a CUDA device and DRY_RUN is not set, else ``cpu``,
  where tiny-torch-cpu's twin ``lent-cpu`` stands in for tiny-gpu-torch and what needs NVML is
  said to be skipped. No GPU without DRY_RUN is a FAIL, and the rest runs on the CPU all the same.
* ``orphan``: a pytest session boots the deployment and is SIGKILLed with its launcher and API
  server, as a CI job killed whole: the engine core must be left running (on a GPU, holding its
  memory: by its pid where NVML names it here with a figure, else by each GPU's use against its
  figure before the boot, as the plugin accounts under gVisor). A killed process nobody reaped
  (a zombie: a container's init that does not reap) is gone. The next step's session must sweep
  the engine core.
* ``e2e``: the plugin on the deployment, profiles default and ring-ll, two boots each, the JSON and
  Markdown reports and the plots into OUT. It passes when the flow ran end to end and every
  window is measured or INVALID with its cause: an INVALID window on a lent machine is a finding
  (its cause is the host's or the client's), not a failure of the flow.
* ``report``: what the run and its report show: the orphan swept and its memory back, every boot
  accounted, every window measured or INVALID with its cause (said), NVML telemetry in each
  measured window (GPU), the plots.

Injections for the dry run's tests (tests/unit/test_gpu_lent.py), each a trap of the device:
``LENT_DEPLOYMENT`` runs another deployment of the suite (``lent-cpu-client-bound``: every window
INVALID); ``LENT_UNREAPED=1`` makes the orphan step a child subreaper that never reaps, so the
killed launcher and API server stay zombies; ``LENT_SIMULATED_GPU`` (a folder) holds the orphan's
memory on the simulated GPU (tests/fakes/simgpu, whose NVML and nvidia-smi must be on the paths),
where NVML may name it without a figure.
* ``cleanup`` (always, whatever the budget): the plugin's sweep over this run's launch records,
  so nothing a cut or skipped step left outlives the command or holds the GPU the bare check
  measures (a FAIL where it found something).
* ``bare-check BUDGET_S``: ci/gpu-bare-check.sh in what is left, its lines under OUT/bare, its own
  steps to skip in BARE_SKIP, and the ones that passed in WORK/bare-skip for the rerun's line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement  # pytest's own dependency: there wherever pytest is

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "ci" / "lent_tests"
DEPLOYMENT = {"gpu": "tiny-gpu-torch", "cpu": "lent-cpu"}
PROFILES = ("default", "ring-ll")
BOOTS = int(os.environ.get("LENT_BOOTS", "2"))  # 1 in the CI test of the dry run
# The image's own copies, which nothing carried shadows (ci/gpu-image-packages.txt): the versions
# the run's figures rest on, said in the preflight's line.
SHOWN_VERSIONS = ("pytest", "pytest-benchmark", "psutil", "matplotlib")
sys.path.insert(0, str(ROOT))

from pytest_kimiperf.judge.gate import EXIT_OK, EXIT_TESTS_FAILED, INVALID_ONLY_EXIT  # noqa: E402
from pytest_kimiperf.server.gpu_memory import DEVICE_TOLERANCE_MIB, GpuHolders  # noqa: E402


def _mode(work: Path) -> str:
    return (work / "mode").read_text().strip() if (work / "mode").is_file() else "cpu"


def _env(work: Path) -> dict[str, str]:
    """The plugin sessions' environment: one launch-record folder for the orphan's run and the
    next (the sweep reads it), the tiny model's cache in WORK, the suite's size."""
    return {**os.environ, "KIMIPERF_STATE_DIR": str(work / "state"), "KIMIPERF_CACHE_DIR": str(work / "cache"),
            "LENT_SCALE": _mode(work), "PYTHONUNBUFFERED": "1"}


def _deployment(work: Path) -> str:
    return os.environ.get("LENT_DEPLOYMENT") or DEPLOYMENT[_mode(work)]


def _reads_gpu_memory(work: Path) -> bool:
    """Whether the orphan's GPU memory is read: on a GPU, or on the simulated one."""
    return _mode(work) == "gpu" or bool(os.environ.get("LENT_SIMULATED_GPU"))


def _pytest(work: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "--kimiperf-deployment", _deployment(work),
            "--basetemp", str(work / f"pytest-{len(list(work.glob('pytest-*')))}"), *args]


# --------------------------------------------------------------------------- preflight


def step_preflight(work: Path, out: Path) -> tuple[str, str]:
    """Python, dependencies, plots, and whether this run is on a GPU."""
    from ci.gpu_bare_preflight import python_problem

    problem = python_problem()
    declared = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    found = {req.name: _version(req.name) for req in declared}
    missing = [name for name, version in found.items() if version is None]
    too_old = [f"{req.name} {found[req.name]} (needs {req.specifier})" for req in declared
               if found[req.name] is not None and not req.specifier.contains(found[req.name] or "", prereleases=True)]
    plots = _version("matplotlib")
    versions = ", ".join(f"{name} {_version(name) or 'none'}" for name in SHOWN_VERSIONS)
    import torch

    gpu = torch.cuda.is_available()
    dry = os.environ.get("DRY_RUN", "") not in ("", "0")
    mode = "gpu" if gpu and not dry else "cpu"
    (work / "mode").write_text(mode + "\n")
    if gpu:
        props = torch.cuda.get_device_properties(0)
        seen = f"{props.name} ({props.total_memory // 2**20} MiB), torch {torch.__version__} CUDA {torch.version.cuda}"
    else:
        seen = f"torch {torch.__version__} sees no GPU ({'a CPU build' if torch.version.cuda is None else 'no device'})"
    where = (f"GPU mode on {seen}" if mode == "gpu" else
             f"CPU mode ({'DRY_RUN' if dry else 'no GPU'}: {seen}): lent-cpu (tiny-torch-cpu) stands in for "
             "tiny-gpu-torch; the NVML and GPU-memory checks are skipped, each saying so")
    line = (f"{where}; python {sys.version.split()[0]}; {versions}; pyproject's dependencies "
            f"{'all present' if not missing else 'MISSING ' + ', '.join(missing) + ' (carry them: ci/gpu-bare-deps.sh)'}"
            f"{'; TOO OLD ' + ', '.join(too_old) if too_old else ''}"
            f"; plots: {'matplotlib ' + plots if plots else 'none (no matplotlib here, and it is not carried: 107 MB)'}")
    if problem or missing or too_old:
        return "FAIL", f"{problem + '; ' if problem else ''}{line}"
    if mode == "cpu" and not dry:
        return "FAIL", f"expected a GPU (set DRY_RUN=1 for a run on the CPU): {line}"
    return ("OK" if mode == "gpu" else "INFO"), line


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# --------------------------------------------------------------------------- the bare check

# What fails on a host without a GPU whatever the code does: torch sees none (preflight), and
# nvidia-smi and NVML are not there (smi, nvml).
NEEDS_A_GPU = ("preflight", "smi", "nvml")


def step_bare_check(work: Path, out: Path, budget_s: str) -> tuple[str, str]:
    """ci/gpu-bare-check.sh in ``budget_s``, its check lines and recordings under OUT/bare."""
    env = {**os.environ, "OUT": str(out / "bare"), "BARE_BUDGET_S": budget_s, "PYTHON": sys.executable,
           "TMPDIR": str(work), "SKIP": os.environ.get("BARE_SKIP", "")}
    done = subprocess.run(["bash", str(ROOT / "ci" / "gpu-bare-check.sh")], env=env, capture_output=True, text=True,
                          check=False)
    print(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("check: ")]
    verdicts = {line.split()[2].rstrip(":"): line.split()[1] for line in lines}
    failed = sorted(step for step, verdict in verdicts.items() if verdict == "FAIL")
    counts = ", ".join(f"{sum(v == kind for v in verdicts.values())} {kind}" for kind in ("OK", "INFO", "FAIL"))
    rerun = next((line for line in done.stdout.splitlines() if line.startswith("SKIP=")), "SKIP=")
    (work / "bare-skip").write_text(rerun.removeprefix("SKIP="))
    not_run = sorted(step for step in verdicts if step not in rerun.removeprefix("SKIP=").split(",") + failed)
    text = (f"{len(verdicts)} steps: {counts}; failed: {', '.join(failed) or 'none'}; not run: "
            f"{', '.join(not_run) or 'none'}; rerun with BARE_{rerun}")
    if not verdicts:
        return "FAIL", f"no check lines (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-200:]}"
    if _mode(work) == "cpu":
        unexpected = [step for step in failed if step not in NEEDS_A_GPU]
        if unexpected:
            return "FAIL", f"{text}; on the CPU only {', '.join(NEEDS_A_GPU)} may fail"
        return "INFO", f"{text} (CPU mode: those need a GPU; the GPU steps were not started)"
    return ("FAIL" if failed else "INFO" if not_run else "OK"), text


# --------------------------------------------------------------------------- the orphan


def step_orphan(work: Path, out: Path) -> tuple[str, str]:
    """Boot, then SIGKILL pytest, the launcher and the API server at once; the engine core stays."""
    import psutil

    family_file = work / "family.json"
    if os.environ.get("LENT_UNREAPED"):
        _never_reap_orphans()
    before_mib = _device_mib(work)
    log = (work / "orphan-pytest.txt").open("w")
    session = subprocess.Popen(_pytest(work, str(SUITE / "hold_server.py"), "-s"), cwd=SUITE, stdout=log,
                               stderr=subprocess.STDOUT, env={**_env(work), "LENT_FAMILY": str(family_file)})
    deadline = time.monotonic() + 300
    while not family_file.is_file() and session.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not family_file.is_file():
        session.kill()
        session.wait()
        return "FAIL", f"the holding session never booted (exit {session.returncode}); see orphan-pytest.txt"
    family = json.loads(family_file.read_text())
    if os.environ.get("LENT_SIMULATED_GPU"):
        _simulated_engine_memory(family["engine"])
    engines = [psutil.Process(pid) for pid in family["engine"]]
    held_before = _held(work, family["engine"], before_mib)
    for pid in (family["launcher"], family["server"], family["pytest"]):  # the launcher first: it must not clean up
        os.kill(pid, signal.SIGKILL)
    session.wait()
    log.close()
    time.sleep(2.0)
    alive = [p.pid for p in engines if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    held = _held(work, alive, before_mib)
    (work / "orphan.json").write_text(json.dumps({"engine": alive, "held_mib": held.mib, "accounting": held.how,
                                                  "family": family}))
    killed = (family["launcher"], family["server"])
    gone = [pid for pid in killed if is_gone(pid)]
    unreaped = sum(psutil.pid_exists(pid) for pid in gone)
    memory = (f"holding {held.mib} MiB ({held.said}; {held_before.mib} MiB before the kill)" if _reads_gpu_memory(work)
              else "GPU memory not checked (CPU mode)")
    text = (f"pytest {family['pytest']}, launcher {family['launcher']} and API server {family['server']} SIGKILLed "
            f"({len(gone)} of 2 gone{f', {unreaped} of them zombies nobody reaped' if unreaped else ''}); engine core "
            f"{alive or family['engine']} {'left running' if alive else 'GONE'}, {memory}")
    ok = alive and len(gone) == 2 and (not _reads_gpu_memory(work) or held.mib > 0)
    return ("OK" if ok else "FAIL"), text


def is_gone(pid: int) -> bool:
    """Whether ``pid`` has ended: not there, or a zombie (ended, its exit status not yet collected,
    which psutil.pid_exists still counts: a container's init may never collect it)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _never_reap_orphans() -> None:
    # PR_SET_CHILD_SUBREAPER (prctl(2)): the killed session's processes are reparented to this
    # step, which never waits for them, as under an init that does not reap.
    import ctypes

    pr_set_child_subreaper = 36
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) refused")


# What the dry run's orphan holds on the simulated GPU: far past the plugin's tolerance.
SIMULATED_ENGINE_MIB = 4096


def _simulated_engine_memory(engine_pids: Sequence[int]) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "fakes"))
    from simgpu import state  # type: ignore[import-not-found]

    for pid in engine_pids:
        state.hold({0: SIMULATED_ENGINE_MIB}, pid=pid, directory=os.environ["LENT_SIMULATED_GPU"])


@dataclass(frozen=True)
class OrphanMemory:
    """The GPU memory the orphan holds, and how it was read: ``pid`` (NVML names its processes here)
    or ``device`` (each GPU's use against its figure before the orphan's boot)."""

    mib: int
    how: str
    said: str


def account_orphan_memory(engine_pids: Sequence[int], holders: GpuHolders, before_mib: Mapping[int, int],
                          now_mib: Mapping[int, int]) -> OrphanMemory:
    """What the orphan's engine core holds: by its pids where NVML names them here with a figure;
    where NVML names none of them (gVisor: its pids are another namespace's, or it lists no process
    at all) or names them without a figure (NVML_VALUE_NOT_AVAILABLE), by device-level accounting,
    as the plugin's own waits do (server/gpu_memory.py): what the GPUs use above their figure
    before the boot, past the driver's own drift."""
    named = {pid: mib for pid, mib in holders.by_pid().items() if pid in engine_pids}
    known = {pid: mib for pid, mib in named.items() if mib is not None}
    if named and len(known) == len(named):
        return OrphanMemory(sum(known.values()), "pid", f"NVML names {', '.join(f'pid {p}' for p in sorted(named))}")
    grown = sum(max(0, now_mib[i] - before_mib[i]) for i in now_mib.keys() & before_mib.keys())
    if named:
        why = f"NVML names {', '.join(f'pid {p}' for p in sorted(named))} without a figure for its memory"
    else:
        unnamed = sum(holder.pid is None for holder in holders.holders)
        why = (f"NVML names none of its pids here (NVML lists {len(holders.holders)} process(es), {unnamed} of "
               "another pid namespace)")
    return OrphanMemory(grown if grown > DEVICE_TOLERANCE_MIB else 0, "device",
                        f"{why}: device-level, +{grown} MiB since before its boot")


def _device_mib(work: Path) -> dict[int, int]:
    if not _reads_gpu_memory(work):
        return {}
    from pytest_kimiperf.server.gpu_memory import gpu_memory_used_mib

    return gpu_memory_used_mib()


def _held(work: Path, pids: Sequence[int], before_mib: Mapping[int, int]) -> OrphanMemory:
    if not _reads_gpu_memory(work):
        return OrphanMemory(0, "none", "CPU mode")
    from pytest_kimiperf.server.gpu_memory import gpu_holders

    return account_orphan_memory(pids, gpu_holders(), before_mib, _device_mib(work))


# --------------------------------------------------------------------------- end to end


def step_e2e(work: Path, out: Path) -> tuple[str, str]:
    """The plugin on the deployment: two profiles, two boots each, reports and plots."""
    args = ["--kimiperf-profile", ",".join(PROFILES), "--kimiperf-boots", str(BOOTS), "--kimiperf-max-boots",
            str(BOOTS), "--kimiperf-json", str(out / "report.json"), "--kimiperf-markdown", str(out / "report.md"),
            "-p", "no:randomly", str(SUITE / "test_lent.py")]
    if _version("matplotlib"):
        args[-1:-1] = ["--kimiperf-plots", str(work / "plots")]
    log = work / "e2e-pytest.txt"
    with log.open("w") as sink:
        code = subprocess.run(_pytest(work, *args), cwd=SUITE, stdout=sink, stderr=subprocess.STDOUT, env=_env(work),
                              check=False).returncode
    (work / "e2e.exit").write_text(f"{code}\n")
    summary = next((line for line in reversed(log.read_text().splitlines()) if line.startswith("=")), "no summary")
    try:
        report: dict[str, Any] | None = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        report = None
    return judge_e2e(code, summary.strip("= "), report, expected=len(PROFILES) * BOOTS * TESTS_A_BOOT)


# The suite's tests (lent_tests/test_lent.py), each measured once a boot.
TESTS_A_BOOT = 2
# All passed, some test failed, every failure INVALID (the plugin's own code); the rest
# (interrupted, internal error, usage error, nothing collected, every failure UNRESOLVED: a verdict
# the run could not reach) mean the flow did not run to its end as it should.
_RAN_TO_ITS_END = (EXIT_OK, EXIT_TESTS_FAILED, INVALID_ONLY_EXIT)


def judge_e2e(code: int, summary: str, report: Mapping[str, Any] | None, *, expected: int) -> tuple[str, str]:
    """The end-to-end step's verdict: OK where pytest ran to its end, the report holds ``expected``
    windows, and each was measured or INVALID with its cause, every failed test being one of
    those; FAIL naming what else happened (a test that failed for another reason, a window
    without a figure or a cause, no report)."""
    said = f"pytest exit {code}: {summary}"
    if code not in _RAN_TO_ITS_END:
        return "FAIL", f"{said} (the run did not reach its end)"
    if report is None:
        return "FAIL", f"{said}; no report.json"
    tests = report.get("tests") or []
    invalid = [t for t in tests if t.get("invalid")]
    measured = [t for t in tests if t.get("run") and not t.get("invalid")]
    problems = [f"{_window(t)}: INVALID without a cause ({t['invalid']})" for t in invalid if not t.get("invalid_cause")]
    problems += [f"{_window(t)}: failed: {'; '.join(t['failures'])[:200]}" for t in measured if t.get("failures")]
    problems += [f"{_window(t)}: neither measured nor INVALID" for t in tests if t not in invalid and t not in measured]
    if len(tests) != expected:
        problems.append(f"{len(tests)} windows in report.json, not {expected}")
    if code != EXIT_OK and not invalid:
        problems.append("a test failed but no window is INVALID: see e2e-pytest.txt")
    account = f"{len(measured)} of {len(tests)} windows measured, {len(invalid)} INVALID"
    return ("FAIL" if problems else "OK"), f"{said}; {account}" + (f"; {'; '.join(problems)}" if problems else "")


def _window(test: Mapping[str, Any]) -> str:
    return f"{str(test.get('test', '?')).split('::')[-1]}[{test.get('profile')}]"


def step_report(work: Path, out: Path) -> tuple[str, str]:
    """What the end-to-end run and its report show."""
    import psutil

    output = (work / "e2e-pytest.txt").read_text() if (work / "e2e-pytest.txt").is_file() else ""
    orphan = json.loads((work / "orphan.json").read_text()) if (work / "orphan.json").is_file() else {}
    facts, problems = [], []
    swept = [line for line in output.splitlines() if "kimiperf: zombie sweep:" in line]
    for pid in orphan.get("engine", []):
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            problems.append(f"the orphan engine core {pid} still runs")
        elif not any(f"pid {pid} " in line for line in swept):
            problems.append(f"the orphan engine core {pid} is gone but no sweep line names it")
    # Per pid ("which held N MiB of GPU memory") or, where NVML names no process here, per device
    # ("N MiB of GPU memory came back"): the sweep says one or the other (server/zombies.py).
    # Or, where NVML named it without a figure, "which held an unknown amount of GPU memory".
    freed = [line.split("zombie sweep: ", 1)[1] for line in swept if " of GPU memory" in line]
    facts.append(f"swept: {len(swept)} line(s)" + (f", {'; '.join(freed)}" if freed else ""))
    if _reads_gpu_memory(work) and orphan.get("held_mib") and not freed:
        problems.append(f"the orphan held {orphan['held_mib']} MiB ({orphan.get('accounting')} accounting) but the "
                        "sweep did not say what GPU memory it freed")
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError) as error:
        return "FAIL", f"no report.json ({type(error).__name__}); {'; '.join(problems + facts)}"
    boots = {name: p["boots"] for name, p in report["profiles"].items()}
    if boots != {name: BOOTS for name in PROFILES}:
        problems.append(f"boots {boots}, not {BOOTS} of each of {', '.join(PROFILES)}")
    accounts = [a for p in report["profiles"].values() for a in p["boot_accounts"]]
    ready = sorted(round(a["total_s"], 1) for a in accounts)
    facts.append(f"{len(accounts)} boots accounted, ready after {ready} s")
    tests = report["tests"]
    measured = [t for t in tests if t.get("run") and not t.get("invalid")]
    invalid = [t for t in tests if t.get("invalid")]
    # An INVALID window is a finding of the device: said with its cause, never a failure here.
    facts.append(f"{len(measured)} of {len(tests)} test results measured" + (
        f", {len(invalid)} INVALID: " + "; ".join(f"{_window(t)} ({t.get('invalid_cause') or 'no cause given'}): "
                                                 f"{t['invalid']}" for t in invalid) if invalid else ""))
    if causeless := [_window(t) for t in invalid if not t.get("invalid_cause")]:
        problems.append(f"INVALID without a cause: {', '.join(causeless)}")
    decode = decode_medians(measured)
    facts.append(f"decode medians {[round(d) for d in decode]} tok/s" if decode else "no decode median")
    if len(measured) + len(invalid) != len(PROFILES) * BOOTS * TESTS_A_BOOT:
        problems.append(f"{len(measured)} measured and {len(invalid)} INVALID results, not "
                        f"{len(PROFILES) * BOOTS * TESTS_A_BOOT}")
    if _mode(work) == "gpu":
        gpus = [g for t in measured for g in (t.get("host") or {}).get("gpus", [])]
        watched = [t for t in measured if (t.get("host") or {}).get("gpus")]
        facts.append(f"NVML telemetry in {len(watched)} of {len(measured)} windows: {_telemetry(gpus)}")
        if len(watched) != len(measured):
            problems.append("a measured window without NVML telemetry")
    else:
        facts.append("NVML telemetry: not checked (CPU mode)")
    plots = sorted((work / "plots").glob("**/*.png")) if (work / "plots").is_dir() else []
    facts.append(f"{len(plots)} plots" if plots else "no plots" + ("" if _version("matplotlib") else " (no matplotlib)"))
    if _version("matplotlib") and not plots:
        problems.append("matplotlib is here but no plot was written")
    return ("FAIL" if problems else "OK"), "; ".join(problems + facts)


def decode_medians(tests: Sequence[Mapping[str, Any]]) -> list[float]:
    """The decode medians the report gives, lowest first; a window without one (none of its
    requests gave a decode figure: the median is null) is left out."""
    medians = (((t.get("metrics") or {}).get("decode_tok_s") or {}).get("summary", {}).get("median") for t in tests)
    return sorted(m for m in medians if m is not None)


def _telemetry(gpus: Sequence[dict[str, Any]]) -> str:
    if not gpus:
        return "none"
    keys = sorted({key for gpu in gpus for key, value in gpu.items() if value not in (None, [], {})})
    watts = [gpu["energy_j"] / gpu["wall_s"] for gpu in gpus if gpu.get("energy_j") and gpu.get("wall_s")]
    return f"{len(gpus)} readings with {', '.join(keys)[:200]}" + (
        f"; {min(watts):.0f}-{max(watts):.0f} W" if watts else "")


def step_cleanup(work: Path, out: Path) -> tuple[str, str]:
    """End what this run's launches left (an orphan no step swept, where a step was cut or not
    started), with the plugin's own sweep: a launch's processes must not outlive the command."""
    from pytest_kimiperf.server.zombies import sweep_stale_launches

    if not (work / "state").is_dir():
        return "INFO", "no launch records: nothing was started"
    lines = sweep_stale_launches(work / "state", grace_s=10.0).describe()
    return ("INFO" if not lines else "FAIL"), ("nothing left running" if not lines else
                                               f"ended what no step swept: {'; '.join(lines)}")


STEPS: dict[str, Callable[..., tuple[str, str]]] = {
    "preflight": step_preflight, "bare-check": step_bare_check, "orphan": step_orphan, "e2e": step_e2e,
    "report": step_report, "cleanup": step_cleanup,
}


def main(argv: Sequence[str]) -> int:
    """Run one step and print its line; a step that raises is that step's FAIL line, never silence."""
    name, work, out, *rest = argv
    if name not in STEPS:
        print(f"lent: FAIL {name}: no such step; steps: {', '.join(STEPS)}", flush=True)
        return 2
    try:
        verdict, text = STEPS[name](Path(work), Path(out), *rest)
    except Exception as error:  # noqa: BLE001  (one step's failure is its line)
        import traceback

        traceback.print_exc()
        verdict, text = "FAIL", f"{type(error).__name__}: {error}"[:300]
    print(f"lent: {verdict} {name}: {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
