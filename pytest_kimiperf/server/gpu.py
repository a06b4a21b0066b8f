"""Which NVIDIA GPUs this host has, how they are linked, and which processes hold their memory.

Two sources, tried in order: NVML through ``pynvml`` (distribution ``nvidia-ml-py``), then the
``nvidia-smi`` command. On a host with neither (the CPU CI machines) every query answers "no GPU"
within milliseconds: NVML fails to load its shared library and ``nvidia-smi`` is not on PATH, so
nothing waits on a timeout.

The text parsers are pure functions, tested against real recorded outputs in ``tests/data/gpu``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kimiperf.errors import ConfigError, HardwareMissingError, KimiperfError, ServerError

_MIB = 1024 * 1024

# The fields the nvidia-smi fallback asks for, in this order.  `pcie.link.*.max` rather than
# `.current`: the current link drops to gen 1 when the GPU idles (nvidia-smi --help-query-gpu:
# "These may be reduced when the GPU is not in use"), so only `max` is a stable property of the
# host.  No --query-gpu field reports the CUDA version; it comes from the `nvidia-smi` banner.
QUERY_GPU_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "driver_version",
    "pcie.link.gen.max",
    "pcie.link.width.max",
)
QUERY_COMPUTE_APPS_FIELDS: tuple[str, ...] = ("pid", "used_memory")

# Aliases nvidia-smi accepts for the same property (nvidia-smi --help-query-gpu / -compute-apps);
# a header row prints the long form (`used_gpu_memory [MiB]` for a `used_memory` query).
_GPU_FIELD_ALIASES: Mapping[str, str] = {"gpu_name": "name", "gpu_uuid": "uuid"}
_APP_FIELD_ALIASES: Mapping[str, str] = {"used_gpu_memory": "used_memory", "name": "process_name"}
_APP_FIELDS_KNOWN = frozenset(
    {"timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid", "process_name", "used_memory"}
)
# What nvidia-smi prints for a value a card does not report.
_NOT_AVAILABLE = frozenset({"N/A", "[N/A]", "[Not Supported]", "[Not Found]", "[Unknown Error]", ""})
_UNIT_SUFFIX = re.compile(r"\s+(MiB|%|W|MHz)$")
_HEADER_UNIT = re.compile(r"\s*\[[^\]]*\]$")

# `nvidia-smi topo -m` link codes (from the legend the command prints).  SOC is the pre-2017 name
# of SYS.  NV# is a bonded set of # NVLinks; every other code is a PCIe path.
_PCIE_CODES = frozenset({"PIX", "PXB", "PHB", "NODE", "SYS", "SOC"})
_NVLINK_CODE = re.compile(r"^NV\d+$")
_GPU_LABEL = re.compile(r"^GPU\d+$")
_CUDA_VERSION = re.compile(r"CUDA Version\s*:\s*([^\s|]+)")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver reports it; None where the driver does not say."""

    index: int
    name: str
    uuid: str | None
    memory_total_mib: int
    driver_version: str
    cuda_version: str | None
    pcie_gen: int | None
    pcie_width: int | None


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
class Topology:
    """GPU-to-GPU link codes from ``nvidia-smi topo -m``; ``matrix[i][j]`` links GPU i and j."""

    gpu_labels: tuple[str, ...]
    matrix: tuple[tuple[str, ...], ...]

    @property
    def nvlink(self) -> bool:
        """True if any two GPUs are joined by NVLink (an ``NV#`` cell)."""
        return any(_NVLINK_CODE.match(code) for code in self.link_codes())

    def link_codes(self) -> frozenset[str]:
        """The distinct link codes between different GPUs (the diagonal ``X`` left out)."""
        return frozenset(code for i, row in enumerate(self.matrix) for j, code in enumerate(row) if i != j)

    def describe(self) -> str:
        """One phrase for reports: ``NVLink (NV6)`` or ``PCIe only (SYS)``."""
        codes = ",".join(sorted(self.link_codes())) or "single GPU"
        return f"NVLink ({codes})" if self.nvlink else f"PCIe only ({codes})"


