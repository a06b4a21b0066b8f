"""Error rates of the verdict at the levels it states (issue 46), in simulation.

Each table is a CPU-only simulation through the plugin's own functions
(``profiles.compare_in_session`` for two profiles of one session,
``history.compare_with_history`` for the gate against a history), seeded: the same arguments
print the same figures.

* ``edge``: how often "within +/-tol" is said when the true change sits at the band's edge
  (a TOST at 5% says it at most 5% of the time), 2-6 boots a side, profiles and gate;
* ``modes``: issue 46's item 1, a history in which 30% of boots fall into a spawn mode 20%
  slower and a run of 3 boots (fast spawns) moved by a true change: the verdicts by change;
* ``drift``: a history that grows itself, judged against its anchor (judge/history.py): the true
  change when a slow drift first fails, and the share of quiet nights that fail;
* ``nightly``: the same through the shipped path: each night's 2 boots judged by the gate
  against the history's window and by the drift test against the anchor, at the run's critical
  value for the shipped suite (24 entries, each judged twice), appended on pass
  (baselines.append_history with on_pass, unless history.py refuses the night: it looked worse than
  the tolerance without a verdict; ``--no-guard`` appends every passing night).

    nice -n 19 python benchmarks/verdict_soundness.py edge [--trials 1500]
    nice -n 19 python benchmarks/verdict_soundness.py modes [--trials 40]
    nice -n 19 python benchmarks/verdict_soundness.py drift [--trials 200]
    nice -n 19 python benchmarks/verdict_soundness.py nightly [--trials 100] [--no-guard]
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pytest_kimiperf.config.deployments import Spreads  # noqa: E402
from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary  # noqa: E402
from pytest_kimiperf.judge.baselines import BaselineBoot, BaselineEntry  # noqa: E402
from pytest_kimiperf.judge.baselines import append_history  # noqa: E402
from pytest_kimiperf.judge.history import drift_of_entry  # noqa: E402
from pytest_kimiperf.judge.gate import family_critical  # noqa: E402
from pytest_kimiperf.judge.noise import BootOrigin  # noqa: E402
from pytest_kimiperf.judge.history import compare_with_history  # noqa: E402
from pytest_kimiperf.judge.profiles import InSessionRules, compare_in_session  # noqa: E402
from pytest_kimiperf.judge.stats import VerdictKind, band_log  # noqa: E402
from nightly import drift_tonight  # noqa: E402

HIGHER = Direction.HIGHER_IS_BETTER
# The Kimi deployment's rules: boot spread 1% declared (3 df), tolerance 3%.
KIMI = InSessionRules(boot_spread=0.01, boot_spread_df=3.0)
TOLERANCE = 0.03
SE_LOG = 0.003  # a boot's own error of its median (20 requests at a 1.5% CV)


def boot(log_figure: float, session: str, host: str = "h") -> BootSummary:
    return BootSummary(median=100.0 * math.exp(log_figure), n=20, se_log=SE_LOG, session=session, host=host)


def edge_profiles(rng: np.random.Generator, k: int, shift: float, trials: int, noise: float) -> float:
    """The share of sessions that read "within" two profiles ``shift`` (log) apart, k boots each."""
    within = 0
    for _ in range(trials):
        ref = [boot(rng.normal(0.0, noise), "now") for _ in range(k)]
        cur = [boot(shift + rng.normal(0.0, noise), "now") for _ in range(k)]
        c = compare_in_session(cur, ref, direction=HIGHER, tolerance=TOLERANCE, rules=KIMI)
        within += c.verdict is VerdictKind.WITHIN_TOLERANCE
    return within / trials


def edge_gate(rng: np.random.Generator, k: int, shift: float, trials: int, spreads: Spreads,
              sessions: int, per_session: int) -> float:
    """The share of runs of ``k`` boots that read "within" against a history of ``sessions`` x
    ``per_session`` boots, the truth ``shift`` (log) away; noise as ``spreads`` declares it."""
    boot_sd, session_sd = math.log1p(spreads.boot), math.log1p(spreads.session)
    within = 0
    for _ in range(trials):
        history = []
        for s in range(sessions):
            level = rng.normal(0.0, session_sd)
            history += [boot(level + rng.normal(0.0, boot_sd), f"s{s}") for _ in range(per_session)]
        level = shift + rng.normal(0.0, session_sd)
        current = [boot(level + rng.normal(0.0, boot_sd), "now") for _ in range(k)]
        c = compare_with_history(current, history, direction=HIGHER, tolerance=TOLERANCE, spreads=spreads)
        within += c.verdict is VerdictKind.WITHIN_TOLERANCE
    return within / trials


def edge(args: argparse.Namespace) -> None:
    band = band_log(TOLERANCE)
    rng = np.random.default_rng(args.seed)
    print(f"'within +/-3%' at the band's edge (true change -3.0% / +{math.expm1(band) * 100:.2f}%), "
          f"{args.trials} sessions a cell; target <= 5%")
    print("\nprofiles (compare_in_session; boot noise 1%, declared 1% with 3 df):")
    print("boots a side | at -3.0% | at +3.09%")
    for k in range(2, 7):
        low = edge_profiles(rng, k, -band, args.trials, math.log1p(0.01))
        high = edge_profiles(rng, k, band, args.trials, math.log1p(0.01))
        print(f"{k:12d} | {low:7.1%} | {high:8.1%}")
    gate_trials = max(args.trials // 3, 1)
    for label, spreads, sessions, per in (("3 sessions x 2 boots, boot 1%", Spreads(0.01), 3, 2),
                                          ("10 sessions x 1 boot, boot 1%, session 1%", Spreads(0.01, 0.01), 10, 1)):
        print(f"\ngate (compare_with_history; history {label}, declared right), {gate_trials} runs a cell:")
        print("boots a run | at -3.0% | at +3.09%")
        for k in range(2, 7):
            low = edge_gate(rng, k, -band, gate_trials, spreads, sessions, per)
            high = edge_gate(rng, k, band, gate_trials, spreads, sessions, per)
            print(f"{k:11d} | {low:7.1%} | {high:8.1%}")


def modes_table(args: argparse.Namespace) -> None:
    """Issue 46, item 1: 20 boots over 10 sessions, 30% in a mode 20% slower, spreads boot 1%,
    session 1%, host 2% (one host), tolerance 3%, 3 current boots (fast spawns) moved by the change."""
    rng = np.random.default_rng(args.seed)
    spreads = Spreads(0.01, 0.01, 0.02)
    print(f"a history with a spawn mode 20% slower (30% of boots), 3 fast boots moved by the change, "
          f"{args.trials} runs a row")
    print("true change | verdicts")
    for change in (-0.06, -0.10, -0.14, -0.17, -0.20, 0.06):
        counts: collections.Counter[str] = collections.Counter()
        for _ in range(args.trials):
            history = []
            for i in range(20):
                if i % 2 == 0:
                    level = rng.normal(0.0, 0.01)
                slow = math.log1p(-0.2) if rng.random() < 0.3 else 0.0
                history.append(boot(level + slow + rng.normal(0.0, 0.01), f"s{i // 2}"))
            level = math.log1p(change) + rng.normal(0.0, 0.01)
            current = [boot(level + rng.normal(0.0, 0.01), "now") for _ in range(3)]
            c = compare_with_history(current, history, direction=HIGHER, tolerance=TOLERANCE, spreads=spreads)
            counts[c.verdict.value] += 1
        print(f"{change:+11.0%} | " + ", ".join(f"{v} {n}" for v, n in counts.most_common()))


def drift_table(args: argparse.Namespace) -> None:
    """Nightly runs of 2 boots (boot 1%, session 1%, declared right) appending while they pass,
    judged against the anchor (a deliberate recording of 2 sessions x 2 boots) by
    history.drift_of_entry (benchmarks/nightly.py). A drift of d a night: the true change when the series first
    fails, and the share failing before twice the tolerance; none: the share of nights failing."""
    spreads = Spreads(0.01, 0.01)
    band = band_log(TOLERANCE)
    rng = np.random.default_rng(args.seed)
    print(f"drift against the anchor, tolerance 3%, {args.trials} series a row")
    print("per night | nights to 2x tol | failed before 2x tol | true change at first failure (median, p10-p90) "
          "| nights failing")
    for per_night in (-0.0005, -0.001, -0.0025, 0.0):
        nights = int(2 * band / -math.log1p(per_night)) + 1 if per_night else 200
        before, at_fail, failing, total = 0, [], 0, 0
        for _ in range(args.trials):
            anchor = []
            for s in range(2):
                level = rng.normal(0.0, 0.01)
                anchor += [boot(level + rng.normal(0.0, 0.01), f"a{s}") for _ in range(2)]
            series: list[list[BootSummary]] = []
            first = None
            for night in range(1, nights + 1):
                level = math.log1p(per_night) * night + rng.normal(0.0, 0.01)
                boots = [boot(level + rng.normal(0.0, 0.01), f"n{night}") for _ in range(2)]
                d = drift_tonight(anchor, series, boots, direction=HIGHER, tolerance=TOLERANCE, spreads=spreads)
                total += 1
                if d is not None and d.failed:
                    failing += 1
                    if first is None:
                        first = night
                    if per_night:
                        break
                    continue  # a failing night appends nothing
                series.append(boots)
            if first is not None and per_night:
                before += 1
                at_fail.append(math.expm1(math.log1p(per_night) * first))
        if per_night:
            q = np.quantile(at_fail, [0.1, 0.5, 0.9]) if at_fail else [math.nan] * 3
            print(f"{per_night:+9.2%} | {nights:16d} | {before / args.trials:20.1%} | "
                  f"{q[1]:+.1%} ({q[0]:+.1%}..{q[2]:+.1%}) | -")
        else:
            print(f"{'none':>9} | {'-':>16} | {'-':>20} | - | {failing / total:.2%} of {total} nights")


def _stored(levels: list[float], session: str, stamp: int) -> BaselineEntry:
    """One run's boots of one metric as the baseline file stores them."""
    boots = tuple(BaselineBoot(median=100.0 * math.exp(x), n=20, se_log=SE_LOG, recorded_at=f"2026-{stamp:08d}",
                               git_commit=None, versions={}, origin=BootOrigin(session, "h")) for x in levels)
    return BaselineEntry(test="t.py::t", profile="default", metric="decode_tok_s", unit="tok/s", direction=HIGHER,
                         samples=(100.0,), median=100.0, iqr=(100.0, 100.0), n=1, recorded_at=f"2026-{stamp:08d}",
                         git_commit=None, profile_env={}, boots=boots)


