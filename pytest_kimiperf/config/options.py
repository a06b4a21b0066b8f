"""The plugin's options: one table, shared by the command line and the ini twins.

Precedence, applied by :func:`read_raw_options`: command line > environment variable (where
one exists) > ini option > default. Validation happens once, in settings.build_settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kimiperf.config.settings import DEFAULT_DEPLOYMENT, DEFAULT_PROFILES, RawOption


@dataclass(frozen=True)
class Option:
    """One option: its flag, ini twin, environment variable, default and help.

    ``name`` is the key Settings are built from; the argparse ``dest`` carries the plugin's
    prefix, so a user's conftest may add ``--port`` or ``--grace`` of its own.
    """

    name: str
    flag: str
    ini: str | None
    help: str
    default: Any = None
    env: str | None = None
    kind: str = "string"  # string | bool
    # Other names of the plugin's own flag, always registered with it.
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        """Where argparse keeps the value: ``kimiperf_<name>``."""
        return f"kimiperf_{self.name}"

    @property
    def own_flag(self) -> str:
        """The flag under the plugin's prefix, always registered: ``--kimiperf-deployment``."""
        if self.flag.startswith(OWN_PREFIXES):
            return self.flag
        return f"--kimiperf-{self.flag[2:]}"

    @property
    def short_flag(self) -> str | None:
        """The documented bare flag (``--deployment``), registered only where no conftest of the
        user's took the name first; None when the flag already has the plugin's prefix."""
        return None if self.flag == self.own_flag else self.flag


OWN_PREFIXES = ("--kimiperf-", "--perf-")


