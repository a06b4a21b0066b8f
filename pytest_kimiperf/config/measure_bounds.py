"""The bounds a deployment sets on a measurement: the client's self-check and a quiet host.

:class:`HealthBounds` (a deployment's ``client_bounds``): past these the load generator, not
the server, shaped the numbers, and the run is INVALID (measure/results.py applies them).
:class:`HostBounds` (a deployment's ``host_bounds``): how much foreign activity a measured round
tolerates (measure/hostwatch.py applies them). Both are read and checked here, where the
deployment tables are, so a bad table is a usage error before anything runs.
"""

from __future__ import annotations

from typing import Any

from collections.abc import Mapping
from dataclasses import dataclass, fields

from pytest_kimiperf.errors import ConfigError

# nvmlClocksEventReason* bits: the nine nvml.h defines and ORs into nvmlClocksEventReasonAll
# (NVIDIA/go-nvml gen/nvml/nvml.h at 2f9e261; no nvml.h in that history ever defined 0x200 or
# 0x400). pynvml 13.615 also names 0x200 "BoardLimit" and 0x400 "Reliability", in its deprecated
# nvmlClocksThrottleReason* set only: no header says the driver sets them, so they decode as
# unknown_0x200 / unknown_0x400 (host_readings.decode_clock_event_reasons) and cannot be bounded.
CLOCK_EVENT_REASON_BITS: Mapping[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
KNOWN_THROTTLE_REASONS = frozenset(CLOCK_EVENT_REASON_BITS.values())


@dataclass(frozen=True)
class HealthBounds:
    """Past these, the client (not the server) shaped the numbers and the run is INVALID.

    * ``max_cpu_fraction``: process CPU time / wall time of a client process. One asyncio loop
      uses at most one core; close to 1.0 it queues its work, so stamps and sends go late.
    * ``max_loop_latency_p50_ms`` / ``_p99_ms``: how long an event that became due waited
      before its loop ran it (a probe thread posts to the loop every 2 ms and times the answer).
      Arrival stamps are the kernel's, but a loop that reads late reads two chunks of a stream
      at once and both get the later one's stamp; where the kernel gives no stamp, the read
      time is the stamp. The median catches a client that is always behind; the p99 catches
      stalls as long as a token gap (5 ms is one gap at 200 tok/s).
    * ``max_send_lag_p99_ms``: request sent versus its schedule (its arrival time for a request
      rate; the previous request's end for a closed loop), which shapes the offered load.

    The client's per-request deadlines travel with them (a deployment sets both kinds in its
    ``client_bounds`` table): past these a request has *stalled* and is invalid, and
    ``STALLS_TO_ABORT`` stalls in a row end the scenario (measure/engine.py):

    * ``first_token_deadline_s``: send to the first token chunk. 120 s is two orders above
      Kimi's TTFT at 64 streams of 1024-token prompts (the whole queue's prefill) and far below
      the 600 s whole-request timeout a wedged server would otherwise cost per request.
    * ``idle_deadline_s``: no token chunk for this long once the stream has begun. A busy
      server's longest decode pause is a prefill of newly admitted prompts, seconds at most.
    """

    max_cpu_fraction: float = 0.90
    max_loop_latency_p50_ms: float = 0.5
    max_loop_latency_p99_ms: float = 5.0
    max_send_lag_p99_ms: float = 5.0
    first_token_deadline_s: float = 120.0
    idle_deadline_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_cpu_fraction", "max_loop_latency_p50_ms", "max_loop_latency_p99_ms",
                     "max_send_lag_p99_ms", "first_token_deadline_s", "idle_deadline_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"HealthBounds.{name}={value!r}: must be a positive number")


def _checked_bound(key: str, value: object, source: str) -> object:
    """Return the bound in its stored form, or raise ConfigError naming key, value and source."""
    if key == "forbidden_throttle_reasons":
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: host bound {key} = {value!r} must be a list of reason names")
        if unknown := sorted(set(value) - KNOWN_THROTTLE_REASONS):
            known = ", ".join(sorted(KNOWN_THROTTLE_REASONS))
            raise ConfigError(f"{source}: host bound {key} = {list(value)!r} names unknown reasons {unknown}; "
                              f"known: {known}")
        return tuple(value)
    # TOML has no null, so "none" is how a pyproject table switches a bound off.
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if key == "max_foreign_gpu_processes":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{source}: host bound {key} = {value!r} must be an integer >= 0 or 'none'")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{source}: host bound {key} = {value!r} must be a share from 0 to 1 or 'none'")
    return float(value)


@dataclass(frozen=True)
class HostBounds:
    """How much foreign activity a measured round tolerates; None = not bounded.

    Shares are of the whole host's CPU capacity (all cores) or of wall time (PSI). A busy
    process beside a server gets less than a core: the scheduler favours the server's mostly
    waiting processes (on the 2-core CPU host one busy-looping process per core read 18.5%), so
    deployments set their own bound (tiny-cpu 10%, Kimi's 64+ core host 5%); 20% is the default.
    PSI bounds are off by default: our own server oversubscribing the cores raises ``cpu some``.
    ``forbidden_throttle_reasons``: clock events that flag a window. ``sw_power_cap`` (the board
    holding its power limit) is the measured load's own on a GPU no other process shares: it is
    reported with the result then, and flags the window only beside another GPU process
    (measure/hostwatch.py).
    """

    max_foreign_cpu_share: float | None = 0.20
    max_steal_share: float | None = 0.10
    max_psi_cpu_some: float | None = None
    max_psi_io_some: float | None = None
    max_psi_memory_some: float | None = None
    max_foreign_gpu_processes: int | None = 0
    forbidden_throttle_reasons: tuple[str, ...] = (
        "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_power_cap"
    )

    def __post_init__(self) -> None:
        for item in fields(self):
            object.__setattr__(self, item.name, _checked_bound(item.name, getattr(self, item.name), "HostBounds"))

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], *, source: str) -> HostBounds:
        """Build bounds from a config table (e.g. a deployment's ``host_bounds``), checking every key."""
        known = [item.name for item in fields(cls)]
        for key, value in data.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown host bound {key!r} = {value!r}; known: {', '.join(known)}")
        checked: dict[str, Any] = {key: _checked_bound(key, value, source) for key, value in data.items()}
        return cls(**checked)
