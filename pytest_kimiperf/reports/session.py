"""What the plugin produces at session end: baselines, plots, Markdown, JSON, the terminal summary.

``plugin.py`` calls :func:`write_outputs` from ``pytest_sessionfinish`` (controller only) and
:func:`terminal_summary` from ``pytest_terminal_summary``. Both take the plugin's run state
duck-typed (``settings``, ``results``, ``fingerprint``, ``manager``, ``view``, ``output_error``)
and neither imports pytest. The report is built once in :func:`write_outputs` and kept on the
state as ``state.report`` so the summary does not compute the profile comparisons twice.

One failing output does not stop the others: every error is collected, the rest is still
written, and one KimiperfError naming all of them is raised at the end, which the plugin turns
into ``state.output_error`` and a failed exit status.
"""

from __future__ import annotations

import importlib.metadata
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pytest_kimiperf.judge import baselines
from pytest_kimiperf.judge.baseline_schema import BaselineFile
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.baselines import baseline_entries
from pytest_kimiperf.reports.json_report import build_json_report, write_json_report
from pytest_kimiperf.reports.markdown import render_markdown, write_markdown
from pytest_kimiperf.reports.model import (
    BaselineUpdate,
    ProfileFacts,
    SessionReport,
    build_session_report,
)
from pytest_kimiperf.reports.nccl_check import NcclDebugCheck, check_server_log
from pytest_kimiperf.reports.terminal import render_summary
from pytest_kimiperf.roofline.inputs import build_roofline_report, decode_results

GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def write_outputs(config: Any, state: Any) -> None:
    """Write the baselines (--update-baselines) and the reports asked for; raise KimiperfError on failure."""
    settings = state.settings
    asked = bool(settings.update_baselines or settings.perf_json or settings.perf_markdown
                 or settings.perf_plots or settings.perf_export)
    if not state.results and not asked and not _records(state):
        return  # not a perf run: say nothing, write nothing
    needs_fingerprint = bool(state.results) and asked
    report = build_report(state, rootpath=Path(config.rootpath), probe_fingerprint=needs_fingerprint)
    state.report = report
    errors: list[str] = report.errors
    # The plots set this run beside the baseline it was judged against: read it before
    # --update-baselines replaces it.
    judged_against = _baseline_file(report) if settings.perf_plots and state.results else None

    if settings.update_baselines:
        try:
            report.baselines_update = _update_baselines(state, rootpath=Path(config.rootpath))
        except KimiperfError as exc:
            errors.append(str(exc))

    if settings.perf_plots and state.results:
        from pytest_kimiperf.reports.plots import render_plots

        try:
            files = render_plots(report, settings.perf_plots, baseline=judged_against)
        except KimiperfError as exc:
            errors.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - a drawing bug must not cost the JSON report
            errors.append(f"drawing plots into {settings.perf_plots} failed: {type(exc).__name__}: {exc}")
        else:
            report.outputs["plots"] = str(settings.perf_plots)
            report.plot_files = [str(path) for path in files]

    markdown_targets: list[tuple[Path, bool, str]] = []
    if settings.perf_markdown:
        markdown_targets.append((settings.perf_markdown, False, "--perf-markdown"))
    step_summary = os.environ.get(GITHUB_STEP_SUMMARY)
    # Only a run that measured something adds to the job summary: the plugin is loaded by every
    # pytest run in the environment, and unit-test jobs should not get an empty perf section.
    if step_summary and state.results:
        markdown_targets.append((Path(step_summary), True, f"${GITHUB_STEP_SUMMARY}"))
    if markdown_targets:
        for path, append, source in markdown_targets:
            key = "github_step_summary" if append else "markdown"
            report.outputs[key] = str(path)
        text = render_markdown(report)
        for path, append, source in markdown_targets:
            try:
                write_markdown(path, text, append=append, source=source)
            except KimiperfError as exc:
                errors.append(str(exc))
                report.outputs.pop("github_step_summary" if append else "markdown", None)

    if settings.perf_export is not None and state.results:
        from pytest_kimiperf.reports.export import write_exports

        try:
            write_exports(report, settings.perf_export, detailed=settings.perf_export_detailed)
        except KimiperfError as exc:
            errors.append(str(exc))
        else:
            report.outputs["export"] = str(settings.perf_export)

    if settings.perf_json:
        report.outputs["json"] = str(settings.perf_json)
        data = build_json_report(report)
        config.hook.pytest_kimiperf_update_json(config=config, report=data)
        try:
            write_json_report(settings.perf_json, data)
        except KimiperfError as exc:
            errors.append(str(exc))
            report.outputs.pop("json", None)

    if errors:
        raise KimiperfError("; ".join(errors))


