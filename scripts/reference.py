"""The reference pages of the docs site, generated from the code so they cannot drift from it.

``python scripts/reference.py [--check] [OUT_DIR]`` writes ``options.md``,
``deployment.md``, ``metrics.md``, ``api.md`` and ``compare.md`` into OUT_DIR (default ``docs/reference``) from
the option table, the deployment and profile key tables, the metric table, the package's
exported names (``public_names``), the fixtures and the hook specs. With ``--check`` it writes
nothing and exits 1 naming each page that differs from what it would write; the unit tests run
the same check.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's package, whichever is installed

from pytest_kimiperf.compare.cli import USAGE_EXIT  # noqa: E402
from pytest_kimiperf.compare.cli import parser as compare_parser  # noqa: E402
from pytest_kimiperf.compare.verdict import PASSED_EXIT, REGRESSION_EXIT, UNRESOLVED_EXIT  # noqa: E402
from pytest_kimiperf.config.deployment_tables import _FIELDS as DEPLOYMENT_FIELDS  # noqa: E402
from pytest_kimiperf.config.deployment_tables import _USER_BASE  # noqa: E402
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS, PLACEHOLDERS  # noqa: E402
from pytest_kimiperf.config.metric_specs import METRICS, SampleKind  # noqa: E402
from pytest_kimiperf.config.nccl.profiles import _PROFILE_TABLE_KEYS, BUILTIN_PROFILES  # noqa: E402
from pytest_kimiperf.config.nodes import Node  # noqa: E402
from pytest_kimiperf.config.options import OPTIONS  # noqa: E402
from pytest_kimiperf.public_names import PUBLIC_NAMES  # noqa: E402

COMMAND = "python scripts/reference.py"
_DEFAULT_OUT = ROOT / "docs" / "reference"
PACKAGE = ROOT / "pytest_kimiperf"

# The environment variables the plugin reads (or sets) besides the options' own: name -> meaning.
# tests/unit/test_reference.py fails on a KIMIPERF_* name (or an os.environ read) in the package
# that neither this table nor an option names.
ENVIRONMENT: dict[str, str] = {
    "KIMIPERF_CACHE_DIR": "where files that outlive a run are kept: the tiny CPU model, the servers' compile "
                          "caches, launch records (default `$XDG_CACHE_HOME/pytest-kimiperf`, else "
                          "`~/.cache/pytest-kimiperf`)",
    "KIMIPERF_STATE_DIR": "the directory of launch records, which a later run reads to find and stop servers a "
                          "killed run left behind (default `<cache dir>/launches`)",
    "KIMIPERF_LAUNCH_ID": "set by the plugin in every server's environment (each child process inherits it), so "
                          "a later run recognises a killed run's processes; not for you to set",
    "XDG_CACHE_HOME": "the base of the default cache directory and of the Hugging Face cache",
    "HF_HUB_CACHE": "where a Hub model's files are looked for (its `config.json` for the roofline, its "
                    "weights for the weight cache's size check)",
    "HF_HOME": "as `HF_HUB_CACHE`, with `/hub` appended, where that is unset",
    "VLLM_CACHE_ROOT": "set for each server to `<cache dir>/vllm` (torch.compile cache) unless the shell or "
                       "the deployment sets it",
    "TORCHINDUCTOR_CACHE_DIR": "set for each server to `<cache dir>/torchinductor` unless the shell or the "
                               "deployment sets it",
    "GITHUB_STEP_SUMMARY": "when set (GitHub Actions), the Markdown summary is appended to this file",
    "GITHUB_ACTIONS": "with `GITHUB_REF_NAME`: the branch `--kimiperf-append-on-pass` compares with",
    "GITHUB_REF_NAME": "the branch on GitHub Actions (`<n>/merge` on a pull request)",
    "GITLAB_CI": "with `CI_COMMIT_BRANCH`: the branch on GitLab CI (unset in a merge request pipeline)",
    "CI_COMMIT_BRANCH": "the branch on GitLab CI",
    "BUILDKITE": "with `BUILDKITE_BRANCH`: the branch on Buildkite",
    "BUILDKITE_BRANCH": "the branch on Buildkite",
    "PYTEST_XDIST_WORKER": "set by pytest-xdist on its workers: the host watch counts the controller as this "
                           "run's own process, not as foreign load",
    "PYTEST_XDIST_TESTRUNUID": "set by pytest-xdist: one id for the whole run, so the boots of all its workers "
                               "count as one session",
    "PYTEST_ADDOPTS": "pytest's own: read to tell an option given twice in it (a usage error naming both "
                      "values) from one it gives and the command line overrides",
}

# What each deployment key is, and its default where the table's own base does not say it (a
# value worked out from other keys). The generator fails on a key of the code missing here.
_DEPLOYMENT_KEYS: dict[str, tuple[str, str | None]] = {
    "extends": ("a deployment (built-in or yours) this one starts from; its keys are the defaults",
                "none: the defaults below"),
    "description": ("one line, shown by `--kimiperf-list` and in the report header", "user deployment from <where>"),
    "model": ("what `{model}` in the command becomes: a Hub name or a local path", None),
    "served_model_name": ("the name the server serves the model under (the client's `model`)",
                          "the model's last path part"),
    "tensor_parallel_size": ("what `{tp}` in the command becomes", None),
    "command": ("the server's command, an argument list with placeholders " +
                ", ".join(f"`{{{p}}}`" for p in PLACEHOLDERS) + "; never a shell string", None),
    "env": ("environment variables every server of this deployment starts with (on top of the shell's)", None),
    "health_deadline_s": ("seconds a server may take to become ready before the boot fails", None),
    "gpu_count": ("GPUs this machine must have; 0 for a CPU deployment or one that only attaches",
                  "the GPUs the command's parallel layout places on this machine (0 without a command)"),
    "gpu_name_contains": ("a text every GPU's name must contain (`RTX PRO 6000`)", None),
    "decode_floor_tok_s": ("single-stream decode below this fails the test (0: no floor)", None),
    "decode_target_tok_s": ("single-stream decode below this warns (`BelowTargetWarning`)",
                            "the floor, when only a floor is given"),
    "host": ("the address the server listens on", None),
    "quantization": ("the quantization, as recorded in the report", None),
    "revision": ("the model revision, as recorded in the report and the fingerprint", None),
    "tolerances": ("metric -> fraction: this deployment's default tolerance of each metric (see the metrics page)",
                   None),
    "client_bounds": ("overrides of the load client's self-check bounds", None),
    "model_config": ("the model's `config.json` (or its folder, relative to the rootdir) for the roofline, where "
                     "it is not found from `model`", None),
    "memory_bandwidth_gbs": ("memory bandwidth per device in GB/s for the roofline, instead of the datasheet "
                             "figure or the measured CPU copy", None),
    "allreduce_latency_us": ("one decode-sized allreduce's latency in microseconds, for the roofline", None),
    "boot_spread": ("declared SD of a boot's median (fraction, 0.01 = 1%) until the baseline history measures it",
                    None),
    "session_spread": ("declared SD of a session's shared effect on its boots, pooled with what the history's "
                       "sessions measure (a floor they can raise)", None),
    "host_spread": ("declared SD among hosts with one fingerprint, pooled with what the history's hosts measure",
                    None),
    "boot_spreads": ("a metric whose boots spread wider than `boot_spread` (a tail such as p99 ITL), its own "
                     "declared SD: {metric = fraction}", None),
    "boot_spread_df": ("how sure `boot_spread` is, in degrees of freedom (3 for a guess; `inf`: exact)", None),
    "session_spread_df": ("how sure `session_spread` is, in degrees of freedom (default 10; `inf`: exact, the rule "
                          "before)", None),
    "host_spread_df": ("how sure `host_spread` is, in degrees of freedom (default 10; `inf`: exact)", None),
    "spawn_mode_drop": ("how much slower a boot in the slow spawn mode is (0.5: half as fast; 0: no modes)", None),
    "spawn_mode_share": ("the share of boots that land in the slow spawn mode", None),
    "max_boots": ("most boots per profile in one session, on demand when a first boot looks worse", None),
    "host_bounds": ("overrides of the host watch's bounds (`max_foreign_cpu_share`, ...)", None),
    "weight_cache": ("`auto`: `vllm preload` daemons hold the weights between boots where the platform allows "
                     "(CUDA); `off`: never", None),
    "nodes": ("a deployment across machines: one table per node, the head first (see the scaling how-to)", None),
    "master_port": ("the head's torch.distributed port (none: a free one per boot)", None),
    "restart_command": ("with `--kimiperf-server-url`: an argument list that restarts the attached server "
                        "between boots", None),
    "server_hardware": ("with `--kimiperf-server-url`: the attached server's hardware, as "
                        "`--kimiperf-server-hardware` states it (which, its variable and its ini setting win over "
                        "this)", None),
    "control_command": ("with `--kimiperf-control`: the command that serves the recorded build (the default "
                        "branch's virtualenv or image), placeholders as `command`", None),
    "load_s": ("seconds one boot takes to become ready, for `--kimiperf-plan`, until the history records it",
               None),
    "gpu_memory_wait_s": ("seconds GPU memory may take to come back before a boot (after the sweep of a killed "
                          "run's processes, and after a stopped server)", None),
}

_PROFILE_KEYS: dict[str, tuple[str, str]] = {
    "description": ("string", "what the profile is for (default: its environment, spelled out)"),
    "env": ("table of `VARIABLE = string or integer`", "environment variables set on top of the deployment's "
            "(NCCL ones are checked against NCCL's rules)"),
    "args": ("array of strings", "server arguments appended to the deployment's command (one given twice "
             "replaces the deployment's)"),
    "extends": ("string", "a profile (built-in or yours) whose `env` and `args` this one starts from"),
}

_SAMPLES: dict[SampleKind, str] = {
    SampleKind.REQUEST: "one per valid request",
    SampleKind.ROUND: "one per measured round",
    SampleKind.TAIL: "the pooled samples of its base metric; a boot is their quantile",
    SampleKind.GOODPUT: "one per round, counted against the SLOs given to `perf.check(goodput=...)`",
    SampleKind.BOOT: "one per server boot after the session's first",
}

_TYPE_NAMES = {str: "string", int: "integer", float: "number", list: "array", dict: "table"}


def _generated(title: str, intro: str) -> list[str]:
    return [f"<!-- Generated by `{COMMAND}`: edit the code, then run it again. -->", "", f"# {title}", "",
            f"*Generated from the code by `{COMMAND}`.* {intro}", ""]


def _code(text: object) -> str:
    return f"`{text}`"


def _prose(text: object) -> str:
    """Text for Markdown: ``<`` and ``>`` outside code spans escaped, so ``<rootdir>`` is no tag."""
    parts = str(text).split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _cell(text: object) -> str:
    # A pipe inside a code span would show its escape on the site: such a span becomes plain text.
    parts = _prose(text).split("`")
    text = "".join(f"`{p}`" if i % 2 and "|" not in p else p for i, p in enumerate(parts))
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> list[str]:
    header = list(header)
    return [f"| {' | '.join(header)} |", f"|{' :-- |' * len(header)}",
            *(f"| {' | '.join(_cell(c) for c in row)} |" for row in rows), ""]


def _rst(text: str) -> str:
    """A docstring's reStructuredText roles and double backquotes as Markdown code."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _first_paragraph(obj: object) -> str:
    """The first paragraph of an object's docstring, on one line."""
    doc = inspect.getdoc(obj) or ""
    return _rst(" ".join(doc.split("\n\n")[0].split()))


