"""The session reporter and the pytest-benchmark bridge: the perf results of a run and everything written from them.

The pytest-benchmark bridge: where pytest-benchmark is active (not on an xdist worker, not under
``--benchmark-disable`` or ``--benchmark-skip``), the first ``perf.measure`` of a test runs as its
one timed round (:func:`run_timed`: the scenario's wall time), with the LLM figures in
``benchmark.extra_info`` under vLLM ``bench serve``'s names (:func:`extra_info`) and the
fingerprint in ``machine_info``. Its table leaves these rows out (:func:`without_scenario_rows`):
one round reads as "StdDev 0.0000", and a round per request would have it judge the within-boot
distribution, request by request, the test stats.py rejects (the boot is the unit that varies).
The gate never depends on any of this.

The session reporter: the role pytest's junitxml gives its ``LogXML``. One
:class:`SessionReporter`, made in ``pytest_configure`` on the process that writes files and kept
in the stash, is forwarded the hooks it needs; it owns the results, the workers' server records,
the report (built once, at session finish) and the output errors, and reads the run's own facts
from a :class:`RunFacts`. One failing output does not stop the others. Nothing here imports
pytest or pytest-benchmark.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
import dataclasses
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
import importlib.metadata
from pathlib import Path
import shlex
from typing import Any, Protocol, TypeVar

from pytest_kimiperf.config.metric_specs import SampleKind, metrics_of
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.baselines import BaselineFile, Fingerprint, baseline_entries
from pytest_kimiperf.judge.engine_clock import vllm_named
from pytest_kimiperf.judge.gate import RunDecision
from pytest_kimiperf.judge.history import append_refusal
from pytest_kimiperf.judge.profiles import InSessionRules, profile_comparisons, session_plan
from pytest_kimiperf.measure.time_account import PlannedTime, SessionClock, TimeAccount, account_time
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.results import RunResult
from pytest_kimiperf.numbers import json_safe
from pytest_kimiperf.reports.answers import missing_baseline_warning
from pytest_kimiperf.reports.model import BaselineUpdate, ProfileFacts, SessionReport, build_session_report
from pytest_kimiperf.reports.nccl import NcclDebugCheck, check_server_log
from pytest_kimiperf.reports.outputs import OutputContext, write_outputs
from pytest_kimiperf.reports.header import planned_time
from pytest_kimiperf.reports.sentences import not_recorded_line, say_run_invalid
from pytest_kimiperf.reports.terminal import render_summary
from pytest_kimiperf.roofline.inputs import build_roofline_report, decode_results
from pytest_kimiperf.server.allreduce_path import decode_reach
from pytest_kimiperf.server.manager import ServerRecord
from pytest_kimiperf.server.weight_cache import WeightCacheFacts
from pytest_kimiperf.storage import baselines
from pytest_kimiperf.storage.git_facts import current_git_branch, current_git_commit


# The name pytest-benchmark's entry point registers its plugin under.
_BENCHMARK_PLUGIN = "benchmark"
# The extra_info key that marks a round as a kimiperf scenario (what the table leaves out).
_TIMED_KEY = "kimiperf_timed"
_TIMED = "one round: the scenario's wall time (prompt preparation, warm-up and measured rounds)"

T = TypeVar("T")


def _bench_serve_keys() -> tuple[str, ...]:
    """The figures extra_info carries, in bench serve's names: each per-request metric's median
    and each per-round throughput of the metric table (config/metric_specs.py)."""
    return (*(f"median_{name}" for name in metrics_of(SampleKind.REQUEST)), *metrics_of(SampleKind.ROUND))


def active_benchmark(config: Any, getfixturevalue: Callable[[str], Any], *, is_worker: bool) -> Any | None:
    """pytest-benchmark's ``benchmark`` fixture of the current test when it times anything, else None."""
    if is_worker:
        return None  # pytest-benchmark disables itself on xdist workers
    if not config.pluginmanager.hasplugin(_BENCHMARK_PLUGIN):
        return None
    if config.getoption("benchmark_skip", False):
        # The fixture calls pytest.skip under --benchmark-skip: the perf test must still run.
        return None
    fixture = getfixturevalue("benchmark")
    return fixture if getattr(fixture, "enabled", False) else None


