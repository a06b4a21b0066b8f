"""A/A over the whole shipped suite: how often a run of an unchanged build gets any direction.

Issue 46's target: at most 1% of runs with any REGRESSION or IMPROVEMENT, counting everything a
run of the suite judges: every gated metric of both profiles against its own baseline history
(gate_power.py's suite shape: 10 metrics in 5 tests, so 20 baseline comparisons) (the gate, boots on demand:
gate_power.py's ``gate_run``), and the profile
comparison of the second profile against the first in the same session, metric by metric
(``profiles.compare_in_session``, what the summary's profile rows say). Both profiles share the
session's effect, as they do in ``make perf``. Simulated with gate_power.py's noise model (per
request CV 2% with heavy tails, boot and session effects half shared by a boot's metrics, a
drift of 0.5% over the session), tolerance 3%, 2 planned boots a profile (a third on demand),
the spreads declared boot 1% (3 df), session 1%, host 2% (10 df each, the defaults), against the
truth as declared and at twice the declaration (declared at half the truth), for the history
shapes of issue 46 (1 session x 5 boots, 3 x 2, 10 x 1). ``--family`` judges each baseline
comparison at the run family's critical value (gate.family_critical of the 20 comparisons)
instead of stats.GATE_CRITICAL. Seeded::

    nice -n 19 python benchmarks/suite_aa.py --runs 600
    nice -n 19 python benchmarks/suite_aa.py --runs 600 --family
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gate_power import PROFILES, TESTS, Noise, Rate, GateRules, World, gate_run, rate  # noqa: E402

from pytest_kimiperf.config.deployments import Spreads  # noqa: E402
from pytest_kimiperf.config.metric_specs import Direction  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary  # noqa: E402
from pytest_kimiperf.judge.gate import family_critical  # noqa: E402
from pytest_kimiperf.judge.profiles import InSessionRules, compare_in_session  # noqa: E402
from pytest_kimiperf.judge.stats import VerdictKind  # noqa: E402

DIRECTIONAL = (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
SHAPES = ((1, 5), (3, 2), (10, 1))
TRUTHS = (("declared right: boot 1%, session 1%", 0.01, 0.01), ("declared at half: boot 2%, session 2%", 0.02, 0.02))


@dataclass(frozen=True)
class SuiteRow:
    """One cell: runs with any direction, and where it came from."""

    label: str
    any_direction: Rate
    gate_direction: Rate
    profile_direction: Rate
    gate_metrics_directional: Rate


def suite_run(world: World, rules: GateRules, history_boots: int, in_session: InSessionRules) -> tuple[bool, bool, int, int]:
    """One A/A run: (a gate direction, a profile direction, gate comparisons with a direction,
    gate comparisons)."""
    session = world.session_effects()
    boots: list[dict[int, list[BootSummary]]] = []
    gate_hits = comparisons = 0
    for p in range(PROFILES):
        out: dict[str, object] = {}
        verdicts, _ = gate_run(world, world.history(history_boots), change=0.0, rules=rules, start=p / PROFILES,
                               span=1 / PROFILES, out=out, session=session, session_name="current")
        gate_hits += sum(v in DIRECTIONAL for v in verdicts)
        comparisons += len(verdicts)
        boots.append(out["boots"])  # type: ignore[arg-type]
    profile = any(
        compare_in_session(boots[1][m], boots[0][m], direction=Direction.HIGHER_IS_BETTER, tolerance=rules.tolerance,
                           rules=in_session).verdict in DIRECTIONAL
        for m in range(sum(TESTS)))
    return gate_hits > 0, profile, gate_hits, comparisons


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write it as JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=600, help="runs per cell (default 600)")
    parser.add_argument("--family", action="store_true",
                        help="each baseline comparison at family_critical(20) instead of GATE_CRITICAL")
    parser.add_argument("--seed", type=int, default=4700)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    spreads = Spreads(0.01, 0.01, 0.02)
    m = PROFILES * sum(TESTS)
    rules = GateRules(0.03, spreads, 3, boots=2, critical=family_critical(m) if args.family else None)
    in_session = InSessionRules(boot_spread=spreads.boot, boot_spread_df=spreads.boot_df)
    started = time.monotonic()
    rows = []
    index = 0
    for name, boot, session_sd in TRUTHS:
        for k, n in SHAPES:
            world = World(Noise(boot, 0.02, 0.005, session_sd=session_sd, history_sessions=k, history_boots=k * n),
                          np.random.default_rng(args.seed + index))
            index += 1
            any_hits = gate_runs = profile_runs = hits = total = 0
            for _ in range(args.runs):
                gate, profile, g, c = suite_run(world, rules, k * n, in_session)
                any_hits += gate or profile
                gate_runs += gate
                profile_runs += profile
                hits += g
                total += c
            rows.append(SuiteRow(f"{name}; history {k} x {n}", rate(any_hits, args.runs), rate(gate_runs, args.runs),
                                 rate(profile_runs, args.runs), rate(hits, total)))
    crit = f"family_critical({m}) = {rules.critical:.2f}" if rules.critical else "GATE_CRITICAL"
    print(f"A/A, whole suite (2 profiles x {sum(TESTS)} gated metrics against their histories, and the profile comparison); "
          f"tolerance 3%, declared boot/session/host 1%/1%/2% at 3/10/10 df, {crit}, {args.runs} runs a cell")
    print(f"{'cell':<62} | {'runs with any direction':>24} | {'gate':>20} | {'profiles':>20} | {'gate, per metric':>20}")
    for r in rows:
        print(f"{r.label:<62} | {_pct(r.any_direction):>24} | {_pct(r.gate_direction):>20} | "
              f"{_pct(r.profile_direction):>20} | {_pct(r.gate_metrics_directional):>20}")
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([{**r.__dict__, **{k: v.__dict__ for k, v in r.__dict__.items()
                                                              if isinstance(v, Rate)}} for r in rows], indent=2) + "\n")
    return 0


def _pct(r: Rate) -> str:
    return f"{r.value * 100:4.1f}% [{r.low * 100:.1f}-{r.high * 100:.1f}]"


if __name__ == "__main__":
    raise SystemExit(main())
