"""Attaching to a running server (``--kimiperf-server-url``), and restarting it between boots.

An attached run measures a server it does not own, so on its own it gets one boot, which can
screen a change but never convict it (judge/stats.py). A deployment's ``restart_command`` gives it
more: before each boot after the first, :func:`restart_server` runs it, sees the server go down
and waits for it to serve its model again. "Go down" is the proof a restart happened: a command
that returns while the old server keeps answering (``kubectl rollout restart`` without waiting)
would have the gate count one boot twice. The command's output goes to a temporary file, not a
pipe, which a server started in the background would hold open, keeping :func:`subprocess.run`
waiting.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server.http_json import fetch_served_models
from pytest_kimiperf.server.process import ServerHandle, bearer, check_health, check_ready

_POLL_S = 0.2
_HEALTH_TIMEOUT_S = 2.0
_OUTPUT_TAIL = 600


@dataclass(frozen=True)
class Restart:
    """What one restart took: the command's own seconds, and the seconds until the server
    served its model again (from the command's start)."""

    command_s: float
    ready_s: float


def restart_server(
    argv: Sequence[str],
    *,
    base_url: str,
    model: str,
    headers: Mapping[str, str],
    deadline_s: float,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    health: Callable[[str, Mapping[str, str], float], str | None] = check_health,
    ready: Callable[[str, str, Mapping[str, str], float], str | None] = check_ready,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Restart:
    """Run ``argv``, see the server at ``base_url`` stop answering, and wait until it serves
    ``model`` again; ServerError (naming the command and what was seen) otherwise."""
    shown = shlex.join(argv)
    start = clock()
    went_down = threading.Event()
    stop_watch = threading.Event()

    def watch() -> None:  # /health while the command runs: a quick restart is down only briefly
        while not stop_watch.is_set() and not went_down.is_set():
            if health(base_url, headers, _HEALTH_TIMEOUT_S) is not None:
                went_down.set()
            stop_watch.wait(_POLL_S)

    watcher = threading.Thread(target=watch, name="kimiperf-restart-watch", daemon=True)
    watcher.start()
    with tempfile.TemporaryFile(mode="w+") as output:
        try:
            done = run(list(argv), stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                       timeout=deadline_s, check=False)
        except FileNotFoundError:
            raise ServerError(f"restart_command {shown}: {argv[0]!r} was not found (give its path, or install "
                              "it)") from None
        except subprocess.TimeoutExpired:
            raise ServerError(f"restart_command {shown} did not return within health_deadline_s = "
                              f"{deadline_s:g} s") from None
        finally:
            stop_watch.set()
            watcher.join()
        output.seek(0)
        said = output.read().strip()[-_OUTPUT_TAIL:]
    command_s = clock() - start
    if done.returncode != 0:
        raise ServerError(f"restart_command {shown} exited {done.returncode}" + (f": {said}" if said else ""))
    while not went_down.is_set():
        if health(base_url, headers, _HEALTH_TIMEOUT_S) is not None:
            went_down.set()
            break
        if clock() - start > deadline_s:
            raise ServerError(
                f"restart_command {shown} returned, but {base_url} never stopped answering /health within "
                f"{deadline_s:g} s: the same server process would be measured as another boot. Give a command "
                "that stops the old server before a new one serves (systemctl restart does; for Kubernetes, "
                "delete the pod and wait for the next one)")
        sleep(_POLL_S)
    why = "not polled yet"
    while clock() - start <= deadline_s:
        why = ready(base_url, model, headers, _HEALTH_TIMEOUT_S) or ""
        if not why:
            return Restart(command_s=command_s, ready_s=clock() - start)
        sleep(_POLL_S)
    raise ServerError(f"{base_url} did not serve {model!r} again within health_deadline_s = {deadline_s:g} s after "
                      f"restart_command {shown}: {why}")


def attach_server(settings: Settings, profile: str, *, previous: ServerHandle | None,
                  announce: Callable[[str], None]) -> tuple[ServerHandle, Restart | None]:
    """The handle of the server at ``--kimiperf-server-url`` for ``profile``'s next boot: restarted first
    when this is not the first (``previous``) and the deployment names a restart_command."""
    url = settings.server_url
    assert url is not None
    deployment = settings.deployment
    headers = bearer(settings.api_key)
    restart = None
    if previous is not None and deployment.restart_command:
        announce(f"kimiperf: restarting the attached server for another boot: {shlex.join(deployment.restart_command)}")
        restart = restart_server(deployment.restart_command, base_url=url, model=previous.model,
                                 headers=headers, deadline_s=deployment.health_deadline_s)
        announce(f"kimiperf: {url} serves {previous.model!r} again, {restart.ready_s:.1f} s after the restart command "
            f"started (the command took {restart.command_s:.1f} s)")
    model = deployment.served_model_name or served_model(url, headers, deployment=deployment.name)
    why_not = check_ready(url, model, headers, timeout_s=5.0)
    if why_not:
        served = fetch_served_models(url, headers)
        if served and model not in served:
            # Measuring another model silently would judge it against this deployment's floors
            # and baselines.
            raise ServerError(
                f"--kimiperf-server-url {url} serves {', '.join(repr(m) for m in served)}, but deployment "
                f"{deployment.name} names model {model!r}: attach to the server of that model, choose the "
                "deployment that names the served one (--kimiperf-deployment), or leave model and served_model_name out "
                "of an attach-only deployment so the served one is taken")
        raise ServerError(f"--kimiperf-server-url {url} is not ready for deployment {deployment.name} "
                          f"(model {model!r}): {why_not}")
    handle = ServerHandle(base_url=url, model=model, deployment=deployment.name, profile=profile, log_path=None,
                          external=True, api_key=settings.api_key)
    return handle, restart


def served_model(url: str, headers: Mapping[str, str], *, deployment: str) -> str:
    """The model an attached server serves, for a deployment that names none: the one
    ``/v1/models`` lists (a server of several must be told which, by served_model_name)."""
    served = fetch_served_models(url, headers)
    if len(served) == 1:
        return served[0]
    if not served:
        raise ServerError(f"--kimiperf-server-url {url} lists no model at /v1/models, and deployment {deployment} names none "
                          "(served_model_name): is it a vLLM OpenAI-compatible server, and is it ready?")
    raise ServerError(f"--kimiperf-server-url {url} serves {', '.join(repr(m) for m in served)}; deployment {deployment} "
                      "names none: set served_model_name in its table to the one to measure")