def _value(value: Any) -> str:
    if value is None or value == () or value == {}:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _code(value) if value else "none"
    if isinstance(value, float) and value.is_integer():
        return _code(int(value))
    if isinstance(value, Mapping) and set(value) == set(METRICS) and len(set(value.values())) == 1:
        return f"every metric: `{next(iter(value.values()))}`"
    if isinstance(value, Mapping):
        return ", ".join(f"`{k}={v}`" for k, v in value.items())
    if isinstance(value, tuple) and all(isinstance(v, Node) for v in value):
        return ", ".join(f"`{n.name}` on `{n.host}`" for n in value)
    if isinstance(value, (tuple, list)):
        return _code(" ".join(str(v) for v in value))
    return _code(value)


# -- options --------------------------------------------------------------------------------------


def _options_page() -> str:
    """docs/reference/options.md: every option, with its spellings, default and help."""
    lines = _generated("Options", "Every option has one long flag; most have an ini setting of the same name "
                       "with underscores, some an environment variable and a short alias.")
    lines += ["## Precedence", "",
              "Each option is taken from the first of these that sets it: the command line, its environment "
              "variable (where it has one), its ini setting (in `[tool.pytest.ini_options]` of `pyproject.toml`, "
              "or `pytest.ini`, `tox.ini`, `setup.cfg`), then the default. A switch (an option without a value) "
              "is set by its flag, by `true` in the ini file, or by `1`, `true`, `yes` or `on` in its variable "
              "(`0`, `false`, `no` or `off` turn it off).", "",
              "An option given twice with two values in one place (the command line, `PYTEST_ADDOPTS`, the "
              "ini file's `addopts`) is a usage error that names both: give it once (a list comma-separated, "
              "`--kimiperf-profile default,ring-ll`). In two places the later wins, as for pytest's own "
              "options: the command line over `PYTEST_ADDOPTS` over `addopts`.", "",
              "Deprecated spellings still work and warn once (`KimiperfDeprecationWarning`), naming the "
              "spelling to use.", "", "## All options", ""]
    rows = []
    for opt in OPTIONS:
        old = [*(_code(s) for s in opt.deprecated), *(f"ini {_code(n)}" for n in opt.deprecated_ini)]
        rows.append([f"[{_code(opt.flag)}](#{opt.flag.lstrip('-')})", _code(opt.short) if opt.short else "",
                     _code(opt.ini) if opt.ini else "", _code(opt.env) if opt.env else "",
                     opt.shown_default, ", ".join(old)])
    lines += _table(["option", "short alias", "ini setting", "environment variable", "default", "deprecated"], rows)
    for opt in OPTIONS:
        usage = f"`{opt.flag}` (a switch)" if opt.kind == "bool" else f"`{opt.flag} {opt.metavar}`"
        lines += [f"### `{opt.flag}` {{#{opt.flag.lstrip('-')}}}", "", f"{usage}: {_prose(opt.help)}.", ""]
        facts = [f"short alias {_code(opt.short)}"] if opt.short else []
        facts.append(f"ini setting {_code(opt.ini)}" if opt.ini else "no ini setting")
        if opt.env:
            facts.append(f"environment variable {_code(opt.env)}")
        lines += [f"Default: {_prose(opt.shown_default)}; " + ", ".join(facts) + ".", ""]
    lines += ["## Other environment variables", "",
              "Read (or, where said, set) by the plugin besides the options' own variables above.", ""]
    lines += _table(["variable", "what it does"], ([_code(name), text] for name, text in ENVIRONMENT.items()))
    return "\n".join(lines).rstrip() + "\n"


