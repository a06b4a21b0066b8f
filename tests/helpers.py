"""What the plugin's own tests share: paths, the test doubles' commands, stub deployments.

Plain functions and constants (fixtures live in conftest.py); tests import them as
``from tests.helpers import ...``.
"""

from __future__ import annotations

import json
import sys
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil

from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.measure.results import RunResult
from pytest_kimiperf.reports.sentences import say_run_invalid

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
FAKES = TESTS / "fakes"
PERF_TESTS = ROOT / "perf_tests"
BENCHMARKS = ROOT / "benchmarks"
STUB_SERVER = FAKES / "stub_vllm.py"
STUB_PRELOAD = FAKES / "stub_preload.py"

# A busy process of many threads that run outside the GIL (hashlib hashes a large buffer without
# it): the scheduler shares the CPU by thread, so such a process takes several times what a
# single-threaded one can and ranks among the host watch's busiest whatever else this host runs
# (a plain `while True: pass` was outranked by other load). Run as ``python -c BUSY <threads>``.
BUSY = """
import hashlib, sys, threading
block = bytes(1 << 20)
def spin():
    while True:
        hashlib.sha256(block).digest()
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=spin, daemon=True).start()
spin()
"""
PACED_SERVER = FAKES / "paced_server.py"
TLS_GATEWAY = FAKES / "tls_gateway.py"


def nvml_loads() -> bool:
    """Whether NVML answers on this host (then it is asked before any nvidia-smi)."""
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def running_stub(*args: str, model: str = "stub-model") -> Iterator[str]:
    """A bare stub server (tests/fakes/stub_vllm.py ``args``) serving ``model`` that answers
    /health; yields its URL and kills it after (for tests that need no plugin around it)."""
    import socket
    import subprocess
    import time

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    proc = subprocess.Popen([sys.executable, str(STUB_SERVER), "--model", model, "--port", str(port),
                             "--load-seconds", "0", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "stub did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        proc.kill()
        proc.wait()


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
    host_bounds: str = '{ max_foreign_cpu_share = "none", max_steal_share = "none" }',
    boot_spread: float = 0.06,
    session_spread: float | None = None,
    gpu_count: int = 0,
    extra_keys: str = "",
) -> str:
    """A ``[tool.kimiperf.deployments.<name>]`` table that boots tests/stub_vllm.py (on the
    simulated GPU, tests/fakes/simgpu, with ``gpu_count`` and --sim-gpu-mib in ``extra_args``)."""
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
        f"gpu_count = {gpu_count}\n"
        f"command = {json.dumps(command)}\n"
        f"health_deadline_s = {health_deadline_s}\n"
        f"decode_floor_tok_s = {floor}\n"
        f"decode_target_tok_s = {target}\n"
        # These runs test plumbing, not the client: its self-check (loop latency, send lag, CPU
        # share) reads this host's scheduling, so it is switched off here (TOML's inf: no figure
        # exceeds it). tests/plugin/test_invalid_exit.py makes a client-bound INVALID on demand
        # with a bound no process meets. So is the share of requests a window may lose a figure
        # to shared reads (1: any share): which chunks a loaded host reads together is its
        # scheduling too. A test that counts samples takes the count the run reports (its JSON's
        # run.measured), never the count it sent.
        f"client_bounds = {{ max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, "
        f"max_loop_latency_p99_ms = inf, max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }}\n"
        # The stub shares this host's two cores like tiny-cpu does: two runs of the identical
        # stub differ by ~6% in decode and throughput, and its p99 ITL (a tail of 2 ms gaps,
        # host jitter) read +23% and +43% in two A/A sessions of test_perf_suite, so the metrics'
        # GPU defaults of 3-10% give false regressions. Every metric gets tiny-cpu's 25%.
        f"tolerances = {{ {', '.join(f'{m} = 0.25' for m in METRICS)} }}\n"
        # Plumbing runs are not about the host: other tests (xdist workers, the outer pytest)
        # share it. The host-watch tests pass their own bounds.
        f"host_bounds = {host_bounds}\n"
        f"boot_spread = {boot_spread}\n"
        + (f"session_spread = {session_spread}\n" if session_spread is not None else "")
        + extra_keys
    )


def said(run: RunResult) -> str:
    """Why ``run`` cannot be trusted, as the report words it (measure/ keeps the facts)."""
    assert run.invalid is not None, "the run is valid"
    return say_run_invalid(run.invalid)


def measured_count(run: Mapping[str, Any], figure: str) -> int:
    """How many requests of a measured window gave ``figure``, as the run reports it (a JSON
    report test's ``run``), once every request it sent is accounted for: measured, or withheld
    with a reason. A test that counts samples of a real client's run asserts this count, never
    the count it sent: which requests keep a figure is the host's scheduling (issue 64)."""
    count = run["measured"]["figures"][figure]
    assert count["sent"] == run["completed"] + run["failed"], (figure, count, run["completed"], run["failed"])
    assert count["measured"] + sum(count["withheld"].values()) == count["sent"], (figure, count)
    return int(count["measured"])


def counted_boots(report: Mapping[str, Any], profile: str, figure: str = "decode_tok_s") -> int:
    """How many boots of ``profile`` a comparison of ``figure`` can rest on, as the JSON report
    says: valid boots whose run measured at least a boot's minimum of it (MIN_SAMPLES_PER_BOOT).
    How many a loaded host leaves is its own; that the comparison rests on exactly these is the
    product's."""
    from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT

    return sum(1 for t in report["tests"] if t["profile"] == profile and not t["invalid"] and figure in t["metrics"]
               and measured_count(t["run"], figure) >= MIN_SAMPLES_PER_BOOT)


