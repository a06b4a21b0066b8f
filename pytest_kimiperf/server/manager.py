"""Owns the session's servers: one per NCCL profile, one at a time, always stopped.

**The host claim.** Two sessions that both boot the deployment's servers must not run side by
side: the second would fail to fit, or both would measure a shared machine, and CI's concurrency
group does not cover an engineer at a terminal. So the first session to boot takes an exclusive
``flock`` on ``host.lock`` in the launch-state directory until its servers are stopped; a second
waits, naming the holder, up to ``--kimiperf-host-wait``. The lock serializes one user's sessions;
users who share a host's GPUs point ``KIMIPERF_STATE_DIR`` at one shared directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from pytest_kimiperf.config.nccl.debug_log import nccl_debug_env
from pytest_kimiperf.config.nccl.profiles import NcclProfile, profile_server_env
from pytest_kimiperf.config.serve_args import CommandPlan
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.paths import compile_cache_env
from pytest_kimiperf.server import zombies as process_sweep
from pytest_kimiperf.server.zombies import HeldLock, SweepAccount
from pytest_kimiperf.server.attach import attach_server
from pytest_kimiperf.server.cluster import NodeGroup, node_group
from pytest_kimiperf.server.gpu import HardwareRequirement
from pytest_kimiperf.server.gpu_memory import describe_mib, gpu_holders, gpu_memory_used_mib, settle_before_boot
from pytest_kimiperf.server.hardware_check import await_free_memory, deployment_gpus
from pytest_kimiperf.server.process import (
    HEALTH_PROBE_TIMEOUT_S,
    ServerHandle,
    ServerProcess,
    StopControl,
    check_health,
    check_port_free,
    pick_free_port,
    recorded_env,
)
from pytest_kimiperf.server.boot_account import BootAccount, ServerSpan, account_boot
from pytest_kimiperf.server.progress import BootProgress
from pytest_kimiperf.server.tiny_model import resolve_model_path
from pytest_kimiperf.server.weight_cache import (
    WeightCacheFacts,
    WeightCachePlan,
    daemon_argv,
    daemon_env,
    held_gib_per_rank,
    plan_weight_cache,
    profile_cache_reason,
    unsupported_reason,
)

# The host claim: one pytest session at a time boots servers on a host.
_LOCK_NAME = "host.lock"
_HOLDER_NAME = "host-holder.json"
# How often a waiting session repeats who it waits for (a 36-minute boot is long to watch).
_REMIND_S = 60.0


@dataclass(frozen=True)
class HostClaimHolder:
    """The session holding the host, as it described itself."""

    pid: int
    command: str
    since: float

    def describe(self, now: float) -> str:
        """``pid 123 (pytest perf_tests ...), holding the host for 4m12s``."""
        held_s = max(0, int(now - self.since))
        return f"pid {self.pid} ({self.command}), holding the host for {held_s // 60}m{held_s % 60:02d}s"


def _read_holder(path: Path) -> HostClaimHolder | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return HostClaimHolder(pid=int(data["pid"]), command=str(data["command"]), since=float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_holder(path: Path) -> None:
    try:
        command = " ".join(psutil.Process().cmdline())
    except psutil.Error:
        command = "?"
    command = command if len(command) <= 200 else command[:197] + "..."
    write_atomically(path, json.dumps({"pid": os.getpid(), "command": command, "since": time.time()}))


def _claim_host(
    state_dir: Path, *, wait_s: float, announce: Callable[[str], None], poll_s: float = 0.25,
) -> HeldLock:
    """Take the host for this session's servers, waiting up to ``wait_s`` for another session;
    ServerError naming the holder when the wait runs out."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    start = time.monotonic()
    next_word = start
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            now = time.monotonic()
            holder = _read_holder(state_dir / _HOLDER_NAME)
            who = holder.describe(time.time()) if holder else "a session that has not said who it is"
            if now - start >= wait_s:
                raise ServerError(
                    f"another pytest session on this host is using it for its servers: {who}; "
                    f"waited {now - start:.0f}s (--kimiperf-host-wait {wait_s:g}). Let it finish, stop "
                    "it, or wait longer with --kimiperf-host-wait"
                )
            if now >= next_word:
                announce(f"kimiperf: waiting for another pytest session on this host to finish with its "
                    f"servers: {who}; waiting up to {wait_s:g}s (--kimiperf-host-wait)")
                next_word = now + _REMIND_S
            time.sleep(poll_s)
    except BaseException:
        os.close(fd)
        raise
    if time.monotonic() - start > poll_s:
        announce(f"kimiperf: the host is free after {time.monotonic() - start:.0f}s of waiting")
    with contextlib.suppress(OSError):
        _write_holder(state_dir / _HOLDER_NAME)
    return HeldLock(state_dir / _LOCK_NAME, fd)


