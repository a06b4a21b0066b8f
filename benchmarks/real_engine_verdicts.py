"""What the real CPU engine says of the verdicts: statistics on this host's noise, so a
benchmark, not a test of `make test` (tests/real_engine asserts the same runs' plumbing).

Each check boots tiny-cpu several times (about 25 boots in all, 20-40 minutes on the hosts of
this family) and prints its figures; its assertions are the claims the numbers must support:

- three profiles, two boots each, interleaved: ring-ll (an A/A: NCCL cannot act on the CPU
  engine) gets no direction, and --enforce-eager (a really slower engine) is never "better";
- a recorded baseline, the identical server (never a regression), then the server throttled to
  a tenth of its CPU time (a REGRESSION on two boots, and nothing appended);
- two busy-looping processes a core during one profile's boot: that profile is INVALID naming
  them, the run exits 75, and no direction is claimed;
- the identical server as its own --kimiperf-control (no direction), and the compile cache (the
  first boot compiles from scratch, the three after it reuse what it wrote).

Run: .venv/bin/python -m pytest -p tests.conftest benchmarks/real_engine_verdicts.py -s -p no:randomly
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS

from tests.real_engine.conftest import no_servers_before_and_after, vllm_processes  # noqa: F401 - a fixture
from tests.real_engine.test_profiles_cpu import PROFILES




def ready_servers(state_dir: Path, known: dict[int, str], timeout_s: float = 1.0) -> dict[int, str]:
    """{pgid: profile} of the plugin's servers in ``state_dir`` that answer /health: a load the
    test puts on a server starts after its boot, or it would slow the boot (four boots of
    tiny-cpu throttled to a quarter took 4 minutes more), not the measurement. ``known``: the
    ones found ready before (a ready server stays so)."""
    ready = dict(known)
    for path in state_dir.glob("*.json"):
        try:
            record = json.loads(path.read_text())
            pgid, profile, argv = int(record["pgid"]), str(record["profile"]), list(record["cmdline"])
            port = int(argv[argv.index("--port") + 1])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
        if pgid in ready:
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as answer:
                if answer.status == 200:
                    ready[pgid] = profile
        except (OSError, http.client.HTTPException):
            continue
    return ready


PROFILES_PROJECT = """
[tool.kimiperf.profiles.eager]
description = "no torch.compile: vLLM runs the model eagerly"
args = ["--enforce-eager"]
"""

# The perf tests are the real-engine tier's own; this run adds the second boot a verdict needs.



def test_profiles_under_xdist_boot_interleaved_see_their_env_and_args_and_only_the_real_change_is_judged(
    pytester: pytest.Pytester, no_servers_before_and_after, tmp_path: Path
) -> None:
    pytester.makefile(".toml", pyproject=PROFILES_PROJECT)
    pytester.makepyfile(test_e2e=PROFILES)
    report = tmp_path / "report.json"
    # Under xdist (-n 2): the plugin's scheduler gives every perf test of every boot to one
    # worker; the JSON report, written by the controller, says what the workers did. Two boots
    # per profile, interleaved. On the CPU engine NCCL variables cannot act (gloo): ring-ll is
    # an A/A case, so any "better" or "worse" would be false. --enforce-eager turns off vLLM's
    # torch.compile (Inductor), which changes how fast a token is decoded: the positive
    # control `make perf` lacks, a real difference between two servers.
    result = pytester.runpytest_subprocess(
        "-n", "2", "--deployment", "tiny-cpu", "--nccl-profile", "default,ring-ll,eager", "--kimiperf-boots", "2",
        "--kimiperf-json", str(report), "-p", "no:randomly", "-v", timeout=1500,  # -v: each boot's row
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines([
        "kimiperf: profile eager: args --enforce-eager (checked against vLLM *'s serve parser)"])
    data = json.loads(report.read_text())
    assert {name: p["boots"] for name, p in data["profiles"].items()} == {"default": 2, "ring-ll": 2, "eager": 2}
    starts = [line.split("for profile ")[1].split()[0] for line in result.outlines
              if "starting tiny-cpu server for profile" in line]
    assert starts == ["default", "ring-ll", "eager", "eager", "ring-ll", "default"], starts
    assert data["profiles"]["eager"]["profile_args"] == ["--enforce-eager"]
    assert data["profiles"]["default"]["profile_args"] == data["profiles"]["ring-ll"]["profile_args"] == []
    # The argument reached vLLM and changed what it did: every compiled boot has a compile phase
    # (torch.compile on the CPU, from its cache or not), no eager boot has one.
    compiles = {name: ["compiling" in [ph["phase"] for ph in a["phases"]] for a in p["boot_accounts"]]
                for name, p in data["profiles"].items()}
    assert compiles == {"default": [True, True], "ring-ll": [True, True], "eager": [False, False]}, compiles
    decode = [t for t in data["tests"] if t["test"].endswith("test_single_stream_decode")]
    assert sorted((t["profile"], t["profile_args"]) for t in decode) == [
        ("default", []), ("default", []), ("eager", ["--enforce-eager"]), ("eager", ["--enforce-eager"]),
        ("ring-ll", []), ("ring-ll", [])]
    for test in decode:
        assert test["metrics"]["decode_tok_s"]["summary"]["n"] == 8
        assert test["metrics"]["decode_tok_s"]["summary"]["median"] > 0
    compared = {c["profile"]: c for c in data["profile_comparisons"] if c["unit"] == "tok/s"}  # "metric" holds its label
    assert set(compared) == {"ring-ll", "eager"}, compared
    assert all(c["boots_current"] == 2 and c["boots_reference"] == 2 for c in compared.values())
    assert compared["ring-ll"]["verdict"] not in ("regression", "improvement"), compared["ring-ll"]["message"]
    # What the gate concluded of eager, printed for CI's log. Measured on a quiet host, 3 boots
    # each (closing note of issue 24): eager decodes 883-911 tok/s per boot against default's
    # 1094-1195, -22.8% (90% CI -35.1..-8.2%), "changed, size unresolved": beyond the 18% boot
    # spread tiny-cpu declares but inside its 25% tolerance, so two boots a side cannot convict
    # it. What they must never do is call the slower engine better, or give no verdict at all.
    eager = compared["eager"]
    print(f"enforce-eager vs default: decode change {eager['change']:+.1%}, verdict {eager['verdict']!r}: "
          f"{eager['message']}")
    assert math.isfinite(eager["change"]), eager["message"]
    assert eager["verdict"] not in ("improvement", "not comparable", "insufficient samples", "not judged"), \
        eager["message"]
    # The worker's boot progress reached the controller's output, and the summary put the
    # profiles side by side with a verdict.
    result.stdout.fnmatch_lines([
        "[[]gw?[]] kimiperf [[]default[]] loading weights*elapsed",
        "[[]gw?[]] kimiperf: tiny-cpu server (default) ready after *s",
        "[[]gw?[]] kimiperf: tiny-cpu server (ring-ll) ready after *s",
    ])
    result.stdout.fnmatch_lines(["*kimiperf: profiles vs default*", "*test_e2e.py::test_single_stream_decode*"])
    result.stdout.re_match_lines([
        r"\s+decode tok/s\s+default\s+[\d.]+\s+[\d.]+-[\d.]+\s+reference",
        r"\s+ring-ll boot 2\s+[\d.]+\s+[\d.]+-[\d.]+\s+[+-][\d.]+%\s+[+-][\d.]+\.\.[+-][\d.]+%\s+"
        r"(within tolerance|no detectable change|changed, size unresolved|inconclusive)",
    ])


GATE = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=30, warmup_requests=3)

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"])
"""