def run_timed(benchmark: Any, target: Callable[[], T]) -> T:
    """Call ``target`` once as pytest-benchmark's single timed round and return its result."""
    result: T = benchmark.pedantic(target, rounds=1, iterations=1, warmup_rounds=0)
    return result


def extra_info(run: RunResult, *, profile: str, deployment: str) -> dict[str, Any]:
    """The LLM figures of a RunResult for ``benchmark.extra_info`` (bench serve names, JSON-safe):
    the median of each per-request metric and each per-round one, from the metric table."""
    summary = run.summary()
    figures = summary.to_json()
    info: dict[str, Any] = {key: json_safe(figures.get(key)) for key in _bench_serve_keys()}
    info.update({
        "completed": summary.completed,
        "failed": summary.failed,
        "scenario": run.scenario_name,
        "valid": summary.valid,
        "invalid_reason": say_run_invalid(summary.invalid) if summary.invalid is not None else None,
        "profile": profile,
        "deployment": deployment,
        _TIMED_KEY: _TIMED,
    })
    return info


def without_scenario_rows(groups: list[tuple[Any, list[dict[str, Any]]]]) -> tuple[list[tuple[Any, list[dict[str, Any]]]], int]:
    """pytest-benchmark's table groups without the kimiperf scenarios' rows (their JSON and
    storage keep them), and how many rows were left out."""
    kept: list[tuple[Any, list[dict[str, Any]]]] = []
    hidden = 0
    for name, benches in groups:
        rows = [b for b in benches if _TIMED_KEY not in (b.get("extra_info") or {})]
        hidden += len(benches) - len(rows)
        if rows:
            kept.append((name, rows))
    return kept, hidden


def add_fingerprint(machine_info: MutableMapping[str, Any], fingerprint: Any) -> None:
    """Put the kimiperf fingerprint into pytest-benchmark's ``machine_info`` (when one was taken)."""
    if fingerprint is not None:
        machine_info["kimiperf"] = fingerprint.to_json()


class RunFacts(Protocol):
    """What the reporter reads of the run it reports on."""

    settings: Settings

    def fingerprint(self) -> Fingerprint: ...

    def known_fingerprint(self) -> Fingerprint | None: ...

    def baselines_path(self) -> Path | None: ...

    def server_records(self) -> dict[str, ServerRecord] | None: ...

    def weight_cache_facts(self) -> WeightCacheFacts | None: ...

    def clock(self) -> SessionClock: ...


class TerminalWriter(Protocol):
    """The part of pytest's terminal reporter the summary writes through."""

    @property
    def verbosity(self) -> int: ...

    def write_sep(self, sep: str, title: str | None = None, **markup: bool) -> None: ...

    def write_line(self, line: str, **markup: bool) -> None: ...


