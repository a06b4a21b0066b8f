"""The plugin's warning classes, so a user's ini can escalate them one by one.

``filterwarnings = error::pytest_kimiperf.InconclusiveWarning`` fails a perf test whose
comparison with its baseline is inconclusive (``--kimiperf-strict`` is the shorthand for that one);
``error::pytest_kimiperf.KimiperfWarning`` fails on any of them.
"""

from __future__ import annotations

import pytest


class KimiperfWarning(pytest.PytestWarning):
    """Base of every warning a perf test raises."""


class KimiperfDeprecationWarning(KimiperfWarning, DeprecationWarning):
    """An old spelling of an option or of its ini setting was used: it still works, and the
    warning names the spelling to use instead."""


class InconclusiveWarning(KimiperfWarning):
    """The change against the baseline looks beyond the tolerance without a verdict: the bounds
    a sign needs at the run's level hold zero (inconclusive), or exclude it without settling the
    size (changed, size unresolved), on too few boots."""


class MissingBaselineWarning(KimiperfWarning):
    """No baseline for this hardware: the test measured but judged nothing against history."""


class BelowTargetWarning(KimiperfWarning):
    """Single-stream decode is above the deployment's floor but below its target."""


class SoftFingerprintWarning(KimiperfWarning):
    """The baseline was recorded with other soft facts (host name, driver build, kernel)."""


class OtherVersionsWarning(KimiperfWarning):
    """Judged against a baseline of the same hardware recorded under other vLLM/torch/NCCL."""


class OneSessionHistoryWarning(KimiperfWarning):
    """The baseline history spans one session: the session spread in force is declared, not measured."""


# By gate.WarningKind value (this module stays free of the gate's numpy imports).
CLASS_OF: dict[str, type[KimiperfWarning]] = {
    "inconclusive": InconclusiveWarning,
    "missing-baseline": MissingBaselineWarning,
    "below-target": BelowTargetWarning,
    "soft-fingerprint": SoftFingerprintWarning,
    "other-versions": OtherVersionsWarning,
    "other": KimiperfWarning,
}