def decode_lost(report: Mapping[str, Any]) -> list[str]:
    """The node ids of a JSON report's perf tests that check decode and whose window measured no
    decode figure: every stream came in bursts or with its first chunk in a shared read, as a
    client the scheduler held off reads them (a loaded host did it to all 5 streams of a window
    at 10 ms a token). Such a test has no decode median, and a floor fails it saying so; its
    outcome is the host's, so a plumbing test expects it from the count the run reports."""
    return [t["nodeid"] for t in report["tests"]
            if "decode_tok_s" in t["metrics"] and measured_count(t["run"], "decode_tok_s") == 0]


def expect_outcomes_with_decode_lost(result: Any, report: Mapping[str, Any], passed: int) -> list[str]:
    """Assert a pytester ``result``'s outcomes: ``passed`` tests pass but the floor-checked perf
    tests that measured no decode figure (:func:`decode_lost`), which fail saying so. Returns
    their node ids."""
    lost = decode_lost(report)
    result.assert_outcomes(passed=passed - len(lost), failed=len(lost))
    for nodeid in lost:
        # The failure's own section: the short summary cuts its message to the terminal's width.
        name = nodeid.split("::")[-1].replace("[", "[[]")
        result.stdout.fnmatch_lines([f"*_ {name} _*", "single-stream decode: none of the * requests sent gave a decode "
                                     "figure (*)",
                                     f"FAILED {nodeid.replace('[', '[[]')}*"])
    return lost


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie awaiting its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


RESTART_SCRIPT = FAKES / "restart_server.py"


class RestartableServer:
    """A server started as ``systemctl`` would start a service, and its ``restart_command``:
    tests/fakes/restart_server.py with a pidfile. ``start()`` waits until ``model`` is served;
    ``stop()`` kills whatever process the pidfile names last (a restart replaces it)."""

    def __init__(self, argv: list[str], port: int, directory: Path, *, model: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.model = model
        self.pidfile = directory / "server.pid"
        self.log = directory / "server.log"
        self.restart_command = [sys.executable, str(RESTART_SCRIPT), "--pidfile", str(self.pidfile),
                                "--log", str(self.log), "--", *argv]

    def pid(self) -> int:
        return int(self.pidfile.read_text())

    def start(self, deadline_s: float = 30.0) -> None:
        import subprocess
        import time

        import httpx

        subprocess.run(self.restart_command, check=True, timeout=60)
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                answer = httpx.get(self.url + "/v1/models", timeout=1.0)
                if answer.status_code == 200 and self.model in answer.text:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the server did not serve {self.model} within {deadline_s:g} s: " \
                                                f"{self.log.read_text()[-2000:] if self.log.exists() else 'no log'}"
            time.sleep(0.2)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace_s`` (as the script does)."""
        import importlib.util

        if not self.pidfile.exists():
            return
        spec = importlib.util.spec_from_file_location("restart_server", RESTART_SCRIPT)
        assert spec is not None and spec.loader is not None
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        script.stop(self.pid(), grace_s)


def run_checked(argv: list[str], cwd: Path, timeout: float = 300,
                *, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as a user's shell would, with nothing of this checkout or of the test run in
    its environment (only PATH and HOME); its exit status must be one of ``ok``."""
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                            env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert result.returncode in ok, f"{argv}: exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-3000:]}"
    return result


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def percent_after(text: str, prefix: str) -> float:
    """The signed percentage that follows ``prefix`` in a run's output (the first one), as a float.

    The stub paces its tokens on a set schedule (a late wake-up delays one token, never the
    pace), so a stub slowed 5x reads -80% within a few points on any host that keeps up; tests
    bound the figure around the change as set, never match one digit of it.
    """
    import re

    found = re.search(re.escape(prefix) + r"\s*([+-]\d+(?:\.\d+)?)%", " ".join(text.split()))
    assert found, f"no percentage after {prefix!r} in the output"
    return float(found.group(1))


def quota_cgroup(quota_us: int, period_us: int = 100_000) -> tuple[Path, str] | str:
    """A new cgroup of this host's cpu controller, beside the caller's, that holds ``quota_us``
    of CPU per ``period_us``: its folder and its path in the hierarchy; else why none can be
    made here (a string: the caller skips with it). :func:`remove_cgroup` takes it away."""
    import os

    from pytest_kimiperf.measure.cgroup_quota import process_cgroup_dirs

    levels = process_cgroup_dirs()
    if not levels:
        return "no cpu cgroup controller is mounted here"
    mine = levels[0]
    name = f"kimiperf-test-{os.getpid()}-{quota_us}"
    folder = Path(mine.folder).parent / name if mine.name != "/" else Path(mine.folder) / name
    path = str(Path(mine.name).parent / name) if mine.name != "/" else f"/{name}"
    try:
        if mine.version == 2:
            # v2 lets a cgroup with processes hand the cpu controller to children only at the root.
            if mine.name != "/":
                return f"cgroup v2 here ({mine.name}) cannot give a new child the cpu controller beside this process"
            (Path(mine.folder) / "cgroup.subtree_control").write_text("+cpu")
        folder.mkdir()
        if mine.version == 1:
            (folder / "cpu.cfs_period_us").write_text(str(period_us))
            (folder / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            (folder / "cpu.max").write_text(f"{quota_us} {period_us}")
    except OSError as error:
        with_cleanup = folder.is_dir()
        if with_cleanup:
            folder.rmdir()
        return f"cannot make a cgroup with a CPU quota at {folder}: {error}"
    return folder, path


def remove_cgroup(folder: Path) -> None:
    """Kill what is left in a cgroup :func:`quota_cgroup` made, then remove it."""
    import time

    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            psutil.Process(int(pid)).kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + 10
    while True:
        try:
            folder.rmdir()
            return
        except OSError:  # EBUSY until the killed processes have left it
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
