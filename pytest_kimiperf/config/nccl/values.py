"""The rules each NCCL_*/CUDA_* value in a profile must follow, taken from NCCL itself.

:func:`validate_profile` checks a resolved profile's environment: an error for a value NCCL
would reject or silently misread, a warning for one that is legal but probably not what was
meant (an unknown NCCL_ name, a non-power-of-two buffer, LL128 forced on a PCIe-only host).

Sources for the rules below (checked, not guessed):

- NCCL user guide, "Environment Variables" (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
  read at version 2.29): accepted values of each variable.
- NCCL source, ``src/graph/tuning.cc`` ``parseList`` (2.24+): the per-collective grammar of
  NCCL_PROTO / NCCL_ALGO and its error cases; ``src/misc/param.cc`` ``ncclLoadParam``: how
  integer parameters are read (strtoll); ``src/graph/paths.cc`` ``ncclGetLevel``:
  NCCL_P2P_DISABLE / NCCL_P2P_LEVEL parsing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from pytest_kimiperf.config.names import did_you_mean
from pytest_kimiperf.errors import ConfigError


class NamedEnv(Protocol):
    """What a profile check reads of a profile (profiles.NcclProfile, which imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...


# Every variable the NCCL 2.29 user guide documents (env.html), a few NCCL's source reads undocumented
# and two PyTorch reads under an NCCL_ name: the names "did you mean" knows.
# fmt: off
KNOWN_NCCL_VARIABLES: frozenset[str] = frozenset(
    {
        # System configuration
        "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_RETRY_CNT",
        "NCCL_SOCKET_RETRY_SLEEP_MSEC", "NCCL_SOCKET_POLL_TIMEOUT_MSEC", "NCCL_SOCKET_NTHREADS",
        "NCCL_NSOCKS_PERTHREAD", "NCCL_CROSS_NIC", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
        "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
        "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_FIFO_TC",
        "NCCL_IB_RETURN_ASYNC_EVENTS", "NCCL_OOB_NET_ENABLE", "NCCL_OOB_NET_IFNAME",
        "NCCL_UID_STAGGER_THRESHOLD", "NCCL_UID_STAGGER_RATE", "NCCL_NET", "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_IGNORE_CPU_AFFINITY",
        "NCCL_CONF_FILE", "NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_DEBUG_TIMESTAMP_LEVELS", "NCCL_COLLNET_ENABLE",
        "NCCL_COLLNET_NODE_THRESHOLD", "NCCL_CTA_POLICY", "NCCL_NETDEVS_POLICY", "NCCL_TOPO_FILE",
        "NCCL_TOPO_DUMP_FILE", "NCCL_SET_THREAD_NAME",
        # Debugging
        "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_P2P_DIRECT_DISABLE", "NCCL_SHM_DISABLE",
        "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NRINGS", "NCCL_MIN_NRINGS", "NCCL_CHECKS_DISABLE", "NCCL_CHECK_POINTERS",
        "NCCL_LAUNCH_MODE", "NCCL_IB_DISABLE", "NCCL_IB_AR_THRESHOLD", "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_CUDA_SUPPORT", "NCCL_IB_PCI_RELAXED_ORDERING",
        "NCCL_IB_ADAPTIVE_ROUTING", "NCCL_IB_ECE_ENABLE", "NCCL_MEM_SYNC_DOMAIN", "NCCL_CUMEM_ENABLE",
        "NCCL_CUMEM_HOST_ENABLE", "NCCL_NET_GDR_LEVEL", "NCCL_IB_GDR_LEVEL", "NCCL_NET_GDR_C2C",
        "NCCL_NET_GDR_READ", "NCCL_NET_SHARED_BUFFERS", "NCCL_NET_SHARED_COMMS",
        "NCCL_SINGLE_RING_THRESHOLD", "NCCL_LL_THRESHOLD", "NCCL_TREE_THRESHOLD", "NCCL_ALGO",
        "NCCL_PROTO", "NCCL_NVB_DISABLE", "NCCL_PXN_DISABLE", "NCCL_P2P_PXN_LEVEL", "NCCL_PXN_C2C",
        "NCCL_RUNTIME_CONNECT", "NCCL_GRAPH_REGISTER", "NCCL_LOCAL_REGISTER",
        "NCCL_LEGACY_CUDA_REGISTER", "NCCL_WIN_ENABLE", "NCCL_SET_STACK_SIZE",
        "NCCL_GRAPH_MIXING_SUPPORT", "NCCL_DMABUF_ENABLE", "NCCL_P2P_NET_CHUNKSIZE",
        "NCCL_P2P_LL_THRESHOLD", "NCCL_ALLOC_P2P_NET_LL_BUFFERS", "NCCL_COMM_BLOCKING",
        "NCCL_CGA_CLUSTER_SIZE", "NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_NVLS_ENABLE",
        "NCCL_IB_MERGE_NICS", "NCCL_MNNVL_ENABLE", "NCCL_MNNVL_UUID", "NCCL_MNNVL_CLIQUE_ID",
        "NCCL_RAS_ENABLE", "NCCL_RAS_ADDR", "NCCL_RAS_TIMEOUT_FACTOR", "NCCL_LAUNCH_ORDER_IMPLICIT",
        "NCCL_LAUNCH_RACE_FATAL", "NCCL_IPC_USE_ABSTRACT_SOCKET",
        # Read by NCCL's source but not in the user guide (tuning.cc, param.cc, debug.cc).
        "NCCL_LL128_NTHREADS", "NCCL_THREAD_THRESHOLDS", "NCCL_NET_OVERHEAD", "NCCL_PAT_ENABLE",
        "NCCL_NO_CACHE", "NCCL_PARAM_DUMP_ALL", "NCCL_WARN_ENABLE_DEBUG_INFO",
        # Read by PyTorch's ProcessGroupNCCL (old names of TORCH_NCCL_*), not by NCCL.
        "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT",
    }
)
# fmt: on

# ncclFuncStr in NCCL's enqueue.cc: the prefixes NCCL 2.24+ accepts before ':' (case-insensitive).
_NCCL_FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
_NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
_NCCL_ALGORITHMS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
# How NCCL itself spells the algorithms it prints (ncclAlgoStr, src/init.cc v2.28.9-1 line 50).
_NCCL_SPELLING = {"CollnetDirect": "CollNetDirect", "CollnetChain": "CollNetChain"}
_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
# NCCL_P2P_LEVEL's legacy integers (user guide; paths.cc levelsOldToNew). NVL has none.
P2P_LEGACY_LEVELS = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}
_NTHREADS = ("64", "128", "256", "512")
_MAX_MIN_NCHANNELS = 32  # user guide: "up to 32 (2.5 and later)"
_MAX_CTAS = 64  # user guide: "a positive integer value up to 64 (32 prior to 2.25)"