# -- deployments and profiles ---------------------------------------------------------------------


def _type_name(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    if set(types) == {int, float}:
        return "number"
    return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)


def _deployment_page() -> str:
    """docs/reference/deployment.md: the deployment and profile table keys, and the built-ins."""
    missing = set(DEPLOYMENT_FIELDS) ^ set(_DEPLOYMENT_KEYS)
    if missing:
        raise SystemExit(f"reference: _DEPLOYMENT_KEYS and the deployment key table differ on {sorted(missing)}")
    if set(_PROFILE_TABLE_KEYS) ^ set(_PROFILE_KEYS):
        raise SystemExit("reference: _PROFILE_KEYS and the profile key table differ")
    lines = _generated("Deployments and profiles", "`[tool.kimiperf]` in the rootdir's `pyproject.toml` holds two "
                       "tables: `deployments` and `profiles`; a conftest may add more through the "
                       "`pytest_kimiperf_add_deployments` and `pytest_kimiperf_add_profiles` hooks.")
    lines += ["## Deployment keys", "",
              "`[tool.kimiperf.deployments.NAME]`: every key is optional. A table with `extends` starts from "
              "that deployment; one without starts from the defaults below (no floor, the metrics' own "
              "tolerances). A key not in this table is a usage error naming the allowed ones.", ""]
    rows = []
    for key, expected in DEPLOYMENT_FIELDS.items():
        text, default = _DEPLOYMENT_KEYS[key]
        rows.append([_code(key), _type_name(expected),
                     default if default is not None else _value(getattr(_USER_BASE, key)), text])
    lines += _table(["key", "type", "default", "meaning"], rows)
    lines += ["## Profile keys", "",
              "`[tool.kimiperf.profiles.NAME]`: a profile is a variant of the server, booted and judged on its "
              "own; a user profile of a built-in's name replaces it. The name `all` is reserved.", ""]
    lines += _table(["key", "type", "meaning"],
                    ([_code(key), *_PROFILE_KEYS[key]] for key in _PROFILE_TABLE_KEYS))
    lines += ["## Built-in deployments", ""]
    for dep in BUILTIN_DEPLOYMENTS.values():
        lines += [f"### {dep.name}", "", dep.description + ".", ""]
        lines += _table(["key", "value"], ([_code(k), _value(getattr(dep, k))] for k in DEPLOYMENT_FIELDS
                                           if k not in ("extends", "description")))
        if dep.decode_per_canary_mops is not None:
            per_floor, per_target = dep.decode_per_canary_mops
            lines += [f"On a host whose canary reads M Mops, the decode floor is {per_floor:g}·M and the target "
                      f"{per_target:g}·M tok/s; the figures above hold where no canary is read.", ""]
        if dep.declared_from:
            lines += [f"Spreads, modes, floor and target declared from: {_prose(dep.declared_from)}.", ""]
    lines += ["## Built-in profiles", ""]
    lines += _table(["profile", "what it is", "environment", "arguments"],
                    ([_code(p.name), p.description, _value(p.env), _value(p.args)] for p in BUILTIN_PROFILES.values()))
    return "\n".join(lines).rstrip() + "\n"


