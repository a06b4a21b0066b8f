"""The files a run writes from its session report: one :class:`Output` each, in the order written.

A new format is one module that renders and writes it, one entry in :data:`OUTPUTS`, and its
option's row (config/options.py). The reporter hands every output the same report; one that
fails does not stop the others (its error is listed and its place left out); the summary lists
each written output's place under its label, in this order. The JSON report comes last: it
records where the others went.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.baselines import BaselineFile
from pytest_kimiperf.reports.model import SessionReport

GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


@dataclass(frozen=True)
class OutputContext:
    """What the outputs read besides the report: the settings, the baseline the run was judged
    against (read before --kimiperf-update-baselines replaced it), the environment and the
    ``pytest_kimiperf_update_json`` hook."""

    settings: Settings
    judged_against: BaselineFile | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    update_json: Callable[[dict[str, Any]], None] = lambda data: None


@dataclass(frozen=True)
class Target:
    """One place an output writes to: its key in ``report.outputs`` and its path."""

    kind: str
    path: Path


class Output(Protocol):
    """One report format."""

    # What the summary calls each of its targets, by kind (the key in report.outputs).
    labels: Mapping[str, str]
    # Whether it names its places in report.outputs before it writes (the Markdown lists where it
    # goes); the others are named once written.
    listed_first: bool

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        """Where this run asked it to write (none: not asked)."""
        ...

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        """Write it; a KimiperfError names what could not be written."""
        ...


class Plots:
    labels: Mapping[str, str] = {"plots": "plots"}
    listed_first = False

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        plots = ctx.settings.perf_plots
        return [Target("plots", plots)] if plots and report.results else []

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        from pytest_kimiperf.reports.plots import render_plots

        try:
            files = render_plots(report, target.path, baseline=ctx.judged_against)
        except KimiperfError:
            raise
        except Exception as exc:  # noqa: BLE001 - a drawing bug must not cost the JSON report
            raise KimiperfError(f"drawing plots into {target.path} failed: {type(exc).__name__}: {exc}") from exc
        report.plot_files = [str(path) for path in files]


class Markdown:
    labels: Mapping[str, str] = {"markdown": "Markdown summary",
                                 "github_step_summary": "Markdown appended to $GITHUB_STEP_SUMMARY"}
    listed_first = True

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        found = [Target("markdown", ctx.settings.perf_markdown)] if ctx.settings.perf_markdown else []
        # Only a run that measured something adds to the job summary: the plugin is loaded by every
        # pytest run in the environment, and unit-test jobs should not get an empty perf section.
        if (step_summary := ctx.environ.get(GITHUB_STEP_SUMMARY)) and report.results:
            found.append(Target("github_step_summary", Path(step_summary)))
        return found

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        from pytest_kimiperf.reports.markdown import render_markdown, write_markdown

        appended = target.kind == "github_step_summary"
        write_markdown(target.path, render_markdown(report), append=appended,
                       source=f"${GITHUB_STEP_SUMMARY}" if appended else "--kimiperf-markdown")


class BenchServeExport:
    labels: Mapping[str, str] = {"export": "vLLM bench serve results"}
    listed_first = False

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        export = ctx.settings.perf_export
        return [Target("export", export)] if export is not None and report.results else []

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        from pytest_kimiperf.reports.export import write_exports

        write_exports(report, target.path, detailed=ctx.settings.perf_export_detailed)


class JsonReport:
    labels: Mapping[str, str] = {"json": "JSON report"}
    listed_first = True

    def targets(self, report: SessionReport, ctx: OutputContext) -> list[Target]:
        return [Target("json", ctx.settings.perf_json)] if ctx.settings.perf_json else []

    def write(self, report: SessionReport, target: Target, ctx: OutputContext) -> None:
        from pytest_kimiperf.reports.json_report import build_json_report, write_json_report

        data = build_json_report(report)
        ctx.update_json(data)
        write_json_report(target.path, data)


OUTPUTS: tuple[Output, ...] = (Plots(), Markdown(), BenchServeExport(), JsonReport())


def output_labels() -> dict[str, str]:
    """Every output's label, by kind, in the order the outputs are written."""
    return {kind: label for output in OUTPUTS for kind, label in output.labels.items()}


def write_outputs(report: SessionReport, ctx: OutputContext) -> None:
    """Write every output the run asked for, in :data:`OUTPUTS`' order; what fails is added to
    ``report.errors`` and left out of ``report.outputs``, and the rest is still written."""
    for output in OUTPUTS:
        targets = output.targets(report, ctx)
        if output.listed_first:
            report.outputs.update((t.kind, str(t.path)) for t in targets)
        for target in targets:
            try:
                output.write(report, target, ctx)
            except KimiperfError as exc:
                report.errors.append(str(exc))
                report.outputs.pop(target.kind, None)
            else:
                report.outputs[target.kind] = str(target.path)
