"""The reports a run writes are a list of formats (reports/outputs.py): each names its places, one
that fails costs no other, and the summary lists each written place under the format's own label."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.reports import outputs
from pytest_kimiperf.reports.model import SessionReport
from pytest_kimiperf.reports.outputs import OUTPUTS, OutputContext, Target, output_labels, write_outputs
from pytest_kimiperf.reports.terminal import servers_and_files


def _report() -> SessionReport:
    return SessionReport(generator="test", created_at="2026-01-02T03:04:05Z", deployment={}, fingerprint=None,
                         reference_profile="default", profiles=[], results=[], profile_comparisons=[])


class _Format:
    """A format of a test's own: it writes what it is told, or fails."""

    listed_first = False

    def __init__(self, kind: str, path: Path, *, fails: bool = False, seen: list[Any] | None = None) -> None:
        self.labels: Mapping[str, str] = {kind: f"{kind} file"}
        self.kind, self.path, self.fails, self.seen = kind, path, fails, seen if seen is not None else []

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        return [Target(self.kind, self.path)]

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        self.seen.append(dict(report.outputs))
        if self.fails:
            raise KimiperfError(f"cannot write {target.path}: disk full")
        target.path.write_text(self.kind)


def test_every_format_has_a_label_and_a_kind_of_its_own() -> None:
    kinds = [kind for output in OUTPUTS for kind in output.labels]
    assert len(kinds) == len(set(kinds)) == len(output_labels())
    assert list(output_labels())[-1] == "json"  # written last: it records where the others went


def test_a_new_format_is_one_entry_and_the_summary_lists_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outputs, "OUTPUTS", (*OUTPUTS, _Format("csv", tmp_path / "run.csv")))
    report = _report()
    write_outputs(report, OutputContext(SimpleNamespace(perf_plots=None, perf_markdown=None, perf_export=None,
                                                        perf_json=None), environ={}))  # type: ignore[arg-type]
    assert report.outputs == {"csv": str(tmp_path / "run.csv")} and (tmp_path / "run.csv").read_text() == "csv"
    lines = [line.text for line in servers_and_files(report, quiet=False)]
    assert f"csv file: {tmp_path / 'run.csv'}" in lines


def test_a_format_that_fails_costs_no_other_and_is_not_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    broken = _Format("first", tmp_path / "first.txt", fails=True)
    after = _Format("second", tmp_path / "second.txt", seen=seen)
    monkeypatch.setattr(outputs, "OUTPUTS", (broken, after))
    report = _report()
    write_outputs(report, OutputContext(SimpleNamespace(), environ={}))  # type: ignore[arg-type]
    assert report.errors == [f"cannot write {tmp_path / 'first.txt'}: disk full"]
    assert report.outputs == {"second": str(tmp_path / "second.txt")}
    assert seen == [{}]  # the failed one was never listed, so no later report names it


def test_the_markdown_and_json_name_where_they_go_and_the_json_comes_last(tmp_path: Path) -> None:
    settings = SimpleNamespace(perf_plots=None, perf_export=None, perf_markdown=tmp_path / "summary.md",
                               perf_json=tmp_path / "report.json")
    report = _report()
    write_outputs(report, OutputContext(settings, environ={}))  # type: ignore[arg-type]
    assert list(report.outputs) == ["markdown", "json"] and not report.errors
    assert str(tmp_path / "summary.md") in (tmp_path / "report.json").read_text()