def terminal_summary(terminalreporter: Any, state: Any) -> None:
    """Write the kimiperf part of pytest's terminal summary; never raises."""
    try:
        report: SessionReport | None = getattr(state, "report", None)
        if report is None and (state.results or _records(state)):
            config = getattr(terminalreporter, "config", None)
            rootpath = Path(config.rootpath) if config is not None else None
            report = build_report(state, rootpath=rootpath, probe_fingerprint=False)
        output_error = state.output_error
        if report is not None and output_error == "; ".join(report.errors):
            output_error = None  # already listed one by one
        verbosity = int(getattr(terminalreporter, "verbosity", 0))
        for line in render_summary(report, verbosity=verbosity, output_error=output_error):
            if line.sep is not None:
                terminalreporter.write_sep(line.sep, line.text, **line.markup)
            else:
                terminalreporter.write_line(line.text, **line.markup)
    except Exception as exc:  # noqa: BLE001 - a raise here would hide pytest's own summary line
        terminalreporter.write_line(
            f"kimiperf: could not write the perf summary: {type(exc).__name__}: {exc}", red=True)


def build_report(state: Any, *, rootpath: Path | None, probe_fingerprint: bool) -> SessionReport:
    """The session's report from the plugin's run state (``probe_fingerprint`` may probe GPUs).

    With single-stream decode results it also computes the roofline, which on a CPU deployment
    measures this host's copy bandwidth (about half a second, after the servers have stopped).
    """
    settings = state.settings
    fingerprint = state.fingerprint
    if fingerprint is None and settings.deployment.needs_gpus and decode_results(state.results):
        # The GPU ceiling needs the GPU's name and interconnect; under xdist only the workers
        # probed them.
        probe_fingerprint = True
    if fingerprint is None and probe_fingerprint:
        # Under xdist the workers probed the hardware; the controller needs it for the baseline
        # file name and the report, so it probes once itself (same function the plugin uses).
        from pytest_kimiperf.judge.fingerprint import session_fingerprint

        fingerprint = state.fingerprint = session_fingerprint(settings.deployment)
    baselines_path: str | None = None
    if state.view is not None:
        baselines_path = str(state.view.path)
    elif fingerprint is not None:
        baselines_path = str(baselines.baseline_path(
            settings.baselines_dir, settings.deployment.name, fingerprint.key))
    report = build_session_report(
        results=state.results,
        reference_profile=settings.reference_profile.name,
        profiles=_profile_facts(state),
        deployment=_deployment_json(settings),
        fingerprint=fingerprint.to_json() if fingerprint is not None else None,
        created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        generator=_generator(),
        baselines_path=baselines_path,
        prior_spread=settings.deployment.boot_spread,
        roofline=build_roofline_report(
            state.results, settings.deployment, fingerprint, rootpath=rootpath, external=settings.external,
        ),
    )
    report.weight_cache = state.manager.weight_cache_facts() if state.manager is not None else None
    return report


def _baseline_file(report: SessionReport) -> BaselineFile | None:
    """The baseline file this run was judged against, or None (none, or unreadable: the
    verdicts already said so)."""
    if report.baselines_path is None:
        return None
    try:
        return baselines.load_baseline(report.baselines_path)
    except (KimiperfError, OSError):
        return None