@dataclass(frozen=True)
class HardwareRequirement:
    """The GPUs a deployment needs; ``gpu_count=0`` means it runs on CPU."""

    gpu_count: int
    gpu_name_contains: str | None = None
    min_memory_mib: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gpu_count, bool) or not isinstance(self.gpu_count, int) or self.gpu_count < 0:
            raise ConfigError(f"gpu_count must be an integer >= 0, got {self.gpu_count!r}")
        if self.gpu_name_contains is not None and (
            not isinstance(self.gpu_name_contains, str) or not self.gpu_name_contains.strip()
        ):
            raise ConfigError(
                f"gpu_name_contains must be a non-empty string or None, got {self.gpu_name_contains!r}"
            )
        if self.min_memory_mib is not None and (
            isinstance(self.min_memory_mib, bool)
            or not isinstance(self.min_memory_mib, int)
            or self.min_memory_mib <= 0
        ):
            raise ConfigError(
                f"min_memory_mib must be a positive integer or None, got {self.min_memory_mib!r}"
            )

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


# --------------------------------------------------------------------------- parsers (pure)


def _strip_value(value: str) -> str:
    return _UNIT_SUFFIX.sub("", value.strip())


def _optional_int(value: str, *, what: str) -> int | None:
    value = _strip_value(value)
    if value in _NOT_AVAILABLE:
        return None
    try:
        return int(float(value)) if "." in value else int(value)
    except ValueError:
        raise ValueError(f"{what}: expected a number or N/A, got {value!r}") from None


def _normalize_header(token: str) -> str:
    return _HEADER_UNIT.sub("", token.strip())


def _split_row(line: str, fields: Sequence[str], free_text: Iterable[str]) -> list[str]:
    """Split one CSV row; surplus commas belong to the one free-text field (names may hold commas)."""
    values = [value.strip() for value in line.split(",")]
    surplus = len(values) - len(fields)
    if surplus == 0:
        return values
    spill = [i for i, name in enumerate(fields) if name in set(free_text)]
    if surplus < 0 or len(spill) != 1:
        raise ValueError(f"row has {len(values)} values for {len(fields)} fields {list(fields)}: {line!r}")
    at = spill[0]
    merged = ", ".join(values[at : at + surplus + 1])
    return [*values[:at], merged, *values[at + surplus + 1 :]]


def _gpu_field(name: str) -> str:
    name = name.strip()
    return _GPU_FIELD_ALIASES.get(name, name)


def parse_query_gpu_csv(
    text: str, fields: Sequence[str] = QUERY_GPU_FIELDS, *, cuda_version: str | None = None
) -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=<fields>`` output into GpuInfo rows.

    Accepts ``--format=csv`` (header and units) and ``csv,noheader,nounits``; a header row, when
    present, names the fields and overrides ``fields``.  The query must include ``name``,
    ``memory.total`` and ``driver_version``; ``index``, ``uuid`` and the PCIe link fields are
    optional (missing index: row order).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    wanted = [_gpu_field(name) for name in fields]
    if lines:
        head = [_gpu_field(_normalize_header(token)) for token in lines[0].split(",")]
        if "name" in head and "memory.total" in head:
            wanted, lines = head, lines[1:]
    missing = {"name", "memory.total", "driver_version"} - set(wanted)
    if missing:
        raise ValueError(f"--query-gpu fields {list(wanted)} lack {sorted(missing)}")
    gpus: list[GpuInfo] = []
    for row_number, line in enumerate(lines):
        row = dict(zip(wanted, _split_row(line, wanted, ("name",)), strict=True))
        where = f"--query-gpu row {row_number + 1}"
        memory = _optional_int(row["memory.total"], what=f"{where} memory.total")
        if memory is None:
            raise ValueError(f"{where}: memory.total is not reported ({row['memory.total']!r}): {line!r}")
        index = _optional_int(row["index"], what=f"{where} index") if "index" in row else None
        uuid = _strip_value(row.get("uuid", ""))
        gen = row.get("pcie.link.gen.max", row.get("pcie.link.gen.current", ""))
        width = row.get("pcie.link.width.max", row.get("pcie.link.width.current", ""))
        gpus.append(
            GpuInfo(
                index=row_number if index is None else index,
                name=row["name"],
                uuid=None if uuid in _NOT_AVAILABLE else uuid,
                memory_total_mib=memory,
                driver_version=_strip_value(row["driver_version"]),
                cuda_version=cuda_version,
                pcie_gen=_optional_int(gen, what=f"{where} pcie gen"),
                pcie_width=_optional_int(width, what=f"{where} pcie width"),
            )
        )
    return gpus


