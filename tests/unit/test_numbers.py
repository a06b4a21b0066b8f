"""The shared number helpers: one rule each, as every report and message writes them."""

from __future__ import annotations

import math
import re

import pytest

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.numbers import (
    finite_only, fmt_ci, fmt_change, fmt_share, fmt_spread, fmt_value, json_safe, positive_int,
)


@pytest.mark.parametrize(("value", "text"), [(81.4, "81.4"), (12.345, "12.35"), (1234.4, "1234"),
                                             (12345.6, "12346"), (None, "n/a"), (math.nan, "n/a")])
def test_a_figure_has_four_significant_digits_and_never_e_notation(value: float | None, text: str) -> None:
    assert fmt_value(value) == text


def test_changes_intervals_spreads_and_shares_read_as_percent() -> None:
    assert fmt_change(0.006) == "+0.6%" and fmt_change(-0.25) == "-25.0%" and fmt_change(math.inf) == "n/a"
    assert fmt_ci(-0.008, 0.02) == "-0.8..+2.0%" and fmt_ci(None, 0.1) == "n/a"
    assert fmt_spread(0.008) == "0.8%" and fmt_spread(0.18) == "18%" and fmt_spread(None) == "n/a"
    assert fmt_share(0.372) == "37%" and fmt_share(0.042) == "4.2%"


def test_json_safe_turns_every_non_finite_float_into_null_at_any_depth() -> None:
    assert json_safe({"a": [1.0, math.nan, {"b": math.inf}], 2: (3, "x")}) == {"a": [1.0, None, {"b": None}], "2": [3, "x"]}
    assert finite_only([1.0, math.nan, 2.0]) == [1.0, 2.0]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_positive_int_names_the_setting_and_the_value(bad: object) -> None:
    with pytest.raises(ConfigError, match=rf"^SingleStream\.requests={re.escape(repr(bad))}: must be an integer >= 1$"):
        positive_int(bad, what="SingleStream.requests")
    assert positive_int(None, what="x", allow_none=True) is None and positive_int(4, what="x") == 4
