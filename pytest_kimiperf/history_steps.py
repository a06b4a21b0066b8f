"""Where a baseline file's histories stepped, without running anything.

    python -m pytest_kimiperf.history_steps baselines/<deployment>/<key>.json [more files]
        [--spreads BOOT,SESSION,HOST] [--plot DIR] [--json]

For each entry (test, profile, metric) the steps judge/history.py finds in its boot history, as the
gate finds them, at the deployment's declared spreads raised where the history shows more. Exit
status 0 whether or not a history stepped, 2 on a bad argument or an unreadable file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS, Deployment, Spreads
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.baselines import BaselineEntry
from pytest_kimiperf.storage.baselines import load_baseline
from pytest_kimiperf.judge.history import find_steps
from pytest_kimiperf.judge.notes import HistoryStep, HistorySteps
from pytest_kimiperf.reports.sentences import note_text

_DEFAULTS = Spreads(Deployment.boot_spread, Deployment.session_spread, Deployment.host_spread)


def _parse_spreads(text: str) -> Spreads:
    """``BOOT,SESSION,HOST`` fractions (0.01 = 1%) as Spreads; ValueError naming the value otherwise."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or not all(0.0 <= v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(
            f"--spreads {text!r}: give three fractions BOOT,SESSION,HOST, each at least 0 and below 1 "
            "(0.01,0.01,0.02 for 1%, 1%, 2%)")
    boot, session, host = values
    return Spreads(boot, session, host)


def _spreads(deployment: str, given: Spreads | None) -> tuple[Spreads, str]:
    if given is not None:
        return given, "given by --spreads"
    if deployment in BUILTIN_DEPLOYMENTS:
        return BUILTIN_DEPLOYMENTS[deployment].spreads, f"declared by the built-in deployment {deployment!r}"
    return _DEFAULTS, f"a deployment table's defaults ({deployment!r} is not built in: --spreads sets its own)"


def _pct(spreads: Spreads) -> str:
    return "/".join(f"{v:.0%}" for _, v in spreads.by_level())


def main(argv: Sequence[str] | None = None) -> int:
    """Print the steps of each file's histories; 0 when read, 2 on a bad argument or file."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kimiperf.history_steps",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="baseline files (baselines/<deployment>/<key>.json)")
    parser.add_argument("--spreads", type=_parse_spreads, default=None,
                        help="declared boot, session and host spreads as fractions (default: the deployment's)")
    parser.add_argument("--plot", type=Path, default=None, metavar="DIR", help="draw each history into DIR (PNG)")
    parser.add_argument("--json", action="store_true", help="print the steps as JSON")
    args = parser.parse_args(argv)
    if args.plot is not None:
        from pytest_kimiperf.reports.plots import matplotlib_problem
        problem = matplotlib_problem()
        if problem:
            parser.error(problem.replace("--kimiperf-plots", "--plot"))
    out: list[dict[str, object]] = []
    for path in args.files:
        try:
            baseline = load_baseline(path)
        except KimiperfError as exc:
            print(f"history_steps: {exc}", file=sys.stderr)
            return 2
        if baseline is None:
            print(f"history_steps: no baseline file at {path}", file=sys.stderr)
            return 2
        spreads, whence = _spreads(baseline.deployment, args.spreads)
        if not args.json:
            print(f"{path}: deployment {baseline.deployment}, {len(baseline.entries)} entries; "
                  f"boot/session/host spreads {_pct(spreads)} ({whence})")
        for key in sorted(baseline.entries):
            entry = baseline.entries[key]
            # The file's histories share the budget for a false step, as a run's do.
            steps = find_steps(entry.summaries(), spreads=spreads, histories=max(1, len(baseline.entries)))
            since = sum(1 for s in entry.summaries() if s.usable) if not steps else steps[-1].boots_after
            out.append({"file": str(path), "entry": key, "boots": len(entry.boots), "judged_boots": since,
                        "steps": [step.plain() for step in steps]})
            if not args.json:
                said = note_text(HistorySteps(tuple(steps), since)) if steps else "no step"
                print(f"  {key}: {len(entry.boots)} boots; {said}")
            if args.plot is not None:
                try:
                    _plot(args.plot, path, entry, steps)
                except KimiperfError as exc:
                    print(f"history_steps: {exc}", file=sys.stderr)
                    return 2
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


def _plot(out_dir: Path, path: Path, entry: BaselineEntry, steps: Sequence[HistoryStep]) -> None:
    from pytest_kimiperf.reports.plots import plot_history, save_figure, unique_slugs

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KimiperfError(f"cannot create the plot directory {out_dir} (from --plot): {exc.strerror or exc}") from None
    name = f"{path.stem}--{entry.key}"
    save_figure(plot_history(entry, steps), out_dir / f"{unique_slugs([name])[name]}--history.png")


if __name__ == "__main__":
    sys.exit(main())