def parse_cuda_version(text: str) -> str | None:
    """Read the CUDA version from plain ``nvidia-smi`` or ``nvidia-smi -q`` output; None if absent.

    ``nvidia-smi -q`` prints ``CUDA Version : Not Found`` when no CUDA driver is visible; that
    reads as None, not as a version.
    """
    match = _CUDA_VERSION.search(text)
    if match is None:
        return None
    value = match.group(1).strip()
    return value if re.fullmatch(r"\d+(\.\d+)*", value) else None


def parse_topology(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m`` into the GPU-to-GPU link matrix.

    Columns are found from the header row (tabs or spaces, leading whitespace or not); NIC rows and
    columns, CPU/NUMA affinity and the legend are ignored.  An unknown link code raises ValueError
    rather than being guessed as PCIe.
    """
    lines = text.splitlines()
    header_at = next(
        (
            i
            for i, line in enumerate(lines)
            if (tokens := line.split()) and tokens[0] == "GPU0" and (len(tokens) == 1 or tokens[1] != "X")
        ),
        None,
    )
    if header_at is None:
        raise ValueError(f"no header row starting with GPU0 in nvidia-smi topo -m output: {text[:200]!r}")
    columns: list[str] = []
    for token in lines[header_at].split():
        if token in {"CPU", "NUMA", "GPU"}:
            break
        columns.append(token)
    gpu_columns = [i for i, label in enumerate(columns) if _GPU_LABEL.match(label)]
    labels = tuple(columns[i] for i in gpu_columns)
    rows: dict[str, tuple[str, ...]] = {}
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or not _GPU_LABEL.match(tokens[0]):
            continue
        label, cells = tokens[0], tokens[1 : 1 + len(columns)]
        if len(cells) < len(columns):
            raise ValueError(f"topo row {label} has {len(cells)} cells for {len(columns)} columns: {line!r}")
        for column, code in zip(columns, cells, strict=True):
            known = code in _PCIE_CODES or _NVLINK_CODE.match(code) or (code == "X" and column == label)
            if not known:
                raise ValueError(
                    f"unknown link code {code!r} between {label} and {column} in nvidia-smi topo -m; "
                    "known: X (self), PIX, PXB, PHB, NODE, SYS, SOC, NV#"
                )
        rows[label] = tuple(cells[i] for i in gpu_columns)
    if set(rows) != set(labels):
        raise ValueError(f"topo header names GPUs {list(labels)} but rows are {list(rows)}")
    return Topology(gpu_labels=labels, matrix=tuple(rows[label] for label in labels))


def _app_field(name: str) -> str:
    name = _normalize_header(name)
    return _APP_FIELD_ALIASES.get(name, name)


def parse_compute_apps(text: str, fields: Sequence[str] = QUERY_COMPUTE_APPS_FIELDS) -> dict[int, int]:
    """Parse ``nvidia-smi --query-compute-apps`` into {pid: used MiB}, summed over GPUs.

    Accepts ``--format=csv`` (header and units) and ``csv,noheader,nounits``; a header row names
    the fields.  A pid whose memory reads ``N/A`` is kept with 0 MiB: it still holds a context.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    wanted = [_app_field(name) for name in fields]
    if lines and all(_app_field(token) in _APP_FIELDS_KNOWN for token in lines[0].split(",")):
        wanted, lines = [_app_field(token) for token in lines[0].split(",")], lines[1:]
    if not {"pid", "used_memory"} <= set(wanted):
        raise ValueError(f"--query-compute-apps fields {wanted} need pid and used_memory")
    used: dict[int, int] = {}
    for line in lines:
        if "," not in line:
            # "No running processes found" and similar messages: not data.
            continue
        row = dict(zip(wanted, _split_row(line, wanted, ("process_name",)), strict=True))
        pid = _optional_int(row["pid"], what="--query-compute-apps pid")
        if pid is None:
            raise ValueError(f"--query-compute-apps row without a pid: {line!r}")
        mib = _optional_int(row["used_memory"], what=f"--query-compute-apps used_memory of pid {pid}")
        used[pid] = used.get(pid, 0) + (mib or 0)
    return used


# --------------------------------------------------------------------------- live queries


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _load_nvml(notes: list[str]) -> Any | None:
    """Import pynvml and initialise NVML; None (with a note saying why) if either fails."""
    try:
        import pynvml  # optional dependency (extra "gpu"): imported only when asked
    except ImportError:
        notes.append("NVML: nvidia-ml-py is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        notes.append(f"NVML: {error}")
        return None
    return pynvml


def _nvml_optional(pynvml: Any, getter: Callable[..., Any], *args: Any) -> Any | None:
    try:
        return getter(*args)
    except pynvml.NVMLError:
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
            )
        )
    return gpus


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


