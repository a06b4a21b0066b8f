"""The plugin's own files: its JSON report (``--kimiperf-json``) and its baseline files.

A report holds every boot of every test and profile of a session (``tests``: one entry per test,
profile and boot, with each metric's samples); each becomes one run, summarized as the gate
summarizes a boot (judge/boots.summarize_metric). A baseline file holds each test's, profile's
and metric's history of boots (storage/baselines.py reads and checks it); each stored boot
becomes one run. Runs are matched across groups by test and profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kimiperf.compare.runs import ResultFileError, RunFigure, ToolRun, count, mapping
from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.errors import BaselineError
from pytest_kimiperf.storage.baselines import SCHEMA_VERSION as BASELINE_SCHEMA, parse_baseline
from pytest_kimiperf.judge.stats import summarize_metric
from pytest_kimiperf.reports.model import short_test
from pytest_kimiperf.reports.outputs import SCHEMA_VERSION as REPORT_SCHEMA

TOOL = "pytest-kimiperf"


def is_report(data: Any) -> bool:
    """Whether ``data`` is the plugin's JSON report."""
    return isinstance(data, Mapping) and "tests" in data and "schema_version" in data and "profiles" in data


def is_baseline(data: Any) -> bool:
    """Whether ``data`` is one of the plugin's baseline files."""
    return isinstance(data, Mapping) and "entries" in data and "fingerprint" in data and "schema_version" in data


def read_report(path: Path, data: Mapping[str, Any]) -> list[ToolRun]:
    """Every valid boot of the report; ResultFileError for a newer schema or a damaged entry."""
    version = data.get("schema_version")
    if version != REPORT_SCHEMA:
        raise ResultFileError(f"{path}: field 'schema_version' is {version!r}; this pytest-kimiperf reads reports of "
                              f"schema {REPORT_SCHEMA}")
    tests = data["tests"]
    if not isinstance(tests, list):
        raise ResultFileError(f"{path}: field 'tests' is {type(tests).__name__}, not a list")
    runs = []
    for index, entry in enumerate(tests):
        where = f"tests[{index}]"
        if not isinstance(entry, Mapping) or not all(isinstance(entry.get(k), str) for k in ("test", "profile")):
            raise ResultFileError(f"{path}: {where} has no 'test' and 'profile' names")
        if entry.get("invalid"):
            continue  # an INVALID boot measured nothing about the build (the report says why)
        metrics = mapping(entry, "metrics", path, where=where)
        figures: dict[str, RunFigure] = {}
        for name, mres in metrics.items():
            field = f"{where}.metrics.{name}"
            if name not in METRICS:
                raise ResultFileError(f"{path}: {field}: unknown metric (known: {', '.join(sorted(METRICS))})")
            samples = mres.get("samples") if isinstance(mres, Mapping) else None
            if not isinstance(samples, list) or not all(isinstance(s, (int, float)) or s is None for s in samples):
                raise ResultFileError(f"{path}: field '{field}.samples' is missing or not a list of numbers")
            boot = summarize_metric(name, [float("nan") if s is None else float(s) for s in samples])
            figures[name] = RunFigure(boot.median, boot.n, f"{field}.samples")
        run = entry.get("run")
        run = run if isinstance(run, Mapping) else {}
        load = run.get("load")
        load = load if isinstance(load, Mapping) else {}
        completed = count(run, "completed", path, where=f"{where}.run") if "completed" in run else 0
        failed = count(run, "failed", path, where=f"{where}.run") if "failed" in run else 0
        runs.append(ToolRun(path=str(path), tool=TOOL, version=str(data.get("generator") or ""),
                            load=f"{short_test(entry['test'])} [{entry['profile']}]",
                            load_kind=str(load.get("kind") or entry.get("scenario") or ""), figures=figures,
                            requests=completed + failed, failed_requests=failed,
                            label=f"{entry['profile']} boot {entry.get('boot', index + 1)}"))
    if not runs:
        raise ResultFileError(f"{path}: field 'tests' holds no valid boot")
    return runs


def read_baseline(path: Path, text: str) -> list[ToolRun]:
    """Every stored boot of the baseline file, one run per test, profile and boot."""
    try:
        baseline = parse_baseline(path, text)
    except BaselineError as exc:
        raise ResultFileError(str(exc).replace(f"baseline {path}", f"{path} (a baseline of schema {BASELINE_SCHEMA})")) from None
    by_boot: dict[tuple[str, str, int], dict[str, RunFigure]] = {}
    for key, entry in baseline.entries.items():
        for index, boot in enumerate(entry.summaries()):
            by_boot.setdefault((entry.test, entry.profile, index), {})[entry.metric] = RunFigure(
                boot.median, boot.n, f"entries.{key}.boots[{index}]")
    if not by_boot:
        raise ResultFileError(f"{path}: field 'entries' holds no recorded boot")
    return [ToolRun(path=str(path), tool=TOOL, version="", load=f"{short_test(test)} [{profile}]", load_kind="",
                    figures=figures, requests=max(f.n for f in figures.values()), failed_requests=0,
                    label=f"{profile} recorded boot {index + 1}")
            for (test, profile, index), figures in by_boot.items()]
