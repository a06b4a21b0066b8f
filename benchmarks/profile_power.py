"""How often a profile comparison gives an inert profile a direction, and what it still detects.

The profile comparison (``--nccl-profile default,ring-ll``) judges each profile's boots against
the reference profile's, all in one session (pytest_kimiperf/judge/profiles.py). Two views,
both through the function the terminal summary uses (``profiles.compare_profiles`` calls
``profiles.compare_in_session`` for each test and metric):

* **replay**: real boots of one session of the noise corpus (benchmarks/data/noise) split into
  two "profiles" of k boots, interleaved as ``make perf`` boots them (A B B A ...), every gated
  metric of the session judged together, per host of the corpus and with the deployment's rules.
  A/A: any REGRESSION or IMPROVEMENT on any metric is a false direction. The same split with the
  second side's figures halved or doubled shows what a real effect of that size gets.
* **simulation**: sessions of 2 profiles x 12 metrics with normal boot noise (half of it shared
  by a boot's metrics) and spawn modes (every metric of a slow boot slow), at 2, 3 and 4 boots a
  side; the GPU cell of a user's question (two NCCL settings 0.6% apart, boot noise 1%, tolerance
  3%, 2 boots each).

    python benchmarks/profile_power.py [--trials 400] [--splits 200] [--json PATH]

Seeded: the same arguments print the same tables. Targets: an inert profile gets a direction in
at most 1% of sessions in every row; the GPU question reads "within" in at least 90%.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS  # noqa: E402
from pytest_kimiperf.config.metric_specs import Direction, metric_spec  # noqa: E402
from pytest_kimiperf.judge.stats import BootSummary  # noqa: E402
from pytest_kimiperf.judge.profiles import InSessionRules, SpawnModes, compare_in_session  # noqa: E402
from noise_corpus import CorpusBoot, load_corpus  # noqa: E402
from pytest_kimiperf.judge.stats import VerdictKind  # noqa: E402

DIRECTIONAL = (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
METRICS = 12
SHARED_BOOT_SHARE = 0.5
CORPUS = Path(__file__).parent / "data" / "noise"


@dataclass(frozen=True)
class Row:
    """One row of a table: what it is, and its counts."""

    label: str
    sessions: int
    directional: int
    within: int
    called: int  # sessions whose effect got the right direction (effect rows)

    def text(self) -> str:
        """The row as printed."""
        return (f"{self.label:<64} | {_pct(self.directional, self.sessions):>20} | "
                f"{_pct(self.within, self.sessions):>20} | {_pct(self.called, self.sessions):>20}")


def _pct(hits: int, trials: int) -> str:
    if trials == 0:
        return "n/a"
    ci = scipy_stats.binomtest(hits, trials).proportion_ci(confidence_level=0.95, method="wilson")
    return f"{hits / trials:6.1%} [{ci.low:.1%}-{ci.high:.1%}]"


def _judge(cur: list[BootSummary], ref: list[BootSummary], direction: Direction, tolerance: float,
           rules: InSessionRules) -> VerdictKind:
    return compare_in_session(cur, ref, direction=direction, tolerance=tolerance, rules=rules).verdict


# -- simulation ------------------------------------------------------------------------------

def simulate(label: str, *, trials: int, k: int, boot_sd: float, slow_share: float, slow_drop: float,
             effect: float, rules: InSessionRules, tolerance: float, metrics: int = METRICS,
             seed: int = 1) -> Row:
    """Sessions of one profile against the reference, ``k`` boots a side, every metric's true
    change ``effect`` (a fraction; 0 for A/A), higher is better."""
    rng = np.random.default_rng(seed)
    directional = within = called = 0
    want = VerdictKind.IMPROVEMENT if effect > 0 else VerdictKind.REGRESSION
    for _ in range(trials):
        slow = rng.random(2 * k) < slow_share
        shared = rng.normal(size=2 * k) * math.sqrt(SHARED_BOOT_SHARE)
        verdicts = []
        for _m in range(metrics):
            logs = boot_sd * (shared + rng.normal(size=2 * k) * math.sqrt(1 - SHARED_BOOT_SHARE))
            logs += np.where(slow, math.log1p(-slow_drop), 0.0)
            # Interleaved A B B A ...: the sides alternate in pairs, which the noise here ignores.
            logs[k:] += math.log1p(effect)
            ref = [BootSummary(math.exp(x), 20, 0.01) for x in logs[:k]]
            cur = [BootSummary(math.exp(x), 20, 0.01) for x in logs[k:]]
            verdicts.append(_judge(cur, ref, Direction.HIGHER_IS_BETTER, tolerance, rules))
        directional += any(v in DIRECTIONAL for v in verdicts)
        within += all(v is VerdictKind.WITHIN_TOLERANCE for v in verdicts)
        called += effect != 0 and all(v is want for v in verdicts)
    return Row(label, trials, directional, within, called)


def simulation_rows(trials: int) -> list[Row]:
    """The GPU question and the spawn-mode cells, on the built-in deployments' rules."""
    kimi = BUILTIN_DEPLOYMENTS["kimi-k25-int4-tp8"]
    tiny = BUILTIN_DEPLOYMENTS["tiny-cpu"]
    gpu = InSessionRules.of(kimi)
    rows = [
        simulate("GPU: 0.6% apart, boot 1%, tol 3%, 2 v 2 (1 metric)", trials=trials, k=2, boot_sd=0.01,
                 slow_share=0, slow_drop=0, effect=0.006, rules=gpu, tolerance=0.03, metrics=1),
        simulate("GPU: 0.6% apart, boot 1%, tol 3%, 3 v 3 (1 metric)", trials=trials, k=3, boot_sd=0.01,
                 slow_share=0, slow_drop=0, effect=0.006, rules=gpu, tolerance=0.03, metrics=1),
        simulate("GPU: A/A, boot 1%, tol 3%, 2 v 2", trials=trials, k=2, boot_sd=0.01, slow_share=0,
                 slow_drop=0, effect=0, rules=gpu, tolerance=0.03),
        simulate("GPU: A/A, 30% modes at even odds, not declared, 2 v 2", trials=trials, k=2, boot_sd=0.01,
                 slow_share=0.5, slow_drop=0.3, effect=0, rules=gpu, tolerance=0.03),
        simulate("GPU: A/A, 30% modes at even odds, declared, 2 v 2", trials=trials, k=2, boot_sd=0.01,
                 slow_share=0.5, slow_drop=0.3, effect=0, rules=replace(gpu, modes=SpawnModes(0.3, 0.5)),
                 tolerance=0.03),
    ]
    cpu = InSessionRules.of(tiny)
    drop, within_sd = tiny.spawn_mode_drop, tiny.boot_spread
    for share in sorted({0.1, tiny.spawn_mode_share, 0.5}):
        for k in (2, 3, 4):
            args = dict(trials=trials, k=k, boot_sd=within_sd, slow_share=share, slow_drop=drop, rules=cpu,
                        tolerance=tiny.tolerance("decode_tok_s"))
            rows.append(simulate(f"tiny-cpu: A/A, modes {drop:.0%} at {share:.0%}, {k} v {k}", effect=0, **args))
            rows.append(simulate(f"tiny-cpu: x2, modes {drop:.0%} at {share:.0%}, {k} v {k} (1 metric)",
                                 effect=1.0, metrics=1, **args))
            rows.append(simulate(f"tiny-cpu: x0.5, modes {drop:.0%} at {share:.0%}, {k} v {k} (1 metric)",
                                 effect=-0.5, metrics=1, **args))
    return rows


