"""The plugin's options: one table, shared by the command line and the ini twins.

Precedence: command line > environment variable (where one exists) > ini option > default. An
option given twice with two values in one place (the command line, ``PYTEST_ADDOPTS``, ``addopts``)
is a usage error naming both: argparse would silently keep the last, a run nobody asked for. Given
in two places, the later one wins, as pytest's own options do.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kimiperf.config.settings import DEFAULT_DEPLOYMENT, DEFAULT_PROFILES, RawOption, Settings, build_settings
from pytest_kimiperf.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """One option: its flag, ini twin, environment variable, default and help. The argparse
    ``dest`` carries the plugin's prefix, so a user's conftest may add ``--port`` of its own."""

    name: str
    flag: str
    help: str
    default: Any = None
    env: str | None = None
    kind: str = "string"  # string | bool
    # False where a committed ini file must not set it (a key, a switch that never runs tests).
    has_ini: bool = True
    # The documented short alias, registered only where no conftest of the user's took the name.
    short: str | None = None
    # Old spellings, still parsed; each used one is named in a KimiperfDeprecationWarning.
    deprecated: tuple[str, ...] = ()
    deprecated_ini: tuple[str, ...] = ()
    # What --help and the reference say the default is, where the value is computed at run time.
    default_text: str | None = None
    # A comma-separated list: a repeat's error says to give the values that way.
    comma_list: bool = False

    @property
    def dest(self) -> str:
        return f"kimiperf_{self.name}"

    @property
    def ini(self) -> str | None:
        """The ini twin, the flag's own name: ``--kimiperf-json`` -> ``kimiperf_json``."""
        return self.flag[2:].replace("-", "_") if self.has_ini else None

    @property
    def metavar(self) -> str:
        """The value's name in ``--help``: ``--kimiperf-json=JSON``."""
        return self.flag[len(OWN_PREFIX):].upper().replace("-", "_")

    @property
    def shown_default(self) -> str:
        """The default in words, as ``--help`` shows it."""
        if self.default_text is not None:
            return self.default_text
        if self.kind == "bool":
            return "on" if self.default else "off"
        return str(self.default)

    @property
    def help_text(self) -> str:
        return f"{self.help} (default: {self.shown_default})"

    @property
    def bare_spellings(self) -> tuple[str, ...]:
        """The spellings without the plugin's prefix (the short alias, old bare flags): each is
        registered only where no conftest of the user's took the name first."""
        return tuple(f for f in (self.short, *self.deprecated) if f and not f.startswith(OWN_PREFIX))

    def flags(self, *, bare: bool) -> list[tuple[str, str | None]]:
        """(spelling, help) of each flag to register, the prefixed ones or the bare ones, all into
        the option's one dest; an old spelling has no help (argparse hides it)."""
        if bare:
            spellings = list(self.bare_spellings)
        else:
            spellings = [f for f in (self.flag, *self.deprecated) if f.startswith(OWN_PREFIX)]
        return [(f, self.help_text if f == self.flag else f"alias of {self.flag}" if f == self.short else None)
                for f in spellings]

    def ini_names(self) -> list[tuple[str, str]]:
        """(name, help) of each ini setting to register: the flag's twin and its old names."""
        if self.ini is None:
            return []
        return [(self.ini, self.help_text), *((n, f"deprecated: use {self.ini}") for n in self.deprecated_ini)]


OWN_PREFIX = "--kimiperf-"
# Where SpelledAction keeps, per dest, the spellings given on the command line, in order.
SPELLINGS_DEST = "kimiperf__spellings"
# ... and each (spelling, value) given, in order, so a repeat is seen rather than overwritten.
GIVEN_DEST = "kimiperf__given"


