"""The user's deployment tables: ``[tool.kimiperf.deployments.NAME]`` read, checked and resolved.

Every key's type and every value's range is checked here, so a bad table is a usage error naming
the table, the key and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS, PLACEHOLDERS, Deployment
from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.config.names import check_placeholders, check_safe_name
from pytest_kimiperf.config.nodes import check_nodes, layout_gpu_count, parse_nodes


# What a user deployment without ``extends`` starts from: nothing of another deployment's (a GPU
# deployment given tiny-cpu's 25% tolerances would be judged as loosely as the 2-core CPU twin).
_USER_BASE = Deployment(
    name="",
    description="",
    model="",
    served_model_name="",
    tensor_parallel_size=1,
    command=(),
    env=MappingProxyType({}),
    health_deadline_s=3600.0,
    gpu_count=0,
    gpu_name_contains=None,
    decode_floor_tok_s=0.0,
    decode_target_tok_s=0.0,
)

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "extends": str,
    "description": str,
    "model": str,
    "served_model_name": str,
    "tensor_parallel_size": int,
    "command": list,
    "env": dict,
    "health_deadline_s": (int, float),
    "gpu_count": int,
    "gpu_name_contains": str,
    "decode_floor_tok_s": (int, float),
    "decode_target_tok_s": (int, float),
    "host": str,
    "quantization": str,
    "revision": str,
    "tolerances": dict,
    "client_bounds": dict,
    "model_config": str,
    "memory_bandwidth_gbs": (int, float),
    "allreduce_latency_us": (int, float),
    "boot_spread": (int, float),
    "boot_spreads": dict,
    "session_spread": (int, float),
    "host_spread": (int, float),
    "boot_spread_df": (int, float),
    "session_spread_df": (int, float),
    "host_spread_df": (int, float),
    "spawn_mode_drop": (int, float),
    "spawn_mode_share": (int, float),
    "max_boots": int,
    "host_bounds": dict,
    "weight_cache": str,
    "nodes": list,
    "master_port": int,
    "restart_command": list,
    "server_hardware": str,
    "control_command": list,
    "load_s": (int, float),
    "gpu_memory_wait_s": (int, float),
}


def resolve_deployments(
    user_tables: Mapping[str, Mapping[str, Any]], *, source: str
) -> dict[str, Deployment]:
    """Built-in deployments plus the user's tables (which may ``extends`` another one)."""
    known = dict(BUILTIN_DEPLOYMENTS)
    pending = dict(user_tables)

    def build(name: str, chain: tuple[str, ...]) -> Deployment:
        if name in chain:
            raise ConfigError(f"deployment {name!r} in {source} extends itself: {' -> '.join(chain + (name,))}")
        table = pending.pop(name)
        where = f"{source} [deployments.{name}]"
        check_safe_name("deployment", name, source=where)
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table, got {type(table).__name__}")
        for key, value in table.items():
            if key not in _FIELDS:
                raise ConfigError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(sorted(_FIELDS))}")
            expected = _FIELDS[key]
            if not isinstance(value, expected) or isinstance(value, bool):
                raise ConfigError(
                    f"{where}: {key} = {value!r} has the wrong type; expected {_type_names(expected)}"
                )
        parent_name = table.get("extends")
        if parent_name is not None:
            if parent_name in pending:
                build(parent_name, chain + (name,))
            if parent_name not in known:
                raise ConfigError(f"{where}: extends unknown deployment {parent_name!r}; "
                                  f"known: {', '.join(sorted(known))}")
            base = known[parent_name]
        else:
            if "command" in table and "model" not in table:
                raise ConfigError(
                    f"{where}: a command without a model; give model (what '{{model}}' in the command "
                    f"becomes), or set 'extends' to a known deployment: {', '.join(sorted(known))}"
                )
            # Without a command the deployment can only attach (--kimiperf-server-url): nothing boots, and
            # without a model the served one comes from the server's /v1/models.
            base = _USER_BASE
        known[name] = _apply(base, name, table, where)
        return known[name]

    while pending:
        build(next(iter(pending)), ())
    return known


