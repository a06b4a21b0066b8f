"""One vLLM server process: launch, wait for readiness, notice death, stop without leftovers.

The server runs under the launcher (launcher.py) in its own session, output straight into a log
file (a pipe nobody drains would block a chatty server), with a ``KIMIPERF_LAUNCH_ID`` marker in
the environment every child inherits: how teardown and the next run's sweep find exactly the
processes we started (zombies.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import httpx
import psutil

from pytest_kimiperf.server.boot_account import BootAccount
from pytest_kimiperf.config.nodes import SECRET_NAMES, Node
from pytest_kimiperf.server import zombies as process_sweep
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server.http_json import served_models
from pytest_kimiperf.server.progress import BootProgress, BootTracker, split_log_records

LAUNCH_ID_ENV = process_sweep.LAUNCH_ID_ENV
SPT_NOENV = "SPT_NOENV"
# A ServerError quotes this many of its log's last records, after the log's path: the engine's
# last words (its exception is the last of them) on the first screen; the file has the rest.
LOG_TAIL_LINES = 10
_POLL_S = 0.25
_HTTP_CHECK_EVERY_S = 1.0
# Between tests: how long /health may take to answer (vLLM answers it even under full load)
# and how long a server that stopped answering gets to finish dying before we call it wedged.
HEALTH_PROBE_TIMEOUT_S = 10.0
_EXIT_WAIT_S = 5.0

# Variables worth recording as "the environment the server ran with": the ones that change
# how vLLM, NCCL, CUDA and OpenMP behave. Secrets (VLLM_API_KEY) are never recorded.
_RECORDED_PREFIXES = ("NCCL_", "CUDA_", "VLLM_", "OMP_", "HF_", "TORCH_", "GLOO_")

ProgressCallback = Callable[[BootProgress, float, bool], None]


@dataclass
class StopControl:
    """Shared between the session's signal handlers and the stops in progress: a handler that
    raised into a stop would abandon it (the server left running), so it sets ``kill_now`` and the
    stop, which checks it every 50 ms, SIGKILLs everything the launch owns at once."""

    stopping: bool = False
    kill_now: bool = False


@dataclass(frozen=True)
class ServerHandle:
    """What a test gets: where the server is and how it was started."""

    base_url: str
    model: str
    deployment: str
    profile: str
    log_path: Path | None
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    overridden_shell_env: Mapping[str, tuple[str, str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    pid: int | None = None
    external: bool = False
    boot_s: float | None = None
    api_key: str | None = field(default=None, repr=False)
    # A deployment that spans nodes (cluster.py): every node's name, the head first, and the
    # server pids of the worker nodes on this machine (their processes are ours, not foreign).
    nodes: tuple[str, ...] = ()
    node_pids: tuple[int, ...] = ()
    # Nodes behind a launch template, with the launch marker of their processes there: the host
    # watch reads them through the node agent (measure/hostwatch.py).
    remote_nodes: tuple[tuple[Node, str], ...] = ()
    # Where this boot's seconds went (progress.py): set by the manager once it is ready.
    boot_account: BootAccount | None = None

    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate against the server (empty without an API key)."""
        return bearer(self.api_key)