def probe_gpus(timeout_s: float = 10.0) -> GpuProbe:
    """Find this host's NVIDIA GPUs through NVML, else nvidia-smi, saying why when there are none.

    All host GPUs are reported, whatever CUDA_VISIBLE_DEVICES says (NVML ignores it).
    """
    notes: list[str] = []
    pynvml = _load_nvml(notes)
    if pynvml is not None:
        try:
            return GpuProbe(gpus=tuple(_nvml_gpus(pynvml)), source="NVML", notes=())
        except pynvml.NVMLError as error:
            notes.append(f"NVML: {error}")
        finally:
            pynvml.nvmlShutdown()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        notes.append("nvidia-smi not found on PATH")
        return GpuProbe(gpus=(), source="none", notes=tuple(notes))
    try:
        text = _run_smi(
            smi, [f"--query-gpu={','.join(QUERY_GPU_FIELDS)}", "--format=csv,noheader,nounits"], timeout_s
        )
        cuda = parse_cuda_version(_run_smi(smi, [], timeout_s)) if text.strip() else None
    except KimiperfError as error:
        notes.append(str(error))
        return GpuProbe(gpus=(), source="none", notes=tuple(notes))
    return GpuProbe(
        gpus=tuple(parse_query_gpu_csv(text, cuda_version=cuda)), source="nvidia-smi", notes=tuple(notes)
    )


def query_gpus(timeout_s: float = 10.0) -> list[GpuInfo]:
    """List this host's NVIDIA GPUs (NVML, else nvidia-smi); [] on a host without them."""
    return list(probe_gpus(timeout_s).gpus)


