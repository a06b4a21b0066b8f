"""What a run says before its first test: the header (the settings in effect), --kimiperf-plan and --kimiperf-list.

* ``--kimiperf-list`` (:func:`listing_lines`): every deployment, profile and metric a run could
  use and where each is defined; nothing is collected, probed or booted.
* ``--kimiperf-plan`` (:func:`plan_lines`): what a run will cost and what it can resolve, before
  any boot (for Kimi-K2.5 a boot is a 20-36 minute load: ``--kimiperf-profile all`` is 7 profiles
  x 2 boots, about 6.5 hours): the boots, their loading time, and the smallest change the run
  resolves between its profiles and against the baseline history. Only the fingerprint is probed.
* The report header (:func:`settings_lines`, :func:`fingerprint_lines`): the settings in effect,
  as pytest-benchmark and pytest-randomly print theirs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
import math
from pathlib import Path
import shlex
import statistics
from typing import TYPE_CHECKING

from pytest_kimiperf.config.deployments import Deployment, describe_command
from pytest_kimiperf.config.metric_specs import Direction, METRICS, metric_spec
from pytest_kimiperf.config.nccl.profiles import describe_args, describe_env, inherited_nccl_env
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.measure.time_account import PlannedTime
from pytest_kimiperf.reports.nccl import forecast_line
from pytest_kimiperf.server.weight_cache import header_lines as weight_cache_lines, profile_cache_reason, why_not_used

# The judge (numpy, scipy) is imported where a plan is worked out, not with the module: the
# header of a run without perf tests must not load them.
if TYPE_CHECKING:
    from pytest_kimiperf.judge.baselines import BaselineFile, Fingerprint, HistorySpan
    from pytest_kimiperf.judge.profiles import InSessionRules
    from pytest_kimiperf.measure.cgroup_quota import QuotaInForce


_METRICS_SOURCE = "pytest_kimiperf/config/metric_specs.py"


def _rows(rows: list[tuple[str, ...]]) -> list[str]:
    """Aligned columns; the last one (often long) is left as it is."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows]


def listing_lines(s: Settings) -> list[str]:
    """Every deployment, profile and metric, marked where this run's settings select it."""
    lines = ["kimiperf deployments (--kimiperf-deployment; * selected):"]
    lines += _rows([(("* " if name == s.deployment.name else "  ") + name, f"{dep.source}: {dep.description}")
                    for name, dep in sorted(s.deployments.items())])
    selected = {p.name for p in s.profiles}
    lines.append("kimiperf profiles (--kimiperf-profile, comma-separated, or 'all'; * selected):")
    lines += _rows([(("* " if name in selected else "  ") + name,
                     f"{p.source}: " + describe_env(p) + (f"; args {describe_args(p)}" if p.args else ""))
                    for name, p in sorted(s.known_profiles.items())])
    lines.append(f"kimiperf metrics (perf.check names; tolerance of deployment {s.deployment.name}; "
                 f"defined in {_METRICS_SOURCE}):")
    lines += _rows([(name, spec.label, spec.unit,
                     "higher is better" if spec.direction is Direction.HIGHER_IS_BETTER else "lower is better",
                     f"tolerance {s.deployment.tolerance(name):.0%}")
                    for name, spec in METRICS.items()])
    return lines


_HEADLINE_METRIC = "decode_tok_s"


def fmt_duration(seconds: float) -> str:
    """``1 h 52 min``, ``28 min``, ``45 s``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def _load_time(s: Settings, baseline: BaselineFile | None) -> tuple[float | None, str]:
    """Seconds one boot takes to become ready, and where that figure comes from."""
    recorded = [boot.median for entry in (baseline.entries.values() if baseline else ())
                if entry.metric == "boot_ready_s" for boot in entry.boots]
    if recorded:
        return statistics.median(recorded), f"the median of {len(recorded)} recorded boots (boot_ready_s)"
    if s.deployment.load_s is not None:
        return s.deployment.load_s, f"declared by deployment {s.deployment.name} (load_s)"
    return None, (f"unknown: deployment {s.deployment.name} declares no load_s and its baseline history has no "
                  "boot_ready_s; perf.check(run, ['boot_ready_s']) records it")


def planned_time(s: Settings, baseline: BaselineFile | None) -> PlannedTime:
    """What the plan predicts of the run's time, for the time account to set the run beside."""
    seconds, source = _load_time(s, baseline)
    profiles = len(s.profiles)
    return PlannedTime(boots=s.boots * profiles, most_boots=s.max_boots * profiles, ready_s=seconds, source=source)


