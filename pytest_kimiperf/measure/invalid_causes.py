"""Why a measurement was not judged, as a cause that says what to do about it (pure).

A run that is INVALID taught nothing about the build, and what the user does next depends on
why: a busy host clears by itself, a CPU quota does not, a client held off the CPU needs CPUs of
its own. Only the host and the client make a measurement INVALID: a server that stalls or
writes its stream in bursts is what the test exists to catch, measured and judged like any
slower one. Every place that advises (the test's line, the answers, the summary's last line,
the exit line) takes its advice from the cause, through :func:`advice`, so a quota never reads
as a busy host's "retry".
"""

from __future__ import annotations

from enum import StrEnum
from typing import assert_never


class InvalidCause(StrEnum):
    """Why a measurement was not judged."""

    BUSY_HOST = "busy-host"  # other work broke a bound of the host watch in every attempt
    CPU_QUOTA = "cpu-quota"  # a cgroup CPU quota throttled every attempt
    GPU_THROTTLE = "gpu-throttle"  # the GPUs' clocks were held back by something other than the load
    CLIENT_HELD = "client-held"  # the client was held off the CPU, or ran out of it
    NO_REQUEST = "no-request"  # no request measured, or none valid


def advice(cause: InvalidCause) -> str:
    """What to do about an INVALID of this cause, as the words after the reason."""
    match cause:
        case InvalidCause.BUSY_HOST:
            return "rerun when the processes named above are done, or on a host of its own"
        case InvalidCause.CPU_QUOTA:
            return ("raise the CPU quota (a container's CPU limit) or measure a lighter load: a rerun under the "
                    "same quota is throttled again")
        case InvalidCause.GPU_THROTTLE:
            return "clear what held the GPU clocks back (heat, a power cap, another process), then rerun"
        case InvalidCause.CLIENT_HELD:
            return ("give the client CPUs of its own (more cores than the server uses, or client_processes) or "
                    "quieten the host: a rerun on the same loaded host is held off again")
        case InvalidCause.NO_REQUEST:
            return "the server answered no request: its log says why"
        case _:
            assert_never(cause)


def advice_for(causes: list[str] | tuple[str, ...]) -> str:
    """The advice of every distinct cause in ``causes`` (InvalidCause values), joined; a value
    this version does not know (a newer report) is left out."""
    known = [InvalidCause(c) for c in dict.fromkeys(causes) if c in InvalidCause._value2member_map_]
    return "; ".join(advice(c) for c in known)