# -- metrics --------------------------------------------------------------------------------------


def _metrics_page() -> str:
    """docs/reference/metrics.md: every metric a perf test can judge."""
    if set(SampleKind) - set(_SAMPLES):
        raise SystemExit("reference: _SAMPLES lacks a SampleKind")
    lines = _generated("Metrics", "A perf test judges each metric it measured against its baseline, within a "
                       "tolerance: the deployment's `tolerances` entry, a test's "
                       "`@pytest.mark.kimiperf(tolerances={...})`, else the default below.")
    rows = []
    for spec in METRICS.values():
        better = "higher" if spec.direction.value == "higher_is_better" else "lower"
        sample = _SAMPLES[spec.sample]
        if spec.quantile is not None:
            sample = f"p{round(spec.quantile * 100)} of {_code(spec.base)}'s samples in a boot"
        elif spec.boot_phase is not None:
            sample = f"{sample}: its {spec.boot_phase} phase"
        rows.append([_code(spec.name), spec.label, spec.unit, better, f"{spec.default_tolerance:.0%}", sample,
                     _code(spec.bench_serve_name) if spec.bench_serve_name else ""])
    lines += _table(["metric", "what it is", "unit", "better", "default tolerance", "one sample",
                     "vLLM `bench serve` name"], rows)
    lines += ["A boot is summarized by the median of its samples (a tail metric: by its quantile); a verdict "
              "compares boots. The `bench serve` name is the field (or the `median_`/`p99_` prefix's stem) "
              "that vLLM's `bench serve` result uses for the same figure.", ""]
    return "\n".join(lines).rstrip() + "\n"


