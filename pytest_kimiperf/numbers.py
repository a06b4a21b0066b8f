"""Numbers as every part of the plugin writes and checks them: one home, low in the layers.

Formatting (a figure at four significant digits, a signed change, a boot spread, a share), the
JSON-safe form of a value (no NaN), and the rules for integer and positive-number settings.
Imports only ``errors``; every package may import it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from pytest_kimiperf.errors import ConfigError


def fmt_value(value: float | None) -> str:
    """A measured figure at four significant digits, never in e-notation (81.4, 12.35, 1234)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    text = f"{value:.4g}"
    # .4g turns 12345 into 1.234e+04; tok/s and ms read better as plain numbers.
    return f"{value:.0f}" if "e" in text else text


def fmt_change(fraction: float | None) -> str:
    """A signed relative change in percent, ``+0.6%``."""
    if fraction is None or not math.isfinite(fraction):
        return "n/a"
    return f"{fraction * 100:+.1f}%"


def fmt_ci(low: float | None, high: float | None) -> str:
    """A confidence interval of a relative change, ``-0.8..+2.0%``."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return "n/a"
    return f"{low * 100:+.1f}..{high * 100:+.1f}%"


def fmt_spread(fraction: float | None) -> str:
    """A spread between boots (always positive) as ``0.8%``, two significant digits."""
    return "n/a" if fraction is None or not math.isfinite(fraction) else f"{fraction * 100:.2g}%"


def fmt_share(fraction: float) -> str:
    """A part of a whole: whole percent from 10% up, two significant digits below (``37%``, ``4.2%``)."""
    pct = 100 * fraction
    return f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"


def is_real(value: object, *, finite: bool = False) -> TypeGuard[float]:
    """Whether ``value`` is a real number (ints, floats, numpy scalars), not a bool; with
    ``finite``, also not NaN or infinite. The one copy of this check."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    return not finite or math.isfinite(value)


def finite_only(samples: Iterable[float]) -> list[float]:
    """The finite samples (a failed request's NaN left out)."""
    return [s for s in samples if math.isfinite(s)]


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float made None, through mappings and sequences.

    JSON has no NaN: a failed request's NaN sample and an uncomputable bound become null (and
    pytest-benchmark's ``json.dumps`` of extra_info would otherwise print ``NaN``).
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def positive_int(value: object, *, what: str, allow_none: bool = False) -> int | None:
    """``value`` if it is an integer >= 1 (not a bool); else a ConfigError naming ``what`` and the value."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or None" if allow_none else ""
        raise ConfigError(f"{what}={value!r}: must be an integer >= 1{extra}")
    return value


def positive_number(value: object, *, what: str, allow_none: bool = False) -> float | None:
    """``value`` if it is a finite number > 0 (not a bool); else a ConfigError naming ``what`` and the value."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        extra = " or None" if allow_none else ""
        raise ConfigError(f"{what}={value!r}: must be a positive number{extra}")
    return value
