"""The plugin's settings, read and validated once into a frozen object.

Precedence for every option: command line > environment variable (where one exists) > ini
option (``[tool.pytest.ini_options]`` / pytest.ini) > default. Deployments and NCCL profiles
defined by users come from ``[tool.kimiperf]`` in the rootdir's ``pyproject.toml`` and from the
``pytest_kimiperf_add_deployments`` / ``pytest_kimiperf_add_profiles`` hooks.
"""

from __future__ import annotations

import enum
import math
import re
import tomllib
from collections.abc import Mapping
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytest_kimiperf.config.control import check_control
from pytest_kimiperf.config.deployment_tables import resolve_deployments, select_deployment
from pytest_kimiperf.config.deployments import MIN_BOOTS_DIRECTIONAL, Deployment, resolve_executable
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.nccl.profiles import NcclProfile, control_profile, resolve_profiles, select_profiles
from pytest_kimiperf.config.nccl.values import validate_profile
from pytest_kimiperf.config.nodes import check_nodes
from pytest_kimiperf.config.serve_args import CommandPlan, plan_command, read_serve_parser, serve_entry
from pytest_kimiperf.config.server_url import parse_base_url

DEFAULT_DEPLOYMENT = "kimi-k25-int4-tp8"
DEFAULT_PROFILES = "default"
_BOOT_ORDERS = ("interleaved", "random")
_MISSING_BASELINE_POLICIES = ("warn", "fail")


class MaxBootsSource(enum.Enum):
    """What set the most boots per profile."""

    DEPLOYMENT = "deployment"  # its max_boots: a gate's plan may cap it (session.with_gate_plan)
    OPTION = "option"  # --kimiperf-max-boots or its ini/env twin
    ATTACHED = "attached"  # an attached server without a restart_command boots once
    PLAN = "plan"  # the gate's plan capped the deployment's


@dataclass(frozen=True)
class RawOption:
    """One option's value and where it came from (for error messages)."""

    value: Any
    source: str


@dataclass(frozen=True)
class Settings:
    """Everything downstream needs to know about this run's configuration."""

    deployment: Deployment
    deployments: Mapping[str, Deployment]
    profiles: tuple[NcclProfile, ...]
    known_profiles: Mapping[str, NcclProfile]
    server_url: str | None
    port: int | None
    nccl_debug: bool
    update_baselines: bool
    baselines_dir: Path
    perf_strict: bool
    perf_json: Path | None
    perf_markdown: Path | None
    perf_plots: Path | None
    progress_interval_s: float
    grace_s: float
    api_key: str | None = field(default=None, repr=False)
    profile_warnings: tuple[str, ...] = ()
    host_wait_s: float = 600.0
    server_hardware: str | None = None
    boots: int = 1
    max_boots: int = 1
    # What set max_boots, and the header's words for it.
    max_boots_source: MaxBootsSource = MaxBootsSource.DEPLOYMENT
    max_boots_from: str = "the deployment's max_boots"
    boot_order: str = "interleaved"
    boot_seed: int = 0
    # Each field below is its option's (config/options.py says what it does).
    host_id: str | None = None
    missing_baseline: str = "warn"
    gate: bool = False
    append_on_pass: tuple[str, ...] = ()
    record_command: str | None = None
    perf_export: Path | None = None
    perf_export_detailed: bool = False
    control: bool = False
    # Each selected profile's server command against the deployment's (serve_args.CommandPlan):
    # what its args replaced and which parser checked them. Empty when attached.
    command_plans: Mapping[str, CommandPlan] = field(default_factory=dict)

    @property
    def external(self) -> bool:
        """Attach mode: measure a server somebody else started."""
        return self.server_url is not None

    @property
    def reference_profile(self) -> NcclProfile:
        """The profile others are compared with: the control (--kimiperf-control), else
        ``default`` when selected, else the first."""
        return next((p for p in self.profiles if p.control_of),
                    next((p for p in self.profiles if p.name == "default"), self.profiles[0]))

    @property
    def missing_baseline_fails(self) -> bool:
        """A metric without a baseline fails its test (``fail``; not while recording them)."""
        return self.missing_baseline == "fail" and not self.update_baselines