def _update_baselines(state: Any, *, rootpath: Path) -> BaselineUpdate:
    settings = state.settings
    entries, not_recorded = baseline_entries(state.results, git_commit=baselines.current_git_commit(rootpath))
    fp = state.fingerprint
    if fp is None:
        # No perf test ran anywhere, so there is nothing to record and no hardware to name.
        return BaselineUpdate(path=str(settings.baselines_dir), entries=0, not_recorded=tuple(not_recorded))
    path = baselines.baseline_path(settings.baselines_dir, settings.deployment.name, fp.key)
    if not entries:
        return BaselineUpdate(path=str(path), entries=0, not_recorded=tuple(not_recorded))
    try:
        baselines.update_baseline(path, settings.deployment.name, fp, entries)
    except OSError as exc:
        # update_baseline turns its own write errors into BaselineError; creating the directory
        # (a --baselines-dir that is a file, no permission) can still fail underneath it.
        raise KimiperfError(
            f"cannot write baseline {path} (--update-baselines, --baselines-dir "
            f"{settings.baselines_dir}): {exc.strerror or exc}"
        ) from None
    return BaselineUpdate(path=str(path), entries=len(entries), not_recorded=tuple(not_recorded))


def _records(state: Any) -> dict[str, Any]:
    """Server records of this process and, under xdist, those the workers sent back."""
    from pytest_kimiperf.server.manager import ServerRecord

    merged: dict[str, Any] = {}
    own = dict(state.manager.records) if state.manager is not None else {}
    for rec in [*own.values(), *getattr(state, "worker_records", [])]:
        if rec.profile in merged:
            merged[rec.profile].merge(rec)
        else:
            merged[rec.profile] = ServerRecord.from_json(rec.to_json())
    return merged


def _profile_facts(state: Any) -> list[ProfileFacts]:
    settings = state.settings
    records = _records(state)
    facts = []
    for profile in settings.profiles:
        rec = records.get(profile.name)
        seen_env = next((dict(r.server_env) for r in state.results if r.profile == profile.name), {})
        if rec is None:
            # This process never held the server: an xdist worker booted it (its record stays
            # on that worker) or it never ran. The results still carry the env it ran with.
            facts.append(ProfileFacts(
                name=profile.name, description=profile.description, profile_env=dict(profile.env),
                server_env=seen_env, boots=0 if (state.manager is not None or getattr(state, "worker_records", None)) else None,
            ))
            continue
        facts.append(ProfileFacts(
            name=profile.name, description=profile.description, profile_env=dict(profile.env),
            server_env=dict(rec.env) or seen_env,
            overridden_shell_env=dict(rec.overridden_shell_env),
            boots=None if settings.external else rec.boots, boot_s=rec.boot_s,
            log_path=str(rec.log_path) if rec.log_path else None,
            leftovers=tuple(rec.leftovers), error=rec.error,
            nccl_debug=_nccl_debug_check(settings, profile, rec),
            boot_accounts=tuple(rec.accounts),
        ))
    return facts


def _nccl_debug_check(settings: Any, profile: Any, rec: Any) -> NcclDebugCheck | None:
    """The --nccl-debug verdicts of one profile's server, from its log; None without --nccl-debug."""
    if not settings.nccl_debug:
        return None
    if settings.external:
        return NcclDebugCheck(
            profile.name, None,
            error="attached with --server-url: no server log here; start that server with "
                  "NCCL_DEBUG=INFO and look for '<VAR> set by environment to' in its log",
        )
    if rec.boots == 0 and rec.log_path is None:
        return None  # never started in this session: there is no log to judge
    return check_server_log(profile.name, profile.env, rec.log_path,
                            cpu_engine=not settings.deployment.needs_gpus)


def _deployment_json(settings: Any) -> dict[str, Any]:
    dep = settings.deployment
    return {
        "name": dep.name,
        "description": dep.description,
        "model": dep.model,
        "served_model_name": dep.served_model_name,
        "revision": dep.revision,
        "quantization": dep.quantization,
        "tensor_parallel_size": dep.tensor_parallel_size,
        "decode_floor_tok_s": dep.decode_floor_tok_s,
        "decode_target_tok_s": dep.decode_target_tok_s,
        "tolerances": dict(dep.tolerances),
        "source": dep.source,
        "server_url": settings.server_url,
        "model_config": dep.model_config,
        "memory_bandwidth_gbs": dep.memory_bandwidth_gbs,
        "allreduce_latency_us": dep.allreduce_latency_us,
    }


def _generator() -> str:
    try:
        return f"pytest-kimiperf {importlib.metadata.version('pytest-kimiperf')}"
    except importlib.metadata.PackageNotFoundError:
        return "pytest-kimiperf"