# -- Python API -----------------------------------------------------------------------------------


class _Annotation:
    """An annotation kept as the text the code wrote (``from __future__ import annotations``)."""

    def __init__(self, text: object) -> None:
        self.text = text if isinstance(text, str) else inspect.formatannotation(text)

    def __repr__(self) -> str:
        return str(self.text)


def _signature(obj: Callable[..., Any], width: int = 100) -> str:
    """``(a: int, *, b: str = 'x') -> T``, one parameter a line where it is wider than ``width``."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = [p.replace(annotation=_Annotation(p.annotation)) if p.annotation is not p.empty else p
              for p in sig.parameters.values()]
    ret = sig.return_annotation
    sig = sig.replace(parameters=params, return_annotation=sig.empty if ret is sig.empty else _Annotation(ret))
    text = str(sig)
    if len(text) <= width:
        return text
    head, _, tail = text.rpartition(")")
    parts = [str(p) for p in sig.parameters.values()]
    star = next((i for i, p in enumerate(sig.parameters.values()) if p.kind is p.KEYWORD_ONLY), None)
    if star is not None and not any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        parts.insert(star, "*")
    return "(\n" + "".join(f"    {part},\n" for part in parts) + ")" + tail


def _members(cls: type) -> list[str]:
    lines = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            lines.append(f"- `{name}` (property): {_first_paragraph(member)}")
        elif inspect.isfunction(member):
            lines.append(f"- `{name}{_signature(member)}`: {_first_paragraph(member)}")
    return [*lines, ""] if lines else []


def _entry(name: str, obj: Any) -> list[str]:
    if inspect.isclass(obj) and issubclass(obj, Warning):
        bases = ", ".join(b.__name__ for b in obj.__bases__)
        return [f"### {name}", "", "```python", f"class {name}({bases})", "```", "", _first_paragraph(obj), ""]
    prefix = "class " if inspect.isclass(obj) else ""
    lines = [f"### {name}", "", "```python", f"{prefix}{name}{_signature(obj)}", "```", "", _first_paragraph(obj), ""]
    return lines + (_members(obj) if inspect.isclass(obj) else [])


def _decorated(path: Path, decorator: str) -> list[tuple[str, str | None]]:
    """(name, scope) of each function in ``path`` under ``@<decorator>`` (called or not)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            if ast.unparse(target) == decorator:
                scope = next((str(kw.value.value) for kw in getattr(deco, "keywords", ())
                              if kw.arg == "scope" and isinstance(kw.value, ast.Constant)), None)
                found.append((node.name, scope))
    return found