def _read_pyproject_table(rootpath: Path) -> tuple[dict[str, Any], str]:
    """``[tool.kimiperf]`` of the rootdir's pyproject.toml (empty when there is none)."""
    path = rootpath / "pyproject.toml"
    if not path.is_file():
        return {}, str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    table = data.get("tool", {}).get("kimiperf", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.kimiperf] must be a table")
    allowed = {"deployments", "profiles"}
    unknown = set(table) - allowed
    if unknown:
        raise ConfigError(
            f"{path}: [tool.kimiperf] has unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    return table, str(path)


def build_settings(
    options: Mapping[str, RawOption],
    *,
    rootpath: Path,
    extra_deployments: Mapping[str, Mapping[str, Any]] | None = None,
    extra_profiles: Mapping[str, Mapping[str, Any]] | None = None,
    pcie_only: bool | None = None,
) -> Settings:
    """Validate raw option values into Settings; any bad value raises ConfigError.

    Each phase stops at its first bad value, in this order, so of several bad values the one
    named is always the same.
    """
    chosen = _deployment_and_profiles(options, rootpath, extra_deployments, extra_profiles, pcie_only)
    deployment = chosen.deployment
    server_url = _server_url(options["server_url"])
    control, profiles = _with_control(options, deployment, chosen.profiles, server_url)
    profiles, command_plans = _booted_commands(profiles, deployment, server_url)
    server_hardware = _attached_server_hardware(options, server_url, profiles, deployment)
    append_on_pass = _append_on_pass(options, server_url, server_hardware)
    boots = _boots(options, profiles, server_url, control)
    max_boots, max_boots_source, max_boots_from = _max_boots(options, deployment, boots, server_url)
    boot_order, boot_seed = _boot_order(options), _boot_seed(options)
    missing_baseline, gate = _missing_baseline_policy(options)
    perf_export, export_detailed = _export(
        options.get("perf_export", RawOption(None, "default")),
        options.get("perf_export_detailed", RawOption(False, "default")), rootpath)
    return Settings(
        deployment=deployment, deployments=chosen.deployments, profiles=profiles,
        known_profiles=chosen.known_profiles, profile_warnings=chosen.warnings, control=control,
        command_plans=command_plans, server_url=server_url, server_hardware=server_hardware,
        boots=boots, max_boots=max_boots, max_boots_source=max_boots_source, max_boots_from=max_boots_from,
        boot_order=boot_order, boot_seed=boot_seed,
        missing_baseline=missing_baseline, gate=gate, append_on_pass=append_on_pass,
        perf_export=perf_export, perf_export_detailed=export_detailed,
        port=_port(options["port"]),
        nccl_debug=bool(options["nccl_debug"].value),
        update_baselines=bool(options["update_baselines"].value),
        baselines_dir=_path(options["baselines_dir"], rootpath) or rootpath / "baselines",
        perf_strict=bool(options["perf_strict"].value),
        perf_json=_path(options["perf_json"], rootpath),
        perf_markdown=_path(options["perf_markdown"], rootpath),
        perf_plots=_path(options["perf_plots"], rootpath),
        progress_interval_s=_seconds(options["progress_interval"], positive=True),
        grace_s=_seconds(options["grace"], positive=True),
        api_key=_api_key(options["api_key"]),
        host_wait_s=_seconds(options.get("host_wait", RawOption("600", "default"))),
        host_id=_host_id(options.get("host_id", RawOption(None, "default"))),
        record_command=str(options.get("record_command", RawOption(None, "default")).value or "").strip() or None,
    )


@dataclass(frozen=True)
class _Chosen:
    """The deployments and profiles defined, the ones selected, and what the selected profiles warn of."""

    deployments: Mapping[str, Deployment]
    deployment: Deployment
    known_profiles: Mapping[str, NcclProfile]
    profiles: tuple[NcclProfile, ...]
    warnings: tuple[str, ...]


def _deployment_and_profiles(
    options: Mapping[str, RawOption],
    rootpath: Path,
    extra_deployments: Mapping[str, Mapping[str, Any]] | None,
    extra_profiles: Mapping[str, Mapping[str, Any]] | None,
    pcie_only: bool | None,
) -> _Chosen:
    """The deployment and profiles selected, from the built-ins, [tool.kimiperf] and the hooks'."""
    table, pyproject = _read_pyproject_table(rootpath)
    deployments = resolve_deployments(
        {**table.get("deployments", {}), **(extra_deployments or {})},
        source=f"{pyproject} [tool.kimiperf]" if not extra_deployments else
        f"{pyproject} [tool.kimiperf] / pytest_kimiperf_add_deployments",
    )
    dep_opt = options["deployment"]
    deployment = select_deployment(str(dep_opt.value), deployments, source=dep_opt.source)

    known_profiles = resolve_profiles(
        {**table.get("profiles", {}), **(extra_profiles or {})},
        source=f"{pyproject} [tool.kimiperf.profiles]",
    )
    prof_opt = options["nccl_profiles"]
    profiles = tuple(select_profiles(str(prof_opt.value), known_profiles, source=prof_opt.source))

    warnings: list[str] = []
    for profile in profiles:
        warnings.extend(validate_profile(profile, pcie_only=pcie_only))
    return _Chosen(deployments, deployment, known_profiles, profiles, tuple(warnings))


def _with_control(options: Mapping[str, RawOption], deployment: Deployment, profiles: tuple[NcclProfile, ...],
                  server_url: str | None) -> tuple[bool, tuple[NcclProfile, ...]]:
    """--kimiperf-control checked; when on, the selected profile's control joins the profiles."""
    control_opt = options.get("control", RawOption(False, "default"))
    control = check_control(control_opt.value, control_opt.source, deployment, profiles,
                            server_url=server_url, update=bool(options["update_baselines"].value))
    return control, ((*profiles, control_profile(profiles[0])) if control else profiles)


def _booted_commands(profiles: tuple[NcclProfile, ...], deployment: Deployment,
                     server_url: str | None) -> tuple[tuple[NcclProfile, ...], dict[str, CommandPlan]]:
    """Each profile's server command, checked before any boot, and its args as the command takes
    them; an attached server is already running, so it has none."""
    if server_url is not None:
        return profiles, {}
    _check_port_placeholder(deployment)
    command_plans = _command_plans(profiles, deployment)
    return tuple(replace(p, args=command_plans[p.name].args) for p in profiles), command_plans


def _attached_server_hardware(options: Mapping[str, RawOption], server_url: str | None,
                              profiles: tuple[NcclProfile, ...], deployment: Deployment) -> str | None:
    """The attached server's hardware as the user states it (None when booting): the option by its
    precedence, else the deployment's ``server_hardware``. An attached server takes one profile as
    its label, and a baseline recorded from it must say what it ran on."""
    if server_url and len(profiles) > 1:
        raise ConfigError(
            f"--kimiperf-server-url {server_url} attaches to one running server, whose environment and arguments "
            f"were set when it started; give at most one --kimiperf-profile as its label, "
            f"not {', '.join(p.name for p in profiles)}"
        )
    stated = options.get("server_hardware", RawOption(None, "default"))
    if stated.value in (None, "") and deployment.server_hardware is not None:
        stated = RawOption(deployment.server_hardware, f"deployment {deployment.name}'s server_hardware "
                                                       f"({deployment.source})")
    server_hardware = _server_hardware(stated, server_url)
    if server_url and bool(options["update_baselines"].value) and server_hardware is None:
        raise ConfigError(
            f"--kimiperf-update-baselines with --kimiperf-server-url {server_url}: this host cannot see the attached "
            "server's hardware, and a baseline must say what it was measured on; state it with "
            "--kimiperf-server-hardware '8x <GPU>, <interconnect>', or once for every run in the repository: "
            "the kimiperf_server_hardware ini option or the deployment's server_hardware"
        )
    return server_hardware


def _append_on_pass(options: Mapping[str, RawOption], server_url: str | None,
                    server_hardware: str | None) -> tuple[str, ...]:
    """The branches on which a passing run appends its boots: not with --kimiperf-update-baselines,
    and from an attached server only when its hardware is stated."""
    append_on_pass = _branches(options.get("append_on_pass", RawOption(None, "default")))
    if append_on_pass and bool(options["update_baselines"].value):
        raise ConfigError(
            f"--kimiperf-update-baselines with append-on-pass {','.join(append_on_pass)!r}: the first records "
            "every run, the second only a passing run on those branches; give one")
    if append_on_pass and server_url and server_hardware is None:
        raise ConfigError(
            f"append-on-pass with --kimiperf-server-url {server_url}: a baseline must say what it was measured on; "
            "state the attached server's hardware with --kimiperf-server-hardware '8x <GPU>, <interconnect>'")
    return append_on_pass


def _boots(options: Mapping[str, RawOption], profiles: tuple[NcclProfile, ...], server_url: str | None,
           control: bool) -> int:
    """Boots per profile planned up front."""
    boots = _count(options["boots"], "boots per profile") if "boots" in options else 1
    if len(profiles) > 1 and options.get("boots", RawOption("1", "default")).source == "default" and not server_url:
        # One boot each can never give a direction between profiles (nor tell a change from a
        # spawn mode): a comparison plans the boots a verdict needs unless told otherwise.
        boots = MIN_BOOTS_DIRECTIONAL
    if control and boots < MIN_BOOTS_DIRECTIONAL:
        raise ConfigError(f"--kimiperf-control with {boots} boot per profile (from {options['boots'].source}): one "
                          f"boot a side never gives a direction, so the control could never fail the run; use "
                          f"--kimiperf-boots {MIN_BOOTS_DIRECTIONAL} or more")
    return boots


def _max_boots(options: Mapping[str, RawOption], deployment: Deployment, boots: int,
               server_url: str | None) -> tuple[int, MaxBootsSource, str]:
    """The most boots per profile, what set it, and the words that say where it came from."""
    max_boots_opt = options.get("max_boots", RawOption(None, "default"))
    max_boots_source, max_boots_from = MaxBootsSource.DEPLOYMENT, f"deployment {deployment.name}'s max_boots"
    if max_boots_opt.value in (None, ""):
        max_boots = max(deployment.max_boots, boots)
    else:
        max_boots_source, max_boots_from = MaxBootsSource.OPTION, max_boots_opt.source
        max_boots = _count(max_boots_opt, "most boots per profile")
        if max_boots < boots:
            raise ConfigError(f"most boots per profile {max_boots} (from {max_boots_opt.source}) is below the "
                              f"{boots} planned boots (from {options['boots'].source}); use at least {boots}")
    if server_url and not deployment.restart_command:
        if boots > 1:
            raise ConfigError(f"{boots} boots per profile (from {options['boots'].source}) with --kimiperf-server-url "
                              f"{server_url}: an attached server is not booted by this run, and deployment "
                              f"{deployment.name} names no restart_command to restart it with; use 1, or give "
                              "the deployment a restart_command (such as ['systemctl', 'restart', 'vllm'])")
        max_boots, max_boots_from = 1, "an attached server without a restart_command"
        max_boots_source = MaxBootsSource.ATTACHED
    return max_boots, max_boots_source, max_boots_from


def _boot_order(options: Mapping[str, RawOption]) -> str:
    boot_order = str(options.get("boot_order", RawOption("interleaved", "default")).value)
    if boot_order not in _BOOT_ORDERS:
        raise ConfigError(f"boot order {boot_order!r} (from {options['boot_order'].source}); allowed: "
                          f"{', '.join(_BOOT_ORDERS)}")
    return boot_order


def _boot_seed(options: Mapping[str, RawOption]) -> int:
    boot_seed_opt = options.get("boot_seed", RawOption("0", "default"))
    try:
        return int(str(boot_seed_opt.value))
    except ValueError:
        raise ConfigError(f"boot seed {boot_seed_opt.value!r} (from {boot_seed_opt.source}) must be an integer") from None


def _missing_baseline_policy(options: Mapping[str, RawOption]) -> tuple[str, bool]:
    """What a perf test without a baseline does (warn or fail), and whether this run is a gate,
    which makes it fail."""
    missing_opt = options.get("missing_baseline", RawOption("warn", "default"))
    missing_baseline = str(missing_opt.value).strip().lower()
    if missing_baseline not in _MISSING_BASELINE_POLICIES:
        raise ConfigError(f"missing-baseline policy {missing_opt.value!r} (from {missing_opt.source}); allowed: "
                          f"{', '.join(_MISSING_BASELINE_POLICIES)}")
    gate_opt = options.get("gate", RawOption(False, "default"))
    gate = _flag(gate_opt, "gate")
    if gate:
        if missing_opt.source != "default" and missing_baseline != "fail":
            raise ConfigError(f"gate mode (from {gate_opt.source}) with missing-baseline policy {missing_opt.value!r} "
                              f"(from {missing_opt.source}): a gate fails where it has no baseline to judge "
                              "against; drop the policy, or run without the gate")
        missing_baseline = "fail"
    return missing_baseline, gate


HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


def _host_id(opt: RawOption) -> str | None:
    """A declared host id: a name such as a runner's (letters, digits and ``._:@-``)."""
    if opt.value is None or str(opt.value).strip() == "":
        return None
    value = str(opt.value).strip()
    if not HOST_ID.fullmatch(value):
        raise ConfigError(f"host id {value!r} (from {opt.source}): use 1-128 letters, digits and '._:@-', "
                          "starting with a letter or digit, such as the runner's name 'gpu-runner-1'")
    return value


BRANCH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")


def _branches(opt: RawOption) -> tuple[str, ...]:
    """Branch names, comma-separated (letters, digits and ``._/-``); empty: off."""
    if opt.value is None:
        return ()
    names = tuple(n.strip() for n in str(opt.value).split(",") if n.strip())
    for name in names:
        if not BRANCH.fullmatch(name) or ".." in name:
            raise ConfigError(f"append-on-pass branch {name!r} (from {opt.source}): use branch names of letters, "
                              "digits and '._/-', comma-separated, such as 'main' or 'main,release/1.2'")
    return names


def _flag(opt: RawOption, what: str) -> bool:
    """A switch from the command line (True), an ini bool (True/False) or an environment variable."""
    if isinstance(opt.value, bool):
        return opt.value
    text = str(opt.value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what} {opt.value!r} (from {opt.source}); allowed: 1, true, yes, on or 0, false, no, off")


def _check_port_placeholder(deployment: Deployment) -> None:
    """A booted server listens where the plugin waits for it: on the port it puts in ``{port}``."""
    if not deployment.command:
        raise ConfigError(
            f"deployment {deployment.name!r} ({deployment.source}) has no command, so this run has nothing to "
            "boot: attach to its running server with --kimiperf-server-url, or give the table model and command "
            "(such as command = ['vllm', 'serve', '{model}', '--port', '{port}'])")
    if not any("{port}" in part for part in deployment.command):
        raise ConfigError(
            f"deployment {deployment.name!r} ({deployment.source}): its command has no '{{port}}' placeholder, "
            "but each boot gets a free port (or --kimiperf-port) and the plugin waits for the server there; "
            "add '--port', '{port}' to the command (or attach to a running server with --kimiperf-server-url)")


def _command_plans(profiles: tuple[NcclProfile, ...], deployment: Deployment) -> dict[str, CommandPlan]:
    """Each profile's args checked, before any boot, against the serve parser of the vLLM the
    deployment runs (read only when a selected profile has args: it imports vLLM once)."""
    parser = None
    entry = serve_entry(deployment.command)
    if entry is not None and any(p.args for p in profiles):
        program = deployment.command[0]
        python = sys.executable if program in ("{python}", "vllm") or os.path.basename(program) == "vllm" \
            else resolve_executable(program)
        parser = read_serve_parser(python)
    # The control's args go to the control_command unchecked: it serves another build, whose
    # parser this one does not read.
    plans = {p.name: plan_command(p.args, deployment.control_command if p.control_of else deployment.command,
                                  None if p.control_of else parser, who=f"profile {p.name!r} (from {p.source}) args")
             for p in profiles}
    for p in profiles if deployment.nodes else ():  # a profile's args must not undo what spanning nodes needs
        check_nodes(deployment.nodes, command=plans[p.name].apply(deployment.command),
                    tensor_parallel_size=deployment.tensor_parallel_size, master_port=deployment.master_port,
                    where=f"profile {p.name!r} (from {p.source}) args on deployment {deployment.name}")
    return plans


def _export(dir_opt: RawOption, detailed_opt: RawOption, rootpath: Path) -> tuple[Path | None, bool]:
    directory = _path(dir_opt, rootpath)
    detailed = bool(detailed_opt.value)
    if detailed and directory is None:
        raise ConfigError(f"--kimiperf-export-detailed (from {detailed_opt.source}) adds the per-request "
                          "arrays to the --kimiperf-export files: give --kimiperf-export DIR too")
    if directory is not None and directory.exists() and not directory.is_dir():
        raise ConfigError(f"export directory {dir_opt.value!r} (from {dir_opt.source}) is a file, "
                          "not a directory")
    return directory, detailed


def _count(opt: RawOption, what: str) -> int:
    try:
        value = int(str(opt.value))
    except ValueError:
        value = 0
    if value < 1 or value > 100:
        raise ConfigError(f"{what} {opt.value!r} (from {opt.source}) must be an integer from 1 to 100")
    return value


def _server_url(opt: RawOption) -> str | None:
    if opt.value in (None, ""):
        return None
    url = str(opt.value).rstrip("/")
    if urlsplit(url).path.endswith("/v1"):
        url = url[: -len("/v1")]
    parse_base_url(url, source=opt.source)  # ConfigError saying what is allowed
    return url


def _port(opt: RawOption) -> int | None:
    if opt.value in (None, ""):
        return None
    try:
        port = int(opt.value)
    except (TypeError, ValueError):
        port = -1
    if not 1 <= port <= 65535:
        raise ConfigError(f"port {opt.value!r} (from {opt.source}) must be an integer from 1 to 65535")
    return port


def _seconds(opt: RawOption, *, positive: bool = False) -> float:
    try:
        value = float(opt.value)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        bound = ">" if positive else ">="
        raise ConfigError(f"{opt.value!r} (from {opt.source}) must be a number of seconds {bound} 0")
    return value


def _server_hardware(opt: RawOption, server_url: str | None) -> str | None:
    if opt.value in (None, ""):
        return None
    if server_url is None:
        return None  # it describes attached servers only; a booted server's hardware is probed
    text = " ".join(str(opt.value).split())
    if len(text) > 200:
        raise ConfigError(f"server hardware (from {opt.source}) is {len(text)} characters; keep it under 200")
    return text


def _path(opt: RawOption, rootpath: Path) -> Path | None:
    if opt.value in (None, ""):
        return None
    path = Path(str(opt.value)).expanduser()
    return path if path.is_absolute() else rootpath / path if opt.source.startswith("ini") else path.resolve()


def _api_key(opt: RawOption) -> str | None:
    if opt.value in (None, ""):
        return None
    key = str(opt.value)
    if any(ch.isspace() for ch in key):
        raise ConfigError(f"the API key (from {opt.source}) contains whitespace; it must be one token")
    return key