def plan_lines(s: Settings, baseline: BaselineFile | None) -> list[str]:
    """The plan, as printed by ``--kimiperf-plan``."""
    from pytest_kimiperf.judge.baselines import HistorySpan
    from pytest_kimiperf.judge.gate import family_critical
    from pytest_kimiperf.judge.noise import design_critical, smallest_change
    from pytest_kimiperf.judge.profiles import InSessionRules, control_reach
    from pytest_kimiperf.judge.stats import DETECTION_POWER, GATE_CRITICAL

    dep = s.deployment
    profiles = [p.name for p in s.profiles]
    planned, most = s.boots * len(profiles), s.max_boots * len(profiles)
    lines = [f"kimiperf plan for deployment {dep.name} (nothing boots):",
             f"  boots: {len(profiles)} profile{'s' * (len(profiles) != 1)} ({', '.join(profiles)}) x {s.boots} = "
             f"{planned} boot{'s' * (planned != 1)}"
             + (f", up to {most} with boots on demand ({s.max_boots} per profile)" if most > planned else "")]
    if s.external:
        lines.append("  attached (--kimiperf-server-url): " + (
            f"restarted with {' '.join(dep.restart_command)} for each boot after the first" if dep.restart_command
            else "one boot, never restarted (no restart_command): it can screen a change, never convict one"))
    seconds, source = _load_time(s, baseline)
    if seconds is None:
        lines.append(f"  loading: {source}")
    else:
        loading = f"{fmt_duration(seconds * planned)} of loading" + (
            f", up to {fmt_duration(seconds * most)}" if most > planned else "")
        lines.append(f"  loading: {fmt_duration(seconds)} a boot ({source}): {loading}")
    tolerance = dep.tolerance(_HEADLINE_METRIC)
    label = metric_spec(_HEADLINE_METRIC).label
    power = f"{DETECTION_POWER:.0%} power"
    rules = InSessionRules.of(dep)
    if s.control:
        lines.append(f"  against the control ({s.reference_profile.name}: the deployment's control_command, the "
                     f"recorded build, booted beside it, {s.boots} boot{'s' * (s.boots != 1)} each): a {label} "
                     f"regression of {control_reach(dep.boot_spread, max(s.boots, 2), tolerance, rules):.1%} or more "
                     f"is convicted "
                     f"beyond the {tolerance:.0%} tolerance ({power}); the session and host levels cancel")
    elif len(profiles) > 1:
        apart = smallest_change(dep.boot_spread, s.boots)
        lines.append(f"  profiles against each other ({s.boots} boot{'s' * (s.boots != 1)} each, boot spread "
                     f"{dep.boot_spread:.0%} declared): {label} changes of {apart:.1%} or more are told apart "
                     f"({power})" + ("; one boot each can never give a direction: use --kimiperf-boots 2 or more"
                                     if s.boots < 2 else ""))
    span = baseline.span() if baseline is not None else HistorySpan(0, 0, 0)
    if span.boots == 0:
        lines.append("  against the baseline: none recorded for this hardware yet (--kimiperf-update-baselines records one)")
    else:
        session_var = math.log1p(dep.session_spread) ** 2 * (1.0 + 1.0 / span.sessions)
        boots = max(s.boots, 2)
        # The gate's critical value at this design's df (the declarations' and the history's own),
        # its tail the run's: the baseline's entries of the selected profiles, times its looks.
        chosen = {p.name for p in s.profiles}
        family = sum(1 + bool(e.nights) for e in baseline.entries.values() if e.profile in chosen) \
            if baseline is not None else 0
        looks = max(1, s.max_boots - s.boots + 1)
        critical = design_critical(math.log1p(dep.boot_spread) ** 2 * (1.0 / boots + 1.0 / span.boots),
                                   dep.boot_spread_df + boots - 1 + max(span.boots - span.sessions, 0),
                                   [(session_var, dep.session_spread_df + span.sessions - 1)],
                                   z=family_critical(family * looks) if family else GATE_CRITICAL)
        beyond = smallest_change(dep.boot_spread, boots, reference_boots=span.boots, tolerance=tolerance,
                                 fixed_var=session_var, critical=critical)
        lines.append(f"  against the baseline ({span.boots} boots over {span.sessions} session"
                     f"{'s' * (span.sessions != 1)}): a {label} regression of {beyond:.1%} or more is convicted "
                     f"beyond the {tolerance:.0%} tolerance ({power}, the session spread {dep.session_spread:.0%} "
                     "as declared; another host adds its own)")
        if beyond > 2 * tolerance and not s.control:
            lines.append("  " + history_advice(dep.boot_spread, dep.session_spread, max(s.boots, 2), span,
                                               tolerance, label, boot_df=dep.boot_spread_df,
                                               session_df=dep.session_spread_df))
            offer = _control_offer(s, seconds, tolerance, label, rules)
            lines.extend(["  " + offer] if offer else [])
    return lines


