"""NCCL profiles: named sets of environment overrides a vLLM server is booted with.

A profile is resolved from the built-ins and the user's ``[tool.kimiperf.profiles]`` table,
validated against NCCL's documented value rules, selected by ``--nccl-profile``, turned into
the server's environment, and, with ``--nccl-debug``, checked against what NCCL itself logged.

Sources for the rules below (checked, not guessed):

- NCCL user guide, "Environment Variables" (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html,
  read at version 2.29): accepted values of each variable.
- NCCL source, ``src/graph/tuning.cc`` ``parseList`` (2.24+): the per-collective grammar of
  NCCL_PROTO / NCCL_ALGO and its error cases; ``src/misc/param.cc`` ``ncclLoadParam``: the
  ``"%s set by environment to %lld."`` log line of integer parameters; ``src/graph/paths.cc``
  ``ncclGetLevel``: NCCL_P2P_DISABLE / NCCL_P2P_LEVEL parsing and logging.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.names import check_safe_name

__all__ = [
    "BUILTIN_PROFILES",
    "KNOWN_NCCL_VARIABLES",
    "NCCL_DEBUG_ENV",
    "NcclProfile",
    "applied_status",
    "describe_env",
    "inherited_nccl_env",
    "parse_nccl_env_lines",
    "profile_server_env",
    "resolve_profiles",
    "select_profiles",
    "validate_profile",
]


class _FrozenEnv(Mapping[str, str]):
    """A read-only, hashable name -> value mapping, so a profile can be a dict key or set member."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str]) -> None:
        self._items: dict[str, str] = dict(items)

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self._items.items())}}}"


@dataclass(frozen=True)
class NcclProfile:
    """One named set of environment overrides for the server, and where it was defined."""

    name: str
    description: str
    env: Mapping[str, str]
    source: str = "built-in"

    def __post_init__(self) -> None:
        # Freeze whatever mapping the caller passed, so the profile stays hashable and
        # nobody can change a profile's environment after it was validated.
        if not isinstance(self.env, _FrozenEnv):
            object.__setattr__(self, "env", _FrozenEnv(self.env))


