"""Whether this host can run a deployment: enough of the right GPUs, room beside the weight cache,
free memory once the sweep has ended what killed runs left, and links that suit the NCCL profiles
asked for.

Each check asks the GPU query it is given (``gpu.probe_gpus`` by default) only when the answer
matters: never for a server we do not boot nor a CPU deployment; a query of recorded facts makes
every rule testable without GPUs (``tests/data/gpu``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.config.nccl.values import validate_profile
from pytest_kimiperf.errors import ConfigError, HardwareMissingError, KimiperfError
from pytest_kimiperf.server.gpu import (
    GpuProbe,
    HardwareRequirement,
    check_hardware,
    probe_gpus,
    query_topology,
    visible_nvml_indices,
)
from pytest_kimiperf.server.gpu_memory import DEVICE_TOLERANCE_MIB, GpuHolders, gpu_holders, gpu_memory_used_mib
from pytest_kimiperf.server.nvidia_smi import GpuInfo, Topology
from pytest_kimiperf.server.weight_cache import check_fit, gpu_memory_utilization, memory_fit, why_not_used

# How long one driver query may take before it reads as "no answer".
QUERY_TIMEOUT_S = 10.0


_probe_host = partial(probe_gpus, timeout_s=QUERY_TIMEOUT_S)
_host_topology = partial(query_topology, timeout_s=QUERY_TIMEOUT_S)


def deployment_gpus(deployment: Deployment,
                    probe: Callable[[], GpuProbe] = _probe_host) -> tuple[GpuProbe, list[GpuInfo], str | None]:
    """What the probe found, the GPUs the server can use (CUDA_VISIBLE_DEVICES as it gets it: the
    shell's, then the deployment's env; NVML ignores it) and, where that leaves fewer than the host
    has, a phrase saying so."""
    found = probe()
    visible = {**os.environ, **deployment.env}.get("CUDA_VISIBLE_DEVICES")
    indices = visible_nvml_indices(visible, len(found.gpus), gpus=lambda: found.gpus)
    usable = [gpu for gpu in found.gpus if gpu.index in indices]
    scope = (f"CUDA_VISIBLE_DEVICES={visible!r} leaves the server {len(usable)} of the host's {len(found.gpus)}"
             if visible is not None and len(usable) < len(found.gpus) else None)
    return found, usable, scope


def hardware_problem(
    deployment: Deployment, *, external: bool = False, control: bool = False,
    probe: Callable[[], GpuProbe] = _probe_host,
) -> str | None:
    """Why this host cannot run ``deployment`` (GPUs missing or of another kind, or the weight
    cache would leave an engine no room), in one message; None when it can, on CPU, or for an
    ``external`` server. Free memory is judged after the sweep (:func:`await_free_memory`): what
    holds it may be a killed run's processes."""
    if external or not deployment.needs_gpus:
        return None
    found, usable, scope = deployment_gpus(deployment, probe)
    requirement = HardwareRequirement(deployment.gpu_count, deployment.gpu_name_contains)
    try:
        check_hardware(requirement, usable, deployment=deployment.name, unavailable_reason=found.absence_reason(),
                       scope=scope)
        check_weight_cache_fit(deployment, usable, control=control)
    except HardwareMissingError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class Shortfall:
    """One GPU the server will take with less free than vLLM asks at startup."""

    gpu: GpuInfo
    free_mib: int
    need_mib: int


def memory_shortfalls(deployment: Deployment, gpus: Sequence[GpuInfo], used_mib: Mapping[int, int]) -> list[Shortfall]:
    """The GPUs the server will take (the first ``gpu_count`` of ``gpus``, in CUDA's order) with less
    free than vLLM asks at startup: total x --gpu-memory-utilization (vLLM 0.32 v1/worker/utils.py
    request_memory, "Free memory on device ... is less than desired GPU memory utilization"). A GPU
    whose use is not known is not judged."""
    share = gpu_memory_utilization(deployment.command)
    found = [Shortfall(gpu, gpu.memory_total_mib - used_mib[gpu.index], math.ceil(gpu.memory_total_mib * share))
             for gpu in gpus[:deployment.gpu_count] if gpu.index in used_mib]
    return [short for short in found if short.free_mib < short.need_mib]


def check_free_memory(deployment: Deployment, gpus: Sequence[GpuInfo], used_mib: Mapping[int, int],
                      holders: GpuHolders | None = None) -> None:
    """HardwareMissingError when one of the GPUs the server will take has less free than vLLM asks
    (:func:`memory_shortfalls`), naming per GPU what holds it: each process (pid, name, MiB) and the
    memory no listed process accounts for."""
    short = memory_shortfalls(deployment, gpus, used_mib)
    if not short:
        return
    share = gpu_memory_utilization(deployment.command)
    named = "; ".join(_shortfall_line(s, used_mib, holders) for s in short)
    raise HardwareMissingError(
        f"deployment {deployment.name!r}: {named} (--gpu-memory-utilization {share:g} of each GPU must be free "
        "when the engine starts). These are no processes of an earlier kimiperf run (the sweep ended those), so "
        "they are never signalled: end them (`nvidia-smi --query-compute-apps=pid,process_name,used_memory "
        "--format=csv`), choose free GPUs with CUDA_VISIBLE_DEVICES, or lower --gpu-memory-utilization in a "
        "deployment that extends this one.")


