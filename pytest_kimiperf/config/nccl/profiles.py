"""Profiles: named variants of the server, as environment overrides and extra server arguments.

A profile is resolved from the built-ins and the user's ``[tool.kimiperf.profiles]`` table,
selected by ``--kimiperf-profile`` (short alias ``--nccl-profile``) and turned into the server's
environment and command. Its NCCL values are checked against NCCL's own rules in ``values``, its
arguments against the installed vLLM's serve parser in ``config.serve_args``; what NCCL logged
with ``--kimiperf-nccl-debug`` is read in ``debug_log``. The built-ins are NCCL's; a user's profile may
change anything the server takes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.names import check_safe_name, did_you_mean
from pytest_kimiperf.config.nccl.values import is_nccl_related


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
    """One named variant of the server: environment overrides, arguments appended to the
    deployment's command (an argument list, never a shell string), and where it was defined.

    Both are what the profile is: baselines, the weight cache and the reports key on them."""

    name: str
    description: str
    env: Mapping[str, str]
    source: str = "built-in"
    args: tuple[str, ...] = ()
    # --kimiperf-control: the profile this one is the control of (served by the deployment's
    # control_command, the recorded build); "" for every other profile.
    control_of: str = ""

    def __post_init__(self) -> None:
        # Hashable, and unchangeable once validated.
        if not isinstance(self.env, _FrozenEnv):
            object.__setattr__(self, "env", _FrozenEnv(self.env))
        object.__setattr__(self, "args", tuple(self.args))


# A control profile's name: the candidate's with this suffix. "@" is outside the names a profile
# may be given (config/names.py), so no profile of a user's can be mistaken for a control.
_CONTROL_SUFFIX = "@control"


def control_profile(candidate: NcclProfile) -> NcclProfile:
    """The control of ``candidate`` (--kimiperf-control): its environment and arguments, served
    by the deployment's control_command, which serves the recorded build."""
    return NcclProfile(f"{candidate.name}{_CONTROL_SUFFIX}",
                       f"the control: {candidate.name} served by the deployment's control_command (the recorded build)",
                       dict(candidate.env), "--kimiperf-control", candidate.args, control_of=candidate.name)


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
            # Tree for AllReduce only: NCCL has no Tree AllGather (tuning.cc), and vLLM gathers
            # the logits with one, so a bare NCCL_ALGO=Tree fails the engine (values.py
            # VLLM_COLLECTIVES). The per-collective form needs NCCL 2.24+.
            NcclProfile(
                "tree-ll",
                "Tree algorithm for all-reduce (NCCL's other collectives have no Tree), LL protocol",
                {"NCCL_ALGO": "allreduce:Tree", "NCCL_PROTO": "LL"},
            ),
            NcclProfile(
                "tree-simple",
                "Tree algorithm for all-reduce (NCCL's other collectives have no Tree), Simple protocol",
                {"NCCL_ALGO": "allreduce:Tree", "NCCL_PROTO": "Simple"},
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

_RESERVED_PROFILE_NAMES = frozenset({"all"})
_PROFILE_TABLE_KEYS = ("description", "env", "args", "extends")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class _UserTable:
    name: str
    description: str | None
    extends: str | None
    env: dict[str, str]
    source: str
    args: tuple[str, ...] = ()


def _profile_source(table_source: str, name: str) -> str:
    # The exact TOML header a user would search for: [tool.kimiperf.profiles.NAME].
    if table_source.endswith("]"):
        return f"{table_source[:-1]}.{name}]"
    return f"{table_source} profile {name!r}"


def _read_user_table(name: object, table: object, table_source: str) -> _UserTable:
    name = check_safe_name("profile", name, source=table_source)
    where = _profile_source(table_source, name)
    if name in _RESERVED_PROFILE_NAMES:
        raise ConfigError(
            f"profile name {name!r} (from {where}) is reserved: --kimiperf-profile {name} selects "
            "every profile; choose another name"
        )
    if not isinstance(table, Mapping):
        raise ConfigError(f"profile {name!r} (from {where}) must be a table with keys "
                          f"{', '.join(_PROFILE_TABLE_KEYS)}; got {type(table).__name__} {table!r}")
    for key in table:
        if key not in _PROFILE_TABLE_KEYS:
            raise ConfigError(f"profile {name!r} (from {where}): unknown key {key!r}; allowed keys: "
                              f"{', '.join(_PROFILE_TABLE_KEYS)}{did_you_mean(str(key), _PROFILE_TABLE_KEYS)}")
    description = table.get("description")
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ConfigError(
            f"profile {name!r} (from {where}): description must be a non-empty string; got {description!r}"
        )
    extends = table.get("extends")
    if extends is not None and not isinstance(extends, str):
        raise ConfigError(f"profile {name!r} (from {where}): extends must be the name of another profile "
                          f"(a string); got {type(extends).__name__} {extends!r}")
    raw_env = table.get("env", {})
    if not isinstance(raw_env, Mapping):
        raise ConfigError(f"profile {name!r} (from {where}): env must be a table of VARIABLE = value; "
                          f"got {type(raw_env).__name__} {raw_env!r}")
    env: dict[str, str] = {}
    for var, value in raw_env.items():
        if not isinstance(var, str) or not _ENV_NAME.match(var):
            raise ConfigError(f"profile {name!r} (from {where}): {var!r} is not a valid environment variable "
                              "name; use letters, digits and '_', not starting with a digit")
        # TOML booleans are ints to Python; `true` is never what NCCL reads, so say so.
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ConfigError(f"profile {name!r} (from {where}): {var} = {value!r} has type "
                              f"{type(value).__name__}; a value must be a string or an integer "
                              "(write 1/0, not true/false)")
        env[var] = str(value)
    return _UserTable(name, description, extends, env, where, _read_args(table.get("args", []), name, where))


def _read_args(raw: object, name: str, where: str) -> tuple[str, ...]:
    """A table's ``args``: a list of strings (integers allowed for values), never a shell string."""
    if isinstance(raw, str):
        raise ConfigError(f"profile {name!r} (from {where}): args must be a list of arguments, never a shell "
                          f"string; write {[*shlex.split(raw)]!r} instead of {raw!r}")
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(f"profile {name!r} (from {where}): args must be a list of arguments such as "
                          f"[\"--max-num-batched-tokens\", \"4096\"]; got {type(raw).__name__} {raw!r}")
    args = []
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ConfigError(
                f"profile {name!r} (from {where}): args item {item!r} has type {type(item).__name__}; "
                "each item is a string (or a number for a value)"
            )
        args.append(str(item))
    return tuple(args)


def resolve_profiles(user_tables: Mapping[str, Mapping[str, object]], source: str) -> dict[str, NcclProfile]:
    """Every usable profile: the built-ins, then the user's, with ``extends`` applied (a child's
    env and args on top of its parent's). A user profile of a built-in's name replaces it in
    place. Values are not checked here: see :func:`validate_profile`."""
    if not isinstance(user_tables, Mapping):
        raise ConfigError(f"{source} must be a table of profiles ({{name = {{env = {{...}}}}}}); "
                          f"got {type(user_tables).__name__} {user_tables!r}")
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
        parent_args: tuple[str, ...] = ()
        if table.extends is not None:
            parent = table.extends
            if parent in chain:
                cycle = " -> ".join((*chain[chain.index(parent) :], parent))
                raise ConfigError(f"profile {parent!r} (from {tables[parent].source}) has an extends cycle: "
                                  f"{cycle}; a profile cannot extend itself, directly or through others "
                                  "(to change a built-in, redefine it without extends)")
            if parent not in tables and parent not in BUILTIN_PROFILES:
                known = sorted({*BUILTIN_PROFILES, *tables})
                raise ConfigError(f"profile {name!r} (from {table.source}) extends unknown profile {parent!r} "
                                  f"(chain: {' -> '.join((*chain, parent))}){did_you_mean(parent, known)}; "
                                  f"known profiles: {', '.join(known)}")
            parent_profile = resolve(parent, chain)
            parent_env, parent_args = parent_profile.env, parent_profile.args
        env = {**parent_env, **table.env}
        args = (*parent_args, *table.args)
        description = table.description
        if description is None:
            description = _describe(env, args)
            if table.extends is not None:
                description = f"{table.extends} + {_describe(table.env, table.args)}"
        profile = NcclProfile(name, description.strip(), env, table.source, args)
        resolved[name] = profile
        return profile

    for name in tables:
        profiles[name] = resolve(name, ())
    return profiles


def _known_listing(known: Mapping[str, NcclProfile]) -> str:
    width = max((len(name) for name in known), default=0)
    lines = [f"  {name.ljust(width)}  {p.description} [{_describe(p.env, p.args)}]" for name, p in known.items()]
    return "\n".join(lines)


def select_profiles(spec: str, known: Mapping[str, NcclProfile], *, source: str) -> list[NcclProfile]:
    """Turn ``--kimiperf-profile`` (``"a,b"`` or ``"all"``) into the profiles to run, in that order;
    a name given twice would boot and measure the same server twice."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"empty profile selection (from {source}); give comma-separated profile names "
                          f"or 'all'. Known profiles:\n{_known_listing(known)}")
    names = [part.strip() for part in spec.split(",")]
    if any(not name for name in names):
        raise ConfigError(f"profile selection {spec!r} (from {source}) has an empty name; use "
                          "comma-separated names such as 'default,ring-ll'")
    if "all" in names:
        if len(names) > 1:
            raise ConfigError(f"profile selection {spec!r} (from {source}) mixes 'all' with names; use "
                              "'all' alone or list the names")
        return list(known.values())
    seen: set[str] = set()
    selected: list[NcclProfile] = []
    for name in names:
        if name in seen:
            raise ConfigError(
                f"profile {name!r} is selected twice in {spec!r} (from {source}); list each profile once"
            )
        seen.add(name)
        if name not in known:
            raise ConfigError(f"unknown profile {name!r} (from {source}){did_you_mean(name, known)}; "
                              f"known profiles (or 'all'):\n{_known_listing(known)}")
        selected.append(known[name])
    return selected


def profile_server_env(
    profile: NcclProfile, base_env: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The server's environment, ``base_env`` with the profile's variables on top, and the shell
    variables the profile changed, ``name -> (shell value, profile value)``, so the run can say so."""
    env = dict(base_env)
    overridden = {
        var: (env[var], value) for var, value in profile.env.items() if var in env and env[var] != value
    }
    env.update(profile.env)
    return env, overridden


def inherited_nccl_env(profile: NcclProfile, base_env: Mapping[str, str]) -> dict[str, str]:
    """NCCL_*/CUDA_* variables from the shell that reach the server because the profile leaves
    them: a header that shows only the profile's overrides would hide them."""
    return {
        var: value
        for var, value in sorted(base_env.items())
        if is_nccl_related(var) and var not in profile.env
    }


def _describe(env: Mapping[str, str], args: tuple[str, ...]) -> str:
    if not args:
        return describe_env(env)
    return f"{describe_env(env)} {describe_args(args)}" if env else describe_args(args)


def describe_args(args: NcclProfile | tuple[str, ...]) -> str:
    """A profile's server arguments as one shell-quoted line (``--enforce-eager``), or ``""``."""
    items = args.args if isinstance(args, NcclProfile) else args
    return shlex.join(items)


def describe_env(profile: NcclProfile | Mapping[str, str]) -> str:
    """One line for the header: ``NCCL_ALGO=Ring NCCL_PROTO=LL`` (sorted), or ``(no overrides)``."""
    env = profile.env if isinstance(profile, NcclProfile) else profile
    if not env:
        return "(no overrides)"
    return " ".join(f"{var}={shlex.quote(value)}" for var, value in sorted(env.items()))
