"""What NCCL's ``NCCL_DEBUG=INFO`` logs say it read and ran, under ``--kimiperf-nccl-debug``.

What NCCL read: the values it logged (``src/misc/param.cc`` ``ncclLoadParam``, ``src/graph/paths.cc``
``ncclGetLevel``) and the enabled matrix it parsed from NCCL_ALGO / NCCL_PROTO, which says a setting
was read, not used. What it ran: rank 0's TUNING lines, one per collective enqueued; under CUDA
graphs (vLLM's decode) each captured size appears once. Small all-reduces that vLLM runs on a path
of its own never reach NCCL and are absent: ``server/allreduce_path.py`` reads which path each boot
took.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from pytest_kimiperf.config.nccl.values import P2P_LEGACY_LEVELS, enabled_lists, is_nccl_related

# INFO prints the "<VAR> set by environment to <value>" lines; NCCL_DEBUG_SUBSYS keeps NCCL's default
# set (src/debug.cc: INIT, BOOTSTRAP, ENV) and adds TUNING, under which rank 0 logs what each collective ran.
NCCL_DEBUG_ENV: Mapping[str, str] = MappingProxyType({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,TUNING"})

# "<host>:<pid>:<tid> [<dev>] NCCL INFO <VAR> set by environment to <value>" (debug.cc prefix);
# the line may carry a launcher prefix ("(Worker_TP0 pid=12) ", "[1,0]<stdout>:") or an
# NCCL_DEBUG_TIMESTAMP_FORMAT timestamp in front, hence search, not match.
_SET_BY_ENV = re.compile(r"NCCL INFO (?P<var>[A-Za-z_][A-Za-z0-9_]*) set by environment to (?P<value>.*)$")
# param.cc ncclLoadParam when strtoll fails: "Invalid value %s for %s, using default %lld."
_INVALID_VALUE = re.compile(
    r"NCCL INFO Invalid value (?P<given>.*) for (?P<var>[A-Za-z_][A-Za-z0-9_]*), "
    r"using default (?P<value>-?[0-9]+)\.$"
)
_INT_WITH_PERIOD = re.compile(r"^(-?[0-9]+)\.$")

# Files, not the server log: on stdout NCCL's lines sit in each worker's 4 KiB libc buffer (src/debug.cc
# v2.28.9-1 lines 34, 385), so eight ranks interleave mid-line and a SIGKILLed worker loses its last
# block; NCCL line-buffers a NCCL_DEBUG_FILE (lines 224-263), ``%h.%p`` one per process.
_DEBUG_FILE_SUFFIX = ".nccl"


def nccl_debug_env(server_log: Path) -> dict[str, str]:
    """What ``--kimiperf-nccl-debug`` adds to a server's environment: INFO level, one file per process."""
    pattern = server_log.with_name(f"{server_log.stem}{_DEBUG_FILE_SUFFIX}.%h.%p")
    return {**NCCL_DEBUG_ENV, "NCCL_DEBUG_FILE": str(pattern)}


def debug_files(server_log: Path) -> list[Path]:
    """The per-process NCCL debug files of the server whose log is ``server_log``, by name."""
    return sorted(server_log.parent.glob(f"{server_log.stem}{_DEBUG_FILE_SUFFIX}.*"))


def debug_file_lines(files: Iterable[Path]) -> Iterator[str]:
    """Every line of the files, file after file (each holds one process's whole lines)."""
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as handle:
            yield from handle


def parse_nccl_env_lines(lines: Iterable[str]) -> dict[str, str]:
    """The value NCCL's log says it took for each variable: a rejected value as the default it fell
    back to, an integer without the period ``%lld.`` leaves (param.cc); where ranks disagree, the
    distinct values joined with `` | ``."""
    seen: dict[str, list[str]] = {}
    for raw in lines:
        line = raw.rstrip("\r\n")
        invalid = _INVALID_VALUE.search(line)
        match = invalid or _SET_BY_ENV.search(line)
        if match is None:
            continue
        value = match.group("value").rstrip()
        if not invalid:
            period = _INT_WITH_PERIOD.match(value)
            if period:
                value = period.group(1)
        values = seen.setdefault(match.group("var"), [])
        if value not in values:
            values.append(value)
    return {var: " | ".join(values) for var, values in seen.items()}