# Which algorithms NCCL implements for each collective (ncclTopoTuneModel, src/graph/tuning.cc v2.28.9-1
# lines 273-277, the same since v2.24.3-1): a bare NCCL_ALGO=Tree leaves AllGather with none, and
# enqueue.cc (lines 1848-1859) fails the call with ncclInvalidUsage.
_ALGORITHMS_FOR: dict[str, tuple[str, ...]] = {
    "Broadcast": ("Ring",),
    "Reduce": ("Ring",),
    "AllGather": ("Ring", "CollnetDirect", "NVLS", "PAT"),
    "ReduceScatter": ("Ring", "CollnetDirect", "NVLS", "PAT"),
    "AllReduce": ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree"),
}
# Algorithms that run the Simple protocol only (tuning.cc v2.28.9-1 lines 280-282 for NVLS,
# NVLSTree and PAT; CollNet's bandwidth is zeroed for LL and LL128, lines 311-312).
_SIMPLE_ONLY = frozenset({"CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"})
# What is left on one node of PCIe-only GPUs (tuning.cc v2.28.9-1 lines 465-473 and 206): NVLS
# needs NVSwitch multicast, CollNet a CollNet plugin (CollnetDirect also NVSwitch), NVLSTree is
# off on a single node, and PAT runs with one GPU per node only.
_PCIE_NODE_ALGORITHMS = frozenset({"Tree", "Ring"})
# The collectives vLLM 0.32 runs on a tensor-parallel CUDA engine through PyNccl, AllReduce
# (device_communicators/cuda_communicator.py:432-438) and AllGather for the logits
# (layers/logits_processor.py:124-130): leaving either with no algorithm crashes the first forward pass.
VLLM_COLLECTIVES: tuple[str, ...] = ("AllReduce", "AllGather")


def is_nccl_related(var: str) -> bool:
    """Whether ``var`` is one of the NCCL_*/CUDA_* variables this plugin reports on."""
    return var.startswith("NCCL_") or var.startswith("CUDA_")


class _Rejection(Exception):
    """Internal: a value broke a rule; the caller adds profile, variable and source."""


@dataclass(frozen=True)
class _ListEntry:
    """One ';'-separated item of NCCL_PROTO / NCCL_ALGO: which functions, include or exclude what."""

    functions: tuple[str, ...]
    exclude: bool
    elements: tuple[str, ...]