def query_topology(timeout_s: float = 10.0) -> Topology | None:
    """Read ``nvidia-smi topo -m``; None where nvidia-smi is absent."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    return parse_topology(_run_smi(smi, ["topo", "-m"], timeout_s))


def check_hardware(
    req: HardwareRequirement,
    gpus: Sequence[GpuInfo],
    *,
    deployment: str,
    unavailable_reason: str | None = None,
) -> None:
    """Raise HardwareMissingError, in one message, unless ``gpus`` satisfy the deployment's need.

    ``unavailable_reason`` (``GpuProbe.absence_reason()``) explains an empty ``gpus``.
    """
    if req.gpu_count == 0:
        return
    matching = [gpu for gpu in gpus if req.matches(gpu)]
    if len(matching) >= req.gpu_count:
        return
    if not gpus:
        found = "found no NVIDIA GPU" + (f" ({unavailable_reason})" if unavailable_reason else "")
    else:
        kinds = Counter((gpu.name, gpu.memory_total_mib) for gpu in gpus)
        found = "found " + ", ".join(f"{count}x {name} ({mib} MiB)" for (name, mib), count in kinds.items())
        if len(matching) != len(gpus):
            found += f", of which {len(matching)} qualify"
    raise HardwareMissingError(
        f"deployment {deployment!r} needs {req.describe()}; {found}. "
        "Run here with --deployment tiny-cpu, or on a host that has those GPUs."
    )


def gpu_memory_by_pid(timeout_s: float = 10.0) -> dict[int, int]:
    """Map each pid holding GPU memory to the MiB it holds, summed over GPUs; {} without GPUs.

    Pids are as the driver sees them: the host PID namespace (a process in another container
    shows as ``[Not Found]`` in nvidia-smi).
    """
    notes: list[str] = []
    pynvml = _load_nvml(notes)
    if pynvml is not None:
        try:
            used: dict[int, int] = {}
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    # usedGpuMemory is None where the driver cannot attribute memory (e.g. WDDM).
                    mib = (process.usedGpuMemory or 0) // _MIB
                    used[int(process.pid)] = used.get(int(process.pid), 0) + mib
            return used
        except pynvml.NVMLError as error:
            notes.append(f"NVML: {error}")
        finally:
            pynvml.nvmlShutdown()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    try:
        text = _run_smi(
            smi,
            [f"--query-compute-apps={','.join(QUERY_COMPUTE_APPS_FIELDS)}", "--format=csv,noheader,nounits"],
            timeout_s,
        )
    except KimiperfError as error:
        # A host that has GPUs but cannot say who holds them must not read as "all memory free".
        raise ServerError(
            f"cannot read GPU memory per process: {error}; {'; '.join(notes)}".rstrip("; ")
        ) from None
    return parse_compute_apps(text)


def wait_gpu_memory_freed(
    pids: Iterable[int],
    *,
    deadline_s: float,
    poll_s: float = 1.0,
    probe: Callable[[], Mapping[int, int]] = gpu_memory_by_pid,
) -> None:
    """Wait up to ``deadline_s`` seconds until none of ``pids`` holds GPU memory; else ServerError.

    Ended processes can keep their GPU memory for a while (the driver frees it when the CUDA
    context is torn down), so a new server started at once could fail to allocate.
    """
    watched = frozenset(int(pid) for pid in pids)
    if deadline_s < 0 or poll_s <= 0:
        raise ValueError(
            f"deadline_s must be >= 0 and poll_s > 0, got deadline_s={deadline_s}, poll_s={poll_s}"
        )
    end = time.monotonic() + deadline_s
    while True:
        held = {pid: mib for pid, mib in probe().items() if pid in watched}
        if not held:
            return
        left = end - time.monotonic()
        if left <= 0:
            holders = ", ".join(f"pid {pid} ({mib} MiB)" for pid, mib in sorted(held.items()))
            raise ServerError(
                f"GPU memory still held {deadline_s:g} s after stopping the server: {holders}. "
                "Check `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv` "
                "and end those processes before the next run."
            )
        time.sleep(min(poll_s, left))


__all__ = [
    "QUERY_COMPUTE_APPS_FIELDS",
    "QUERY_GPU_FIELDS",
    "GpuInfo",
    "GpuProbe",
    "HardwareRequirement",
    "Topology",
    "check_hardware",
    "gpu_memory_by_pid",
    "parse_compute_apps",
    "parse_cuda_version",
    "parse_query_gpu_csv",
    "parse_topology",
    "probe_gpus",
    "query_gpus",
    "query_topology",
    "wait_gpu_memory_freed",
]