def _control_offer(s: Settings, seconds: float | None, tolerance: float, label: str, rules: InSessionRules) -> str | None:
    """Where the history cannot convict twice the tolerance: what a control booted beside the
    run (--kimiperf-control) would, and what it costs, or what it needs; None where this run
    could not take one (attached, several profiles, a deployment across nodes)."""
    from pytest_kimiperf.judge.profiles import control_reach

    if s.external or len(s.profiles) != 1 or s.deployment.nodes:
        return None
    boots = max(s.boots, 2)
    reach = f"a {label} regression of {control_reach(s.deployment.boot_spread, boots, tolerance, rules):.1%} or more"
    if not s.deployment.control_command:
        return (f"in one session, against the recorded build booted beside it, {reach} would be convicted: declare "
                f"the deployment's control_command and add --kimiperf-control")
    more = 2 * boots - s.boots  # the control's boots, and the candidate's raised to two
    cost = f", about {fmt_duration(seconds * more)} more loading" if seconds is not None else ""
    return (f"or judge it against the recorded build booted beside it: --kimiperf-control convicts {reach} "
            f"({more} more boot{'s' * (more != 1)}{cost}; the session and host levels cancel)")


def history_advice(boot_spread: float, session_spread: float, boots: int, span: HistorySpan, tolerance: float,
                   label: str, *, boot_df: float = math.inf, session_df: float = math.inf) -> str:
    """What history would convict twice the tolerance with DETECTION_POWER, or why none can."""
    from pytest_kimiperf.judge.noise import sessions_of_history
    from pytest_kimiperf.judge.stats import DETECTION_POWER

    sessions = sessions_of_history(boot_spread, session_spread, boots, reference_boots=span.boots,
                                   sessions=span.sessions, tolerance=tolerance, goal=2 * tolerance,
                                   boot_df=boot_df, session_df=session_df)
    if sessions is not None:
        return (f"to convict a {label} regression of twice the tolerance ({2 * tolerance:.0%}) with {DETECTION_POWER:.0%}"
                f" power, record the baseline over about {sessions} sessions (one boot each is enough: "
                "--kimiperf-append-on-pass on a nightly job grows it)")
    return (f"no history convicts a {label} regression of twice the tolerance with {DETECTION_POWER:.0%} power here: "
            f"this run's own session effect ({session_spread:.0%} declared) is too wide for {boots} boots")


def settings_lines(s: Settings, environ: Mapping[str, str]) -> list[str]:
    """The settings in effect: deployment, profiles with their environment, server mode."""
    lines = [f"kimiperf: deployment {s.deployment.name} ({s.deployment.description})"]
    mode = f"attached to {s.server_url}" if s.external else f"booted per profile, TP={s.deployment.tensor_parallel_size}"
    if s.server_url and s.server_url.startswith("https://"):
        mode += " (HTTPS: timed in the event loop, not by the kernel)"
    lines.append(f"kimiperf: server {mode}; baselines in {s.baselines_dir}"
                 + ("; --kimiperf-update-baselines" if s.update_baselines else ""))
    for profile in s.profiles:
        line = f"kimiperf: profile {profile.name}: {describe_env(profile)}"
        if s.external:
            line = (f"kimiperf: profile {profile.name}: only a label for the attached server, whose "
                    "environment and arguments are whatever it was started with (not known here)")
        else:
            inherited = inherited_nccl_env(profile, {**environ, **s.deployment.env})
            if inherited:
                line += f"; from the shell and deployment: {describe_env(inherited)}"
            plan = s.command_plans.get(profile.name)
            if profile.args and plan is not None:
                checked = f"checked against {plan.checked_by}" if plan.checked_by else \
                    "not checked: the deployment's command is not vLLM's server"
                line = line.replace(": (no overrides)", ":", 1) if not profile.env else line + ";"
                line += f" args {describe_args(profile)} ({checked})"
                line += "".join(f"; replaces the deployment's {r.describe()}" for r in plan.replaced)
        lines.append(line)
    lines.append(declarations_line(s.deployment))
    lines.append(failures_line(s))
    if not s.external:
        dep = s.deployment
        lines.append(f"kimiperf: server command: {describe_command(dep)}")
        if (reach := forecast_line(dep, s.profiles, environ)) is not None:  # what the NCCL variables can touch
            lines.append(reach)
        if s.control:  # --kimiperf-control: the recorded build, booted beside the candidate
            lines.append(f"kimiperf: control command ({s.reference_profile.name}): {describe_command(dep, control=True)}")
        if dep.nodes:  # config/nodes.py: the head runs here, every other node through its template
            lines.append("kimiperf: nodes (vLLM --nnodes, head first): " + ", ".join(
                f"{n.describe()}" + (f" [{' '.join(n.launch)}]" if n.launch else "") for n in dep.nodes))
        lines.extend(f"kimiperf: {line}" for line in weight_cache_lines(
            setting=dep.weight_cache, gpu_count=dep.gpu_count, command=list(dep.command), model=dep.model,
            tensor_parallel_size=dep.tensor_parallel_size, quantization=dep.quantization,
            nodes=max(1, len(dep.nodes)), control=s.control))
        cache_off = why_not_used(setting=dep.weight_cache, gpu_count=dep.gpu_count, command=list(dep.command),
                                 model=dep.model, quantization=dep.quantization, nodes=max(1, len(dep.nodes)),
                                 control=s.control)
        if cache_off is None:  # the engines boot from the cache: say which profiles cannot
            lines.extend(f"kimiperf: weight cache: {reason}" for p in s.profiles if (reason := profile_cache_reason(
                p.name, s.command_plans[p.name].dests if p.name in s.command_plans else frozenset())))
    return lines


