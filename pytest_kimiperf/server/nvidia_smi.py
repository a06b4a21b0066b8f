"""What nvidia-smi prints, read into typed facts: GPUs, their links, and who holds their memory.

``GpuInfo`` has the fields of one ``nvidia-smi --query-gpu`` row (NVML fills the same ones, see
``gpu.py``); ``Topology`` is the ``nvidia-smi topo -m`` matrix.  The parsers are pure functions,
tested against real recorded outputs in ``tests/data/gpu``; running the command is ``gpu.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

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
    "mig.mode.current",
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
    # "Enabled" or "Disabled" (nvidia-smi's mig.mode.current; NVML's nvmlDeviceGetMigMode);
    # None where the GPU has no MIG or the driver does not say.
    mig_mode: str | None = None

    @property
    def in_mig_mode(self) -> bool:
        """True when the GPU is split into MIG instances: CUDA then sees no whole GPU here."""
        return self.mig_mode == "Enabled"


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
    """Parse ``nvidia-smi --query-gpu=<fields>`` output (``--format=csv``, whose header names the
    fields, or ``csv,noheader,nounits``) into GpuInfo rows. ``name``, ``memory.total`` and
    ``driver_version`` are required; a missing ``index`` is the row order."""
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
                mig_mode=_mig_mode(row.get("mig.mode.current", "")),
            )
        )
    return gpus


def _mig_mode(value: str) -> str | None:
    """``Enabled``/``Disabled`` as nvidia-smi prints them; ``[N/A]`` (no MIG on this GPU): None."""
    value = _strip_value(value)
    return value if value in ("Enabled", "Disabled") else None


def parse_cuda_version(text: str) -> str | None:
    """The CUDA version in plain ``nvidia-smi`` or ``nvidia-smi -q`` output; None if absent (or
    ``Not Found``, which ``-q`` prints when no CUDA driver is visible)."""
    match = _CUDA_VERSION.search(text)
    if match is None:
        return None
    value = match.group(1).strip()
    return value if re.fullmatch(r"\d+(\.\d+)*", value) else None


def parse_topology(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m`` into the GPU-to-GPU link matrix (NIC rows and columns, CPU/NUMA
    affinity and the legend ignored); an unknown link code is a ValueError, never guessed as PCIe."""
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


def _compute_app_rows(text: str, fields: Sequence[str],
                      need: tuple[str, ...]) -> Iterator[tuple[dict[str, str], int, int | None]]:
    """Each row of ``nvidia-smi --query-compute-apps`` (fields as asked, or as a header names them)
    with its pid and MiB; a memory that reads ``N/A`` is None: the process holds a context of a
    size the driver does not say (0 would read as "holds nothing")."""
    lines = [line for line in text.splitlines() if line.strip()]
    wanted = [_app_field(name) for name in fields]
    if lines and all(_app_field(token) in _APP_FIELDS_KNOWN for token in lines[0].split(",")):
        wanted, lines = [_app_field(token) for token in lines[0].split(",")], lines[1:]
    if not set(need) <= set(wanted):
        raise ValueError(f"--query-compute-apps fields {wanted} need {', '.join(need[:-1])} and {need[-1]}")
    for line in lines:
        if "," not in line:
            continue  # "No running processes found" and similar messages: not data
        row = dict(zip(wanted, _split_row(line, wanted, ("process_name",)), strict=True))
        pid = _optional_int(row["pid"], what="--query-compute-apps pid")
        if pid is None:
            raise ValueError(f"--query-compute-apps row without a pid: {line!r}")
        yield row, pid, _optional_int(row["used_memory"], what=f"--query-compute-apps used_memory of pid {pid}")


def parse_compute_apps(text: str, fields: Sequence[str] = QUERY_COMPUTE_APPS_FIELDS) -> dict[int, int | None]:
    """Parse ``nvidia-smi --query-compute-apps`` (``--format=csv`` or ``csv,noheader,nounits``)
    into {pid: used MiB}, summed over GPUs; None where any GPU's reads ``N/A``."""
    used: dict[int, int | None] = {}
    for _row, pid, mib in _compute_app_rows(text, fields, ("pid", "used_memory")):
        so_far = used.get(pid, 0)
        used[pid] = None if mib is None or so_far is None else so_far + mib
    return used


def parse_compute_apps_by_gpu(text: str, fields: Sequence[str]) -> list[tuple[str, int, int | None]]:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory`` into ``(gpu uuid, pid,
    MiB)`` rows, one per process and GPU."""
    return [(_strip_value(row["gpu_uuid"]), pid, mib)
            for row, pid, mib in _compute_app_rows(text, fields, ("gpu_uuid", "pid", "used_memory"))]


def parse_memory_used_csv(text: str) -> dict[int, int | None]:
    """Parse ``nvidia-smi --query-gpu=index,memory.used`` into {index: MiB used}, None where a
    GPU does not say (``[N/A]``: unified-memory boards). Accepts a header and units or neither."""
    used: dict[int, int | None] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("index"):
            continue
        values = [value.strip() for value in line.split(",")]
        if len(values) < 2:
            raise ValueError(f"--query-gpu=index,memory.used: expected 'index, MiB', got {line!r}")
        index = _optional_int(values[0], what="--query-gpu index")
        if index is None:
            raise ValueError(f"--query-gpu=index,memory.used row without an index: {line!r}")
        used[index] = _optional_int(values[1], what=f"memory.used of GPU {index}")
    return used
