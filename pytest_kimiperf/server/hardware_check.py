"""Whether this host can run a deployment: enough of the right GPUs, room beside the weight cache,
and links that suit the NCCL profiles asked for.

Each check takes the deployment and the query that finds the GPU facts (``gpu.probe_gpus``,
``gpu.query_topology`` by default), and asks it only when the answer matters: never for a
server we do not boot (``--kimiperf-server-url``, ``external``) nor for a CPU deployment.  Passing a
query that returns recorded facts makes every rule here testable on a host without GPUs
(``tests/data/gpu``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.config.nccl.values import validate_profile
from pytest_kimiperf.errors import ConfigError, HardwareMissingError, KimiperfError
from pytest_kimiperf.server.gpu import GpuProbe, HardwareRequirement, check_hardware, probe_gpus, query_topology
from pytest_kimiperf.server.nvidia_smi import GpuInfo, Topology
from pytest_kimiperf.server.weight_cache import check_fit, memory_fit, why_not_used

# How long one driver query may take before it reads as "no answer".
QUERY_TIMEOUT_S = 10.0


def _probe_host() -> GpuProbe:
    return probe_gpus(timeout_s=QUERY_TIMEOUT_S)


def _host_topology() -> Topology | None:
    return query_topology(timeout_s=QUERY_TIMEOUT_S)


def hardware_problem(
    deployment: Deployment, *, external: bool = False, control: bool = False,
    probe: Callable[[], GpuProbe] = _probe_host,
) -> str | None:
    """Why this host cannot run ``deployment`` (GPUs missing, or the weight cache would leave an
    engine no room on them), in one message; None when it can, when it runs on CPU, or when the
    server is ``external`` (not ours to boot). Under ``control`` (--kimiperf-control) no daemon
    holds the weights."""
    if external or not deployment.needs_gpus:
        return None
    found = probe()
    try:
        check_hardware(
            HardwareRequirement(deployment.gpu_count, deployment.gpu_name_contains), found.gpus,
            deployment=deployment.name, unavailable_reason=found.absence_reason(),
        )
        check_weight_cache_fit(deployment, found.gpus, control=control)
    except HardwareMissingError as exc:
        return str(exc)
    return None


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
    """The profile warnings that depend on the hardware, which configure-time validation could
    not know: an explicit LL128 on a host whose GPUs talk over PCIe only, and an algorithm list
    that leaves a collective vLLM runs nothing this host offers (values.enabled_choices).  No warning where
    nvidia-smi is absent or cannot answer: the perf tests' own hardware check says so, at setup."""
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


__all__ = ["QUERY_TIMEOUT_S", "check_weight_cache_fit", "hardware_problem", "topology_warnings"]
