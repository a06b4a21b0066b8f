"""The planner as a command-line question: how many boots resolve a change of this size?

    python -m pytest_kimiperf.judge.planner --from 81.4 --to 81.9 --spread 0.8%
    python -m pytest_kimiperf.judge.planner --change 6% --spread 1% --tolerance 3% --reference-boots 10

Two profiles booted alike need N boots each; against a baseline of ``--reference-boots`` boots,
N boots of the current build (planning.boots_needed says how, and why a too-small baseline cannot be
outbooted). The spread is the SD of one boot's median: read it from a baseline's history (the
summary prints it next to every verdict) or measure it with benchmarks/noise_study.py.
"""

from __future__ import annotations

import argparse
import math
import sys

from pytest_kimiperf.judge.planning import boots_needed
from pytest_kimiperf.judge.stats import DETECTION_POWER


def _fraction(text: str) -> float:
    """``0.8%`` or ``0.008`` as 0.008; anything else is an argparse error naming the value."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction (0.008) or a percentage (0.8%)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite fraction >= 0")
    return value


def main(argv: list[str] | None = None) -> int:
    """Print the number of boots per side, or why no number of boots will do."""
    parser = argparse.ArgumentParser(prog="python -m pytest_kimiperf.judge.planner", description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--change", type=_fraction, help="true change to resolve, e.g. 0.6%%")
    size.add_argument("--from", dest="before", type=float, help="figure before (e.g. 81.4 tok/s); with --to")
    parser.add_argument("--to", dest="after", type=float, help="figure after (e.g. 81.9 tok/s)")
    parser.add_argument("--spread", type=_fraction, required=True, help="SD of one boot's median, e.g. 0.8%%")
    parser.add_argument("--tolerance", type=_fraction, default=0.0,
                        help="changes inside it do not matter (default 0: tell the two apart)")
    parser.add_argument("--reference-boots", type=int, help="judge against a baseline of this many boots")
    parser.add_argument("--confidence", type=_fraction, default=0.95, help="one-sided (default 0.95)")
    args = parser.parse_args(argv)
    if args.before is not None:
        if args.after is None or args.before <= 0 or args.after <= 0:
            parser.error("--from needs --to, both figures > 0")
        change = abs(args.after / args.before - 1.0)
        what = f"{args.before:g} vs {args.after:g} ({change * 100:.2g}%)"
    else:
        change = args.change
        what = f"a {change * 100:.2g}% change"
    try:
        n = boots_needed(change, args.spread, tolerance=args.tolerance, reference_boots=args.reference_boots,
                         confidence=args.confidence)
    except ValueError as exc:
        parser.error(str(exc))
    side = ("boots per profile" if args.reference_boots is None
            else f"boots of the current build against a {args.reference_boots}-boot baseline")
    if n is None:
        print(f"to tell {what} at a boot spread of {args.spread * 100:.2g}%: no number of boots will do "
              f"against a {args.reference_boots}-boot baseline; record more baseline boots "
              "(--update-baselines --kimiperf-boots N)")
        return 1
    print(f"to tell {what} at a boot spread of {args.spread * 100:.2g}% you need {n} {side} "
          f"({args.confidence:.0%} one-sided, {DETECTION_POWER:.0%} power)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
