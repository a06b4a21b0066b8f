"""``kimiperf compare``: judge groups of result files with the plugin's rules, without booting.

    kimiperf compare --a 'before/*.json' --b 'after/*.json'
    kimiperf compare --group main='runs/main/*.json' --group pr='runs/pr/*.json' --deployment tiny-cpu

The first group is the reference; each file is one run. The exit status is the gate's (0 passed,
1 a regression, 76 a change these files cannot convict); a file or an option this cannot use
exits :data:`USAGE_EXIT` with a message that names it.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from pytest_kimiperf.compare.readers import KNOWN, read_run_file
from pytest_kimiperf.compare.render import render_json, render_markdown, render_text
from pytest_kimiperf.compare.runs import ResultFileError
from pytest_kimiperf.compare.verdict import CompareRules, Group, judge_groups
from pytest_kimiperf.config.deployment_tables import select_deployment
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS
from pytest_kimiperf.config.metric_specs import METRICS
from pytest_kimiperf.errors import KimiperfError
from pytest_kimiperf.judge.profiles import InSessionRules

USAGE_EXIT = 4  # pytest.ExitCode.USAGE_ERROR: what a bad option or file exits in a pytest run too


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_EXIT, f"kimiperf compare: error: {message}\n")


class _Once(argparse.Action):
    """An option that takes one value: given again with another, a usage error naming both
    (argparse would silently keep the last). The repeatable options add up instead: ``--a``,
    ``--b``, ``--group``, ``--tolerance`` and ``--metric``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None and earlier != values:
            raise argparse.ArgumentError(self, f"given twice, as {str(earlier)!r} and {str(values)!r}; it takes one value")
        setattr(namespace, self.dest, values)


def parser() -> argparse.ArgumentParser:
    """The command's options (docs/reference/compare.md lists them)."""
    p = _Parser(prog="kimiperf compare", description=f"Judge groups of result files ({KNOWN}) with the "
                "plugin's rules: the first group is the reference, each file one run.")
    p.add_argument("--a", nargs="+", action="extend", metavar="PATH",
                   help="the reference group's files or globs (label a; repeat it to add files)")
    p.add_argument("--b", nargs="+", action="extend", metavar="PATH",
                   help="the group judged against it: files or globs (label b; repeat it to add files)")
    p.add_argument("--group", action="append", default=[], metavar="LABEL=PATH",
                   help="a labelled group, a file or a glob (repeat it; the first label is the reference; a label "
                   "given twice adds files)")
    p.add_argument("--same-server", action="store_true",
                   help="the runs of each group came from one live server, not from separate boots: each group "
                   "is then one boot, which can screen a change but never convict it")
    p.add_argument("--deployment", action=_Once, metavar="NAME", help="judge with a built-in deployment's declared boot spread, "
                   f"spawn modes and tolerances ({', '.join(BUILTIN_DEPLOYMENTS)})")
    p.add_argument("--boot-spread", type=float, action=_Once, metavar="FRACTION",
                   help="the declared boot-to-boot spread (0.01 = 1%%; default the deployment's, else 0.01)")
    p.add_argument("--tolerance", action="append", default=[], metavar="[METRIC=]FRACTION",
                   help="a tolerance for every metric, or for one (repeat it; one metric's beats every "
                   "metric's); default the metric table's")
    p.add_argument("--metric", action="append", default=[], metavar="METRIC",
                   help="judge only this metric (repeat it); default every metric the files report")
    p.add_argument("--strict", action="store_true", help="a change beyond the tolerance left inconclusive fails")
    p.add_argument("--markdown", type=Path, action=_Once, metavar="PATH", help="write the answer as Markdown too")
    p.add_argument("--json", type=Path, action=_Once, metavar="PATH", help="write the answer as JSON too")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit status."""
    p = parser()
    args = p.parse_args(argv)
    try:
        groups = _groups(args)
        rules = _rules(args)
        outcome = judge_groups(groups, rules)
    except KimiperfError as exc:
        print(f"kimiperf compare: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    sys.stdout.write(render_text(groups, outcome))
    try:
        if args.markdown:
            args.markdown.write_text(render_markdown(groups, outcome), encoding="utf-8")
        if args.json:
            args.json.write_text(json.dumps(render_json(groups, outcome), indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        print(f"kimiperf compare: error: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return USAGE_EXIT
    return outcome.exit_status


def _groups(args: argparse.Namespace) -> list[Group]:
    patterns: dict[str, list[str]] = {}
    for label, given in (("a", args.a), ("b", args.b)):
        if given:
            patterns.setdefault(label, []).extend(given)
    for spec in args.group:
        label, sep, pattern = spec.partition("=")
        if not sep or not label or not pattern:
            raise ResultFileError(f"--group {spec!r}: use LABEL=FILE or LABEL=GLOB (before='runs/before/*.json')")
        patterns.setdefault(label, []).append(pattern)
    groups = []
    for label, given in patterns.items():
        paths: list[str] = []
        for pattern in given:
            found = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
            if not found:
                raise ResultFileError(f"group {label!r}: {pattern!r} matches no file")
            paths += [p for p in found if p not in paths]
        groups.append(Group(label, tuple(run for path in paths for run in read_run_file(Path(path)))))
    return groups


def _rules(args: argparse.Namespace) -> CompareRules:
    rules, tolerances = InSessionRules(), {}
    if args.deployment:
        deployment = select_deployment(args.deployment, BUILTIN_DEPLOYMENTS, source="--deployment")
        rules = InSessionRules.of(deployment)
        tolerances = {name: deployment.tolerance(name) for name in METRICS}
    if args.boot_spread is not None:
        if not 0.0 < args.boot_spread < 1.0:
            raise ResultFileError(f"--boot-spread {args.boot_spread!r}: use a fraction above 0 and below 1 (0.01 = 1%)")
        rules = InSessionRules(args.boot_spread, rules.boot_spread_df, rules.modes, rules.alpha)
    given: dict[str, tuple[str, float]] = {}  # metric ("" for every metric) -> (as given, fraction)
    for spec in args.tolerance:
        metric, sep, value = spec.rpartition("=")
        if sep and metric not in METRICS:
            raise ResultFileError(f"--tolerance {spec!r}: unknown metric {metric!r}; known: {', '.join(sorted(METRICS))}")
        try:
            fraction = float(value)
        except ValueError:
            fraction = float("nan")
        if not 0.0 < fraction < 1.0:
            raise ResultFileError(f"--tolerance {spec!r}: use a fraction above 0 and below 1 (0.05 = 5%)")
        if metric in given and given[metric][1] != fraction:
            raise ResultFileError(f"--tolerance given twice for {metric or 'every metric'}, as {given[metric][0]!r} and "
                                  f"{spec!r}; give one")
        given[metric] = (spec, fraction)
    if "" in given:  # every metric's first, so one metric's wins whatever the order
        tolerances.update({name: given[""][1] for name in METRICS})
    tolerances.update({metric: fraction for metric, (_, fraction) in given.items() if metric})
    for metric in args.metric:
        if metric not in METRICS:
            raise ResultFileError(f"--metric {metric!r}: unknown metric; known: {', '.join(sorted(METRICS))}")
    return CompareRules(rules=rules, tolerances=tolerances, metrics=tuple(dict.fromkeys(args.metric)) or None,
                        same_server=args.same_server, strict=args.strict)