OPTIONS = (
    Option("deployment", "--deployment", "kimiperf_deployment",
            "deployment to boot and judge (built-ins: kimi-k25-int4-tp8, tiny-cpu, tiny-cpu-tp2, tiny-cpu-2node)",
            DEFAULT_DEPLOYMENT, env="KIMIPERF_DEPLOYMENT"),
    Option("nccl_profiles", "--nccl-profile", "kimiperf_nccl_profiles",
            "profile(s) to boot a server for, comma-separated, or 'all': NCCL environments and, "
            "in [tool.kimiperf.profiles], any server environment and arguments", DEFAULT_PROFILES,
            aliases=("--kimiperf-profile",)),
    Option("nccl_debug", "--nccl-debug", "kimiperf_nccl_debug",
            "start servers with NCCL_DEBUG=INFO and check in the log that each variable took effect",
            False, kind="bool"),
    Option("server_url", "--server-url", "kimiperf_server_url",
            "measure an already-running server at this URL: no boot, no teardown, no sweep",
            env="KIMIPERF_SERVER_URL"),
    # No ini twin: a key in a committed ini file is a leaked key.
    Option("api_key", "--kimiperf-api-key", None,
            "API key for the server and client (prefer the VLLM_API_KEY environment variable: "
            "command lines are visible to other users)", env="VLLM_API_KEY"),
    Option("port", "--kimiperf-port", "kimiperf_port",
            "fixed port for booted servers (default: a free port)"),
    # No ini twin: an ini file that always records would turn the gate into a recorder.
    Option("update_baselines", "--update-baselines", None,
            "write the measured samples of the tests that ran as the new baselines", False, kind="bool"),
    Option("append_on_pass", "--kimiperf-append-on-pass", "kimiperf_append_on_pass",
            "branch(es), comma-separated, on which a passing run appends its boots to the baseline "
            "history (e.g. 'main' for a scheduled job; default: off). A failing run appends nothing, "
            "nor one in which a metric is worse than the history by half its tolerance, by the REGRESSION rule (a slow drift)",
            env="KIMIPERF_APPEND_ON_PASS"),
    Option("baselines_dir", "--baselines-dir", "kimiperf_baselines_dir",
            "directory of JSON baselines (default: <rootdir>/baselines)"),
    Option("perf_strict", "--perf-strict", "kimiperf_strict",
            "fail perf tests whose baseline comparison puts the change beyond the tolerance without "
            "a verdict (inconclusive, or changed with its size unresolved)", False, kind="bool"),
    Option("missing_baseline", "--kimiperf-missing-baseline", "kimiperf_missing_baseline",
            "a perf test without a baseline for this hardware: 'warn' (default) or 'fail' (for a "
            "CI gate, where a missing baseline must not pass)", "warn", env="KIMIPERF_MISSING_BASELINE"),
    Option("record_command", "--kimiperf-record-command", "kimiperf_record_command",
            "the command that records this suite's baselines, quoted when a run finds none (e.g. "
            "'make baseline'; default: this run's pytest command with --update-baselines)",
            env="KIMIPERF_RECORD_COMMAND"),
    Option("perf_json", "--perf-json", "kimiperf_json", "write the JSON perf report to this path"),
    Option("perf_markdown", "--perf-markdown", "kimiperf_markdown",
            "write the Markdown summary to this path (also to $GITHUB_STEP_SUMMARY when set)"),
    Option("perf_plots", "--perf-plots", "kimiperf_plots",
            "write PNG plots into this directory (needs matplotlib: pytest-kimiperf[plots])"),
    Option("perf_export", "--perf-export", "kimiperf_export",
            "write per test and profile a `vllm bench serve --save-result` JSON file, and every "
            "request's timeline as requests.jsonl, into this directory"),
    Option("perf_export_detailed", "--perf-export-detailed", "kimiperf_export_detailed",
            "with --perf-export: keep the per-request arrays in the bench-serve files (input_lens, "
            "output_lens, ttfts, itls, start_times, errors), as bench serve's --save-detailed",
            False, kind="bool"),
    Option("progress_interval", "--kimiperf-progress-interval", "kimiperf_progress_interval",
            "seconds between boot progress lines when the output is not a terminal", "30"),
    Option("grace", "--kimiperf-grace", "kimiperf_grace",
            "seconds a stopping server gets between SIGTERM and SIGKILL", "30"),
    Option("host_wait", "--kimiperf-host-wait", "kimiperf_host_wait",
            "seconds to wait for another pytest session on this host to finish with its servers "
            "before failing (default 600; 0: fail at once)", "600"),
    Option("server_hardware", "--server-hardware", "kimiperf_server_hardware",
            "with --server-url: the attached server's hardware in your words (e.g. '8x RTX PRO 6000 "
            "Blackwell, PCIe'), recorded in its fingerprint; required there for --update-baselines"),
    Option("boots", "--kimiperf-boots", "kimiperf_boots",
            "boots per profile planned up front (default 1; 2 when several profiles are compared: one boot "
            "each can never give a direction), in interleaved order A B B A; for "
            "recording a baseline or a careful comparison", "1"),
    Option("max_boots", "--kimiperf-max-boots", "kimiperf_max_boots",
            "most boots per profile, on demand when a first boot looks worse (default: the "
            "deployment's max_boots)"),
    Option("boot_order", "--kimiperf-boot-order", "kimiperf_boot_order",
            "order of the boots of several profiles: interleaved (A B B A ...) or random "
            "(seeded by --kimiperf-boot-seed)", "interleaved"),
    Option("boot_seed", "--kimiperf-boot-seed", "kimiperf_boot_seed",
            "seed of --kimiperf-boot-order random (default 0)", "0"),
    Option("host_id", "--kimiperf-host-id", "kimiperf_host_id",
            "the name of the machine this run measures on, kept across reboots (a runner's name): boots "
            "of one host id are sessions of one host (default: the machine id and DMI product UUID, or "
            "the machine id and kernel boot id where the UUID cannot be read)", env="KIMIPERF_HOST_ID"),
    Option("gate", "--kimiperf-gate", "kimiperf_gate",
            "gate mode, for CI: a perf test without a baseline for this hardware fails, and so does a "
            "change beyond the tolerance without a verdict (as --perf-strict); the header says what fails",
            False, env="KIMIPERF_GATE", kind="bool"),
    # No ini twin: an ini file that always plans would never run a test.
    Option("plan", "--kimiperf-plan", None,
            "print the run's plan: boots per profile, the expected time of loading them, and the smallest "
            "change it can resolve, then exit before any boot", False, kind="bool"),
    # No ini twin: an ini file that always lists would never run a test.
    Option("list", "--kimiperf-list", None,
            "list the deployments, profiles and metrics this run could use, with where each is "
            "defined, then exit without running anything", False, kind="bool"),
)




def read_raw_options(
    getoption: Callable[[str], Any],
    getini: Callable[[str], Any],
    environ: Mapping[str, str] = os.environ,
) -> dict[str, RawOption]:
    """Each option's value and where it came from, by the documented precedence."""
    raw: dict[str, RawOption] = {}
    for opt in OPTIONS:
        value = getoption(opt.dest)
        if value is not None:
            raw[opt.name] = RawOption(value, f"command line {opt.flag}")
        elif opt.env and environ.get(opt.env):
            raw[opt.name] = RawOption(environ[opt.env], f"environment variable {opt.env}")
        elif opt.ini and _ini_is_set(opt, getini(opt.ini)):
            raw[opt.name] = RawOption(getini(opt.ini), f"ini option {opt.ini}")
        else:
            raw[opt.name] = RawOption(opt.default, "default")
    return raw


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
