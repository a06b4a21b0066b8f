"""``--kimiperf-plan``: what a run will cost and what it can resolve, before any boot.

For Kimi-K2.5 a boot is a 20-36 minute load, so a user who selects ``--kimiperf-profile all`` must
learn before the first one that it means 7 profiles x 2 boots, about 6.5 hours of loading. The
plan says, from the same settings the run would use:

* the boots: planned per profile, and the most with boots on demand;
* the wall time of loading them: the load time this deployment's baseline history recorded
  (``boot_ready_s``), else the one its table declares (``load_s``), else unknown;
* the smallest change the run resolves (judge/power.py ``smallest_change``, at DETECTION_POWER): between
  two of its profiles in this session, and against the baseline history beyond the tolerance.

Nothing is collected or booted; the fingerprint is probed (to find the baseline file).
"""

from __future__ import annotations

import math
import statistics

from pytest_kimiperf.config.metric_specs import metric_spec
from pytest_kimiperf.config.settings import Settings
from pytest_kimiperf.judge.baselines import BaselineFile, HistorySpan
from pytest_kimiperf.judge.profiles import control_reach
from pytest_kimiperf.judge.profiles import InSessionRules
from pytest_kimiperf.judge.gate import family_critical
from pytest_kimiperf.judge.power import design_critical, sessions_of_history, smallest_change
from pytest_kimiperf.judge.stats import DETECTION_POWER, GATE_CRITICAL
from pytest_kimiperf.measure.time_account import PlannedTime

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
    """What history would convict twice the tolerance with DETECTION_POWER
    (``power.sessions_of_history``, at the declarations' df), or why none can: this run's own
    session effect."""
    sessions = sessions_of_history(boot_spread, session_spread, boots, reference_boots=span.boots,
                                   sessions=span.sessions, tolerance=tolerance, goal=2 * tolerance,
                                   boot_df=boot_df, session_df=session_df)
    if sessions is not None:
        return (f"to convict a {label} regression of twice the tolerance ({2 * tolerance:.0%}) with {DETECTION_POWER:.0%}"
                f" power, record the baseline over about {sessions} sessions (one boot each is enough: "
                "--kimiperf-append-on-pass on a nightly job grows it)")
    return (f"no history convicts a {label} regression of twice the tolerance with {DETECTION_POWER:.0%} power here: "
            f"this run's own session effect ({session_spread:.0%} declared) is too wide for {boots} boots")
