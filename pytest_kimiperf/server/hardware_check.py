"""Whether this host can run a deployment: enough of the right GPUs, room beside the weight cache,
and links that suit the NCCL profiles asked for.

Pure functions of the deployment and the GPU facts a query found (``gpu.probe_gpus``,
``gpu.query_topology``): the caller asks the driver once per run and passes the answers in, so
every rule here is tested on recorded nvidia-smi outputs (``tests/data/gpu``).  A server we do
not boot (``--server-url``) is the caller's to skip: it needs no check.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.config.nccl.values import validate_profile
from pytest_kimiperf.errors import HardwareMissingError
from pytest_kimiperf.server.gpu import GpuProbe, HardwareRequirement, check_hardware
from pytest_kimiperf.server.nvidia_smi import GpuInfo, Topology
from pytest_kimiperf.server.weight_cache import check_fit, memory_fit, why_not_used


def hardware_problem(deployment: Deployment, probe: GpuProbe) -> str | None:
    """Why this host cannot run ``deployment`` (GPUs missing, or the weight cache would leave an
    engine no room on them), in one message; None when it can or the deployment runs on CPU."""
    if not deployment.needs_gpus:
        return None
    try:
        check_hardware(
            HardwareRequirement(deployment.gpu_count, deployment.gpu_name_contains), probe.gpus,
            deployment=deployment.name, unavailable_reason=probe.absence_reason(),
        )
        check_weight_cache_fit(deployment, probe.gpus)
    except HardwareMissingError as exc:
        return str(exc)
    return None


def check_weight_cache_fit(deployment: Deployment, gpus: Sequence[GpuInfo]) -> None:
    """HardwareMissingError before any boot when the weight-cache daemons and an engine cannot
    share the smallest GPU (weight_cache.py); nothing to check without GPUs, without the cache,
    or while the checkpoint is not on this host yet."""
    if not gpus or why_not_used(
        setting=deployment.weight_cache, gpu_count=deployment.gpu_count, command=list(deployment.command)
    ):
        return
    fit = memory_fit(deployment.model, deployment.tensor_parallel_size, list(deployment.command),
                     min(g.memory_total_mib for g in gpus))
    if fit is not None:
        check_fit(fit)


def topology_warnings(profiles: Iterable[NcclProfile], topology: Topology | None) -> list[str]:
    """The profile warnings that depend on the hardware, which configure-time validation could
    not know: an explicit LL128 on a host whose GPUs talk over PCIe only.  None for
    ``topology`` (no nvidia-smi to ask) gives no warning."""
    if topology is None:
        return []
    pcie_only = not topology.nvlink
    return [w for profile in profiles for w in validate_profile(profile, pcie_only=pcie_only) if "LL128" in w]


__all__ = ["check_weight_cache_fit", "hardware_problem", "topology_warnings"]