def _apply(base: Deployment, name: str, table: Mapping[str, Any], where: str) -> Deployment:
    fields: dict[str, Any] = {"name": name, "source": where}
    for key, value in table.items():
        if key == "extends":
            continue
        if key in ("command", "control_command"):
            if not value or not all(isinstance(part, str) for part in value):
                raise ConfigError(f"{where}: {key} must be a non-empty list of strings")
            check_placeholders(value, PLACEHOLDERS, what="command part", where=where)
            fields[key] = tuple(value)
        elif key == "restart_command":
            if not value or not all(isinstance(part, str) and part for part in value):
                raise ConfigError(f"{where}: restart_command = {value!r}; must be a non-empty list of non-empty "
                                  "strings (an argument list such as ['systemctl', 'restart', 'vllm'])")
            fields[key] = tuple(value)
        elif key == "env":
            fields[key] = MappingProxyType({**base.env, **_string_env(value, where)})
        elif key == "nodes":
            fields[key] = parse_nodes(value, where)
        elif key == "client_bounds":
            fields[key] = MappingProxyType({**base.client_bounds, **_client_bounds(value, where)})
        elif key == "tolerances":
            fields[key] = MappingProxyType({**base.tolerances, **check_tolerances(value, where)})
        elif key == "boot_spreads":
            fields[key] = MappingProxyType({**base.boot_spreads, **_check_metric_fractions(
                value, where, key="boot_spreads", example="{p99_itl_ms = 0.33}", what="0.33 = 33%")})
        elif key == "host_bounds":
            from pytest_kimiperf.config.deployments import HostBounds

            HostBounds.from_mapping({**base.host_bounds, **value}, source=where)  # ConfigError if bad
            fields[key] = MappingProxyType({**base.host_bounds, **value})
        elif _FIELDS[key] == (int, float):
            fields[key] = float(value)
        else:
            fields[key] = value
    if "decode_floor_tok_s" in table and "decode_target_tok_s" not in table:
        # A floor alone: the target (below which a run warns) is at least the floor, so
        # `decode_floor_tok_s = 40` is a deployment, not a target-below-floor error.
        fields["decode_target_tok_s"] = max(base.decode_target_tok_s, float(table["decode_floor_tok_s"]))
    if "gpu_count" not in table and ("extends" not in table or base.gpu_count > 0):
        # Unless given, a deployment holds the GPUs its parallel layout places on this machine
        # (a CPU one says gpu_count = 0): the hardware check and the NVML watch follow it. One
        # without a command only attaches: its GPUs are the server's, not this machine's.
        probe = replace(base, **fields)
        fields["gpu_count"] = 0 if not probe.command else layout_gpu_count(
            probe.command, tensor_parallel_size=probe.tensor_parallel_size, nodes=len(probe.nodes), where=where)
    if "served_model_name" not in table and "model" in table and "extends" not in table:
        fields["served_model_name"] = table["model"].rstrip("/").rsplit("/", 1)[-1]
    if "description" not in table and "extends" not in table:
        fields["description"] = f"user deployment from {where}"
    result = replace(base, **fields)
    _check(result, where)
    return result