class ServerThrottle:
    """Freezes the booted server's process group 51 ms of every 60: a really slower server.

    Busy processes beside the server barely slow it (measured: two per core cost nothing,
    four per core 11%): the scheduler favours the server's processes, which mostly wait. A
    SIGSTOP/SIGCONT duty cycle takes the time away whatever the server does, like a CPU quota.
    Measured on a quiet host, 30 requests of 64 tokens in one boot: running 12 ms of every 60
    cut tiny-cpu's decode 6-10x, 6 ms of every 60 15-21x (and the measurement from 5 s to 80 s).
    The gate convicts across sessions on tiny-cpu (18% boot and 20% session spreads declared,
    2 boots against 1) from about -66% (stats.GATE_CRITICAL), and the baseline's one boot may
    have landed in the slow spawn mode (half speed): the cut must hold beyond about 6x. A
    SIGSTOP sent late (the thread woke late) lets the server run longer, so the next stop is
    stretched to keep its running share at the target; ``running_share`` says what it was, and
    only a process group that exists counts as throttled. The server is found from the plugin's
    own launch records in the test's state directory, and throttled once it is ready
    (ready_servers).
    """

    def __init__(self, state_dir: Path, stopped_s: float = 0.051, running_s: float = 0.009) -> None:
        self._state_dir = state_dir
        self._stopped_s, self._running_s = stopped_s, running_s
        self._done = threading.Event()
        self._ready: dict[int, str] = {}
        self._t0 = time.monotonic()
        self.cycles = 0
        self.throttled_s = 0.0  # wall time with a server under the duty cycle
        self.running_s = 0.0    # of which the server was let run
        self.throttled_by_pgid: dict[int, float] = {}  # the groups it throttled, and for how long
        # What the thread saw, for the premise's message: when it found each server ready,
        # and any error it survived (a thread that died would leave later boots unthrottled).
        self.events: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def running_share(self) -> float:
        """The share of the throttled time the server ran (the target: 9 of 60 ms)."""
        return self.running_s / self.throttled_s if self.throttled_s else math.nan

    def __enter__(self) -> ServerThrottle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _event(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self._t0:.2f}s {what}")

    def _pgids(self) -> list[int]:
        # Only the launches still recorded: a stopped boot's record is gone, its pgid with it.
        live = self._live()
        ready = {pgid: profile for pgid, profile in ready_servers(self._state_dir, self._ready, timeout_s=0.25).items()
                 if pgid in live}
        for pgid in ready.keys() - self._ready.keys():
            self._event(f"server {ready[pgid]} (pgid {pgid}) ready")
        self._ready = ready
        return list(self._ready)

    def _live(self) -> set[int]:
        live = set()
        for path in self._state_dir.glob("*.json"):
            try:
                live.add(int(json.loads(path.read_text())["pgid"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return live

    def _signal(self, pgids: list[int], signum: int) -> list[int]:
        """The process groups that got the signal (a stopped server's group is gone)."""
        signalled = []
        for pgid in pgids:
            try:
                os.killpg(pgid, signum)
                signalled.append(pgid)
            except ProcessLookupError:
                pass
        return signalled

    def _run(self) -> None:
        # Real-time, above the server and its measuring client: a throttle that waits for the CPU
        # sends its SIGSTOPs late and the server runs unthrottled (seen once in CI, when the
        # client itself ran at SCHED_FIFO).
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(20))
        except (AttributeError, OSError):
            pass
        share = self._running_s / (self._running_s + self._stopped_s)
        pgids: list[int] = []
        resumed: float | None = None  # when the server was last let run
        while not self._done.is_set():
            try:
                if not pgids or self.cycles % 8 == 0:
                    # Re-read: a boot on demand starts a new server in a new process group.
                    pgids = self._pgids()
                    if not pgids:
                        resumed = None
                        time.sleep(0.02)
                        continue
                stopped_groups = self._signal(pgids, signal.SIGSTOP)
                if not stopped_groups:  # the server stopped; its record goes next
                    pgids, resumed = [], None
                    continue
                stopped = time.monotonic()
                ran_s = stopped - resumed if resumed is not None else 0.0
                time.sleep(max(self._stopped_s, ran_s * (1 - share) / share))
                self._signal(pgids, signal.SIGCONT)
                span = ran_s + time.monotonic() - stopped
                self.running_s += ran_s
                self.throttled_s += span
                for pgid in stopped_groups:
                    self.throttled_by_pgid[pgid] = self.throttled_by_pgid.get(pgid, 0.0) + span
                self.cycles += 1
                resumed = time.monotonic()
                time.sleep(self._running_s)
            except Exception as exc:  # noqa: BLE001 - survive it, never leave a server stopped, say so
                self._event(f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(Exception):
                    self._signal(pgids, signal.SIGCONT)
                pgids, resumed = [], None
                time.sleep(0.05)
        if resumed is not None:
            self.running_s += time.monotonic() - resumed
            self.throttled_s += time.monotonic() - resumed


def test_baseline_then_the_identical_server_passes_then_a_slowed_one_is_a_regression_on_two_boots(
    pytester: pytest.Pytester, isolated_state: Path, no_servers_before_and_after, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_gate=GATE)
    args = ("--deployment", "tiny-cpu", "-p", "no:cacheprovider")

    recorded = pytester.runpytest_subprocess(*args, "--update-baselines", timeout=900)
    recorded.assert_outcomes(passed=1)
    # The weight cache cannot serve a CPU engine: no daemons, and the engine loads from disk.
    recorded.stdout.fnmatch_lines(["kimiperf: weight cache: off (CPU engine: *UnsupportedPlatformForIPCError*; loading from disk)"])
    [log] = (pytester.path / "runpytest-0" / "kimiperf").glob("server-tiny-cpu-default*.log")
    assert "ipc_cache" not in log.read_text()
    files = list((pytester.path / "baselines" / "tiny-cpu").glob("*.json"))
    assert len(files) == 1
    entry = json.loads(files[0].read_text())["entries"]["test_gate.py::test_single_stream_decode|default|decode_tok_s"]
    assert entry["n"] == 30

    assert len(entry["boots"]) == 1
    # The boot carries where it ran: the session, the host and the host's canary (judge/noise.py).
    origin = entry["boots"][0]["origin"]
    assert len(origin["session"]) == 12 and len(origin["host"]) == 16
    assert origin["canary"]["python_mops"] > 0 and origin["canary"]["copy_gbs"] > 0

    same = pytester.runpytest_subprocess(*args, "--kimiperf-json", "same.json", timeout=900)
    # The identical server: passes. One boot, or two when the first happened to look worse than
    # the tolerance (the tiny-cpu boots of one quiet hour ranged 517-779 tok/s).
    assert same.ret == pytest.ExitCode.OK, same.stdout.str()[-4000:]
    assert same.parseoutcomes().get("passed") in (1, 2) and not same.parseoutcomes().get("failed")
    # An A/A comparison: never a regression, never an improvement. Against a one-boot baseline
    # a boot 28% off is within the boot-to-boot noise of this host, so "inconclusive" is an
    # honest answer too, provided it says what it rests on and how to resolve it; so is
    # "changed, size unresolved" (two boots of one server differ; a 90% interval excludes zero
    # for one A/A pair in ten).
    out = same.stdout.str()
    verdicts = re.findall(r"^\s+decode tok/s\s.*?\s(regression|improvement|within tolerance|no detectable change"
                          r"|changed, size unresolved|inconclusive|not comparable)\s*$", out, re.MULTILINE | re.IGNORECASE)
    honest = {"within tolerance", "no detectable change", "changed, size unresolved", "inconclusive"}
    if "host differs (canary" in out:
        honest.add("not comparable")  # the host itself moved since the recording: reported only
    assert verdicts and set(verdicts) <= honest, out[-4000:]
    if {"inconclusive", "changed, size unresolved"} & set(verdicts):
        # It names its boots and what would resolve it: across sessions (tiny-cpu declares a 20%
        # session spread) that is sessions of the profile and of its baseline, not more boots.
        assert "vs 1 reference boot of 1 session" in out, out[-4000:]
        assert "sessions of this profile" in out or "--kimiperf-update-baselines --kimiperf-boots N" in out, out[-4000:]
    assert "REGRESSION" not in out
    # Another session than the baseline's: the verdict carries the session level it rests on.
    judged = [t["metrics"]["decode_tok_s"]["baseline"] for t in
              json.loads((pytester.path / "same.json").read_text())["tests"]]
    assert judged and all(b["levels"][0]["name"] == "session" for b in judged), judged
    assert all("vs 1 reference boot of 1 session; boot spread" in b["message"] for b in judged), judged

    # A really slower server: its first boot looks worse and asks for a second (one boot can
    # screen, never convict); the second boot's item gives the verdict on both boots.
    # It runs as a scheduled job on main that appends a passing run's boots: failing, it appends nothing.
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_REF_NAME", "main")

    recorded_decode = entry["boots"][0]["median"]
    history = files[0].read_bytes()

    def run_slowed() -> tuple[pytest.RunResult, list[dict], str | None]:
        """The run, its JSON report's tests, and why its premise failed (None: it held)."""
        with ServerThrottle(isolated_state) as throttle:
            result = pytester.runpytest_subprocess(*args, "--kimiperf-append-on-pass", "main",
                                                   "--kimiperf-json", "slowed.json", timeout=1200)
        # The premise, checked: the server ran about a tenth of the time, for longer than one
        # boot's measurement takes unthrottled (30 requests of 64 tokens: 3-15 s on these hosts).
        assert throttle.throttled_s > 30 and throttle.running_share < 0.2, \
            (throttle.throttled_s, throttle.running_share, throttle.throttled_by_pgid, throttle.events)
        # ... and every boot was slowed while it measured: a boot the throttle found late ran at
        # full speed (seen in one CI run: 39.6 then 776 tok/s against a recording of 1093), and
        # two boots that far apart are a spread, not a verdict. The gate convicts on 2 boots
        # against 1 from about a third of the recording (the class's docstring), and two slowed
        # boots that disagree widen the spread it judges by: a fifth leaves a margin, and the
        # throttle cuts 6-27x when it holds.
        tests = json.loads((pytester.path / "slowed.json").read_text())["tests"]
        boots = {t["boot"]: t["metrics"]["decode_tok_s"]["summary"]["median"] for t in tests}
        print(f"slowed run: decode per boot {boots} tok/s against {recorded_decode:.1f} recorded; "
              f"throttled {throttle.throttled_s:.0f} s ({throttle.running_share:.1%} running) "
              f"over groups {throttle.throttled_by_pgid}; {throttle.events}")
        unslowed = {b: m for b, m in boots.items() if not (m is not None and m < recorded_decode / 5)}
        return result, tests, (f"boots {unslowed} ran above a fifth of the recorded {recorded_decode:.1f} tok/s; "
                        f"the throttle saw {throttle.events}") if unslowed else None

    retried = []
    for _ in range(3):
        slowed, tests, unslowed = run_slowed()
        messages = [t["metrics"]["decode_tok_s"]["baseline_message"] or "" for t in tests]
        if unslowed is not None:
            # The harness, not the product, missed: again, from the recorded history (a passing
            # run appended its boots).
            retried.append(unslowed)
            files[0].write_bytes(history)
            continue
        if not any("not comparable" in m and "host differs (canary" in m for m in messages):
            break
        # The host itself moved since the recording (seen in two fresh-clone CI runs: both
        # canary probes 27-43% slower). Then the honest answer is "not comparable", reported
        # only: the run passes, and its boots stay out of the history whatever their figure.
        # Again, on the host as it is now, for the verdict.
        retried.append("the host canary moved")
        assert slowed.ret == pytest.ExitCode.OK, slowed.stdout.str()[-4000:]
        slowed.stdout.fnmatch_lines(["*baselines: not appended to the baseline history: decode tok/s of "
                                     "test_gate.py::test_single_stream_decode [[]default[]] is not comparable to "
                                     "it (the host canary moved; -*"])
        kept = json.loads(files[0].read_text())["entries"]["test_gate.py::test_single_stream_decode|default|decode_tok_s"]
        assert len(kept["boots"]) == 1
    else:
        pytest.fail(f"no verdict to check in three slowed runs: {retried}")
    assert slowed.ret == pytest.ExitCode.TESTS_FAILED, slowed.stdout.str()[-4000:]
    slowed.assert_outcomes(passed=1, failed=1)
    slowed.stdout.fnmatch_lines(["*decode tok/s: REGRESSION -*2 boots*vs 1 reference boot*",
                                 "*baselines: not appended to the baseline history: 1 perf test failed or was invalid, "
                                 "and a failing run appends nothing*"])
    after = json.loads(files[0].read_text())["entries"]["test_gate.py::test_single_stream_decode|default|decode_tok_s"]
    assert len(after["boots"]) == 1


BUSY = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=12, warmup_requests=2)

def test_single_stream_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"])
"""


class BusyDuringSecondProfile:
    """CPU-bound processes (two per core) that start when the second profile's server is ready
    and stop on exit."""

    def __init__(self, state_dir: Path) -> None:
        self._state_dir = state_dir
        self._done = threading.Event()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BusyDuringSecondProfile:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        for proc in self.procs:
            proc.kill()
            proc.wait()

    def _run(self) -> None:
        ready: dict[int, str] = {}
        while not self._done.is_set():
            ready = ready_servers(self._state_dir, ready)
            if "ring-ll" in ready.values():
                # Two per core: the scheduler favours the server's mostly-waiting processes, so
                # one per core used only ~10% of the host each (measured), two per core more.
                self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                              for _ in range(2 * (os.cpu_count() or 2))]
                return
            time.sleep(0.2)


def test_busy_host_during_one_profiles_block_is_invalid_naming_the_process_and_gives_no_verdict(
    pytester: pytest.Pytester, isolated_state: Path, no_servers_before_and_after, tmp_path: Path
) -> None:
    pytester.makepyfile(test_busy=BUSY)
    report = tmp_path / "report.json"
    with BusyDuringSecondProfile(isolated_state) as busy:
        result = pytester.runpytest_subprocess(
            "--deployment", "tiny-cpu", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1",
            "-p", "no:cacheprovider",
            "--kimiperf-json", str(report), timeout=1200)
    assert busy.procs, "the busy processes never started"
    result.assert_outcomes(passed=1, failed=1)
    assert "INVALID measurement: host busy" in result.stdout.str()
    assert result.ret == 75  # every failure INVALID: CI retries on a quiet runner (judge/gate.py)
    data = json.loads(report.read_text())
    ring = [t for t in data["tests"] if t["profile"] == "ring-ll"]
    assert ring and ring[0]["invalid"].startswith("host busy") and ring[0]["host"]["foreign_cpu_share"] > 0.1
    # The processes the test started are named by pid (the terminal wraps lines: read the JSON).
    assert any(f"pid {proc.pid} " in ring[0]["invalid"] for proc in busy.procs), ring[0]["invalid"]
    default = [t for t in data["tests"] if t["profile"] == "default"]
    assert default and default[0]["invalid"] is None and default[0]["host"]["foreign_cpu_share"] < 0.1
    # The disturbed profile is not a sample of anything: no better or worse against default.
    assert not [c for c in data["profile_comparisons"] if c.get("verdict") in ("regression", "improvement")]


DECODE = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=12, warmup_requests=2)

def test_single_stream_decode(perf):
    perf.check(perf.measure(SCENARIO), ["decode_tok_s"])
"""


def test_the_identical_server_as_its_own_control_boots_interleaved_and_gets_no_direction(
    pytester: pytest.Pytester, no_servers_before_and_after, tmp_path: Path
) -> None:
    command = list(BUILTIN_DEPLOYMENTS["tiny-cpu"].command)
    cache = tmp_path / "compile-cache"  # empty: the first boot compiles from scratch
    pytester.makepyprojecttoml('[tool.kimiperf.deployments.tiny-control]\nextends = "tiny-cpu"\n'
                               f"control_command = {json.dumps(command)}\n"
                               f'env = {{ VLLM_CACHE_ROOT = "{cache / "vllm"}", '
                               f'TORCHINDUCTOR_CACHE_DIR = "{cache / "inductor"}" }}\n')
    pytester.makepyfile(test_e2e=DECODE)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        "--deployment", "tiny-control", "--kimiperf-control", "--kimiperf-boots", "2", "--kimiperf-json", str(report),
        "-p", "no:cacheprovider", timeout=1200)
    # An A/A: the candidate and its control are one server; no baseline, so nothing else judges.
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=4)
    starts = [line.split("for profile ")[1].split()[0] for line in result.outlines
              if "starting tiny-control server for profile" in line]
    assert starts == ["default", "default@control", "default@control", "default"], starts
    result.stdout.fnmatch_lines(["kimiperf: control command (default@control): * -m vllm.entrypoints.openai.api_server *"])
    data = json.loads(report.read_text())
    assert data["control"] is True and data["reference_profile"] == "default@control"
    [decode] = [c for c in data["profile_comparisons"] if c["unit"] == "tok/s"]
    assert decode["boots_current"] == 2 and decode["boots_reference"] == 2
    # tiny-cpu declares spawn modes: the comparison weighs them (judge/profiles.compare_with_control).
    assert decode["verdict"] not in ("regression", "improvement"), decode
    assert "slower than the control" not in result.stdout.str()

    # The boot cost: every boot has a compile phase; the first builds the cache, the others reuse it.
    accounts = sorted((a for p in data["profiles"].values() for a in p["boot_accounts"]),
                      key=lambda a: a["log_path"] or "")
    compiles = {(a["profile"], a["boot"]): sum(ph["seconds"] for ph in a["phases"] if ph["phase"] == "compiling")
                for a in accounts}
    print("compile phase per boot (s):", compiles)
    first = [a for a in accounts if a["first_of_deployment"]]
    assert [(a["profile"], a["boot"]) for a in first] == [("default", 1)], accounts
    others = [v for k, v in compiles.items() if k != ("default", 1)]
    assert len(others) == 3 and compiles[("default", 1)] > max(others) and min(others) > 0, compiles
    assert all(a["weights_source"] == "disk" for a in accounts), accounts
    logs = [Path(a["log_path"]).read_text() for a in accounts]
    assert len(logs) == 4 and not any("Compiling model again due to a load failure" in log for log in logs)