BUILTIN_PROFILES: Mapping[str, NcclProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            NcclProfile(
                "default", "NCCL's own choices, no overrides: the reference the others are compared to", {}
            ),
            NcclProfile(
                "ring-ll",
                "Ring algorithm, LL protocol: lowest latency for the small all-reduces of decode",
                {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
            ),
            NcclProfile(
                "ring-simple",
                "Ring algorithm, Simple protocol: bandwidth over latency (large prefill all-reduces)",
                {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
            ),
            NcclProfile(
                "tree-ll",
                "Tree algorithm, LL protocol",
                {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"},
            ),
            NcclProfile(
                "tree-simple",
                "Tree algorithm, Simple protocol",
                {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"},
            ),
            NcclProfile(
                "ring-ll-tuned",
                "ring-ll with 16 channels, 16 MiB buffers and one CUDA work queue per device",
                {
                    "NCCL_PROTO": "LL",
                    "NCCL_ALGO": "Ring",
                    "NCCL_MAX_NCHANNELS": "16",
                    "NCCL_BUFFSIZE": "16777216",
                    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
                },
            ),
            NcclProfile(
                "p2p-off",
                "GPU peer-to-peer transport disabled: traffic goes through host memory (does PCIe P2P help?)",
                {"NCCL_P2P_DISABLE": "1"},
            ),
        )
    }
)

# Every variable the NCCL 2.29 user guide documents (env.html, both "System configuration" and
# "Debugging"), plus a few that NCCL's source reads without documenting them and two that
# PyTorch reads under an NCCL_ name. Accepted without value checks unless a rule below exists;
# the list feeds the "did you mean" warning for misspelled names.
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

# With --nccl-debug the server gets this on top of its profile: INFO level is what prints the
# "<VAR> set by environment to <value>" lines (the default NCCL_DEBUG_SUBSYS, INIT,BOOTSTRAP,ENV,
# includes the ENV subsystem they are logged under).
NCCL_DEBUG_ENV: Mapping[str, str] = MappingProxyType({"NCCL_DEBUG": "INFO"})

_RESERVED_PROFILE_NAMES = frozenset({"all"})
_PROFILE_TABLE_KEYS = ("description", "env", "extends")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# ncclFuncStr in NCCL's enqueue.cc: the prefixes NCCL 2.24+ accepts before ':' (case-insensitive).
_NCCL_FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
_NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
_NCCL_ALGORITHMS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
_P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
# NCCL_P2P_LEVEL's legacy integers (user guide; paths.cc levelsOldToNew). NVL has none.
_P2P_LEGACY_LEVELS = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}
_NTHREADS = ("64", "128", "256", "512")
_MAX_MIN_NCHANNELS = 32  # user guide: "up to 32 (2.5 and later)"
_MAX_CTAS = 64  # user guide: "a positive integer value up to 64 (32 prior to 2.25)"


# --------------------------------------------------------------------------------------------
# Resolution: built-ins + the user's table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _UserTable:
    name: str
    description: str | None
    extends: str | None
    env: dict[str, str]
    source: str


def _profile_source(table_source: str, name: str) -> str:
    # "pyproject.toml [tool.kimiperf.profiles]" -> "pyproject.toml [tool.kimiperf.profiles.NAME]",
    # the exact TOML header a user would search for.
    if table_source.endswith("]"):
        return f"{table_source[:-1]}.{name}]"
    return f"{table_source} profile {name!r}"


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _read_user_table(name: object, table: object, table_source: str) -> _UserTable:
    name = check_safe_name("profile", name, source=table_source)
    where = _profile_source(table_source, name)
    if name in _RESERVED_PROFILE_NAMES:
        raise ConfigError(
            f"profile name {name!r} (from {where}) is reserved: --nccl-profile {name} selects "
            "every profile; choose another name"
        )
    if not isinstance(table, Mapping):
        raise ConfigError(
            f"profile {name!r} (from {where}) must be a table with keys "
            f"{', '.join(_PROFILE_TABLE_KEYS)}; got {type(table).__name__} {table!r}"
        )
    for key in table:
        if key not in _PROFILE_TABLE_KEYS:
            raise ConfigError(
                f"profile {name!r} (from {where}): unknown key {key!r}; allowed keys: "
                f"{', '.join(_PROFILE_TABLE_KEYS)}{_did_you_mean(str(key), _PROFILE_TABLE_KEYS)}"
            )
    description = table.get("description")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ConfigError(
            f"profile {name!r} (from {where}): description must be a non-empty string; got {description!r}"
        )
    extends = table.get("extends")
    if extends is not None and not isinstance(extends, str):
        raise ConfigError(
            f"profile {name!r} (from {where}): extends must be the name of another profile "
            f"(a string); got {type(extends).__name__} {extends!r}"
        )
    raw_env = table.get("env", {})
    if not isinstance(raw_env, Mapping):
        raise ConfigError(
            f"profile {name!r} (from {where}): env must be a table of VARIABLE = value; "
            f"got {type(raw_env).__name__} {raw_env!r}"
        )
    env: dict[str, str] = {}
    for var, value in raw_env.items():
        if not isinstance(var, str) or not _ENV_NAME.match(var):
            raise ConfigError(
                f"profile {name!r} (from {where}): {var!r} is not a valid environment variable "
                "name; use letters, digits and '_', not starting with a digit"
            )
        # TOML booleans are ints to Python; `true` is never what NCCL reads, so say so.
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(
                f"profile {name!r} (from {where}): {var} = {value!r} has type "
                f"{type(value).__name__}; a value must be a string or an integer "
                "(write 1/0, not true/false)"
            )
        env[var] = str(value)
    return _UserTable(name, description, extends, env, where)


def resolve_profiles(user_tables: Mapping[str, Mapping[str, object]], source: str) -> dict[str, NcclProfile]:
    """Return every usable profile: the built-ins, then the user's, with ``extends`` applied.

    ``user_tables`` is the TOML table ``{name: {"description": str, "extends": str,
    "env": {VAR: str | int}}}``; ``source`` says where it came from, for example
    ``"pyproject.toml [tool.kimiperf.profiles]"``. A user profile may redefine a built-in name:
    it replaces the built-in (in place, keeping the built-ins' order) and its ``source`` says so.
    ``extends`` names a built-in or user profile (chains allowed); the child's env is the
    parent's with the child's variables on top. A profile without a description is described
    by its environment. Values are not checked here: see :func:`validate_profile`.
    """
    if not isinstance(user_tables, Mapping):
        raise ConfigError(
            f"{source} must be a table of profiles ({{name = {{env = {{...}}}}}}); "
            f"got {type(user_tables).__name__} {user_tables!r}"
        )
    tables = {}
    for name, table in user_tables.items():
        parsed = _read_user_table(name, table, source)
        tables[parsed.name] = parsed

    profiles: dict[str, NcclProfile] = dict(BUILTIN_PROFILES)
    resolved: dict[str, NcclProfile] = {}

    def resolve(name: str, chain: tuple[str, ...]) -> NcclProfile:
        if name in resolved:
            return resolved[name]
        if name not in tables:
            return BUILTIN_PROFILES[name]
        table = tables[name]
        chain = (*chain, name)
        parent_env: Mapping[str, str] = {}
        if table.extends is not None:
            parent = table.extends
            if parent in chain:
                cycle = " -> ".join((*chain[chain.index(parent) :], parent))
                raise ConfigError(
                    f"profile {parent!r} (from {tables[parent].source}) has an extends cycle: "
                    f"{cycle}; a profile cannot extend itself, directly or through others "
                    "(to change a built-in, redefine it without extends)"
                )
            if parent not in tables and parent not in BUILTIN_PROFILES:
                known = sorted({*BUILTIN_PROFILES, *tables})
                raise ConfigError(
                    f"profile {name!r} (from {table.source}) extends unknown profile {parent!r} "
                    f"(chain: {' -> '.join((*chain, parent))}){_did_you_mean(parent, known)}; "
                    f"known profiles: {', '.join(known)}"
                )
            parent_env = resolve(parent, chain).env
        env = {**parent_env, **table.env}
        description = table.description
        if description is None:
            description = describe_env(env)
            if table.extends is not None:
                description = f"{table.extends} + {describe_env(table.env)}"
        profile = NcclProfile(name, description.strip(), env, table.source)
        resolved[name] = profile
        return profile

    for name in tables:
        profiles[name] = resolve(name, ())
    return profiles


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


class _Rejection(Exception):
    """Internal: a value broke a rule; the caller adds profile, variable and source."""


@dataclass(frozen=True)
class _ListEntry:
    """One ';'-separated item of NCCL_PROTO / NCCL_ALGO: which functions, include or exclude what."""

    functions: tuple[str, ...]
    exclude: bool
    elements: tuple[str, ...]


def _parse_nccl_list(value: str, elements: tuple[str, ...], kind: str) -> list[_ListEntry]:
    # Mirrors parseList in NCCL's tuning.cc (2.24+): ';' separates entries, only the first may
    # lack a "function:" prefix, '^' inverts a list, tokens are case-insensitive, and an unknown
    # token makes NCCL fail (ncclInvalidUsage). Empty tokens are skipped, as strtok does.
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
                    f"unknown collective {prefix!r} in entry {item!r}{_did_you_mean(prefix, _NCCL_FUNCTIONS)}"
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
                    else _did_you_mean(token, elements)
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


def _positive_int(value: str) -> int:
    # NCCL reads integers with strtoll(base 0): a leading 0 means octal and trailing text is
    # dropped without a warning ("16M" would be 16), so accept plain decimal only.
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise _Rejection(
            "not a positive decimal integer (NCCL parses with strtoll base 0: a leading 0 means "
            "octal and trailing text is silently dropped)"
        )
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
    number = _positive_int(value)
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
        _positive_int(value)
    elif var == "NCCL_NTHREADS":
        if value not in _NTHREADS:
            raise _Rejection(f"allowed: {', '.join(_NTHREADS)}")
    elif var == "NCCL_P2P_LEVEL":
        # ncclGetLevel compares with strcmp, so "pix" matches nothing and is silently ignored.
        if value not in _P2P_LEVELS and value not in _P2P_LEGACY_LEVELS:
            hint = " (names are case-sensitive)" if value.upper() in _P2P_LEVELS else ""
            raise _Rejection(f"allowed: {', '.join(_P2P_LEVELS)}{hint}, or the legacy integers 0-4")
    elif var in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"):
        if value not in ("0", "1"):
            raise _Rejection("allowed: 0 or 1")
    elif var == "CUDA_DEVICE_MAX_CONNECTIONS":
        _check_range(value, 1, 32, "an integer")  # CUDA docs: 1 to 32, default 8


def validate_profile(profile: NcclProfile, *, pcie_only: bool | None) -> list[str]:
    """Check a profile's values against NCCL's documented rules; return warnings, raise on errors.

    ``pcie_only`` is True when the GPUs talk over PCIe only (no NVLink), False when NVLink is
    present, None when unknown (CPU engine, no NVML): hardware-dependent warnings need it.
    Raises ConfigError naming the profile, the variable, the bad value and what is allowed.
    Variables outside NCCL_* (VLLM_*, OMP_*, other CUDA_*) are accepted as they are.
    """
    warnings: list[str] = []
    who = f"NCCL profile {profile.name!r} (from {profile.source})"
    env = profile.env
    for var, value in env.items():
        try:
            _check_value(var, value)
        except _Rejection as exc:
            raise ConfigError(f"{who}: {var}={value!r} is invalid: {exc}") from None
        if var.startswith("NCCL_") and var not in KNOWN_NCCL_VARIABLES:
            warnings.append(
                f"{who}: {var} is not an NCCL variable this plugin knows; NCCL ignores unknown "
                f"names{_did_you_mean(var, KNOWN_NCCL_VARIABLES) or ' (no close match)'}"
            )
        elif not var.startswith("NCCL_") and var.upper().startswith("NCCL_"):
            warnings.append(
                f"{who}: {var} is not read by NCCL: environment names are case-sensitive"
                f"{_did_you_mean(var.upper(), KNOWN_NCCL_VARIABLES)}"
            )

    if "NCCL_BUFFSIZE" in env:
        size = int(env["NCCL_BUFFSIZE"])
        if size & (size - 1):
            warnings.append(
                f"{who}: NCCL_BUFFSIZE={size} is not a power of two; NCCL's docs recommend "
                "powers of 2 (default 4194304)"
            )
    for low, high in (("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"), ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS")):
        if low in env and high in env and int(env[low]) > int(env[high]):
            raise ConfigError(
                f"{who}: {low}={env[low]} is above {high}={env[high]}; the minimum must not "
                "exceed the maximum"
            )
    if env.get("NCCL_P2P_DISABLE") == "1" and "NCCL_P2P_LEVEL" in env:
        warnings.append(
            f"{who}: NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} has no effect: NCCL reads "
            "NCCL_P2P_DISABLE=1 first and then ignores the level"
        )
    for var, elements, kind in (
        ("NCCL_PROTO", _NCCL_PROTOCOLS, "protocol"),
        ("NCCL_ALGO", _NCCL_ALGORITHMS, "algorithm"),
    ):
        if var not in env:
            continue
        entries = _parse_nccl_list(env[var], elements, kind)
        if ";" in env[var] or ":" in env[var]:
            warnings.append(
                f"{who}: {var}={env[var]!r} uses the per-collective form, which needs NCCL 2.24+; "
                "older NCCL ignores tokens it does not recognise, so the list may not mean there "
                "what it means here"
            )
        if var == "NCCL_PROTO" and pcie_only:
            forced = _forced_on(entries, "LL128")
            if forced:
                scope = "every collective" if len(forced) == len(_NCCL_FUNCTIONS) else ", ".join(forced)
                warnings.append(
                    f"{who}: NCCL_PROTO={env[var]!r} turns LL128 on ({scope}) on a PCIe-only "
                    "host; NCCL enables LL128 by itself only where it is supported (NVLink), and "
                    "its docs warn that enabling it on other platforms can corrupt data"
                )
    return warnings


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


def _known_listing(known: Mapping[str, NcclProfile]) -> str:
    width = max((len(name) for name in known), default=0)
    lines = [f"  {name.ljust(width)}  {p.description} [{describe_env(p)}]" for name, p in known.items()]
    return "\n".join(lines)


def select_profiles(spec: str, known: Mapping[str, NcclProfile], *, source: str) -> list[NcclProfile]:
    """Turn ``--nccl-profile`` (``"a,b"`` or ``"all"``) into the profiles to run, in that order.

    A name given twice is an error (it would boot and measure the same server twice);
    ``all`` means every known profile and cannot be combined with names.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"empty NCCL profile selection (from {source}); give comma-separated profile names "
            f"or 'all'. Known profiles:\n{_known_listing(known)}"
        )
    names = [part.strip() for part in spec.split(",")]
    if any(not name for name in names):
        raise ConfigError(
            f"NCCL profile selection {spec!r} (from {source}) has an empty name; use "
            "comma-separated names such as 'default,ring-ll'"
        )
    if "all" in names:
        if len(names) > 1:
            raise ConfigError(
                f"NCCL profile selection {spec!r} (from {source}) mixes 'all' with names; use "
                "'all' alone or list the names"
            )
        return list(known.values())
    seen: set[str] = set()
    selected: list[NcclProfile] = []
    for name in names:
        if name in seen:
            raise ConfigError(
                f"NCCL profile {name!r} is selected twice in {spec!r} (from {source}); list each profile once"
            )
        seen.add(name)
        if name not in known:
            raise ConfigError(
                f"unknown NCCL profile {name!r} (from {source}){_did_you_mean(name, known)}; "
                f"known profiles (or 'all'):\n{_known_listing(known)}"
            )
        selected.append(known[name])
    return selected


# --------------------------------------------------------------------------------------------
# Server environment and header text
# --------------------------------------------------------------------------------------------


def _is_nccl_related(var: str) -> bool:
    return var.startswith("NCCL_") or var.startswith("CUDA_")


def profile_server_env(
    profile: NcclProfile, base_env: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Build the server's environment: ``base_env`` with the profile's variables on top.

    Also returns the shell variables the profile changed, ``name -> (shell value, profile
    value)``, so the run can say so. A shell variable with the same value as the profile is
    not reported. Neither ``base_env`` nor ``os.environ`` is modified.
    """
    env = dict(base_env)
    overridden = {
        var: (env[var], value) for var, value in profile.env.items() if var in env and env[var] != value
    }
    env.update(profile.env)
    return env, overridden


def inherited_nccl_env(profile: NcclProfile, base_env: Mapping[str, str]) -> dict[str, str]:
    """NCCL_*/CUDA_* variables from the shell that reach the server because the profile leaves them.

    They apply to every profile, ``default`` included, so a header that shows only the
    profile's overrides would hide them.
    """
    return {
        var: value
        for var, value in sorted(base_env.items())
        if _is_nccl_related(var) and var not in profile.env
    }


def describe_env(profile: NcclProfile | Mapping[str, str]) -> str:
    """One line for the header: ``NCCL_ALGO=Ring NCCL_PROTO=LL`` (sorted), or ``(no overrides)``."""
    env = profile.env if isinstance(profile, NcclProfile) else profile
    if not env:
        return "(no overrides)"
    return " ".join(f"{var}={shlex.quote(value)}" for var, value in sorted(env.items()))


# --------------------------------------------------------------------------------------------
# --nccl-debug: what NCCL says it read
# --------------------------------------------------------------------------------------------

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


def parse_nccl_env_lines(lines: Iterable[str]) -> dict[str, str]:
    """Read NCCL's ``NCCL_DEBUG=INFO`` log and return the value NCCL says it took for each variable.

    Integer parameters are logged as ``"%s set by environment to %lld."`` (param.cc), so the
    trailing period is dropped from integers; string ones (NCCL_PROTO, NCCL_ALGO, ...) are
    logged verbatim. A value NCCL rejected is reported as the default it fell back to. When
    ranks disagree, the distinct values are joined with `` | `` in the order seen.
    """
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
    if var in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL") and _P2P_LEGACY_LEVELS.get(wanted) == logged:
        return True
    if re.fullmatch(r"-?[0-9]+", wanted) and re.fullmatch(r"-?[0-9]+", logged):
        return int(wanted) == int(logged)
    return False


def applied_status(profile_env: Mapping[str, str], seen: Mapping[str, str]) -> dict[str, str]:
    """Say, per NCCL_*/CUDA_* variable of a profile, whether NCCL's log shows it took effect.

    Each answer is ``"applied"``, ``"not seen in the log"`` or ``"seen with a different value:
    X"``. "Not seen" is not "ignored": NCCL logs only some variables (CUDA_* never), only
    at NCCL_DEBUG=INFO, and a CPU engine (gloo) runs no NCCL at all.
    """
    status: dict[str, str] = {}
    for var, wanted in profile_env.items():
        if not _is_nccl_related(var):
            continue
        if var not in seen:
            status[var] = "not seen in the log"
        elif _same_setting(var, wanted, seen[var]):
            status[var] = "applied"
        else:
            status[var] = f"seen with a different value: {seen[var]}"
    return status