def bearer(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header of ``api_key`` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def recorded_env(env: Mapping[str, str], always: frozenset[str] = frozenset()) -> dict[str, str]:
    """The part of a server's environment worth reporting, secrets left out: variables that
    change how vLLM, NCCL, CUDA and OpenMP behave, and every name in ``always`` (what the
    deployment and the profile set, e.g. PYTORCH_CUDA_ALLOC_CONF or LD_PRELOAD)."""
    return {
        k: v for k, v in sorted(env.items())
        if (k.startswith(_RECORDED_PREFIXES) or k in always) and k not in SECRET_NAMES
    }


def pick_free_port(host: str) -> int:
    """A port the OS says is free on ``host`` right now."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise ServerError now if ``port`` is taken, rather than after a long load."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ServerError(
                f"port {port} on {host} is already in use ({exc.strerror}); choose another "
                "with --kimiperf-port or leave it unset to pick a free one"
            ) from None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_health(base_url: str, headers: Mapping[str, str], timeout_s: float) -> str | None:
    """None when ``/health`` answers 200, else why not."""
    try:
        with httpx.Client(timeout=timeout_s, headers=dict(headers)) as client:
            health = client.get(f"{base_url}/health")
    except httpx.HTTPError as exc:
        return f"/health not answering ({type(exc).__name__})"
    return None if health.status_code == 200 else f"/health answered {health.status_code}"


def check_ready(base_url: str, model: str, headers: Mapping[str, str], timeout_s: float) -> str | None:
    """None when the server is ready (``/health`` 200 and ``model`` listed), else why not."""
    try:
        with httpx.Client(timeout=timeout_s, headers=dict(headers)) as client:
            for path in ("/health", "/v1/models"):
                answer = client.get(f"{base_url}{path}")
                if answer.status_code != 200:
                    return f"{path} answered {answer.status_code}"
            served = served_models(answer, f"{base_url}/v1/models")
    except httpx.HTTPError as exc:
        return f"not answering ({type(exc).__name__})"
    except ServerError as exc:
        return str(exc)
    return None if model in served else f"/v1/models lists {served}, not {model!r}"


def tail_lines(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` records of a log (tqdm redraws count as records)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - 256 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    records, rest = split_log_records(text)
    if rest.strip():
        records.append(rest)
    return "\n".join(deque(records, maxlen=n))


class ServerProcess:
    """A server this process launched and owns until :meth:`stop`."""

    def __init__(
        self,
        *,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path,
        state_dir: Path,
        base_url: str,
        served_model_name: str,
        deployment: str,
        profile: str,
        deadline_s: float,
        grace_s: float = 30.0,
        api_key: str | None = None,
        overridden_shell_env: Mapping[str, tuple[str, str]] | None = None,
        always_record: frozenset[str] = frozenset(),
        control: StopControl | None = None,
        ready_when_healthy: bool = False,
    ) -> None:
        self.argv = argv
        # A process that serves no model (the weight-cache daemons, weight_cache.py) is ready
        # when /health answers 200; a server, when /v1/models also lists its model.
        self.ready_when_healthy = ready_when_healthy
        self.control = control or StopControl()
        self.launch_id = uuid.uuid4().hex
        # SPT_NOENV: vLLM names its processes with setproctitle (utils/system_utils.py:194),
        # which by default moves environ away and writes the title over the memory that
        # /proc/PID/environ shows (py-setproctitle src/spt_status.c:204-230), blanking the
        # launch marker in EngineCore and the workers. Set, it clobbers argv only.
        self.env = {**env, LAUNCH_ID_ENV: self.launch_id, SPT_NOENV: "1"}
        if api_key:
            # vLLM reads VLLM_API_KEY itself: the key stays out of the command line (ps, logs).
            self.env["VLLM_API_KEY"] = api_key
        self.log_path = log_path
        self.state_dir = state_dir
        self.base_url = base_url
        self.served_model_name = served_model_name
        self.deployment = deployment
        self.profile = profile
        self.deadline_s = deadline_s
        self.grace_s = grace_s
        self.api_key = api_key
        self.overridden_shell_env = dict(overridden_shell_env or {})
        self.always_record = always_record
        self.progress = BootProgress("not started")
        self.popen: subprocess.Popen[bytes] | None = None
        self.record: process_sweep.LaunchRecord | None = None
        self._held: process_sweep.HeldLock | None = None
        # pytest's end of the launcher's watchdog pipe: closed by the kernel when pytest dies.
        self._watch_fd: int | None = None
        self.started_at: float | None = None
        self.boot_s: float | None = None
        # A node behind a launch template: the node agent's stop of this launch there, kept in
        # the launch record so the next run's sweep ends what a killed session left on the node.
        self.node_stop: tuple[str, ...] = ()

    # -- launch and readiness -------------------------------------------------------------

    def start(self) -> None:
        """Launch the server (under the launcher) in its own session, output to the log file,
        and record it with the owner lock held."""
        self._check_executable()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        watch_read, self._watch_fd = os.pipe()
        try:
            with open(self.log_path, "ab") as log:
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", "pytest_kimiperf.server.launcher", "--watch-fd", str(watch_read),
                     "--grace", f"{self.grace_s:g}", "--", *self.argv],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                    pass_fds=(watch_read,),
                )
        except OSError as exc:
            self._close_watch()
            raise ServerError(
                f"could not start the {self.deployment} server's launcher ({sys.executable!r}: "
                f"{exc.strerror}); command: {' '.join(self.argv)}"
            ) from None
        finally:
            os.close(watch_read)
        self.started_at = time.monotonic()
        try:
            record = dataclasses.replace(process_sweep.record_for_popen(
                self.popen.pid,
                launch_id=self.launch_id,
                deployment=self.deployment,
                profile=self.profile,
                log_path=str(self.log_path),
            ), node_stop=self.node_stop)
            self._held = process_sweep.record_launch(self.state_dir, record)
        except BaseException:
            # Ctrl-C (or a full disk) between the launch and its record: stop() would know
            # nothing to stop and the next run's sweep nothing to find, so stop it here. The
            # process is seconds old: its group holds at most the first children.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)  # its own session: pgid == pid
            self.popen.wait()
            self._close_watch()
            raise
        self.record = record

    def _check_executable(self) -> None:
        """ServerError now, naming the command, if it cannot be run (the launcher would only
        log it)."""
        program = self.argv[0] if self.argv else ""
        found = shutil.which(program, path=self.env.get("PATH", os.defpath)) if os.sep not in program else (
            program if os.access(program, os.X_OK) and os.path.isfile(program) else None)
        if not found:
            raise ServerError(
                f"could not start the {self.deployment} server ({program!r}: not found or not "
                f"executable); command: {' '.join(self.argv)}"
            )

    def _close_watch(self) -> None:
        if self._watch_fd is not None:
            os.close(self._watch_fd)
            self._watch_fd = None

    def wait_ready(self, on_progress: ProgressCallback | None = None) -> ServerHandle:
        """Block until the server is ready; fail fast if it dies, stop it past the deadline. Any
        exception (KeyboardInterrupt included) stops it first: a half-booted server never outlives
        the wait."""
        assert self.popen is not None and self.started_at is not None, "start() first"
        tracker = BootTracker()
        self.progress = tracker.current
        pending = ""
        next_http = 0.0
        why_not = "not checked yet"
        try:
            with open(self.log_path, "rb") as reader:
                while True:
                    code = self.popen.poll()
                    chunk = reader.read().decode("utf-8", "replace")
                    changed = False
                    if chunk:
                        records, pending = split_log_records(pending + chunk)
                        for record in records:
                            if tracker.feed(record):
                                # Each phase the log went through is shown, however the reads
                                # happened to split it (a late read can hold several).
                                self.progress, changed = tracker.current, True
                                if on_progress:
                                    on_progress(self.progress, self.elapsed_s(), True)
                    if on_progress and not changed:
                        on_progress(self.progress, self.elapsed_s(), False)
                    if code is not None:
                        raise ServerError(
                            f"the {self.deployment} server ({self.profile}) exited with code {code} "
                            f"while {self.progress.describe()} after {self.elapsed_s():.0f}s; "
                            f"log: {self.log_path}\n{tail_lines(self.log_path)}"
                        )
                    now = time.monotonic()
                    if now >= next_http:
                        next_http = now + _HTTP_CHECK_EVERY_S
                        why_not = (check_health(self.base_url, {}, timeout_s=1.0) if self.ready_when_healthy
                                   else check_ready(self.base_url, self.served_model_name, bearer(self.api_key),
                                                    timeout_s=1.0)) or ""
                        if not why_not:
                            self.boot_s = self.elapsed_s()
                            return self.handle()
                    if self.elapsed_s() > self.deadline_s:
                        raise ServerError(
                            f"the {self.deployment} server ({self.profile}) was not ready within "
                            f"{self.deadline_s:.0f}s; stuck while {self.progress.describe()} "
                            f"({why_not}); it was stopped. log: {self.log_path}\n"
                            f"{tail_lines(self.log_path)}"
                        )
                    time.sleep(_POLL_S)
        except BaseException:
            self.stop()
            raise

    def elapsed_s(self) -> float:
        """Seconds since launch."""
        return 0.0 if self.started_at is None else time.monotonic() - self.started_at

    def handle(self) -> ServerHandle:
        """The handle tests receive."""
        assert self.popen is not None
        return ServerHandle(
            base_url=self.base_url,
            model=self.served_model_name,
            deployment=self.deployment,
            profile=self.profile,
            log_path=self.log_path,
            env=MappingProxyType(recorded_env(self.env, self.always_record)),
            overridden_shell_env=MappingProxyType(dict(self.overridden_shell_env)),
            pid=self.server_pid(),
            boot_s=self.boot_s,
            api_key=self.api_key,
        )

    def server_pid(self) -> int | None:
        """The server's own pid (the launcher's child), else the launcher's."""
        if self.popen is None:
            return None
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self.popen.pid).children()
            if children:
                return int(children[0].pid)
        return self.popen.pid

    # -- during the session ---------------------------------------------------------------

    def ensure_alive(self, *, health_timeout_s: float = HEALTH_PROBE_TIMEOUT_S,
                     exit_wait_s: float = _EXIT_WAIT_S) -> None:
        """Raise ServerError with the log tail unless the server still runs and answers /health.

        A dying server's sockets close a moment before its exit status can be collected, so one
        that does not answer gets ``exit_wait_s`` to finish exiting (a death, with its exit code)
        before it is reported as wedged.
        """
        if self.popen is None:
            raise ServerError(f"the {self.deployment} server ({self.profile}) was never started")
        code = self.popen.poll()
        if code is None:
            why = check_health(self.base_url, bearer(self.api_key), timeout_s=health_timeout_s)
            if why is None:
                return
            try:
                code = self.popen.wait(timeout=exit_wait_s)
            except subprocess.TimeoutExpired:
                raise ServerError(
                    f"the {self.deployment} server ({self.profile}) still runs but stopped "
                    f"serving: {why}; log: {self.log_path}\n{tail_lines(self.log_path)}"
                ) from None
        raise ServerError(
            f"the {self.deployment} server ({self.profile}) died during the session "
            f"(exit code {code}); log: {self.log_path}\n{tail_lines(self.log_path)}"
        )

    # -- teardown -------------------------------------------------------------------------

    def stop(self, *, keep_record: bool = False) -> process_sweep.TerminationReport | None:
        """Stop the whole server (group, descendants, orphans) and verify nothing is left.

        The record and its owner lock are kept while anything survives (or under ``keep_record``:
        a node behind a template, cluster.py), so a later stop or the next run's sweep tries again.
        """
        if self.record is None:
            return None
        self.control.stopping = True
        try:
            report = process_sweep.stop_launch(
                self.record, grace_s=self.grace_s, kill_now=lambda: self.control.kill_now)
        finally:
            self.control.stopping = False
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)
        if report.survivors or keep_record:
            return report
        process_sweep.forget_launch(self.state_dir, self.record.launch_id)
        if self._held is not None:
            self._held.release()
            self._held = None
        self._close_watch()
        self.record = None
        return report
