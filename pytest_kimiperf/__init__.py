"""pytest-kimiperf: LLM-serving benchmarks (vLLM) as performance tests.

The plugin itself is wired in :mod:`pytest_kimiperf.plugin` (hooks) and
:mod:`pytest_kimiperf.hooks`; the logic lives in subpackages by role (``config``, ``server``,
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

from pytest_kimiperf.public_names import PUBLIC_NAMES as _PUBLIC_NAMES
from pytest_kimiperf.version import __version__ as __version__

if TYPE_CHECKING:  # the re-exports, spelt `X as X`, as type checkers read explicit re-exports
    from pytest_kimiperf.config.settings import Settings as Settings
    from pytest_kimiperf.judge.verdicts import TestResult as TestResult
    from pytest_kimiperf.measure.runner import run_sweep as run_sweep
    from pytest_kimiperf.measure.workload import Concurrency as Concurrency
    from pytest_kimiperf.measure.workload import ConcurrencySweep as ConcurrencySweep
    from pytest_kimiperf.measure.workload import RequestRate as RequestRate
    from pytest_kimiperf.measure.workload import Scenario as Scenario
    from pytest_kimiperf.measure.workload import SingleStream as SingleStream
    from pytest_kimiperf.measure.target import Target as Target
    from pytest_kimiperf.recorder import PerfRecorder as PerfRecorder
    from pytest_kimiperf.warning_types import BelowTargetWarning as BelowTargetWarning
    from pytest_kimiperf.warning_types import InconclusiveWarning as InconclusiveWarning
    from pytest_kimiperf.warning_types import KimiperfDeprecationWarning as KimiperfDeprecationWarning
    from pytest_kimiperf.warning_types import KimiperfWarning as KimiperfWarning
    from pytest_kimiperf.warning_types import MissingBaselineWarning as MissingBaselineWarning
    from pytest_kimiperf.warning_types import OneSessionHistoryWarning as OneSessionHistoryWarning
    from pytest_kimiperf.warning_types import OtherVersionsWarning as OtherVersionsWarning
    from pytest_kimiperf.warning_types import SoftFingerprintWarning as SoftFingerprintWarning

__all__ = ["__version__", *sorted(_PUBLIC_NAMES)]


def __getattr__(name: str) -> Any:
    home = _PUBLIC_NAMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pytest_kimiperf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pytest_kimiperf.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC_NAMES))