# The daemons' launch record and log name them as this "profile": they serve every profile.
WEIGHT_CACHE = "weight-cache"

# Writes one status line to the user (the terminal, or a worker's relay).
Announce = Callable[[str], None]
_ProgressSink = Callable[[str, BootProgress, float, bool], None]


def _log_text(path: Path) -> str:
    """A server's log, or "" where it cannot be read (an account then holds the total only)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@dataclass(frozen=True)
class _EngineEnv:
    """The environment one engine boots with, and what of it the profile set or changed."""

    env: dict[str, str]
    overridden: dict[str, tuple[str, str]]  # name -> (shell value, profile value)
    set_here: frozenset[str]  # names the deployment or the profile set


@dataclass
class ServerRecord:
    """What happened to one profile's server in this session."""

    profile: str
    boots: int = 0
    boot_s: float | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    overridden_shell_env: dict[str, tuple[str, str]] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)
    error: str | None = None
    # One per boot that became ready, in boot order (progress.account_boot).
    accounts: list[BootAccount] = field(default_factory=list)
    # The sweep of a killed run's leftovers, on the record of the boot it came before.
    sweep: SweepAccount | None = None
    # Each boot's and stop's stretch of the wall clock, in order (the session's time account).
    spans: list[ServerSpan] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        """JSON-able form: travels from an xdist worker to the controller in workeroutput."""
        return {
            "profile": self.profile, "boots": self.boots, "boot_s": self.boot_s,
            "log_path": str(self.log_path) if self.log_path else None, "env": self.env,
            "overridden_shell_env": {k: list(v) for k, v in self.overridden_shell_env.items()},
            "leftovers": self.leftovers, "error": self.error,
            "accounts": [a.to_json() for a in self.accounts],
            **({"sweep": self.sweep.to_json()} if self.sweep is not None else {}),
            "spans": [span.to_json() for span in self.spans],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerRecord:
        """Inverse of :meth:`to_json`."""
        return cls(
            profile=data["profile"], boots=int(data["boots"]), boot_s=data.get("boot_s"),
            log_path=Path(data["log_path"]) if data.get("log_path") else None,
            env=dict(data.get("env") or {}),
            overridden_shell_env={k: (v[0], v[1]) for k, v in (data.get("overridden_shell_env") or {}).items()},
            leftovers=list(data.get("leftovers") or []), error=data.get("error"),
            accounts=[BootAccount.from_json(a) for a in data.get("accounts") or []],
            sweep=SweepAccount.from_json(data["sweep"]) if data.get("sweep") else None,
            spans=[ServerSpan.from_json(span) for span in data.get("spans") or []],
        )

    def merge(self, other: ServerRecord) -> None:
        """Add another process's record of the same profile (boots add up)."""
        self.boots += other.boots
        self.boot_s = self.boot_s if self.boot_s is not None else other.boot_s
        self.log_path = self.log_path or other.log_path
        self.env = self.env or other.env
        self.overridden_shell_env = self.overridden_shell_env or other.overridden_shell_env
        self.leftovers.extend(other.leftovers)
        self.error = self.error or other.error
        self.accounts.extend(other.accounts)
        self.sweep = self.sweep or other.sweep
        self.spans.extend(other.spans)


class ServerManager:
    """Boots and stops the servers of one pytest process."""

    def __init__(
        self,
        settings: Settings,
        *,
        log_dir: Path,
        state_dir: Path,
        announce: Announce,
        on_progress: _ProgressSink,
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.state_dir = state_dir
        self.announce = announce
        self.on_progress = on_progress
        self.records: dict[str, ServerRecord] = {}
        self._current: ServerProcess | NodeGroup | None = None
        self._external: ServerHandle | None = None
        self._swept = False
        self._claim: HeldLock | None = None
        # Shared with every ServerProcess: signal handlers escalate stops through it.
        self.control = StopControl()
        self._interrupted = False
        self._signals = 0
        self._ready_boots = 0  # boots of the deployment that became ready in this process
        self._gpu_before_mib: dict[int, int] | None = None  # each GPU's MiB used before the first boot
        self._sweep_account: SweepAccount | None = None
        self._pid_view_said = False
        self._used_before_sweep_mib: dict[int, int] = {}
        # `vllm preload` daemons: planned at the first boot, stopped after the last engine.
        self.weight_cache: WeightCachePlan | None = None
        self.weight_cache_record: ServerRecord | None = None
        self._daemons: ServerProcess | None = None
        self._launched_at: float | None = None  # monotonic: the current boot's launch, for its span

    def record(self, profile: str) -> ServerRecord:
        """The (possibly new) record of ``profile``'s server."""
        return self.records.setdefault(profile, ServerRecord(profile))

    def acquire(self, profile: NcclProfile) -> ServerHandle:
        """Start ``profile``'s server (or attach to the external one) and return its handle;
        the boot's stretch of the wall clock goes on its record, ready or failed."""
        rec = self.record(profile.name)
        started_at, start, boots_before = time.time(), time.monotonic(), rec.boots
        self._launched_at = None
        try:
            return self._acquire(profile, rec)
        finally:
            launch_s = None if self._launched_at is None else self._launched_at - start
            rec.spans.append(ServerSpan("boot", profile.name, max(rec.boots, boots_before + 1), started_at,
                                        time.monotonic() - start, launch_s=launch_s))

    def _acquire(self, profile: NcclProfile, rec: ServerRecord) -> ServerHandle:
        if self.settings.external:
            return self._attach(profile)
        self._clear_host()
        if self.settings.deployment.needs_gpus:
            self._settle_gpus(rec)
        port = self._engine_port(self.settings.deployment.host)
        engine_argv, plan, cache_off = self._engine_argv(profile, port)
        engine_env = self._engine_env(profile, rec)
        server = self._engine_server(profile, rec, engine_argv, engine_env, port)
        self._announce_launch(profile, rec, server, engine_env, plan, cache_off)
        return self._boot(profile, rec, server)

    def _clear_host(self) -> None:
        """Before a boot: honour a signal absorbed by the last stop, stop the previous server,
        take the host for this session and sweep what killed earlier runs left (once)."""
        if self._interrupted:
            # A signal arrived while the previous server was being stopped (and was absorbed
            # so the stop could finish): honour it now instead of booting the next profile.
            raise KeyboardInterrupt("interrupted while a server was being stopped")
        if self._current is not None:
            # pytest finalizes the previous profile's server before the next is set up; this
            # guards the "never two servers at once" promise should that ever change.
            self.release()
        if self._claim is None:
            self._claim = _claim_host(self.state_dir, wait_s=self.settings.host_wait_s, announce=self.announce)
        if not self._swept:
            self._sweep()
            self._swept = True

    def _engine_port(self, host: str) -> int:
        """The configured port, checked free, else a free one on ``host``."""
        if self.settings.port is not None:
            check_port_free(host, self.settings.port)
            return self.settings.port
        return pick_free_port(host)

    def _engine_argv(self, profile: NcclProfile, port: int) -> tuple[list[str], CommandPlan, str | None]:
        """The engine's command for ``profile``, the profile's command plan, and why the weight
        cache is off for this profile alone (else None). Starts the weight cache at the first boot."""
        deployment = self.settings.deployment
        host = deployment.host
        model_path = resolve_model_path(deployment.model, self.announce)
        engine_argv = deployment.argv(model_path=model_path, host=host, port=port)
        if self.weight_cache is None:  # from the deployment's own command: the daemons serve every profile
            self._start_weight_cache(engine_argv)
        assert self.weight_cache is not None
        plan = self.settings.command_plans.get(profile.name, CommandPlan())
        if profile.control_of:  # the recorded build: its own command, never the daemons of this one
            engine_argv = deployment.argv(model_path=model_path, host=host, port=port, control=True)
        engine_argv = plan.apply(engine_argv)
        cache_off = profile_cache_reason(profile.name, plan.dests) if self.weight_cache.enabled else None
        engine_argv += self.weight_cache.engine_args() if cache_off is None else []
        return engine_argv, plan, cache_off

    def _engine_env(self, profile: NcclProfile, rec: ServerRecord) -> _EngineEnv:
        """The engine's environment for ``profile``; sets this boot's log path and the
        environment facts on ``rec``."""
        deployment = self.settings.deployment
        base_env = {**compile_cache_env(), **os.environ, **deployment.env}
        env, overridden = profile_server_env(profile, base_env)
        boot_suffix = "" if rec.boots == 0 else f"-boot{rec.boots + 1}"  # every boot keeps its log
        rec.log_path = self.log_dir / f"server-{deployment.name}-{profile.name}{boot_suffix}.log"
        if self.settings.nccl_debug:  # one NCCL debug file per process, beside the log (debug_log.py)
            env.update(nccl_debug_env(rec.log_path))
        rec.overridden_shell_env = dict(overridden)
        set_here = frozenset(deployment.env) | frozenset(profile.env)
        rec.env = recorded_env(env, set_here)
        return _EngineEnv(env, overridden, set_here)

    def _engine_server(self, profile: NcclProfile, rec: ServerRecord, engine_argv: list[str],
                       engine_env: _EngineEnv, port: int) -> ServerProcess | NodeGroup:
        """The (not yet started) server: this machine's process, or the group of every node."""
        deployment = self.settings.deployment
        host = deployment.host
        env, set_here = engine_env.env, engine_env.set_here
        url_host = f"[{host}]" if ":" in host else host
        assert rec.log_path is not None
        head = ServerProcess(
            argv=engine_argv,
            env=env,
            log_path=rec.log_path,
            state_dir=self.state_dir,
            base_url=f"http://{url_host}:{port}",
            served_model_name=deployment.served_model_name,
            deployment=deployment.name,
            profile=profile.name,
            deadline_s=deployment.health_deadline_s,
            grace_s=self.settings.grace_s,
            api_key=self.settings.api_key,
            overridden_shell_env=engine_env.overridden,
            always_record=set_here,
            control=self.control,
        )
        if deployment.nodes:  # every node of the deployment, the head being this one (cluster.py)
            return node_group(head, deployment.nodes, engine_argv, exported={k: env[k] for k in set_here if k in env},
                              master_port=deployment.master_port or pick_free_port(host))
        return head

    def _announce_launch(self, profile: NcclProfile, rec: ServerRecord, server: ServerProcess | NodeGroup,
                         engine_env: _EngineEnv, plan: CommandPlan, cache_off: str | None) -> None:
        """Say what the profile changes and where the server starts."""
        deployment = self.settings.deployment
        for name, (shell, value) in sorted(engine_env.overridden.items()):
            self.announce(f"kimiperf: profile {profile.name} overrides {name}={shell!r} from the shell with {value!r}")
        for line in [*(f"profile {profile.name} replaces the deployment's {r.describe()}" for r in plan.replaced),
                     *([cache_off] if cache_off else [])]:
            self.announce(f"kimiperf: {line}")
        self.announce(
            f"kimiperf: starting {deployment.name} server for profile {profile.name} "
            f"on {server.base_url}; log: {rec.log_path}"
            + (f"; {server.describe()}" if isinstance(server, NodeGroup) else "")
        )

    def _boot(self, profile: NcclProfile, rec: ServerRecord, server: ServerProcess | NodeGroup) -> ServerHandle:
        """Start ``server``, wait until it serves, and record the boot (its error, if it fails)."""
        deployment = self.settings.deployment
        rec.boots += 1
        self._current = server
        started_wall = datetime.now()  # local time, as vLLM stamps its log lines
        self._launched_at = time.monotonic()
        server.start()
        try:
            handle = server.wait_ready(
                lambda progress, elapsed, changed: self.on_progress(profile.name, progress, elapsed, changed)
            )
        except BaseException as exc:
            if server.record is None:  # wait_ready stopped it, and the stop was verified
                self._current = None
            rec.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise
        rec.boot_s = handle.boot_s
        if deployment.needs_gpus and not self._pid_view_said:
            self._announce_pid_view()
        rec.accounts.append(self._account(rec, started_wall, handle.boot_s or 0.0))
        handle = replace(handle, boot_account=rec.accounts[-1])
        self.announce(f"kimiperf: {deployment.name} server ({profile.name}) ready after {handle.boot_s:.0f}s")
        return handle

    def _settle_gpus(self, rec: ServerRecord) -> None:
        """Device-level accounting: the first boot waits for the room vLLM asks, and every later
        boot for each GPU to be back to the first one's figure (the stopped server's memory)."""
        if self._gpu_before_mib is None:
            self._gpu_before_mib = self._first_boot_memory(rec)
        else:
            settle_before_boot(self._gpu_before_mib, deadline_s=self.settings.deployment.gpu_memory_wait_s,
                               announce=lambda line: self.announce(f"kimiperf: {line}"))

    def _first_boot_memory(self, rec: ServerRecord) -> dict[int, int]:
        """Before the first boot, after the sweep: wait until the server's GPUs have the room vLLM
        asks (what the sweep ended is still coming back), or fail naming what else holds them;
        returns each GPU's MiB used, the figure every later boot is held to."""
        deployment = self.settings.deployment
        requirement = HardwareRequirement(deployment.gpu_count, deployment.gpu_name_contains)
        _found, usable, _scope = deployment_gpus(deployment)
        used = await_free_memory(deployment, [g for g in usable if requirement.matches(g)],
                                 deadline_s=deployment.gpu_memory_wait_s,
                                 announce=lambda line: self.announce(f"kimiperf: {line}"))
        if self._sweep_account is not None:
            returned = {index: self._used_before_sweep_mib[index] - mib for index, mib in used.items()
                        if index in self._used_before_sweep_mib}
            rec.sweep = replace(self._sweep_account, returned_mib=returned)
            self._sweep_account = None
            self.announce(f"kimiperf: zombie sweep: {rec.sweep.summary()}")
        return used

    def _announce_pid_view(self) -> None:
        """Once a session, with the first server holding its GPUs: where NVML's pids name no
        process here (a container under a driver that reports the host's pids), GPU memory is
        accounted per GPU, and the run says so once instead of at every window."""
        try:
            held = gpu_holders()
        except ServerError:
            return  # the per-window readings say what could not be read
        if held.holders:
            self._pid_view_said = True
        if held.note is not None:
            self.announce(f"kimiperf: GPU memory is accounted per GPU, not per process: {held.note}")

    def _account(self, rec: ServerRecord, started_wall: datetime, total_s: float) -> BootAccount:
        """The account of the boot that just became ready, from its log."""
        assert rec.log_path is not None
        account = account_boot(
            _log_text(rec.log_path), profile=rec.profile, ordinal=rec.boots, first_of_deployment=self._ready_boots == 0,
            started_at=started_wall, total_s=total_s, log_path=str(rec.log_path),
            environments=self._environments(rec),
        )
        self._ready_boots += 1
        self.announce(f"kimiperf: {account.summary()}")
        return account

    def _environments(self, rec: ServerRecord) -> dict[str, dict[str, str]]:
        """The environment of each process a boot depended on: the engine's, and the daemons'
        while they serve (never the profile's: weight_cache.daemon_env)."""
        envs = {"engine": dict(rec.env)}
        if self._daemons is not None and self.weight_cache_record is not None:
            envs[WEIGHT_CACHE] = dict(self.weight_cache_record.env)
        return envs

    def _start_weight_cache(self, engine_argv: list[str]) -> None:
        """Plan the weight cache and, where it works, start the daemons and wait for them; daemons
        that cannot start mean disk loads, the reason said once, never a failed session."""
        deployment = self.settings.deployment
        socket_dir = tempfile.mkdtemp(prefix="kimiperf-wc-")  # short: a Unix socket path is <108 bytes
        plan = plan_weight_cache(setting=deployment.weight_cache, gpu_count=deployment.gpu_count,
                                 command=engine_argv, socket_dir=socket_dir,
                                 health_port=pick_free_port("127.0.0.1"), model=deployment.model,
                                 quantization=deployment.quantization, nodes=max(1, len(deployment.nodes)),
                                 control=self.settings.control)
        if not plan.enabled:
            shutil.rmtree(socket_dir, ignore_errors=True)
            self.weight_cache = plan
            return
        rec = self.weight_cache_record = ServerRecord(WEIGHT_CACHE)
        rec.log_path = self.log_dir / f"server-{deployment.name}-{WEIGHT_CACHE}.log"
        env = daemon_env({**compile_cache_env(), **os.environ}, deployment.env)
        rec.env = recorded_env(env, frozenset(deployment.env))
        daemons = ServerProcess(
            argv=daemon_argv(engine_argv, plan), env=env, log_path=rec.log_path, state_dir=self.state_dir,
            base_url=f"http://127.0.0.1:{plan.health_port}", served_model_name=deployment.served_model_name,
            deployment=deployment.name, profile=WEIGHT_CACHE, deadline_s=deployment.health_deadline_s,
            grace_s=self.settings.grace_s, control=self.control, ready_when_healthy=True,
        )
        self.announce(f"kimiperf: starting the {deployment.name} weight-cache daemons (vllm preload); log: {rec.log_path}")
        rec.boots += 1
        self._daemons = daemons
        daemons.start()
        try:
            daemons.wait_ready(
                lambda progress, elapsed, changed: self.on_progress(WEIGHT_CACHE, progress, elapsed, changed))
        except ServerError as exc:
            if daemons.record is not None:  # its stop left survivors: not a fallback, a failure
                raise
            self._daemons = None
            shutil.rmtree(socket_dir, ignore_errors=True)
            reason = unsupported_reason(_log_text(rec.log_path)) or str(exc).splitlines()[0]
            rec.error = reason
            self.weight_cache = WeightCachePlan(False, f"the weight-cache daemons did not start: {reason}")
            self.announce(f"kimiperf: weight cache off, engines load from disk: {reason}")
            return
        rec.boot_s = daemons.boot_s
        self.weight_cache = plan
        held = held_gib_per_rank(_log_text(rec.log_path))
        per_gpu = ", ".join(f"rank {r}: {gib:.1f} GiB" for r, gib in sorted(held.items())) or "not stated in its log"
        self.announce(f"kimiperf: weight-cache daemons ready after {daemons.boot_s or 0:.0f}s; they hold {per_gpu}")

    def weight_cache_facts(self) -> WeightCacheFacts | None:
        """What the weight cache did in this session (None when no server was booted here)."""
        plan, rec = self.weight_cache, self.weight_cache_record
        if plan is None:
            return None
        if rec is None or rec.log_path is None:
            return WeightCacheFacts(used=plan.enabled, reason=plan.fallback_reason)
        return WeightCacheFacts(used=plan.enabled, reason=plan.fallback_reason, boot_s=rec.boot_s,
                                log_path=str(rec.log_path), held_gib_per_rank=held_gib_per_rank(_log_text(rec.log_path)),
                                env=dict(rec.env), leftovers=tuple(rec.leftovers))

    def _stop_weight_cache(self) -> None:
        """Stop the daemons after the last engine and verify nothing of them is left."""
        daemons = self._daemons
        if daemons is None:
            return
        assert self.weight_cache_record is not None
        if not self._stop_verified(daemons, f"{daemons.deployment} weight-cache daemons", self.weight_cache_record):
            return
        self._daemons = None
        if self.weight_cache is not None and self.weight_cache.socket_dir:
            shutil.rmtree(self.weight_cache.socket_dir, ignore_errors=True)

    def ensure_alive(self) -> None:
        """Raise ServerError (with the log tail) if the current server died or stopped serving."""
        if self._current is not None:
            self._current.ensure_alive()
        elif self._external is not None:
            why = check_health(self._external.base_url, self._external.auth_headers(),
                               timeout_s=HEALTH_PROBE_TIMEOUT_S)
            if why is not None:
                raise ServerError(f"--kimiperf-server-url {self._external.base_url} stopped serving: {why}")

    def on_signal(self) -> bool:
        """A stop signal (SIGINT, SIGTERM, SIGHUP) arrived. True: absorbed here, because a stop
        is in progress (it now skips its grace and SIGKILLs everything the launch owns) or this
        is the second signal (the teardown it interrupts will SIGKILL at once). False: the
        caller interrupts the session, as Ctrl-C does (the first signal, and a third)."""
        self._signals += 1
        self._interrupted = True
        if self.control.stopping or self._signals == 2:
            self.control.kill_now = True
            return True
        return False

    def release(self) -> None:
        """Stop the current server and verify that nothing of it is left; until then it stays the
        current one, so :meth:`close` tries an unfinished stop again."""
        server = self._current
        if server is None:
            return
        rec = self.record(server.profile)
        started_at, start = time.time(), time.monotonic()
        try:
            if self._stop_verified(server, f"{server.deployment} server ({server.profile})", rec):
                self._current = None
        finally:
            rec.spans.append(ServerSpan("stop", server.profile, rec.boots, started_at, time.monotonic() - start))

    def _stop_verified(self, process: ServerProcess | NodeGroup, what: str, rec: ServerRecord) -> bool:
        """Stop ``process`` (``what`` names it) and verify that nothing of it is left; False, with
        the survivors announced and kept in ``rec``'s leftovers, when something is."""
        self.announce(f"kimiperf: stopping the {what}")
        report = process.stop()
        if report is not None and report.escalated:
            self.announce(f"kimiperf: a second signal during teardown: every process of the {what} got SIGKILL "
                          "without waiting out the grace")
        if report is None or not report.survivors:
            return True
        survivors = [p.describe() for p in report.survivors]
        rec.leftovers.extend(s for s in survivors if s not in rec.leftovers)
        self.announce(f"kimiperf: WARNING: processes of the {what} survived SIGKILL: " + "; ".join(survivors))
        return False

    def _attach(self, profile: NcclProfile) -> ServerHandle:
        rec = self.record(profile.name)
        self._external, restart = attach_server(self.settings, profile.name, previous=self._external, announce=self.announce)
        rec.env = {}
        rec.boots += 1
        rec.boot_s = restart.ready_s if restart is not None else rec.boot_s
        return self._external

    def _sweep(self) -> None:
        gpus = self.settings.deployment.needs_gpus
        self._used_before_sweep_mib = gpu_memory_used_mib() if gpus else {}
        report = process_sweep.sweep_stale_launches(self.state_dir, grace_s=self.settings.grace_s)
        for line in report.describe():
            self.announce(f"kimiperf: zombie sweep: {line}")
        if report.swept or report.ended:
            self._sweep_account = SweepAccount(launches=report.swept, processes=len(report.ended))
        stuck = report.survivor_gpu_memory_mib or {}
        if stuck and gpus:
            held = ", ".join(f"pid {pid} ({describe_mib(mib)})" for pid, mib in sorted(stuck.items()))
            raise ServerError(
                f"processes of an earlier run survived SIGKILL and still hold GPU memory: {held}; "
                "a new server would not fit next to them. They are usually stuck in the driver: "
                "check `nvidia-smi` and the kernel log, free the GPUs (or reboot), then rerun"
            )

    def close(self) -> None:
        """Stop whatever still runs (end of session, interrupt), then let the next session boot."""
        try:
            try:
                self.release()
                if self._current is not None:
                    self.announce(f"kimiperf: WARNING: left running at exit (survived SIGKILL): "
                             f"{'; '.join(self.record(self._current.profile).leftovers)}; the next run's "
                             "sweep tries again")
                    self._current = None
            finally:
                self._stop_weight_cache()  # after the last engine, whose weights it may hold
        finally:
            if self._claim is not None:
                self._claim.release()
                self._claim = None
