"""The names ``pytest_kimiperf`` exports, each with the module under the package that defines it.

The package root resolves them from this table on first use, and the API reference page lists
them from it. It imports nothing, so the reference page need not import the root: nothing inside
the package does, as the root names every layer.
"""

PUBLIC_NAMES: dict[str, str] = {
    "Concurrency": "measure.workload", "ConcurrencySweep": "measure.workload",
    "RequestRate": "measure.workload", "Scenario": "measure.workload",
    "SingleStream": "measure.workload", "run_sweep": "measure.runner", "Target": "measure.target",
    "PerfRecorder": "recorder", "TestResult": "judge.verdicts", "Settings": "config.settings",
    "KimiperfWarning": "warning_types", "InconclusiveWarning": "warning_types",
    "MissingBaselineWarning": "warning_types", "BelowTargetWarning": "warning_types",
    "SoftFingerprintWarning": "warning_types", "OtherVersionsWarning": "warning_types",
    "OneSessionHistoryWarning": "warning_types", "KimiperfDeprecationWarning": "warning_types",
}