class SpelledAction(argparse.Action):
    """Stores an option's value under its dest (``nargs=0``: a switch, storing ``const``) and
    notes the spelling that gave it, so a source names what the user typed. pytest parses the
    command line twice into one namespace; the second pass repeats the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        value = self.const if self.nargs == 0 else values
        setattr(namespace, self.dest, value)
        for dest, item in ((SPELLINGS_DEST, option_string), (GIVEN_DEST, (option_string, value))):
            kept = getattr(namespace, dest, None)
            if kept is None:
                kept = {}
                setattr(namespace, dest, kept)
            kept.setdefault(self.dest, []).append(item)


OPTIONS = (
    Option("deployment", "--kimiperf-deployment",
           "deployment to boot and judge (built-ins: kimi-k25-int4-tp8, tiny-cpu, tiny-cpu-tp2, tiny-cpu-2node)",
           DEFAULT_DEPLOYMENT, env="KIMIPERF_DEPLOYMENT", short="--deployment"),
    Option("nccl_profiles", "--kimiperf-profile",
           "profile(s) to boot a server for, comma-separated, or 'all': NCCL environments and, "
           "in [tool.kimiperf.profiles], any server environment and arguments", DEFAULT_PROFILES,
           short="--nccl-profile", deprecated=("--kimiperf-nccl-profile",),
           deprecated_ini=("kimiperf_nccl_profiles",), comma_list=True),
    Option("nccl_debug", "--kimiperf-nccl-debug",
           "start servers with NCCL_DEBUG=INFO and check in the log that each variable took effect",
           False, kind="bool", deprecated=("--nccl-debug",)),
    Option("server_url", "--kimiperf-server-url",
           "measure an already-running server at this URL: no boot, no teardown, no sweep",
           env="KIMIPERF_SERVER_URL", default_text="none: boot the deployment's servers",
           deprecated=("--server-url",)),
    # No ini twin: a key in a committed ini file is a leaked key.
    Option("api_key", "--kimiperf-api-key",
           "API key for the server and client (prefer the VLLM_API_KEY environment variable: "
           "command lines are visible to other users)", env="VLLM_API_KEY", has_ini=False,
           default_text="none"),
    Option("port", "--kimiperf-port", "fixed port for booted servers", default_text="a free port"),
    # No ini twin: an ini file that always records would turn the gate into a recorder.
    Option("update_baselines", "--kimiperf-update-baselines",
           "write the measured samples of the tests that ran as the new baselines", False, kind="bool",
           has_ini=False, short="--update-baselines"),
    Option("append_on_pass", "--kimiperf-append-on-pass",
           "branch(es), comma-separated, on which a passing run appends its boots to the baseline "
           "history (e.g. 'main' for a scheduled job). A failing run appends nothing, "
           "nor one in which a metric is not comparable to its history (the host canary moved, or the profile's "
           "environment differs) or looked worse than its tolerance without a verdict. The baseline keeps the "
           "last deliberate recording as an anchor: a drift that adds up beyond the tolerance over the runs "
           "appended since fails (DRIFT)",
           env="KIMIPERF_APPEND_ON_PASS", default_text="off", comma_list=True),
    Option("control", "--kimiperf-control",
           "boot the deployment's control_command (the recorded build) as a control profile, interleaved "
           "with the one selected profile, and judge the candidate against it in this session: the session "
           "and host levels cancel, at twice the boots. A regression against the control fails the run",
           False, kind="bool"),
    Option("baselines_dir", "--kimiperf-baselines-dir", "directory of JSON baselines",
           default_text="<rootdir>/baselines", deprecated=("--baselines-dir",)),
    Option("perf_strict", "--kimiperf-strict",
           "fail perf tests whose baseline comparison puts the change beyond the tolerance without "
           "a verdict (inconclusive, or changed with its size unresolved): with 20 gated metrics it fails "
           "about a third of unchanged runs, so --kimiperf-gate leaves it off", False, kind="bool",
           deprecated=("--perf-strict",)),
    Option("missing_baseline", "--kimiperf-missing-baseline",
           "a perf test without a baseline for this hardware: 'warn' or 'fail' (for a "
           "CI gate, where a missing baseline must not pass)", "warn", env="KIMIPERF_MISSING_BASELINE"),
    Option("record_command", "--kimiperf-record-command",
           "the command that records this suite's baselines, quoted when a run finds none (e.g. "
           "'make baseline')", env="KIMIPERF_RECORD_COMMAND",
           default_text="this run's pytest command with --kimiperf-update-baselines"),
    Option("perf_json", "--kimiperf-json", "write the JSON perf report to this path",
           default_text="none", deprecated=("--perf-json",)),
    Option("perf_markdown", "--kimiperf-markdown",
           "write the Markdown summary to this path (also to $GITHUB_STEP_SUMMARY when set)",
           default_text="none", deprecated=("--perf-markdown",)),
    Option("perf_plots", "--kimiperf-plots",
           "write PNG plots into this directory (needs matplotlib: pytest-kimiperf[plots])",
           default_text="none", deprecated=("--perf-plots",)),
    Option("perf_export", "--kimiperf-export",
           "write per test and profile a `vllm bench serve --save-result` JSON file, and every "
           "request's timeline as requests.jsonl, into this directory", default_text="none",
           deprecated=("--perf-export",)),
    Option("perf_export_detailed", "--kimiperf-export-detailed",
           "with --kimiperf-export: keep the per-request arrays in the bench-serve files (input_lens, "
           "output_lens, ttfts, itls, start_times, errors), as bench serve's --save-detailed",
           False, kind="bool", deprecated=("--perf-export-detailed",)),
    Option("progress_interval", "--kimiperf-progress-interval",
           "seconds between boot progress lines when the output is not a terminal", "30"),
    Option("grace", "--kimiperf-grace", "seconds a stopping server gets between SIGTERM and SIGKILL", "30"),
    Option("host_wait", "--kimiperf-host-wait",
           "seconds to wait for another pytest session on this host to finish with its servers "
           "before failing (0: fail at once)", "600"),
    Option("server_hardware", "--kimiperf-server-hardware",
           "with --kimiperf-server-url: the attached server's hardware in your words (e.g. '8x RTX PRO 6000 "
           "Blackwell, PCIe'), recorded in its fingerprint; required there for --kimiperf-update-baselines. "
           "State it once in the repository (this ini setting, or the deployment table's server_hardware) so "
           "every run states it alike: a baseline is found by it",
           env="KIMIPERF_SERVER_HARDWARE", default_text="the deployment's server_hardware, else none",
           deprecated=("--server-hardware",)),
    Option("boots", "--kimiperf-boots",
           "boots per profile planned up front, in interleaved order A B B A; for recording a "
           "baseline or a careful comparison", "1",
           default_text="1; 2 when several profiles are compared: one boot each can never give a direction"),
    Option("max_boots", "--kimiperf-max-boots",
           "most boots per profile, on demand when a first boot looks worse",
           default_text="the deployment's max_boots"),
    Option("boot_order", "--kimiperf-boot-order",
           "order of the boots of several profiles: interleaved (A B B A ...) or random "
           "(seeded by --kimiperf-boot-seed)", "interleaved"),
    Option("boot_seed", "--kimiperf-boot-seed", "seed of --kimiperf-boot-order random", "0"),
    Option("host_id", "--kimiperf-host-id",
           "the name of the machine this run measures on, kept across reboots (a runner's name): boots "
           "of one host id are sessions of one host", env="KIMIPERF_HOST_ID",
           default_text="the machine id and DMI product UUID, or the machine id and kernel boot id "
           "where the UUID cannot be read"),
    Option("gate", "--kimiperf-gate",
           "gate mode, for CI: a perf test without a baseline for this hardware fails, and boots on demand "
           "follow the deployment's max_boots; a REGRESSION fails as in any run; the header says what fails",
           False, env="KIMIPERF_GATE", kind="bool"),
    # No ini twin: an ini file that always plans would never run a test.
    Option("plan", "--kimiperf-plan",
           "print the run's plan: boots per profile, the expected time of loading them, and the smallest "
           "change it can resolve, then exit before any boot", False, kind="bool", has_ini=False),
    # No ini twin: an ini file that always lists would never run a test.
    Option("list", "--kimiperf-list",
           "list the deployments, profiles and metrics this run could use, with where each is "
           "defined, then exit without running anything", False, kind="bool", has_ini=False),
)


# Where pytest takes command-line arguments from, in the order it joins them (config.parse):
# the ini file's addopts, then PYTEST_ADDOPTS, then the command line itself; the last one wins.
_ArgSources = Sequence[tuple[str, Sequence[str]]]


def arg_sources(addopts: Sequence[str], environ: Mapping[str, str], invocation: Sequence[str]) -> _ArgSources:
    """The places pytest read this run's arguments from, in its order (see :data:`_ArgSources`)."""
    return (("in the ini option addopts", tuple(addopts)),
            ("in PYTEST_ADDOPTS", tuple(shlex.split(environ.get("PYTEST_ADDOPTS", "")))),
            ("on the command line", tuple(invocation)))