def _same_setting(var: str, wanted: str, logged: str) -> bool:
    if wanted == logged:
        return True
    # ncclGetLevel logs the level's name even when it was given as a legacy integer.
    if var in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL") and P2P_LEGACY_LEVELS.get(wanted) == logged:
        return True
    if re.fullmatch(r"-?[0-9]+", wanted) and re.fullmatch(r"-?[0-9]+", logged):
        return int(wanted) == int(logged)
    return False


def applied_status(profile_env: Mapping[str, str], seen: Mapping[str, str]) -> dict[str, str]:
    """Per NCCL_*/CUDA_* variable of a profile, whether NCCL's log shows it took effect. "Not seen"
    is not "ignored": NCCL logs only some variables (CUDA_* never), and gloo runs no NCCL at all."""
    status: dict[str, str] = {}
    for var, wanted in profile_env.items():
        if not is_nccl_related(var):
            continue
        if var not in seen:
            status[var] = "not seen in the log"
        elif _same_setting(var, wanted, seen[var]):
            status[var] = "applied"
        else:
            status[var] = f"seen with a different value: {seen[var]}"
    return status


# tuning.cc (v2.24.3-1+; v2.28.9-1 lines 430-456), rank 0, when NCCL_ALGO or NCCL_PROTO is set: a header
# row, then one row per collective of 1 on, 0 off, 2 for LL128 left to NCCL, per protocol and algorithm.
_MATRIX_START = re.compile(r"NCCL INFO Enabled NCCL Func/Proto/Algo Matrix:\s*$")
_MATRIX_ROW = re.compile(r"^\s*(?P<name>[A-Za-z]+) \|(?P<protocols>[^|]*)\|(?P<algorithms>.*)$")


def parse_enabled_matrix(lines: Iterable[str]) -> dict[str, dict[str, int]] | None:
    """The first enabled-matrix NCCL printed: ``{collective: {protocol or algorithm: 0/1/2}}``."""
    rows = iter(line.rstrip("\r\n") for line in lines)
    for line in rows:
        if not _MATRIX_START.search(line):
            continue
        head = _MATRIX_ROW.match(next(rows, ""))
        if head is None or head.group("name") != "Function":
            return None
        protocols, algorithms = head.group("protocols").split(), head.group("algorithms").split()
        matrix: dict[str, dict[str, int]] = {}
        for row_text in rows:
            row = _MATRIX_ROW.match(row_text)
            values = (row.group("protocols").split(), row.group("algorithms").split()) if row else ((), ())
            if row is None or len(values[0]) != len(protocols) or len(values[1]) != len(algorithms):
                break
            matrix[row.group("name")] = {
                name: int(flag) for name, flag in zip([*protocols, *algorithms], [*values[0], *values[1]])
            }
        return matrix or None
    return None


