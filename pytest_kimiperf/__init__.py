"""pytest-kimiperf: LLM-serving benchmarks (vLLM) as performance tests.

The plugin itself is wired in :mod:`pytest_kimiperf.plugin` (hooks) and
:mod:`pytest_kimiperf.fixtures`; the logic lives in subpackages by role (``config``, ``server``,
``measure``, ``judge``, ``roofline``, ``reports``) that do not import pytest. docs/explanation/architecture.md
draws the layers and the import rule between them.

The public API, for perf tests in any repository::

    from pytest_kimiperf import Concurrency, ConcurrencySweep, PerfRecorder, RequestRate, SingleStream

Names are resolved on first use, so loading the plugin (which imports this package) stays cheap
for runs without perf tests.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from pytest_kimiperf.judge.verdicts import TestResult
    from pytest_kimiperf.recorder import PerfRecorder
    from pytest_kimiperf.measure.runner import run_sweep
    from pytest_kimiperf.measure.scenarios import (
        Concurrency, ConcurrencySweep, RequestRate, Scenario, SingleStream,
    )
    from pytest_kimiperf.measure.target import Target
    from pytest_kimiperf.config.settings import Settings
    from pytest_kimiperf.warning_types import (
        BelowTargetWarning, InconclusiveWarning, KimiperfDeprecationWarning, KimiperfWarning, MissingBaselineWarning,
        OneSessionHistoryWarning, OtherVersionsWarning, SoftFingerprintWarning,
    )

_HOME: dict[str, str] = {
    "Concurrency": "measure.scenarios", "ConcurrencySweep": "measure.scenarios",
    "RequestRate": "measure.scenarios", "Scenario": "measure.scenarios",
    "SingleStream": "measure.scenarios", "run_sweep": "measure.runner", "Target": "measure.target",
    "PerfRecorder": "recorder", "TestResult": "judge.verdicts", "Settings": "config.settings",
    "KimiperfWarning": "warning_types", "InconclusiveWarning": "warning_types",
    "MissingBaselineWarning": "warning_types", "BelowTargetWarning": "warning_types",
    "SoftFingerprintWarning": "warning_types", "OtherVersionsWarning": "warning_types",
    "OneSessionHistoryWarning": "warning_types", "KimiperfDeprecationWarning": "warning_types",
}

__all__ = ["__version__", *sorted(_HOME)]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'pytest_kimiperf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pytest_kimiperf.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