def _markers(path: Path) -> list[str]:
    """The marker lines ``plugin.py`` registers with ``addinivalue_line("markers", ...)``."""
    return [str(call.args[1].value) for call in ast.walk(ast.parse(path.read_text()))
            if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("addinivalue_line")
            and len(call.args) == 2 and isinstance(call.args[1], ast.Constant)
            and getattr(call.args[0], "value", None) == "markers"]


def _api_page() -> str:
    """docs/reference/api.md: the public names, the fixtures, the markers and the hooks."""
    from pytest_kimiperf import hooks, hookspec

    lines = _generated("Python API", "What a perf test or a conftest may use: the names `pytest_kimiperf` "
                       "exports, the fixtures, the marker and the hooks.")
    lines += ["## Fixtures", ""]
    for name, scope in _decorated(PACKAGE / "hooks.py", "pytest.fixture"):
        func = getattr(hooks, name)
        lines += [f"### {name}", "", "```python", f"{name}{_signature(func)}", "```", "",
                  f"Scope: {scope or 'function'}. {_first_paragraph(func)}", ""]
    lines += ["## Markers", ""]
    lines += [f"- `@pytest.mark.{usage})`: {text}" for usage, _, text in
              (m.partition("): ") for m in _markers(PACKAGE / "plugin.py"))]
    lines += ["", "## Names exported by `pytest_kimiperf`", ""]
    for name, home in sorted(PUBLIC_NAMES.items()):
        lines += _entry(name, getattr(importlib.import_module(f"pytest_kimiperf.{home}"), name))
    lines += ["## Hooks", "", "Implement these in a `conftest.py` or a plugin.", ""]
    for name, _ in _decorated(PACKAGE / "hookspec.py", "pytest.hookspec"):
        func = getattr(hookspec, name)
        lines += [f"### {name}", "", "```python", f"def {name}{_signature(func)}", "```", "",
                  _first_paragraph(func), ""]
    return "\n".join(lines).rstrip() + "\n"


