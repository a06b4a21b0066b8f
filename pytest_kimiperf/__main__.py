"""``python -m pytest_kimiperf {compare,merge-driver,boots} ...``: the package's commands that run
without pytest (the ``kimiperf`` console script is the same).

``kimiperf boots`` is the boot planner as a question: how many boots resolve a change of this size?

    kimiperf boots --from 81.4 --to 81.9 --spread 0.8%
    kimiperf boots --change 6% --spread 1% --tolerance 3% --reference-boots 10 \\
        --session-spread 2% --reference-sessions 1

Two profiles booted alike need N boots each; against a baseline of ``--reference-boots`` boots, N
boots of the current build (``judge.noise.boots_needed`` says how). The spread is the SD of one
boot's median: read it from a baseline's history (the summary prints it next to every verdict) or
measure it with benchmarks/noise_study.py. With ``--session-spread`` the comparison is across
sessions: this run's one session against a baseline of ``--reference-sessions``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import math
import sys


_COMMANDS = ("compare", "merge-driver", "boots")


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to the command named first."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in _COMMANDS:
        print(f"usage: kimiperf {{{','.join(_COMMANDS)}}} ... (kimiperf compare --help)", file=sys.stderr)
        return 4
    if args[0] == "boots":  # the command's edge, the one place the planner prints
        line, status = boots_answer(args[1:])
        print(line)
        return status
    if args[0] == "merge-driver":
        from pytest_kimiperf.storage.baseline_merge import main as merge_driver

        return merge_driver(args[1:])
    from pytest_kimiperf.compare.cli import main as compare

    return compare(args[1:])


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


def boots_answer(argv: list[str] | None = None) -> tuple[str, int]:
    """The number of boots per side, or why no number of boots will do, as the line the command
    prints and its exit status (1 when no number of boots will do)."""
    from pytest_kimiperf.judge.noise import boots_needed, sessions_for  # numpy and scipy: only for this command
    from pytest_kimiperf.judge.stats import DETECTION_POWER

    parser = argparse.ArgumentParser(prog="kimiperf boots", description="How many boots resolve a change of this size?")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--change", type=_fraction, help="true change to resolve, e.g. 0.6%%")
    size.add_argument("--from", dest="before", type=float, help="figure before (e.g. 81.4 tok/s); with --to")
    parser.add_argument("--to", dest="after", type=float, help="figure after (e.g. 81.9 tok/s)")
    parser.add_argument("--spread", type=_fraction, required=True, help="SD of one boot's median, e.g. 0.8%%")
    parser.add_argument("--tolerance", type=_fraction, default=0.0,
                        help="changes inside it do not matter (default 0: tell the two apart)")
    parser.add_argument("--reference-boots", type=int, help="judge against a baseline of this many boots")
    parser.add_argument("--confidence", type=_fraction, default=0.95, help="one-sided (default 0.95)")
    parser.add_argument("--session-spread", type=_fraction, default=0.0,
                        help="SD of a session's shared effect (across sessions; default 0: one session)")
    parser.add_argument("--reference-sessions", type=int, default=1,
                        help="sessions the baseline spans (default 1), with --session-spread")
    args = parser.parse_args(argv)
    if args.before is not None:
        if args.after is None or args.before <= 0 or args.after <= 0:
            parser.error("--from needs --to, both figures > 0")
        change = abs(args.after / args.before - 1.0)
        what = f"{args.before:g} vs {args.after:g} ({change * 100:.2g}%)"
    else:
        change = args.change
        what = f"a {change * 100:.2g}% change"
    if args.reference_sessions < 1:
        parser.error(f"--reference-sessions {args.reference_sessions}: use a count of at least 1")
    session_var = math.log1p(args.session_spread) ** 2
    fixed_var = session_var * (1.0 + 1.0 / args.reference_sessions) if args.reference_boots else 2 * session_var
    try:
        n = boots_needed(change, args.spread, tolerance=args.tolerance, reference_boots=args.reference_boots,
                         confidence=args.confidence, fixed_var=fixed_var)
    except ValueError as exc:
        parser.error(str(exc))
    if n is None and session_var > 0:
        k = sessions_for(change, args.spread, session_var, tolerance=args.tolerance, confidence=args.confidence)
        more = (f"about {k} sessions of each side (separate runs, 2 boots each)" if k is not None
                else "a wider tolerance: no number of sessions will do")
        return (f"to tell {what} at a session spread of {args.session_spread * 100:.2g}% no number of boots in "
                f"one session will do (each run shares its session); it takes {more}"), 1
    side = ("boots per profile" if args.reference_boots is None
            else f"boots of the current build against a {args.reference_boots}-boot baseline")
    if n is None:
        return (f"to tell {what} at a boot spread of {args.spread * 100:.2g}%: no number of boots will do "
                f"against a {args.reference_boots}-boot baseline; record more baseline boots "
                "(--kimiperf-update-baselines --kimiperf-boots N)"), 1
    return (f"to tell {what} at a boot spread of {args.spread * 100:.2g}% you need {n} {side} "
            f"({args.confidence:.0%} one-sided, {DETECTION_POWER:.0%} power)"), 0


if __name__ == "__main__":
    sys.exit(main())