@dataclass
class SessionReporter:
    """The perf results of this run and the files and summary made from them (controller only)."""

    run: RunFacts
    rootpath: Path
    update_json: Callable[[dict[str, Any]], None]  # the pytest_kimiperf_update_json hook
    results: list[TestResult] = field(default_factory=list)
    worker_records: list[ServerRecord] = field(default_factory=list)  # sent back by xdist workers
    report: SessionReport | None = None
    # What failed outside the report's own list (report.errors: the outputs it wrote): kept
    # apart, so the summary lists each once without comparing the words.
    output_errors: list[str] = field(default_factory=list)
    # how pytest was invoked (config.invocation_params.args): the default record command
    invocation: tuple[str, ...] = ()
    benchmark_rows_hidden: int = 0  # perf scenarios left out of pytest-benchmark's table

    @property
    def settings(self) -> Settings:
        return self.run.settings

    @property
    def record_command(self) -> str:
        """The command that records this machine's baselines: --kimiperf-record-command, else
        this run's own pytest command with --kimiperf-update-baselines (without --kimiperf-control: the
        control is the recorded build, never one to record)."""
        if self.settings.record_command:
            return self.settings.record_command
        args = shlex.join(arg for arg in self.invocation if arg != "--kimiperf-control")
        ini_control = self.settings.control and "--kimiperf-control" not in self.invocation  # set by an ini file
        return " ".join(part for part in ("python -m pytest", args, "--kimiperf-update-baselines",
                                          "-o kimiperf_control=false" if ini_control else "") if part)

    def missing_baseline_warning(self) -> str | None:
        """The session's one missing-baseline warning (None: nothing missing, or it fails the
        tests instead under --kimiperf-missing-baseline=fail)."""
        if self.report is None or self.settings.missing_baseline == "fail" or self.settings.update_baselines:
            return None
        return missing_baseline_warning(self.report, self.record_command)

    def add_output_error(self, error: str) -> None:
        """One more line for the summary's error section (it fails the run)."""
        self.output_errors.append(error)

    def add_result(self, data: Mapping[str, Any]) -> None:
        """Keep one perf test's result, as its test report carried it (serialized under xdist)."""
        self.results.append(TestResult.from_json(data))

    def add_worker_records(self, data: list[Mapping[str, Any]]) -> None:
        """Keep the server records an xdist worker sent back at its end."""
        self.worker_records.extend(ServerRecord.from_json(rec) for rec in data)

    def has_work(self) -> bool:
        """Whether this run measured or booted anything (else the reporter stays silent)."""
        return bool(self.results or self.run.server_records() is not None or self.worker_records)

    def prepare(self) -> SessionReport | None:
        """Session finish, first: the session's report (None for a run that is no perf run),
        whose profile comparisons judge/gate.py weighs before anything is written."""
        if not self.has_work():
            return None  # quiet when unused: a run without perf tests writes and imports nothing more
        if not self.results and not self._records() and not self._asked():
            return None  # not a perf run: say nothing, write nothing
        try:
            self.report = self.build_report(probe_fingerprint=bool(self.results) and self._asked())
        except KimiperfError as exc:
            self.output_errors.append(str(exc))
        return self.report

    def _in_session_rules(self) -> InSessionRules:
        settings = self.settings
        return InSessionRules.of(settings.deployment, plan=session_plan(
            profiles=len(settings.profiles), boots=settings.boots, max_boots=settings.max_boots,
            control=settings.control))

    def verdict_properties(self) -> list[tuple[str, str]]:
        """Each profile comparison's verdict as a (name, value) property, the comparisons judged
        as the report judges them (judge/profiles.py, on this run's results): for junitxml, whose
        file is written before the report is."""
        settings = self.settings
        rows = profile_comparisons(self.results, settings.reference_profile.name, rules=self._in_session_rules(),
                                   control=settings.control)
        return [(f"kimiperf_verdict {row.test}|{row.metric}|{row.profile} vs {row.reference_profile}",
                 row.comparison.verdict.value) for row in rows if row.comparison is not None]

    def write(self, *, passed: bool) -> None:
        """Session finish, then: write the baselines (--kimiperf-update-baselines, or append-on-pass
        when the run ``passed``, as judge/gate.py decided) and the reports asked for. What cannot
        be written is kept for the summary (:meth:`errors`); the rest is still written."""
        if self.report is None:
            return
        # The account runs on to here: the files are the last of the session's work it can hold.
        planned = self.report.time_account.planned if self.report.time_account is not None else None
        self.report.time_account = self._time_account(planned)
        try:
            self._write_outputs(self.report, passed=passed)
        except KimiperfError as exc:  # before or beside the outputs the report lists
            self.output_errors.append(str(exc))

    def errors(self) -> list[str]:
        """Everything that could not be written: each fails the run."""
        return [*(self.report.errors if self.report is not None else []), *self.output_errors]

    def write_summary(self, terminal: TerminalWriter, *, decision: RunDecision | None = None) -> None:
        """Write the kimiperf part of pytest's terminal summary, ending with how the run ends
        (``decision``); never raises."""
        if not self.has_work():
            return
        try:
            report = self.report
            if report is None and (self.results or self._records()):
                report = self.build_report(probe_fingerprint=False)
            for line in render_summary(report, verbosity=int(getattr(terminal, "verbosity", 0)),
                                       output_error="; ".join(self.output_errors) or None, decision=decision):
                if line.sep is not None:
                    terminal.write_sep(line.sep, line.text, **line.markup)
                else:
                    terminal.write_line(line.text, **line.markup)
        except Exception as exc:  # noqa: BLE001 - a raise here would hide pytest's own summary line
            terminal.write_line(f"kimiperf: could not write the perf summary: {type(exc).__name__}: {exc}", red=True)

    def build_report(self, *, probe_fingerprint: bool) -> SessionReport:
        """The session's report (``probe_fingerprint`` may probe GPUs). With single-stream decode
        results it also computes the roofline, which on a CPU deployment measures this host's copy
        bandwidth (about half a second, after the servers have stopped)."""
        settings = self.settings
        fingerprint = self.run.known_fingerprint()
        if fingerprint is None and settings.deployment.needs_gpus and decode_results(self.results):
            probe_fingerprint = True  # the GPU ceiling needs the GPU's name and interconnect
        if fingerprint is None and probe_fingerprint:
            # Under xdist only the workers probed the hardware: the controller probes once itself.
            fingerprint = self.run.fingerprint()
        opened = self.run.baselines_path()
        baselines_path: str | None = None
        if opened is not None:
            baselines_path = str(opened)
        elif fingerprint is not None:
            baselines_path = str(baselines.baseline_path(
                settings.baselines_dir, settings.deployment.name, fingerprint.key))
        report = build_session_report(
            results=self.results,
            reference_profile=settings.reference_profile.name,
            profiles=self._profile_facts(),
            deployment=_deployment_json(settings),
            fingerprint=fingerprint.to_json() if fingerprint is not None else None,
            created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            generator=_generator(),
            baselines_path=baselines_path,
            rules=self._in_session_rules(),
            control=settings.control,
            roofline=build_roofline_report(
                self.results, settings.deployment, fingerprint, rootpath=self.rootpath, external=settings.external,
            ),
        )
        report.weight_cache = self.run.weight_cache_facts()
        report.record_command = self.record_command
        report.gate = settings.gate
        report.benchmark_rows_hidden = self.benchmark_rows_hidden
        report.time_account = self._time_account(planned_time(settings, _baseline_file(report)))
        return report

    def _time_account(self, planned: PlannedTime | None) -> TimeAccount:
        """Where the session's wall clock went until now, beside the plan (measure/time_account.py):
        this process's servers and, under xdist, those the workers sent back."""
        records = self._records().values()
        return account_time(self.run.clock(), end=time.time(), spans=[s for r in records for s in r.spans],
                            accounts=[a for r in records for a in r.accounts], planned=planned)

    def _asked(self) -> bool:
        s = self.settings
        return bool(s.update_baselines or s.append_on_pass or s.perf_json or s.perf_markdown or s.perf_plots
                    or s.perf_export)

    def _write_outputs(self, report: SessionReport, *, passed: bool) -> None:
        settings = self.settings
        errors: list[str] = report.errors
        # The plots set this run beside the baseline it was judged against: read it before
        # --kimiperf-update-baselines replaces it.
        judged_against = _baseline_file(report) if settings.perf_plots and self.results else None

        if settings.update_baselines:
            try:
                report.baselines_update = self._update_baselines()
            except KimiperfError as exc:
                errors.append(str(exc))
        elif settings.append_on_pass and self.results:
            report.not_appended = append_refusal(self.results, passed=passed, branch=current_git_branch(self.rootpath),
                                                 allowed=settings.append_on_pass)
            if report.not_appended is None:
                try:
                    report.baselines_update = dataclasses.replace(self._update_baselines(on_pass=True), on_pass=True)
                except KimiperfError as exc:
                    errors.append(str(exc))

        write_outputs(report, OutputContext(settings, judged_against=judged_against, update_json=self.update_json))

    def _update_baselines(self, *, on_pass: bool = False) -> BaselineUpdate:
        settings = self.settings
        # A control's boots are the recorded build's, measured for this session's comparison only.
        controls = {p.name for p in settings.profiles if p.control_of}
        results = [res for res in self.results if res.profile not in controls]
        fp = self.run.known_fingerprint()
        entries, skipped = baseline_entries(results, git_commit=current_git_commit(self.rootpath),
                                            vllm=vllm_named(fp.hard) if fp is not None else "")
        not_recorded = [not_recorded_line(res) for res in skipped]
        if fp is None:
            # No perf test ran anywhere, so there is nothing to record and no hardware to name.
            return BaselineUpdate(path=str(settings.baselines_dir), entries=0, not_recorded=tuple(not_recorded))
        path = baselines.baseline_path(settings.baselines_dir, settings.deployment.name, fp.key)
        if not entries:
            return BaselineUpdate(path=str(path), entries=0, not_recorded=tuple(not_recorded))
        try:
            baselines.update_baseline(path, settings.deployment.name, fp, entries, on_pass=on_pass)
        except OSError as exc:
            # update_baseline turns its own write errors into BaselineError; creating the directory
            # (a --kimiperf-baselines-dir that is a file, no permission) can still fail underneath it.
            raise KimiperfError(
                f"cannot write baseline {path} (--kimiperf-update-baselines, --kimiperf-baselines-dir "
                f"{settings.baselines_dir}): {exc.strerror or exc}"
            ) from None
        return BaselineUpdate(path=str(path), entries=len(entries), not_recorded=tuple(not_recorded),
                              restarted=sum(entry.new_level for entry in entries))

    def _records(self) -> dict[str, ServerRecord]:
        """Server records of this process and, under xdist, those the workers sent back."""
        merged: dict[str, ServerRecord] = {}
        for rec in [*(self.run.server_records() or {}).values(), *self.worker_records]:
            if rec.profile in merged:
                merged[rec.profile].merge(rec)
            else:
                merged[rec.profile] = ServerRecord.from_json(rec.to_json())
        return merged

    def _profile_facts(self) -> list[ProfileFacts]:
        settings = self.settings
        records = self._records()
        managed_here = self.run.server_records() is not None
        facts = []
        for profile in settings.profiles:
            rec = records.get(profile.name)
            seen_env = next((dict(r.server_env) for r in self.results if r.profile == profile.name), {})
            named = ProfileFacts(name=profile.name, description=profile.description, profile_env=dict(profile.env),
                                 profile_args=profile.args, replaced_args=_replaced(settings, profile.name))
            if rec is None:
                # This process never held the server: an xdist worker booted it (its record stays
                # on that worker) or it never ran. The results still carry the env it ran with.
                facts.append(dataclasses.replace(
                    named, server_env=seen_env, boots=0 if (managed_here or self.worker_records) else None))
                continue
            facts.append(dataclasses.replace(
                named, server_env=dict(rec.env) or seen_env,
                overridden_shell_env=dict(rec.overridden_shell_env),
                boots=None if settings.external and not settings.deployment.restart_command else rec.boots, boot_s=rec.boot_s,
                log_path=str(rec.log_path) if rec.log_path else None,
                leftovers=tuple(rec.leftovers), error=rec.error,
                nccl_debug=_nccl_debug_check(settings, profile, rec),
                boot_accounts=tuple(rec.accounts), sweep=rec.sweep,
            ))
        return facts