def _check(d: Deployment, where: str) -> None:
    if d.tensor_parallel_size < 1:
        raise ConfigError(f"{where}: tensor_parallel_size = {d.tensor_parallel_size}; must be >= 1")
    if d.gpu_count < 0:
        raise ConfigError(f"{where}: gpu_count = {d.gpu_count}; must be >= 0")
    if not (math.isfinite(d.health_deadline_s) and d.health_deadline_s > 0):
        raise ConfigError(f"{where}: health_deadline_s = {d.health_deadline_s}; must be > 0 seconds")
    if not (math.isfinite(d.gpu_memory_wait_s) and d.gpu_memory_wait_s >= 0):
        raise ConfigError(f"{where}: gpu_memory_wait_s = {d.gpu_memory_wait_s}; must be seconds >= 0 (how long GPU "
                          "memory may take to come back before a boot)")
    if d.load_s is not None and not (math.isfinite(d.load_s) and d.load_s > 0):
        raise ConfigError(f"{where}: load_s = {d.load_s}; must be the seconds one boot takes to be ready, > 0")
    for label, value in (("decode_floor_tok_s", d.decode_floor_tok_s),
                         ("decode_target_tok_s", d.decode_target_tok_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{where}: {label} = {value}; must be a number >= 0")
    if d.server_hardware is not None and not d.server_hardware.strip():
        raise ConfigError(f"{where}: server_hardware is empty; state the attached server's hardware in your words "
                          "(such as '8x H100 SXM, NVLink'), or leave the key out")
    if d.model_config is not None and not d.model_config.strip():
        raise ConfigError(f"{where}: model_config is empty; give the path of the model's config.json "
                          "(or of its directory), or leave the key out")
    if d.memory_bandwidth_gbs is not None and not (
        math.isfinite(d.memory_bandwidth_gbs) and d.memory_bandwidth_gbs > 0
    ):
        raise ConfigError(f"{where}: memory_bandwidth_gbs = {d.memory_bandwidth_gbs}; must be a "
                          "number of GB/s > 0 (per device, 10**9 bytes/s as in datasheets)")
    if d.allreduce_latency_us is not None and not (
        math.isfinite(d.allreduce_latency_us) and d.allreduce_latency_us >= 0
    ):
        raise ConfigError(f"{where}: allreduce_latency_us = {d.allreduce_latency_us}; must be a "
                          "number of microseconds >= 0")
    for name, what in (("boot_spread", "a boot's median"), ("session_spread", "a session's effect"),
                       ("host_spread", "a host's effect")):
        value = getattr(d, name)
        if not (math.isfinite(value) and 0 <= value < 1):
            raise ConfigError(f"{where}: {name} = {value}; must be a fraction >= 0 and below 1 "
                              f"(the SD of {what}: 0.01 = 1%)")
    for name, default in (("boot_spread_df", "3 for a guess"), ("session_spread_df", "10 by default"),
                          ("host_spread_df", "10 by default")):
        value = getattr(d, name)
        if math.isnan(value) or value < 1:
            raise ConfigError(f"{where}: {name} = {value}; must be a number >= 1 or inf (how sure "
                              f"{name[:-3]} is, in degrees of freedom: the units it was measured on less one, "
                              f"{default}, inf for exact)")
    for name, what in (("spawn_mode_drop", "how much slower the slow spawn mode is: 0.5 = half as fast"),
                       ("spawn_mode_share", "the share of boots that land in the slow mode")):
        value = getattr(d, name)
        if not (math.isfinite(value) and 0 <= value < 1):
            raise ConfigError(f"{where}: {name} = {value}; must be a fraction >= 0 and below 1 ({what}; 0: no modes)")
    if (d.spawn_mode_drop > 0) != (d.spawn_mode_share > 0):
        raise ConfigError(f"{where}: spawn_mode_drop = {d.spawn_mode_drop} and spawn_mode_share = "
                          f"{d.spawn_mode_share}; declare both (modes) or neither")
    if d.weight_cache not in ("auto", "off"):
        raise ConfigError(f"{where}: weight_cache = {d.weight_cache!r}; allowed: 'auto', 'off'")
    if d.max_boots < 1:
        raise ConfigError(f"{where}: max_boots = {d.max_boots}; must be an integer >= 1")
    check_nodes(d.nodes, command=d.command, tensor_parallel_size=d.tensor_parallel_size,
                master_port=d.master_port, where=where)
    if d.decode_target_tok_s < d.decode_floor_tok_s:
        raise ConfigError(f"{where}: decode_target_tok_s = {d.decode_target_tok_s} is below "
                          f"decode_floor_tok_s = {d.decode_floor_tok_s}; the target must be >= the floor")


def _string_env(value: Mapping[str, Any], where: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ConfigError(f"{where}: env {key} = {item!r}; values must be strings or integers")
        env[str(key)] = str(item)
    return env


def check_tolerances(value: Any, where: str) -> dict[str, float]:
    """``{metric: fraction}`` checked (known metric, 0 < fraction < 1); ConfigError naming ``where``."""
    return _check_metric_fractions(value, where, key="tolerances", example="{decode_tok_s = 0.05}", what="0.03 = 3%")


def _check_metric_fractions(value: Any, where: str, *, key: str, example: str, what: str) -> dict[str, float]:
    """A table ``key`` of ``{metric: fraction}`` checked (known metric, 0 < fraction < 1);
    ConfigError naming ``where``, the key and the value."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key} = {value!r}; must be a table of metric = fraction, e.g. {example}")
    result: dict[str, float] = {}
    for metric, fraction in value.items():
        if metric not in METRICS:
            raise ConfigError(
                f"{where}: {key} names unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}"
            )
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
            raise ConfigError(
                f"{where}: {key}.{metric} = {fraction!r}; must be a fraction between 0 and 1 ({what})"
            )
        result[metric] = float(fraction)
    return result


def marker_tolerances(args: Sequence[Any], kwargs: Mapping[str, Any], where: str) -> dict[str, float]:
    """A ``@pytest.mark.kimiperf(tolerances=...)`` marker's arguments, checked (ConfigError)."""
    if args or set(kwargs) - {"tolerances"}:
        raise ConfigError(f"{where}: takes only tolerances={{metric: fraction}}, got "
                          f"{', '.join([repr(a) for a in args] + sorted(kwargs))}")
    return check_tolerances(kwargs.get("tolerances", {}), where)


def _client_bounds(value: Mapping[str, Any], where: str) -> dict[str, float]:
    from pytest_kimiperf.config.deployments import HealthBounds

    allowed = set(HealthBounds.__dataclass_fields__)
    result: dict[str, float] = {}
    for name, bound in value.items():
        if name not in allowed:
            raise ConfigError(f"{where}: client_bounds names unknown bound {name!r}; allowed: {', '.join(sorted(allowed))}")
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not bound > 0:
            raise ConfigError(f"{where}: client_bounds.{name} = {bound!r}; must be a positive number")
        result[name] = float(bound)
    return result


def _type_names(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    names = {"str": "a string", "int": "an integer", "float": "a number", "list": "a list",
             "dict": "a table"}
    return " or ".join(names.get(t.__name__, t.__name__) for t in types)


def select_deployment(name: str, known: Mapping[str, Deployment], *, source: str) -> Deployment:
    """The deployment called ``name``; an unknown name lists the known ones."""
    try:
        return known[name]
    except KeyError:
        listing = "; ".join(f"{d.name} ({d.description})" for d in known.values())
        raise ConfigError(f"unknown deployment {name!r} (from {source}); known deployments: {listing}") from None