def _parse_nccl_list(value: str, elements: tuple[str, ...], kind: str) -> list[_ListEntry]:
    # Mirrors parseList in NCCL's tuning.cc (2.24+), down to the empty tokens strtok skips.
    if not value.strip():
        raise _Rejection(f"an empty list; before NCCL 2.24 an empty list disables every {kind}")
    by_lower = {e.lower(): e for e in elements}
    functions_by_lower = {f.lower(): f for f in _NCCL_FUNCTIONS}
    entries: list[_ListEntry] = []
    for position, item in enumerate(t for t in value.split(";") if t):
        parts = item.split(":")
        if len(parts) > 2:
            raise _Rejection(f"entry {item!r} has more than one ':' (use function:{kind}s)")
        if len(parts) == 2:
            prefix, listed = parts
            function = functions_by_lower.get(prefix.lower())
            if function is None:
                raise _Rejection(
                    f"unknown collective {prefix!r} in entry {item!r}{did_you_mean(prefix, _NCCL_FUNCTIONS)}"
                )
            functions: tuple[str, ...] = (function,)
        else:
            if position > 0 or value.startswith(";"):
                raise _Rejection(
                    f"entry {item!r} has no 'function:' prefix; NCCL allows that only for the first entry"
                )
            listed, functions = parts[0], _NCCL_FUNCTIONS
        exclude = listed.startswith("^")
        tokens = [t for t in listed[1:].split(",") if t] if exclude else [t for t in listed.split(",") if t]
        if not tokens and not exclude:
            raise _Rejection(f"entry {item!r} lists no {kind}")
        names = []
        for token in tokens:
            name = by_lower.get(token.lower())
            if name is None:
                hint = (
                    " (NCCL does not strip spaces)"
                    if token.strip().lower() in by_lower
                    else did_you_mean(token, elements)
                )
                raise _Rejection(f"unknown {kind} {token!r}{hint}")
            names.append(name)
        entries.append(_ListEntry(functions, exclude, tuple(names)))
    if not entries:
        raise _Rejection(f"no {kind} listed")
    return entries


def _forced_on(entries: list[_ListEntry], element: str) -> list[str]:
    """Collectives for which the list explicitly turns ``element`` on (not left to NCCL's auto)."""
    state: dict[str, bool | None] = {f: None for f in _NCCL_FUNCTIONS}  # None: NCCL decides
    for entry in entries:
        for function in entry.functions:
            # parseList first sets every element to "unset" (1 for '^' lists, 0 otherwise),
            # then the listed ones to the opposite, so a '^' list that does not name the
            # element switches it on.
            state[function] = (
                (element not in entry.elements) if entry.exclude else (element in entry.elements)
            )
    return [f for f, on in state.items() if on]


