"""What a reader hands the judge: one run of a benchmark tool, its figures by metric.

A figure keeps the tool's own definition (its clock, its tokens, its percentile method): runs are
only compared with runs of the same tool (``verdict``). Each figure says which field of the file
it came from, so an error or a row can name it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimiperf.errors import KimiperfError

# The load a run offered, as config/metric_specs.PRIMARY_METRICS keys it.
SINGLE_STREAM = "single-stream"
CONCURRENCY = "concurrency"
REQUEST_RATE = "request-rate"


class ResultFileError(KimiperfError):
    """A result file that cannot be read whole: unknown, damaged, or of a version whose fields
    moved. The message names the file and the field."""


@dataclass(frozen=True)
class RunFigure:
    """One metric of one run: the tool's figure, the requests it rests on, and its field."""

    value: float
    n: int
    field: str


@dataclass(frozen=True)
class ToolRun:
    """One run of a benchmark tool against one server: what ``compare`` counts as a boot.

    ``load`` says what load the run offered (``concurrency 1``, ``rate 4 req/s``): runs are
    compared load by load. ``load_kind`` picks the primary metric (PRIMARY_METRICS)."""

    path: str
    tool: str
    version: str
    load: str
    load_kind: str
    figures: Mapping[str, RunFigure]
    requests: int
    failed_requests: int
    label: str = ""


def read_text(path: Path) -> str:
    """The file's text, or a ResultFileError that says why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{path}: not a text file ({exc.reason} at byte {exc.start})") from None


def load_json(path: Path) -> Any:
    """The file's JSON, or a ResultFileError that says why it is not JSON."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                              "a file cut short while it was written reads so") from None


def number(data: Mapping[str, Any], key: str, path: Path | str, *, where: str = "", positive: bool = False) -> float:
    """``data[key]`` as a finite number, or a ResultFileError naming the file and the field."""
    name = f"{where}.{key}" if where else key
    if key not in data:
        raise ResultFileError(f"{path}: field {name!r} is missing")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ResultFileError(f"{path}: field {name!r} is {value!r}, not a finite number")
    if value < 0 or (positive and value == 0):
        raise ResultFileError(f"{path}: field {name!r} is {value!r}: it must be {'above' if positive else 'at least'} zero")
    return float(value)


def count(data: Mapping[str, Any], key: str, path: Path | str, *, where: str = "") -> int:
    """``data[key]`` as a count (an integer >= 0), or a ResultFileError naming the field."""
    name = f"{where}.{key}" if where else key
    if key not in data:
        raise ResultFileError(f"{path}: field {name!r} is missing")
    value = data[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResultFileError(f"{path}: field {name!r} is {value!r}, not a count of requests")
    return value


def mapping(data: Any, key: str, path: Path | str, *, where: str = "") -> Mapping[str, Any]:
    """``data[key]`` as a JSON object, or a ResultFileError naming the field."""
    name = f"{where}.{key}" if where else key
    value = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(value, Mapping):
        found = "missing" if not isinstance(data, Mapping) or key not in data else f"{type(value).__name__}, not an object"
        raise ResultFileError(f"{path}: field {name!r} is {found}")
    return value


def load_words(kind: str, value: float | None) -> str:
    """The load as rows and errors name it: ``concurrency 4``, ``rate 2 req/s``, ``one stream``."""
    if kind == SINGLE_STREAM:
        return "one stream"
    if kind == CONCURRENCY:
        return f"concurrency {value:g}" if value is not None else "as fast as it goes"
    return f"rate {value:g} req/s"
