"""What NCCL says it read: the ``--nccl-debug`` environment and reading its ``NCCL_DEBUG=INFO`` log.

With ``--nccl-debug`` the server gets :data:`NCCL_DEBUG_ENV` on top of its profile;
:func:`parse_nccl_env_lines` reads the values NCCL logged and :func:`applied_status` compares
them with what the profile asked for. Sources: NCCL's ``src/misc/param.cc`` ``ncclLoadParam``
(the ``"%s set by environment to %lld."`` log line of integer parameters) and
``src/graph/paths.cc`` ``ncclGetLevel`` (how NCCL_P2P_LEVEL is logged).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from pytest_kimiperf.config.nccl.values import P2P_LEGACY_LEVELS, is_nccl_related

__all__ = ["NCCL_DEBUG_ENV", "applied_status", "parse_nccl_env_lines"]

# With --nccl-debug the server gets this on top of its profile: INFO level is what prints the
# "<VAR> set by environment to <value>" lines (the default NCCL_DEBUG_SUBSYS, INIT,BOOTSTRAP,ENV,
# includes the ENV subsystem they are logged under).
NCCL_DEBUG_ENV: Mapping[str, str] = MappingProxyType({"NCCL_DEBUG": "INFO"})

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
    if var in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL") and P2P_LEGACY_LEVELS.get(wanted) == logged:
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
        if not is_nccl_related(var):
            continue
        if var not in seen:
            status[var] = "not seen in the log"
        elif _same_setting(var, wanted, seen[var]):
            status[var] = "applied"
        else:
            status[var] = f"seen with a different value: {seen[var]}"
    return status