def failures_line(s: Settings) -> str:
    """What fails this run, as the settings in force decide it."""
    fails = ["a regression", "decode below the floor"]
    if s.missing_baseline == "fail" and not s.update_baselines:
        fails.append("no baseline for this hardware")
    if s.perf_strict:
        fails.append("a change beyond the tolerance without a verdict")
    if s.control:
        fails.append(f"a regression against the control ({s.reference_profile.name}, the recorded build)")
    mode = "gate (--kimiperf-gate)" if s.gate else "not a gate (--kimiperf-gate makes one)"
    if s.external and not s.deployment.restart_command:
        fails.append("a change beyond the tolerance on its one boot (UNRESOLVED, exit 76: attached without a "
                     "restart_command, it cannot take the boots a verdict needs)")
    boots = (f"; boots per profile: {s.boots} planned, up to {s.max_boots} on demand ({s.max_boots_from})"
             if s.gate else "")
    return (f"kimiperf: {mode}: fails on {', '.join(fails)}; a run whose only failures are INVALID "
            f"measurements exits 75{boots}")


def declarations_line(dep: Deployment) -> str:
    """What the verdicts of this deployment rest on before its own boots measure it, and where
    that was declared from: how this host compares with those hosts is the canary's to say."""
    modes = (f"spawn modes {dep.spawn_mode_drop:.0%} slower in {dep.spawn_mode_share:.0%} of boots"
             if dep.spawn_mode_drop > 0 else "no spawn modes")
    floor = (f"decode floor / target {dep.decode_per_canary_mops[0]:g} / {dep.decode_per_canary_mops[1]:g} tok/s "
             "per Mops of this host's canary" if dep.decode_per_canary_mops else
             f"decode floor / target {dep.decode_floor_tok_s:g} / {dep.decode_target_tok_s:g} tok/s")
    where = (f"from {dep.declared_from}" if dep.declared_from else
             f"as {dep.source} declares them (the defaults where it is silent)")
    own = "".join(f", {metric_spec(name).label} {spread:.0%}" for name, spread in sorted(dep.boot_spreads.items()))
    return (f"kimiperf: declared for {dep.name}: boot spread {dep.boot_spread:.0%}{own} ({dep.boot_spread_df:g} df), "
            f"session {dep.session_spread:.0%} ({dep.session_spread_df:g} df), host {dep.host_spread:.0%} "
            f"({dep.host_spread_df:g} df); {modes}; {floor}; {where}")


def fingerprint_lines(fingerprint: Fingerprint, baseline_file: Path, *, deployment: Deployment | None = None,
                      span: HistorySpan | None = None, host: Mapping[str, str] | None = None,
                      client: str | None = None, recorded_hosts: Sequence[str] = ()) -> list[str]:
    """The hardware and software the run measures on, the baseline file it selects, and, where
    given, the spreads in force, which host this is and how the client measures on it."""
    from pytest_kimiperf.judge.baselines import describe

    lines = [*describe(fingerprint), f"kimiperf: baseline file {baseline_file}"]
    if deployment is not None:
        lines.append(spreads_line(deployment, span))
    if host is not None:
        lines.append(host_line(host, recorded_hosts))
    if client is not None:
        lines.append(client)
    return lines