def compare_page() -> str:
    """compare.md, from `kimiperf compare`'s parser itself."""
    lines = [*_generated("kimiperf compare", "`kimiperf compare` (also `python -m pytest_kimiperf compare`) judges "
                         "groups of result files with the plugin's rules; the how-to is [Judge result files you "
                         "already have](../how-to/compare.md)."), "## Options", "",
             "| option | what it does |", "| :-- | :-- |"]
    for action in compare_parser()._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "--help" in action.option_strings:
            continue
        flag = action.option_strings[0] + (f" {action.metavar}" if action.metavar else "")
        if action.nargs == "+":
            flag += " ..."
        help_text = (action.help or "").replace("%%", "%").replace("|", "\\|")
        lines.append(f"| `{flag}` | {help_text} |")
    lines += ["", "## Exit status", "", "| status | when |", "| :-- | :-- |",
              f"| {PASSED_EXIT} | passed: no regression, nothing these files cannot convict |",
              f"| {REGRESSION_EXIT} | a regression; a run whose failed requests exceed the gate's share; with "
              "`--strict`, a change beyond the tolerance left inconclusive |",
              f"| {UNRESOLVED_EXIT} | the only findings are changes beyond the tolerance that one boot a side (or one "
              "live server, `--same-server`) cannot convict |",
              f"| {USAGE_EXIT} | a file or an option this cannot use (the message names the file and the field) |"]
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "options.md": _options_page, "deployment.md": _deployment_page, "metrics.md": _metrics_page, "api.md": _api_page,
    "compare.md": compare_page,
}


def _stale_pages(out_dir: Path) -> list[str]:
    """The pages in ``out_dir`` that differ from what the code says now (or are missing)."""
    stale = []
    for name, render in PAGES.items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != render():
            stale.append(str(path))
    return stale


def _write_pages(out_dir: Path) -> list[Path]:
    """Write every page into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, render in PAGES.items():
        (out_dir / name).write_text(render(), encoding="utf-8")
        written.append(out_dir / name)
    return written


def main(argv: list[str] | None = None) -> int:
    """Write the reference pages, or with ``--check`` say which are stale (exit 1)."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming the stale pages")
    parser.add_argument("out_dir", nargs="?", type=Path, default=_DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.check:
        stale = _stale_pages(args.out_dir)
        for path in stale:
            print(f"{path} is stale: run `{COMMAND}` to regenerate it", file=sys.stderr)
        return 1 if stale else 0
    for written in _write_pages(args.out_dir):
        print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