def nightly_table(args: argparse.Namespace) -> None:
    """Nightly runs of 2 boots (boot 1%, session 1%, declared right), each judged by the gate
    against the window and by the drift test against the anchor (a deliberate recording of
    2 sessions x 2 boots), appended when it passes (and the guard lets it)."""
    spreads = Spreads(0.01, 0.01)
    entries = 24  # the shipped suite's gated entries under tiny-cpu, each judged twice with nights
    critical = family_critical(2 * entries)
    band = band_log(TOLERANCE)
    rng = np.random.default_rng(args.seed)
    print(f"nightly gate + drift against the anchor, tolerance 3%, critical {critical:.2f} "
          f"({2 * entries} comparisons), guard {'off' if args.no_guard else 'on'}, {args.trials} series a row")
    print("per night | failed before 2x tol | true change at first failure (median, p10-p90) | by drift | "
          "nights appended | nights failing")
    for per_night in (-0.0005, -0.001, -0.0025, 0.0):
        nights = int(2 * band / -math.log1p(per_night)) + 1 if per_night else 120
        before, at_fail, by_drift, failing, appended, total = 0, [], 0, 0, 0, 0
        for _ in range(args.trials):
            entry = None
            for s in range(2):
                level = rng.normal(0.0, 0.01)
                entry = append_history(entry, _stored([level + rng.normal(0.0, 0.01) for _ in range(2)], f"a{s}", s))
            assert entry is not None
            first = None
            for night in range(1, nights + 1):
                level = math.log1p(per_night) * night + rng.normal(0.0, 0.01)
                new = _stored([level + rng.normal(0.0, 0.01) for _ in range(2)], f"n{night}", 10 + night)
                current = [b.summary() for b in new.boots]
                c = compare_with_history(current, entry.summaries(), direction=HIGHER, tolerance=TOLERANCE,
                                         spreads=spreads, critical=critical, histories=entries)
                d = drift_of_entry(entry, current, tolerance=TOLERANCE, spreads=spreads, critical=critical)
                drifted = d is not None and d.failed
                total += 1
                if c.verdict is VerdictKind.REGRESSION or drifted:
                    failing += 1
                    if first is None:
                        first = night
                        by_drift += drifted and c.verdict is not VerdictKind.REGRESSION
                    if per_night:
                        break
                    continue  # a failing night appends nothing
                # history.append_refusal: a night that looked worse than the tolerance without a verdict.
                if args.no_guard or not (c.unresolved_beyond_tolerance and c.gain < 0):
                    entry = append_history(entry, new, on_pass=True)
                    appended += 1
            if first is not None and per_night:
                before += 1
                at_fail.append(math.expm1(math.log1p(per_night) * first))
        share = f"{appended / total:.0%}"
        if per_night:
            q = np.quantile(at_fail, [0.1, 0.5, 0.9]) if at_fail else [math.nan] * 3
            print(f"{per_night:+9.2%} | {before / args.trials:20.1%} | {q[1]:+.1%} ({q[0]:+.1%}..{q[2]:+.1%}) | "
                  f"{by_drift / max(before, 1):.0%} | {share} | -")
        else:
            print(f"{'none':>9} | - | - | - | {share} | {failing / total:.2%} of {total} nights (one metric)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=("edge", "modes", "drift", "nightly"))
    parser.add_argument("--no-guard", action="store_true",
                        help="nightly: append every passing night, even one that looked worse without a verdict")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--seed", type=int, default=46)
    args = parser.parse_args(argv)
    if args.table == "edge":
        args.trials = args.trials or 1500
        edge(args)
    elif args.table == "drift":
        args.trials = args.trials or 200
        drift_table(args)
    elif args.table == "nightly":
        args.trials = args.trials or 100
        nightly_table(args)
    else:
        args.trials = args.trials or 40
        modes_table(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