def client_line(quota: QuotaInForce, cpus: Collection[int], *, attached: bool) -> str:
    """How the client measures on this host: its priority, where it is placed (measure/
    placement.py) on the ``cpus`` it may use, and the CPU quota in force over the run."""
    from pytest_kimiperf.measure.placement import MIN_CPUS_TO_PLACE, cpu_list

    if attached:
        place = (f"not placed (the attached server's processes are not known here), on the {len(cpus)} CPU(s) "
                 f"this process may use ({cpu_list(cpus)})")
    elif len(cpus) < MIN_CPUS_TO_PLACE:
        place = (f"not isolated: this process may use {len(cpus)} CPU(s) ({cpu_list(cpus)}), too few to keep one "
                 f"from the server (it takes {MIN_CPUS_TO_PLACE}), so it shares them; its self-check guards the stamps")
    else:
        place = (f"on the CPUs of {cpu_list(cpus)} that the server's processes leave free, found at each "
                 "measurement (none free: it shares them)")
    return f"kimiperf: client: normal priority, {place}; {quota.describe()}"


# The recorded host ids the header names, the most recent first.
_HOSTS_NAMED = 3


def host_line(host: Mapping[str, str], recorded_hosts: Sequence[str] = ()) -> str:
    """This host's id and what it is made of: a boot id in it makes every reboot another host.
    Where the baseline's boots came from other host ids only, the option that names this machine
    as one of them, with the ids recorded: it differs only in what the user states."""
    basis = host.get("basis", "")
    here = host.get("host", "?")
    line = f"kimiperf: host id {here} ({basis})"
    if recorded_hosts and here not in recorded_hosts:
        named = ", ".join(recorded_hosts[:_HOSTS_NAMED]) + (
            f" and {len(recorded_hosts) - _HOSTS_NAMED} more" if len(recorded_hosts) > _HOSTS_NAMED else "")
        line += (f"; the baseline's boots were measured on host id {named}, each run here is judged as another host "
                 f"(adding the host spread): if this is that machine, --kimiperf-host-id {shlex.quote(recorded_hosts[0])} "
                 f"(or KIMIPERF_HOST_ID) names it so")
    elif basis == "machine-id+boot-id":
        line += ("; the DMI product UUID is not readable, so a reboot counts as another host (each run then "
                 "adds the host spread): name the machine with --kimiperf-host-id (a runner's name) to keep one")
    return line


def spreads_line(dep: Deployment, span: HistorySpan | None) -> str:
    """The spreads the verdicts use, and whether each is declared or measured (a session or host
    level once the file's fullest history spans MIN_UNITS of them)."""
    from pytest_kimiperf.judge.baselines import HistorySpan
    from pytest_kimiperf.judge.noise import MIN_UNITS

    span = span or HistorySpan(0, 0, 0)
    parts = [f"boot {dep.boot_spread:.0%} declared"
             + (f", or what the boots measure where larger ({span.boots} recorded)" if span.boots else "")]
    for name, declared, units in (("session", dep.session_spread, span.sessions), ("host", dep.host_spread, span.hosts)):
        plural = f"{units} {name}{'s' * (units != 1)}"
        if units < MIN_UNITS:
            parts.append(f"{name} {declared:.0%} declared (the history spans {plural}; measured from {MIN_UNITS})")
        else:
            parts.append(f"{name}: the larger of {declared:.0%} declared and what {plural} measure")
    return ("kimiperf: spreads in force: " + "; ".join(parts)
            + " (a declared spread is a floor: declare a smaller one where the history measures less)")


def one_session_warning(dep: Deployment, span: HistorySpan | None) -> str | None:
    """What to do when the baseline history spans one session: the session level is then a
    guess the next session is judged on (benchmarks/README.md, gate power: a 2% session effect declared as 1%
    convicts an unchanged build in 23% of sessions against a one-session history)."""
    from pytest_kimiperf.judge.noise import MIN_UNITS

    if span is None or span.boots == 0 or span.sessions != 1:
        return None
    boots = f"{span.boots} boot{'s' * (span.boots != 1)}"
    return (f"the baseline history of {dep.name} spans one session ({boots}): the session spread in "
            f"force ({dep.session_spread:.0%}) is declared, not measured, and every later session is judged on "
            f"that guess; record in {MIN_UNITS - 1} more sessions (another day or runner: --kimiperf-update-baselines "
            "appends to the history) to measure it")