def _replaced(settings: Settings, profile: str) -> tuple[str, ...]:
    """The deployment arguments the profile's own replaced, as ``old -> new`` lines."""
    plan = settings.command_plans.get(profile)
    return tuple(r.describe() for r in plan.replaced) if plan is not None else ()


def _baseline_file(report: SessionReport) -> BaselineFile | None:
    """The baseline file this run was judged against, or None (none, or unreadable: the
    verdicts already said so)."""
    if report.baselines_path is None:
        return None
    try:
        return baselines.load_baseline(report.baselines_path)
    except (KimiperfError, OSError):
        return None


def _nccl_debug_check(settings: Settings, profile: NcclProfile, rec: ServerRecord) -> NcclDebugCheck | None:
    """The --kimiperf-nccl-debug verdicts of one profile's server, from its log; None without --kimiperf-nccl-debug."""
    if not settings.nccl_debug:
        return None
    if settings.external:
        return NcclDebugCheck(
            profile.name, None,
            error="attached with --kimiperf-server-url: no server log here; start that server with "
                  "NCCL_DEBUG=INFO and look for '<VAR> set by environment to' in its log",
        )
    if rec.boots == 0 and rec.log_path is None:
        return None  # never started in this session: there is no log to judge
    last = rec.accounts[-1].all_reduce if rec.accounts else None  # the boot whose log the check reads
    return check_server_log(profile.name, profile.env, rec.log_path,
                            cpu_engine=not settings.deployment.needs_gpus, reach=decode_reach(last) if last else None)


def _deployment_json(settings: Settings) -> dict[str, Any]:
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