# -- replay ----------------------------------------------------------------------------------

def _interleaved(order: list[int], k: int) -> tuple[list[int], list[int]]:
    """Boot positions of the two sides as ``make perf`` boots them: A B B A A B B A ..."""
    pattern = [0, 1, 1, 0] * k
    sides: tuple[list[int], list[int]] = ([], [])
    for position, side in zip(order, pattern):
        if len(sides[side]) < k:
            sides[side].append(position)
    return sides


def replay_rows(splits: int, deployment: str, max_foreign_cpu: float) -> list[Row]:
    """A/A and real effects on real boots: each session with 2k+ accepted boots, split into two
    profiles of k boots in boot order (interleaved) and in random orders."""
    dep = BUILTIN_DEPLOYMENTS[deployment]
    rules = InSessionRules.of(dep)
    boots = load_corpus(sorted(CORPUS.glob("*.jsonl")), variant="default", max_foreign_cpu=max_foreign_cpu)
    by_host: dict[str, dict[str, list[CorpusBoot]]] = {}
    for b in boots:
        by_host.setdefault(b.host, {}).setdefault(b.session, []).append(b)
    rng = np.random.default_rng(11)
    rows = []
    for host, sessions in sorted(by_host.items()):
        for k in (2, 3):
            usable = [s for s in sessions.values() if len(s) >= 2 * k]
            if not usable:
                continue
            for effect in (0.0, 1.0, -0.5):
                directional = within = called = trials = 0
                want = VerdictKind.IMPROVEMENT if effect > 0 else VerdictKind.REGRESSION
                for trial in range(splits):
                    session = usable[trial % len(usable)]
                    order = list(rng.permutation(len(session))) if trial >= len(usable) else list(range(len(session)))
                    a, b = _interleaved(order, k)
                    verdicts = []
                    for key in sorted(set.intersection(*(set(x.metrics) for x in session))):
                        spec = metric_spec(key.split("|")[1])
                        scale = 1.0 + effect if spec.direction is Direction.HIGHER_IS_BETTER else 1.0 / (1.0 + effect)
                        ref = [session[i].metrics[key] for i in a]
                        cur = [replace(session[i].metrics[key], median=session[i].metrics[key].median * scale) for i in b]
                        verdicts.append(_judge(cur, ref, spec.direction, dep.tolerance(spec.name),
                                               rules.for_metric(spec.name)))  # as compare_profiles does
                    trials += 1
                    directional += any(v in DIRECTIONAL for v in verdicts)
                    within += all(v is VerdictKind.WITHIN_TOLERANCE for v in verdicts)
                    called += effect != 0 and sum(v is want for v in verdicts) >= len(verdicts) / 2
                what = "A/A" if effect == 0 else f"x{1 + effect:g}"
                rows.append(Row(f"host {host[:8]}: {len(usable)} sessions, {what}, {k} v {k}", trials,
                                directional, within, called))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print both tables (and write them as JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=400, help="simulated sessions per cell (default 400)")
    parser.add_argument("--splits", type=int, default=200, help="replayed splits per row (default 200)")
    parser.add_argument("--deployment", default="tiny-cpu")
    parser.add_argument("--max-foreign-cpu", type=float, default=0.10)
    parser.add_argument("--cells", choices=("all", "replay", "simulation"), default="all")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.trials < 1 or args.splits < 1:
        parser.error(f"--trials {args.trials} and --splits {args.splits}: each must be at least 1")
    started = time.monotonic()
    header = (f"{'cell':<64} | {'any direction':>20} | {'all within':>20} | {'effect called':>20}")
    tables: dict[str, list[dict[str, object]]] = {}
    for name, make in (("replay", lambda: replay_rows(args.splits, args.deployment, args.max_foreign_cpu)),
                       ("simulation", lambda: simulation_rows(args.trials))):
        if args.cells not in ("all", name):
            continue
        rows = make()
        print(f"{name} (sessions with any directional verdict; all metrics within; the effect's direction "
              f"on half or more of the metrics)")
        print(header)
        for row in rows:
            print(row.text(), flush=True)
        print()
        tables[name] = [row.__dict__ for row in rows]
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(tables, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