def read_raw_options(
    getoption: Callable[[str], Any],
    getini: Callable[[str], Any],
    environ: Mapping[str, str] = os.environ,
    *,
    sources: _ArgSources = (),
) -> dict[str, RawOption]:
    """Each option's value and where it came from, by the documented precedence (a deprecated
    spelling counts as its option's own, and its source names the spelling). With ``sources``
    (:func:`arg_sources`), an option given two values in one of them is a ConfigError."""
    raw: dict[str, RawOption] = {}
    for opt in OPTIONS:
        flag, value = _command_line(opt, getoption, sources)
        ini, ini_value = _ini(opt, getini)
        if value is not None:
            raw[opt.name] = RawOption(value, f"command line {flag}")
        elif opt.env and environ.get(opt.env):
            raw[opt.name] = RawOption(environ[opt.env], f"environment variable {opt.env}")
        elif ini is not None:
            raw[opt.name] = RawOption(ini_value, f"ini option {ini}")
        else:
            raw[opt.name] = RawOption(opt.default, "default")
    return raw


def script_settings(deployment: str, *, rootpath: Path, profiles: str = "default", source: str = "a script",
                    extra_deployments: Mapping[str, Mapping[str, Any]] | None = None, **given: Any) -> Settings:
    """Validated settings for a script that drives the plugin's parts outside pytest (ci/,
    benchmarks/): every option at its default but the deployment, the profiles and ``given``,
    checked as a run's are. A stand-in settings object would miss every field added since."""
    raw = {opt.name: RawOption(opt.default, "default") for opt in OPTIONS}
    raw.update({name: RawOption(value, source) for name, value in
                {"deployment": deployment, "nccl_profiles": profiles, **given}.items()})
    unknown = set(given) - {opt.name for opt in OPTIONS}
    if unknown:
        raise ConfigError(f"{source}: unknown option(s) {sorted(unknown)}; known: {', '.join(o.name for o in OPTIONS)}")
    return build_settings(raw, rootpath=rootpath, extra_deployments=extra_deployments)


