"""A measurement under the host watch, taken again while the host is disturbed.

The recorder hands :func:`measure_watched` the scenario's play (one attempt, fresh prompts per
attempt) and the server it measures; the watch (hostwatch.py, and node_watch.py on the nodes
behind a launch template) reads what else used the host meanwhile. A disturbed attempt is
measured again, at most :data:`HOST_RETRIES` times; one disturbed every time makes the run
INVALID (``WatchedRun.busy``). An attached server is measured unwatched: its processes are
unknown here, so on this host they would count as foreign, and on another host this host says
nothing about them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.measure_bounds import HostBounds
from pytest_kimiperf.measure.hostwatch import HostReading, HostWatch
from pytest_kimiperf.measure.invalid import RunInvalid, say_run_invalid
from pytest_kimiperf.measure.node_watch import NodeWatch
from pytest_kimiperf.measure.results import RunResult
from pytest_kimiperf.server.process import ServerHandle

# A measurement the host watch finds disturbed is measured again this many times before the
# run is INVALID: one burst of a cron job should cost a repeat, a busy host a verdict.
HOST_RETRIES = 2


@dataclass(frozen=True)
class HostBusy:
    """The host watch found every attempt disturbed: the last attempt's disturbed readings (this
    machine's and its nodes'), the bounds they broke, and how many attempts were made."""

    readings: tuple[HostReading, ...]
    bounds: HostBounds
    attempts: int

    @property
    def foreign_processes(self) -> list[tuple[str, int, str, float]]:
        """(node, pid, name, share of the host's CPU) of the other processes the watch named
        ("" for this machine)."""
        return [(r.node, p.pid, p.name, p.cpu_share) for r in self.readings for p in r.top_foreign]


InvalidReason = RunInvalid | HostBusy


def say_invalid(reason: InvalidReason) -> str:
    """The sentence a report prints for why a measurement was not judged."""
    if isinstance(reason, HostBusy):
        return ("; ".join(r.describe_busy(reason.bounds) for r in reason.readings)
                + f"; measured {reason.attempts} times, disturbed every time: no verdict from a busy host")
    return say_run_invalid(reason)


def host_busy(readings: Sequence[HostReading], bounds: HostBounds, attempts: int) -> HostBusy | None:
    """The readings that broke a bound, as a HostBusy; None when none did."""
    disturbed = tuple(r for r in readings if r.disturbances(bounds))
    return HostBusy(disturbed, bounds, attempts) if disturbed else None


@dataclass
class WatchedRun:
    """The run, every attempt's host reading, the last attempt's node readings, and why the host
    was too busy for a verdict (None: an attempt was quiet, or nothing was watched)."""

    run: RunResult
    readings: list[HostReading] = field(default_factory=list)
    node_readings: list[HostReading] = field(default_factory=list)
    nodes_here: list[str] = field(default_factory=list)  # nodes behind a template that are this machine
    busy: HostBusy | None = None

    def describe(self) -> str | None:
        """The test report's line about the watch (None when nothing was watched)."""
        if not self.readings:
            return None
        r = self.readings[-1]
        psi = ", ".join(f"PSI {k.replace('_', ' ')} {v * 100:.0f}%" for k, v in sorted(r.psi.items()))
        cpu = ("; ".join(r.blind) if r.blind else
               f"foreign CPU {r.foreign_cpu_share * 100:.0f}% of the host, steal {r.steal_share * 100:.0f}%")
        return (f"host watch ({len(self.readings)} attempt(s)): {cpu}" + (f", {psi}" if psi else "")
                + "".join(f"; node {n.node}: foreign CPU {n.foreign_cpu_share * 100:.0f}%" for n in self.node_readings)
                + "".join(f"; node {name}: this machine, read above" for name in self.nodes_here)
                + "".join(f"; {line}" for line in r.own_throttling())
                + "".join(f"; {gpu.pcie_shortfall()}" for gpu in r.gpus if gpu.pcie_shortfall()))


def measure_watched(play: Callable[[int], RunResult], server: ServerHandle, deployment: Deployment, *,
                    first: Callable[[], RunResult] | None = None) -> WatchedRun:
    """``play(attempt)`` under the host watch until an attempt is quiet (at most 1 +
    HOST_RETRIES attempts). ``first`` takes the first attempt's place (pytest-benchmark's timed
    call of it)."""
    if server.external:
        return WatchedRun(first() if first is not None else play(0))
    bounds = HostBounds.from_mapping(deployment.host_bounds, source=f"deployment {deployment.name} host_bounds")
    watched = WatchedRun(run=None)  # type: ignore[arg-type]  # set by the first attempt
    for attempt in range(1 + HOST_RETRIES):
        nodes = NodeWatch(server.remote_nodes) if server.remote_nodes else None
        if nodes is not None:
            nodes.start()
        here = nodes.here_pids if nodes is not None else set()
        # The watch stops before the next attempt rebinds `here`.
        watch = HostWatch(own_pids=lambda: [*own_pids(server), *here], **gpu_watch(deployment))  # noqa: B023
        watch.start()
        watched.run = first() if attempt == 0 and first is not None else play(attempt)
        reading = watch.stop()
        watched.readings.append(reading)
        watched.node_readings = nodes.stop() if nodes is not None else []
        watched.nodes_here = nodes.here if nodes is not None else []
        watched.busy = host_busy((reading, *watched.node_readings), bounds, attempts=attempt + 1)
        if watched.busy is None:
            return watched
    return watched


def own_pids(server: ServerHandle) -> list[int]:
    """The server's process tree and this client with its worker processes."""
    import psutil

    pids = []
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # The xdist controller only relays reports; other workers' tests are foreign load.
        pids.append(os.getppid())
    # A deployment that spans nodes: its worker nodes on this machine are the server too.
    for root in (server.pid, *server.node_pids, os.getpid()):
        if root is None:
            continue
        try:
            proc = psutil.Process(root)
            pids.append(proc.pid)
            pids.extend(child.pid for child in proc.children(recursive=True))
        except psutil.Error:
            continue
    return pids


def gpu_watch(deployment: Deployment) -> Mapping[str, Any]:
    """NVML and the deployment's GPU indices, where the deployment runs on GPUs."""
    if not deployment.needs_gpus:
        return {}
    try:
        import pynvml
    except ImportError:
        return {}
    from pytest_kimiperf.server.gpu import visible_nvml_indices

    # The server's GPUs: CUDA_VISIBLE_DEVICES as the server gets it (manager.py: the shell's,
    # then the deployment's env), which NVML's indices do not follow.
    visible = {**os.environ, **deployment.env}.get("CUDA_VISIBLE_DEVICES")
    return {"nvml": pynvml, "gpu_indices": visible_nvml_indices(visible, deployment.gpu_count)}


__all__: Sequence[str] = ["HOST_RETRIES", "WatchedRun", "gpu_watch", "measure_watched", "own_pids"]
