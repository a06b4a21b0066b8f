"""Which NVIDIA GPUs this host has and how they are linked (who holds their memory: gpu_memory.py).

Two sources, tried in order: NVML through ``pynvml`` (distribution ``nvidia-ml-py``), then the
``nvidia-smi`` command (``ask_driver`` is that order, written once).  On a host with neither (the
CPU CI machines) every query answers "no GPU" within milliseconds: NVML fails to load its shared
library and ``nvidia-smi`` is not on PATH, so nothing waits on a timeout.

Reading what nvidia-smi prints is ``nvidia_smi.py``'s job, tested on recorded outputs.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pytest_kimiperf.errors import ConfigError, HardwareMissingError, KimiperfError
from pytest_kimiperf.server.nvidia_smi import (
    QUERY_GPU_FIELDS,
    GpuInfo,
    Topology,
    parse_cuda_version,
    parse_query_gpu_csv,
    parse_topology,
)

_MIB = 1024 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuProbe:
    """What a GPU query found, which source answered, and why a source gave nothing."""

    gpus: tuple[GpuInfo, ...]
    source: str
    notes: tuple[str, ...] = ()

    def absence_reason(self) -> str:
        """Say why no GPU was found, for error messages ("nvidia-smi not found; NVML: ...")."""
        return "; ".join(self.notes) if self.notes else f"{self.source} reported 0 GPUs"


@dataclass(frozen=True)
class HardwareRequirement:
    """The GPUs a deployment needs; ``gpu_count=0`` means it runs on CPU."""

    gpu_count: int
    gpu_name_contains: str | None = None
    min_memory_mib: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int) or self.gpu_count < 0:
            raise ConfigError(f"gpu_count must be an integer >= 0, got {self.gpu_count!r}")
        name, mib = self.gpu_name_contains, self.min_memory_mib
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigError(f"gpu_name_contains must be a non-empty string or None, got {name!r}")
        if mib is not None and (isinstance(mib, bool) or not isinstance(mib, int) or mib <= 0):
            raise ConfigError(f"min_memory_mib must be a positive integer or None, got {mib!r}")

    def matches(self, gpu: GpuInfo) -> bool:
        """True if this one GPU is of the kind the deployment needs."""
        if self.gpu_name_contains and self.gpu_name_contains.lower() not in gpu.name.lower():
            return False
        return self.min_memory_mib is None or gpu.memory_total_mib >= self.min_memory_mib

    def describe(self) -> str:
        """Say what is needed, e.g. ``8x NVIDIA GPU whose name contains 'RTX PRO 6000'``."""
        text = f"{self.gpu_count}x NVIDIA GPU"
        if self.gpu_name_contains:
            text += f" whose name contains {self.gpu_name_contains!r}"
        if self.min_memory_mib is not None:
            text += f" with at least {self.min_memory_mib} MiB each"
        return text


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_failures(pynvml: Any) -> tuple[type[BaseException], ...]:
    """What an NVML call raises when the GPU, driver or library cannot answer.

    ``NVMLLibraryMismatchError`` is a plain ``Exception`` in pynvml, not an ``NVMLError``: its
    ``throwOnVersionMismatch`` raises it where the driver's libnvidia-ml lacks the versioned
    function a wrapper calls (nvidia-ml-py 13.615 wraps nvmlDeviceGetComputeRunningProcesses,
    which calls ``..._v3``, so a driver older than the bindings hits it)."""
    mismatch = getattr(pynvml, "NVMLLibraryMismatchError", None)
    return (pynvml.NVMLError,) if mismatch is None else (pynvml.NVMLError, mismatch)


def _load_nvml(notes: list[str]) -> Any | None:
    """Import pynvml and initialise NVML; None (with a note saying why) if either fails."""
    try:
        import pynvml  # optional dependency (extra "gpu"): imported only when asked
    except ImportError:
        notes.append("NVML: nvidia-ml-py is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except nvml_failures(pynvml) as error:
        notes.append(f"NVML: {error}")
        return None
    return pynvml


def _nvml_optional(pynvml: Any, getter: Callable[..., Any], *args: Any) -> Any | None:
    try:
        return getter(*args)
    except nvml_failures(pynvml):
        return None


def _nvml_gpus(pynvml: Any) -> list[GpuInfo]:
    driver = _text(pynvml.nvmlSystemGetDriverVersion())
    # NVML encodes the CUDA driver API version as 1000*major + 10*minor (nvml.h,
    # nvmlSystemGetCudaDriverVersion), e.g. 12040 for 12.4.
    cuda_raw = _nvml_optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion)
    cuda = None if cuda_raw is None else f"{cuda_raw // 1000}.{(cuda_raw % 1000) // 10}"
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _nvml_optional(pynvml, pynvml.nvmlDeviceGetUUID, handle)
        gpus.append(
            GpuInfo(
                index=index,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                uuid=None if uuid is None else _text(uuid),
                memory_total_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB,
                driver_version=driver,
                cuda_version=cuda,
                pcie_gen=_nvml_optional(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkGeneration, handle),
                pcie_width=_nvml_optional(pynvml, pynvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
                mig_mode=_nvml_mig_mode(pynvml, handle),
            )
        )
    return gpus


def _nvml_mig_mode(pynvml: Any, handle: Any) -> str | None:
    """The current MIG mode (nvmlDeviceGetMigMode: [current, pending]); None where the GPU has
    no MIG (NVML_ERROR_NOT_SUPPORTED) or the library predates it."""
    getter = getattr(pynvml, "nvmlDeviceGetMigMode", None)
    modes = _nvml_optional(pynvml, getter, handle) if getter is not None else None
    if not modes:
        return None
    return "Enabled" if modes[0] == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1) else "Disabled"


def _run_smi(smi: str, args: Sequence[str], timeout_s: float) -> str:
    """Run nvidia-smi; raise KimiperfError naming the command on timeout or failure."""
    command = [smi, *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise KimiperfError(f"{' '.join(command)} did not answer within {timeout_s:g} s") from None
    except OSError as error:
        raise KimiperfError(f"{' '.join(command)} could not run: {error}") from None
    if done.returncode != 0:
        # e.g. "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        message = (done.stdout + done.stderr).strip().splitlines()
        raise KimiperfError(
            f"{' '.join(command)} exited with {done.returncode}: {message[0] if message else 'no output'}"
        )
    return done.stdout


@dataclass(frozen=True)
class DriverAnswer(Generic[_T]):
    """What the first source to answer said, and why each source before it did not."""

    value: _T | None
    source: str  # "NVML", "nvidia-smi", or "none" when neither answered
    nvml_notes: tuple[str, ...] = ()
    smi_note: str | None = None
    smi_on_path: bool = False

    @property
    def notes(self) -> tuple[str, ...]:
        """Why NVML, then nvidia-smi, gave nothing, in that order."""
        return self.nvml_notes + ((self.smi_note,) if self.smi_note else ())


def ask_driver(
    nvml_query: Callable[[Any], _T], smi_query: Callable[[str], _T]
) -> DriverAnswer[_T]:
    """Ask NVML (``nvml_query(pynvml)``), else nvidia-smi (``smi_query(path_to_nvidia_smi)``); an
    NVML error or a ``KimiperfError`` from nvidia-smi becomes a note, any other error is raised."""
    notes: list[str] = []
    pynvml = _load_nvml(notes)
    if pynvml is not None:
        try:
            return DriverAnswer(value=nvml_query(pynvml), source="NVML")
        except nvml_failures(pynvml) as error:
            notes.append(f"NVML: {error}")
        finally:
            pynvml.nvmlShutdown()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return DriverAnswer(value=None, source="none", nvml_notes=tuple(notes),
                            smi_note="nvidia-smi not found on PATH")
    try:
        value = smi_query(smi)
    except KimiperfError as error:
        return DriverAnswer(value=None, source="none", nvml_notes=tuple(notes), smi_note=str(error),
                            smi_on_path=True)
    return DriverAnswer(value=value, source="nvidia-smi", nvml_notes=tuple(notes), smi_on_path=True)


def probe_gpus(timeout_s: float = 10.0) -> GpuProbe:
    """Find this host's NVIDIA GPUs through NVML, else nvidia-smi, saying why when there are none
    (every host GPU, whatever CUDA_VISIBLE_DEVICES says: NVML ignores it)."""

    def from_smi(smi: str) -> list[GpuInfo]:
        text = _run_smi(
            smi, [f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", "--format=csv,noheader,nounits"], timeout_s
        )
        cuda = parse_cuda_version(_run_smi(smi, [], timeout_s)) if text.strip() else None
        return parse_query_gpu_csv(text, cuda_version=cuda)

    answer = ask_driver(_nvml_gpus, from_smi)
    return GpuProbe(gpus=tuple(answer.value or ()), source=answer.source, notes=answer.notes)


def query_gpus(timeout_s: float = 10.0) -> list[GpuInfo]:
    """List this host's NVIDIA GPUs (NVML, else nvidia-smi); [] on a host without them."""
    return list(probe_gpus(timeout_s).gpus)