def _shortfall_line(short: Shortfall, used_mib: Mapping[int, int], holders: GpuHolders | None) -> str:
    gpu = short.gpu
    line = f"GPU {gpu.index} ({gpu.name}) has {short.free_mib} of {gpu.memory_total_mib} MiB free, vLLM asks {short.need_mib}"
    if holders is None:
        return line
    listed = holders.on(gpu.index)
    parts = [holder.describe() for holder in listed]
    unlisted = used_mib[gpu.index] - holders.known_mib_on(gpu.index)
    if unlisted > DEVICE_TOLERANCE_MIB:
        # A holder NVML gave no figure for may hold some of it: the words must not say none does.
        who = "no listed process is known to hold" if any(h.mib is None for h in listed) else "no listed process holds"
        parts.append(f"{unlisted} MiB that {who} (another container's process, or memory the "
                     "driver has not given back)")
    return line + (f": held by {', '.join(parts)}" if parts else "")


def await_free_memory(
    deployment: Deployment, gpus: Sequence[GpuInfo], *, deadline_s: float, poll_s: float = 0.5,
    used: Callable[[], Mapping[int, int]] = gpu_memory_used_mib, holders: Callable[[], GpuHolders] = gpu_holders,
    announce: Callable[[str], None] = lambda line: None,
) -> dict[int, int]:
    """Before the first boot, after the sweep: each GPU's MiB used, once every GPU the server will
    take has the room vLLM asks. Memory that no live process holds may still be coming back (a
    swept engine's context the driver is tearing down): it is waited for, up to ``deadline_s``.
    Memory that live processes hold is theirs (the sweep ended every process of ours): the check
    fails at once, naming them per GPU (HardwareMissingError)."""
    end = time.monotonic() + deadline_s
    started = time.monotonic()
    while True:
        now = dict(used())
        short = memory_shortfalls(deployment, gpus, now)
        if not short:
            if time.monotonic() - started > poll_s:
                announce(f"GPU memory came back after {time.monotonic() - started:.1f} s")
            return now
        held = holders()
        # NVML lists live contexts only (in any namespace): memory beyond them has no owner left.
        # A holder without a figure explains nothing: its memory is waited for like an owner's gone.
        waiting = any(now[s.gpu.index] - held.known_mib_on(s.gpu.index) > DEVICE_TOLERANCE_MIB
                      for s in short)
        if not waiting or time.monotonic() >= end:
            check_free_memory(deployment, gpus, now, held)
        time.sleep(max(0.0, min(poll_s, end - time.monotonic())))


def check_weight_cache_fit(deployment: Deployment, gpus: Sequence[GpuInfo], *, control: bool = False) -> None:
    """HardwareMissingError before any boot when the weight-cache daemons and an engine cannot
    share the smallest GPU (weight_cache.py); nothing to check without GPUs, without the cache,
    or while the checkpoint is not on this host yet."""
    if not gpus or why_not_used(
        setting=deployment.weight_cache, gpu_count=deployment.gpu_count, command=list(deployment.command),
        model=deployment.model, quantization=deployment.quantization, nodes=max(1, len(deployment.nodes)),
        control=control,
    ):
        return
    fit = memory_fit(deployment.model, deployment.tensor_parallel_size, list(deployment.command),
                     min(g.memory_total_mib for g in gpus))
    if fit is not None:
        check_fit(fit)


def topology_warnings(
    deployment: Deployment,
    profiles: Iterable[NcclProfile],
    *,
    external: bool = False,
    topology: Callable[[], Topology | None] = _host_topology,
) -> list[str]:
    """The profile warnings configure-time validation could not know: an explicit LL128 on a
    PCIe-only host, and an algorithm list that leaves a collective vLLM runs nothing this host
    offers (values.enabled_choices). None where nvidia-smi cannot answer (the hardware check says so)."""
    if external or not deployment.needs_gpus:
        return []
    try:
        links = topology()
    except KimiperfError:
        return []
    if links is None:
        return []
    pcie_only = not links.nvlink
    found: list[str] = []
    for profile in profiles:
        try:
            found += [w for w in validate_profile(profile, pcie_only=pcie_only) if "LL128" in w]
        except ConfigError as exc:
            # Valid where the hardware was unknown (configure time), fatal on this host: an
            # algorithm list that leaves a collective vLLM runs nothing it can use here (NVLS
            # on a PCIe node). Said before any boot, which would fail with ncclInvalidUsage.
            found.append(f"{exc}; this profile's server cannot serve on this host")
    return found