def _enabled(entries: list[_ListEntry], elements: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """Per collective, the elements a parsed list leaves on (parseList's result, tuning.cc)."""
    enabled = {f: frozenset(elements) for f in _NCCL_FUNCTIONS}
    for entry in entries:
        for function in entry.functions:
            listed = frozenset(entry.elements)
            enabled[function] = frozenset(elements) - listed if entry.exclude else listed
    return enabled


def enabled_choices(env: Mapping[str, str], *, pcie_only: bool | None) -> dict[str, list[tuple[str, str]]]:
    """Per collective, the (algorithm, protocol) pairs NCCL can still choose under ``env`` (valid
    lists): what the lists leave on, crossed with what NCCL implements and, on a PCIe-only node,
    what the host offers (LL128 only where forced: tuning.cc v2.28.9-1 lines 480-491)."""
    algos = _enabled(_parse_nccl_list(env["NCCL_ALGO"], _NCCL_ALGORITHMS, "algorithm"), _NCCL_ALGORITHMS) \
        if "NCCL_ALGO" in env else {f: frozenset(_NCCL_ALGORITHMS) for f in _NCCL_FUNCTIONS}
    if "NCCL_PROTO" in env:
        entries = _parse_nccl_list(env["NCCL_PROTO"], _NCCL_PROTOCOLS, "protocol")
        protos = _enabled(entries, _NCCL_PROTOCOLS)
        forced_ll128 = set(_forced_on(entries, "LL128"))
    else:
        protos, forced_ll128 = {f: frozenset(_NCCL_PROTOCOLS) for f in _NCCL_FUNCTIONS}, set()
    choices: dict[str, list[tuple[str, str]]] = {}
    for function in _NCCL_FUNCTIONS:
        pairs = []
        for algorithm in _ALGORITHMS_FOR[function]:
            if algorithm not in algos[function] or (pcie_only and algorithm not in _PCIE_NODE_ALGORITHMS):
                continue
            for protocol in _NCCL_PROTOCOLS:
                if protocol not in protos[function] or (algorithm in _SIMPLE_ONLY and protocol != "Simple"):
                    continue
                if protocol == "LL128" and pcie_only and function not in forced_ll128:
                    continue
                pairs.append((algorithm, protocol))
        choices[function] = pairs
    return choices


def enabled_lists(env: Mapping[str, str]) -> dict[str, dict[str, dict[str, tuple[str, ...]]]]:
    """Per collective, the algorithms and protocols the profile's lists leave on, as NCCL's
    parseList sets them (``{"AllReduce": {"algorithm": {"on": (...), "all": (...)}, ...}}``);
    only the variables the profile sets, and the names in NCCL's own spelling (init.cc)."""
    result: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {f: {} for f in _NCCL_FUNCTIONS}
    for var, elements, kind in (("NCCL_ALGO", _NCCL_ALGORITHMS, "algorithm"),
                                ("NCCL_PROTO", _NCCL_PROTOCOLS, "protocol")):
        if var not in env:
            continue
        for function, on in _enabled(_parse_nccl_list(env[var], elements, kind), elements).items():
            ordered = tuple(_NCCL_SPELLING.get(e, e) for e in elements if e in on)
            result[function][kind] = {"on": ordered, "all": tuple(_NCCL_SPELLING.get(e, e) for e in elements)}
    return result


def _check_coverage(who: str, env: Mapping[str, str], pcie_only: bool | None) -> list[str]:
    """ConfigError when a collective vLLM runs is left with no algorithm; warnings for the others."""
    if "NCCL_ALGO" not in env and "NCCL_PROTO" not in env:
        return []
    given = " ".join(f"{var}={env[var]!r}" for var in ("NCCL_ALGO", "NCCL_PROTO") if var in env)
    host = " on a PCIe-only node (Tree and Ring only)" if pcie_only else ""
    starved = [f for f, pairs in enabled_choices(env, pcie_only=pcie_only).items() if not pairs]
    fatal = [f for f in starved if f in VLLM_COLLECTIVES]
    if fatal:
        offers = "; ".join(f"{f} with {', '.join(_ALGORITHMS_FOR[f])}" for f in fatal)
        raise ConfigError(
            f"{who}: {given} leaves {' and '.join(fatal)} with no algorithm/protocol{host}; NCCL "
            f"implements {offers} only, and vLLM runs {' and '.join(fatal)} on every tensor-parallel "
            "engine, so the engine would fail with ncclInvalidUsage (\"no algorithm/protocol "
            f"available for function {fatal[0]}\"). Name the collective instead, e.g. "
            "NCCL_ALGO='allreduce:Tree' (NCCL 2.24+), which leaves the other collectives to NCCL"
        )
    return [
        f"{who}: {given} leaves {f} with no algorithm/protocol{host} (NCCL implements it with "
        f"{', '.join(_ALGORITHMS_FOR[f])}); vLLM does not run it on a tensor-parallel engine, but "
        "anything that does fails with ncclInvalidUsage"
        for f in starved
    ]


def _nccl_decimal(value: str) -> int:
    """A positive integer written so that NCCL's strtoll(base 0) reads the same number we do."""
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise _Rejection("not a positive decimal integer (NCCL parses with strtoll base 0: a leading 0 means "
                         "octal and trailing text is silently dropped)")
    return int(value)


def _check_list(value: str, elements: tuple[str, ...], kind: str) -> list[_ListEntry]:
    try:
        return _parse_nccl_list(value, elements, kind)
    except _Rejection as exc:
        raise _Rejection(
            f"{exc}. Allowed: a comma list of {', '.join(elements)} (case-insensitive), "
            "optionally led by '^' to exclude; NCCL 2.24+ also takes ';'-separated "
            "'function:list' entries "
            f"(functions: {', '.join(_NCCL_FUNCTIONS)}), e.g. '^LL128;allreduce:LL'"
        ) from None


def _check_range(value: str, low: int, high: int | None, what: str) -> int:
    number = _nccl_decimal(value)
    if number < low or (high is not None and number > high):
        bound = f"{low}-{high}" if high is not None else f">= {low}"
        raise _Rejection(f"out of range; allowed: {what} {bound}")
    return number


def _check_value(var: str, value: str) -> None:
    """Raise _Rejection when ``value`` breaks the documented rule for ``var``."""
    if var == "NCCL_PROTO":
        _check_list(value, _NCCL_PROTOCOLS, "protocol")
    elif var == "NCCL_ALGO":
        _check_list(value, _NCCL_ALGORITHMS, "algorithm")
    elif var == "NCCL_MIN_NCHANNELS":
        _check_range(value, 1, _MAX_MIN_NCHANNELS, "a channel count")
    elif var == "NCCL_MAX_NCHANNELS":
        _check_range(value, 1, None, "a channel count")
    elif var in ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS"):
        _check_range(value, 1, _MAX_CTAS, "a CTA count")
    elif var == "NCCL_BUFFSIZE":
        _nccl_decimal(value)
    elif var == "NCCL_NTHREADS":
        if value not in _NTHREADS:
            raise _Rejection(f"allowed: {', '.join(_NTHREADS)}")
    elif var == "NCCL_P2P_LEVEL":
        # ncclGetLevel compares with strcmp, so "pix" matches nothing and is silently ignored.
        if value not in _P2P_LEVELS and value not in P2P_LEGACY_LEVELS:
            hint = " (names are case-sensitive)" if value.upper() in _P2P_LEVELS else ""
            raise _Rejection(f"allowed: {', '.join(_P2P_LEVELS)}{hint}, or the legacy integers 0-4")
    elif var in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"):
        if value not in ("0", "1"):
            raise _Rejection("allowed: 0 or 1")
    elif var == "CUDA_DEVICE_MAX_CONNECTIONS":
        _check_range(value, 1, 32, "an integer")  # CUDA docs: 1 to 32, default 8


def validate_profile(profile: NamedEnv, *, pcie_only: bool | None) -> list[str]:
    """Check a profile's values against NCCL's documented rules; return warnings, raise ConfigError
    on errors. ``pcie_only``: no NVLink (None: unknown). Variables outside NCCL_* pass as they are."""
    warnings: list[str] = []
    who = f"NCCL profile {profile.name!r} (from {profile.source})"
    env = profile.env
    for var, value in env.items():
        try:
            _check_value(var, value)
        except _Rejection as exc:
            raise ConfigError(f"{who}: {var}={value!r} is invalid: {exc}") from None
        if var.startswith("NCCL_") and var not in KNOWN_NCCL_VARIABLES:
            warnings.append(f"{who}: {var} is not an NCCL variable this plugin knows; NCCL ignores unknown "
                            f"names{did_you_mean(var, KNOWN_NCCL_VARIABLES) or ' (no close match)'}")
        elif not var.startswith("NCCL_") and var.upper().startswith("NCCL_"):
            warnings.append(f"{who}: {var} is not read by NCCL: environment names are case-sensitive"
                            f"{did_you_mean(var.upper(), KNOWN_NCCL_VARIABLES)}")

    if "NCCL_BUFFSIZE" in env:
        size = int(env["NCCL_BUFFSIZE"])
        if size & (size - 1):
            warnings.append(f"{who}: NCCL_BUFFSIZE={size} is not a power of two; NCCL's docs recommend "
                            "powers of 2 (default 4194304)")
    for low, high in (("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"), ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS")):
        if low in env and high in env and int(env[low]) > int(env[high]):
            raise ConfigError(f"{who}: {low}={env[low]} is above {high}={env[high]}; the minimum must not "
                              "exceed the maximum")
    if env.get("NCCL_P2P_DISABLE") == "1" and "NCCL_P2P_LEVEL" in env:
        warnings.append(f"{who}: NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} has no effect: NCCL reads "
                        "NCCL_P2P_DISABLE=1 first and then ignores the level")
    for var, elements, kind in (
        ("NCCL_PROTO", _NCCL_PROTOCOLS, "protocol"),
        ("NCCL_ALGO", _NCCL_ALGORITHMS, "algorithm"),
    ):
        if var not in env:
            continue
        entries = _parse_nccl_list(env[var], elements, kind)
        if ";" in env[var] or ":" in env[var]:
            warnings.append(f"{who}: {var}={env[var]!r} uses the per-collective form, which needs NCCL 2.24+; "
                            "older NCCL ignores tokens it does not recognise, so the list may not mean there "
                            "what it means here")
        if var == "NCCL_PROTO" and pcie_only:
            forced = _forced_on(entries, "LL128")
            if forced:
                scope = "every collective" if len(forced) == len(_NCCL_FUNCTIONS) else ", ".join(forced)
                warnings.append(f"{who}: NCCL_PROTO={env[var]!r} turns LL128 on ({scope}) on a PCIe-only "
                                "host; NCCL enables LL128 by itself only where it is supported (NVLink), and "
                                "its docs warn that enabling it on other platforms can corrupt data")
    warnings.extend(_check_coverage(who, env, pcie_only))
    return warnings