def query_topology(timeout_s: float = 10.0) -> Topology | None:
    """Read ``nvidia-smi topo -m``; None where nvidia-smi is absent, KimiperfError (naming the
    command and what it printed) where it fails or prints no matrix."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    text = _run_smi(smi, ["topo", "-m"], timeout_s)
    try:
        return parse_topology(text)
    except ValueError as error:
        # gVisor without PCI sysfs prints the header, then "Failed to run topology matrix"
        # (google/gvisor#14407, tests/data/gpu/topo_8x_gvisor_failed.txt).
        raise KimiperfError(f"{smi} topo -m printed no link matrix: {error}") from None


def host_topology(gpus: Sequence[GpuInfo], timeout_s: float = 10.0) -> tuple[Topology | None, str | None]:
    """The GPUs' link matrix where there are GPUs, with why it is missing where it could not be
    read (the fingerprint then says ``unknown`` for the interconnect instead of failing)."""
    if not gpus:
        return None, None
    try:
        return query_topology(timeout_s), None
    except KimiperfError as error:
        return None, str(error)


def visible_nvml_indices(
    visible: str | None, count: int, gpus: Callable[[], Sequence[GpuInfo]] = lambda: query_gpus()
) -> tuple[int, ...]:
    """The NVML indices of the first ``count`` GPUs a CUDA process sees under
    ``CUDA_VISIBLE_DEVICES=visible`` (None: unset, every GPU); NVML itself ignores the variable.

    CUDA's rules (CUDA C Programming Guide, "CUDA Environment Variables"): a comma-separated list
    of indices or UUIDs (``GPU-...``, a unique prefix is enough); the list ends at the first entry
    that names no device, and an empty value hides every GPU. Indices are taken as NVML's, which
    holds where CUDA_DEVICE_ORDER=PCI_BUS_ID and on hosts of one GPU model (CUDA's default
    FASTEST_FIRST order breaks ties by PCI bus id). ``gpus`` is asked only for UUID entries. A
    ``MIG-`` entry names no whole GPU: the list ends there.
    """
    if visible is None:
        return tuple(range(count))
    found: list[int] = []
    known: Sequence[GpuInfo] | None = None
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit():
            index = int(entry)
        elif entry.startswith("GPU-"):
            known = gpus() if known is None else known
            matching = [g.index for g in known if g.uuid is not None and g.uuid.startswith(entry)]
            if len(matching) != 1:
                break
            index = matching[0]
        else:  # "", a MIG instance, a typo, "-1": CUDA stops here
            break
        if index in found:
            break  # named twice: counted once, and nothing after it is trusted
        found.append(index)
    return tuple(found[:count])


def check_hardware(
    req: HardwareRequirement,
    gpus: Sequence[GpuInfo],
    *,
    deployment: str,
    unavailable_reason: str | None = None,
    scope: str | None = None,
) -> None:
    """Raise HardwareMissingError, in one message, unless ``gpus`` satisfy the deployment's need;
    ``scope`` says which of the host's GPUs ``gpus`` are (what CUDA_VISIBLE_DEVICES leaves)."""
    if req.gpu_count == 0:
        return
    matching = [gpu for gpu in gpus if req.matches(gpu) and not gpu.in_mig_mode]
    if len(matching) >= req.gpu_count:
        return
    split = [gpu for gpu in gpus if req.matches(gpu) and gpu.in_mig_mode]
    if split:
        # A GPU in MIG mode shows CUDA only its MIG instances (none until they are created), so
        # vLLM cannot place a tensor-parallel rank on it; say so instead of "GPUs missing".
        indices = ",".join(str(gpu.index) for gpu in split)
        raise HardwareMissingError(
            f"deployment {deployment!r} needs {req.describe()}; {len(split)} of the matching GPUs "
            f"(index {indices}: {split[0].name}) are in MIG mode (mig.mode.current = Enabled), which "
            f"leaves {len(matching)} whole GPU(s). Disable MIG on them (`sudo nvidia-smi -i {indices} "
            "-mig 0`, then reset the GPUs or reboot) or run where whole GPUs are free."
        )
    if not gpus:
        found = "found no NVIDIA GPU" + (f" ({unavailable_reason})" if unavailable_reason else "")
    else:
        kinds = Counter((gpu.name, gpu.memory_total_mib) for gpu in gpus)
        found = "found " + ", ".join(f"{count}x {name} ({mib} MiB)" for (name, mib), count in kinds.items())
        if len(matching) != len(gpus):
            found += f", of which {len(matching)} qualify"
    found += f" ({scope})" if scope else ""
    whole = [gpu for gpu in gpus if not gpu.in_mig_mode]
    if req.gpu_name_contains and len(whole) >= req.gpu_count:
        raise HardwareMissingError(
            f"deployment {deployment!r} needs {req.describe()}; {found}. {_own_gpus_recipe(deployment, whole[0])}")
    raise HardwareMissingError(
        f"deployment {deployment!r} needs {req.describe()}; {found}. "
        "Run here with --kimiperf-deployment tiny-cpu, or on a host that has those GPUs (a deployment that "
        "runs on the CPU says gpu_count = 0; unless given, gpu_count follows its parallel layout)."
    )


def _own_gpus_recipe(deployment: str, gpu: GpuInfo) -> str:
    """How to run ``deployment`` on GPUs of another name: a table that extends it."""
    name = gpu.name.removeprefix("NVIDIA ").strip()
    slug = "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())
    return (f"There are enough GPUs here, of another kind: to run it on them, extend it in pyproject.toml with "
            f"[tool.kimiperf.deployments.{deployment}-{slug}] extends = \"{deployment}\" gpu_name_contains = "
            f"\"{name}\" and run with --kimiperf-deployment {deployment}-{slug} (docs/how-to/own-deployment.md, "
            "\"The same model on other GPUs\": check first that the weights fit).")
