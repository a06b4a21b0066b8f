"""What NCCL ran: the algorithm and protocol it chose for each collective size, from its TUNING lines.

The "Enabled NCCL Func/Proto/Algo Matrix" (debug_log.parse_enabled_matrix) is what NCCL parsed
from NCCL_ALGO / NCCL_PROTO, before it drops what the host cannot run; it says a setting was
read, not used. What a collective ran is logged by rank 0 under the TUNING subsystem, which
``--kimiperf-nccl-debug`` turns on (debug_log.NCCL_DEBUG_ENV), one line per collective enqueued:

* NCCL 2.26 and later, ``src/enqueue.cc``: ``INFO(NCCL_TUNING, "%s: %ld Bytes -> Algo %s proto %s
  channel{Lo..Hi}={%d..%d}", ncclFuncToString(...), bytes, ncclAlgoToString(...),
  ncclProtoToString(...), ...)`` (v2.26.2-1 line 702, v2.28.9-1 line 741, v2.30.7-1 line 822), the
  names upper case (``src/collectives.cc``: TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS,
  NVLS_TREE, PAT; LL, LL128, SIMPLE);
* NCCL 2.21 to 2.25: ``"%s: %ld Bytes -> Algo %d proto %d time %f"`` with the numbers of
  ``src/include/nccl_common.h`` (NCCL_ALGO_TREE 0 ... NCCL_ALGO_PAT 6; NCCL_PROTO_LL 0, LL128 1,
  SIMPLE 2); 2.21 has no function name in front;
* symmetric-memory kernels (2.27+): ``"%s [Symmetric]: %ld Bytes -> Kernel %s nchannels %d
  nthreads %d"`` (2.28 adds `` nWorks %d``), and the copy engine (2.29+):
  ``"%s [Copy Engine]: %ld Bytes -> cudaMemcpy%s"``: neither an NCCL_ALGO algorithm.

Under CUDA graphs (vLLM's decode) a collective is enqueued once, at capture, so the lines name
each captured size once; eager steps log every call. Small all-reduces that vLLM runs on its
own custom all-reduce kernel never reach NCCL and are absent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_kimiperf.config.nccl.values import enabled_lists

__all__ = ["TuningChoice", "chosen_differently", "describe_bytes", "parse_tuning_lines", "tuning_note"]

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