def deprecated_spellings_used(getoption: Callable[[str], Any], getini: Callable[[str], Any]) -> list[str]:
    """One sentence per old spelling this run used, naming the one to use instead."""
    spelled = _get(getoption, SPELLINGS_DEST) or {}
    used = []
    for opt in OPTIONS:
        for spelling in opt.deprecated:
            if spelling in spelled.get(opt.dest, ()):
                used.append(f"{spelling} is deprecated: use {opt.flag}")
        for name in opt.deprecated_ini:
            if _ini_is_set(opt, _get(getini, name)):
                used.append(f"the ini option {name} is deprecated: use {opt.ini}")
    return used


def _command_line(opt: Option, getoption: Callable[[str], Any], sources: _ArgSources) -> tuple[str, Any]:
    """The option's value from the command line, and the spelling that gave it (the last given)."""
    spellings = (_get(getoption, SPELLINGS_DEST) or {}).get(opt.dest) or [opt.flag]
    given: list[tuple[str, Any]] = (_get(getoption, GIVEN_DEST) or {}).get(opt.dest) or []
    value = _get(getoption, opt.dest)
    if len(given) < 2 or opt.kind == "bool" or not sources:
        return spellings[-1], value
    groups = _by_source(given, sources)
    if groups is None:  # the arguments could not be told apart: argparse's last value stands
        return spellings[-1], value
    for where, group in groups:
        values = list(dict.fromkeys(str(v) for _, v in group))
        if len(values) > 1:
            first, second = values[:2]
            how = (f"; for both, give it once: {opt.flag} {first},{second}" if opt.comma_list else
                   "; give it once")
            raise ConfigError(f"{opt.flag} is given twice {where}, as {first!r} and {second!r}: it takes one "
                              f"value, and the later would silently replace the earlier{how}")
    _, last = groups[-1]  # a later place overrides an earlier, as pytest's own options do
    return last[-1][0], value


def _by_source(given: list[tuple[str, Any]], sources: _ArgSources) -> list[tuple[str, list[tuple[str, Any]]]] | None:
    """``given`` split by the place each value came from (only the places that gave one), or
    None where the places' arguments do not account for every value given."""
    spellings = {spelling for spelling, _ in given}

    def count(tokens: Sequence[str]) -> int:
        return sum(1 for t in tokens if t in spellings or t.split("=", 1)[0] in spellings)

    counts = [count(tokens) for _, tokens in sources]
    if sum(counts) != len(given):
        return None
    groups, start = [], 0
    for (where, _), n in zip(sources, counts):
        if n:
            groups.append((where, given[start:start + n]))
        start += n
    return groups


def _ini(opt: Option, getini: Callable[[str], Any]) -> tuple[str | None, Any]:
    for name in (opt.ini, *opt.deprecated_ini) if opt.ini else ():
        value = _get(getini, name)
        if _ini_is_set(opt, value):
            return name, value
    return None, None


def _get(lookup: Callable[[str], Any], name: str) -> Any:
    # A bare old spelling is registered only where no conftest of the user's took the name.
    try:
        return lookup(name)
    except (ValueError, AttributeError, KeyError):
        return None


def perf_run_requested(raw: Mapping[str, RawOption]) -> bool:
    """Whether this run set a kimiperf option: on the command line, in the ini file, or in a
    KIMIPERF_* variable (VLLM_API_KEY alone is common in vLLM environments and asks for nothing)."""
    return any(
        r.source != "default" and not (r.source.startswith("environment variable") and "KIMIPERF_" not in r.source)
        for r in raw.values()
    )


def _ini_is_set(opt: Option, value: Any) -> bool:
    # pytest returns a bool ini's default (False) when the file does not set it: False is
    # therefore "not set", which is also what it means.
    if opt.kind == "bool":
        return value is True
    return value not in (None, "", [])