def matrix_status(profile_env: Mapping[str, str], matrix: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Where NCCL's enabled matrix differs from what the profile's NCCL_ALGO / NCCL_PROTO ask;
    [] when every collective's algorithms and protocols are the ones asked for.

    LL128 left to NCCL (2) counts as on unless the profile names it."""
    asked = enabled_lists(profile_env)
    differences = []
    for function, wanted in asked.items():
        row = matrix.get(function)
        if row is None:
            differences.append(f"{function}: not in NCCL's matrix")
            continue
        enabled = {name for name, flag in row.items() if flag}
        for kind, names in wanted.items():
            seen = sorted(enabled & set(names["all"]), key=str.lower)
            if {n.lower() for n in seen} != {n.lower() for n in names["on"]}:
                differences.append(f"{function} {kind}: NCCL enabled {', '.join(seen) or 'none'}, "
                                   f"the profile asks for {', '.join(names['on']) or 'none'}")
    return differences


# The TUNING line (src/enqueue.cc; v2.28.9-1 line 741): names from 2.26, nccl_common.h's numbers in
# 2.21-2.25 (no function name in 2.21); symmetric kernels (2.27+) and the copy engine (2.29+) name no
# NCCL_ALGO algorithm.
_CHOSEN = re.compile(r"NCCL INFO (?:(?P<func>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\w+) "
                     r"proto (?P<proto>\w+)(?: channel| time|$)")
_SPECIAL = re.compile(r"NCCL INFO (?P<func>[A-Za-z]+) \[(?P<kind>Symmetric|Copy Engine|Hierarchical CE)\]: "
                      r"(?P<bytes>\d+) Bytes -> (?:Kernel (?P<kernel>\S+)|(?P<how>.+?))(?: nchannels .*)?$")
# nccl_common.h's numbering, used by the 2.21-2.25 line.
_ALGO_NUMBERS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
_PROTO_NUMBERS = ("LL", "LL128", "SIMPLE")


@dataclass(frozen=True)
class TuningChoice:
    """What NCCL chose for one collective of one size: algorithm and protocol as NCCL names
    them, or, for a symmetric kernel or the copy engine, what ran (``protocol`` then empty)."""

    function: str  # "AllReduce", ...; "" where the NCCL version does not say (2.21)
    nbytes: int
    algorithm: str
    protocol: str


def _named(value: str, numbers: tuple[str, ...]) -> str:
    return numbers[int(value)] if value.isdigit() and int(value) < len(numbers) else value.upper()


def parse_tuning_lines(lines: Iterable[str]) -> list[TuningChoice]:
    """Every distinct choice in NCCL's TUNING lines, in the order first logged."""
    seen: dict[TuningChoice, None] = {}
    for line in lines:
        line = line.rstrip("\r\n")
        if match := _CHOSEN.search(line):
            choice = TuningChoice(match.group("func") or "", int(match.group("bytes")),
                                  _named(match.group("algo"), _ALGO_NUMBERS), _named(match.group("proto"), _PROTO_NUMBERS))
        elif match := _SPECIAL.search(line):
            what = (f"symmetric kernel {match.group('kernel')}" if match.group("kind") == "Symmetric"
                    else f"{match.group('kind').lower()} ({match.group('how')})")
            choice = TuningChoice(match.group("func"), int(match.group("bytes")), what, "")
        else:
            continue
        seen.setdefault(choice)
    return list(seen)


def describe_bytes(nbytes: int) -> str:
    """``8 KiB``, ``1 MiB``, ``1536 B``: binary units where the size is a whole number of them."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def chosen_differently(profile_env: Mapping[str, str], choices: Iterable[TuningChoice]) -> list[str]:
    """One line per collective size where NCCL ran something the profile's NCCL_ALGO / NCCL_PROTO
    do not allow: ``AllReduce: asked Ring/LL, NCCL chose TREE/SIMPLE for 8 KiB``."""
    asked = enabled_lists(profile_env)
    found = []
    for choice in choices:
        wanted = asked.get(choice.function or "AllReduce", {})
        algorithms = wanted.get("algorithm", {}).get("on")
        protocols = wanted.get("protocol", {}).get("on")
        if algorithms is None and protocols is None:
            continue
        algo_ok = algorithms is None or _norm(choice.algorithm) in {_norm(a) for a in algorithms}
        proto_ok = protocols is None or _norm(choice.protocol) in {_norm(p) for p in protocols}
        if algo_ok and proto_ok:
            continue
        want = "/".join(["|".join(algorithms) if algorithms else "any", "|".join(protocols) if protocols else "any"])
        ran = choice.algorithm + (f"/{choice.protocol}" if choice.protocol else "")
        found.append(f"{choice.function or 'a collective'}: asked {want}, NCCL chose {ran} "
                     f"for {describe_bytes(choice.nbytes)}")
    return found


def tuning_note(profile_env: Mapping[str, str], lines: Iterable[str]) -> str | None:
    """The report's sentence on what NCCL ran, from rank 0's TUNING lines; None where there are
    none (NCCL older than 2.21, the TUNING subsystem off, or no collective reached NCCL)."""
    choices = parse_tuning_lines(lines)
    if not choices:
        return None
    ran = "; ".join(f"{c.function or 'collective'} {describe_bytes(c.nbytes)}: {c.algorithm}"
                    + (f"/{c.protocol}" if c.protocol else "") for c in choices[:12])
    more = f" (and {len(choices) - 12} more)" if len(choices) > 12 else ""
    differing = chosen_differently(profile_env, choices)
    if differing:
        return f"what NCCL ran (TUNING, rank 0) differs from the profile: {'; '.join(differing)}"
    return f"what NCCL ran (TUNING, rank 0) is what the profile asks for: {ran}{more}"
