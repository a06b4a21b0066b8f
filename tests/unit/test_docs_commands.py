"""The commands and paths the hand-written pages show are ones the code has: every `--kimiperf-*`
option exists, options are spelled one way (the full name), every `python -m` module and `make`
target exists, and every path is in the repository or is one the code writes to (the drift this
catches: a page that put launch records in `.kimiperf/` while the code used the user cache)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from pytest_kimiperf import paths
from pytest_kimiperf.compare.cli import parser as compare_parser
from pytest_kimiperf.config.options import OPTIONS
from scripts import reference

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "reference" / name for name in reference.PAGES}
PAGES = sorted([ROOT / "README.md", ROOT / "baselines" / "README.md", ROOT / "ci" / "README.md",
                *(p for p in DOCS.rglob("*.md") if p not in GENERATED)])

FLAGS = {opt.flag for opt in OPTIONS}
ALIASES = {opt.short for opt in OPTIONS if opt.short}
# `kimiperf compare` is a command of its own (no pytest): its pages' options are its parser's.
COMPARE_FLAGS = {flag for action in compare_parser()._actions for flag in action.option_strings}
COMPARE_PAGES = {DOCS / "how-to" / "compare.md"}
MAKE_TARGETS = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))

# What the code writes outside the repository, named from the code itself.
CACHE = "~/.cache/" + paths.default_cache_dir().name
CACHE_FOLDERS = {paths.launch_state_dir(Path("x")).name,
                 *(Path(v).name for v in paths.compile_cache_env(Path("x")).values()), "models"}
RUNTIME_DIRS = {"baselines", "perf-results"}  # settings.py's default baselines_dir; the Makefile's PERF_OUT
REPO_ROOTS = ("perf_tests", "ci", "docs", "pytest_kimiperf", "benchmarks", "tests", "scripts", ".github")

CODE = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.S)
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
MODULE = re.compile(r"python -m (pytest_kimiperf[\w.]*)")
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
PATH = re.compile(r"(?<![\w/.$<-])((?:~/\.cache/|\.)?[\w.-]+/[\w./<>*{}-]*)")


def code_of(page: Path) -> list[str]:
    """The code a page shows: fenced blocks and inline spans."""
    return [block or span for block, span in CODE.findall(page.read_text(encoding="utf-8"))]


def _problems(page: Path) -> list[str]:
    found = []
    for code in code_of(page):
        if "kimiperf compare" in code or "pytest_kimiperf compare" in code:
            found += [f"{option}: no such kimiperf compare option" for option in OPTION.findall(code)
                      if option not in COMPARE_FLAGS]
            continue
        for option in OPTION.findall(code):
            if option.startswith("--kimiperf-") and option not in FLAGS:
                found.append(f"{option}: no such option")
            if option in ALIASES and not (page in COMPARE_PAGES and option in COMPARE_FLAGS):
                found.append(f"{option}: the short alias; the docs spell options --kimiperf-*")
        for module in MODULE.findall(code):
            if importlib.util.find_spec(module.rstrip(".")) is None:
                found.append(f"python -m {module}: no such module")
        for target in MAKE.findall(code):
            if target not in MAKE_TARGETS:
                found.append(f"make {target}: no such Makefile target")
        for path in PATH.findall(code):
            problem = _path_problem(path.rstrip(".,:;)"))
            if problem:
                found.append(problem)
    return found


def _path_problem(path: str) -> str | None:
    if path.startswith(("http", "//")) or "://" in path:
        return None
    if path.startswith("~/.cache/"):
        if not path.startswith(CACHE):
            return f"{path}: the plugin's cache is {CACHE}"
        rest = path[len(CACHE):].strip("/").split("/")[0]
        return None if not rest or rest in CACHE_FOLDERS else f"{path}: the code keeps no {rest!r} in its cache"
    head = path.split("/")[0]
    if head.startswith(".kimiperf"):
        return f"{path}: the code keeps nothing in .kimiperf/ (it uses {CACHE})"
    if head in RUNTIME_DIRS or head.startswith(("<", "$", "{")):
        return None
    if head in REPO_ROOTS:
        fixed = re.split(r"[<*{]", path)[0]  # up to the first placeholder
        return None if (ROOT / fixed).exists() or (ROOT / fixed).parent.is_dir() and not fixed.endswith("/") and \
            _has_prefix(ROOT / fixed) else f"{path}: not in the repository"
    return None


def _has_prefix(path: Path) -> bool:
    """A path cut at a placeholder (`ci/gpu-*`): some file in its folder starts with its name."""
    return any(p.name.startswith(path.name) for p in path.parent.iterdir())


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_commands_and_paths_are_the_codes(page: Path) -> None:
    assert _problems(page) == []


def test_the_check_catches_a_wrong_option_an_alias_and_a_path_the_code_does_not_use(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```bash\npytest --kimiperf-bootz 2 --deployment x\nmake perff\n```\n"
                    "Launch records live in `.kimiperf/launches` and `ci/no-such-file.sh`; "
                    "`python -m pytest_kimiperf.nope`; `~/.cache/pytest-kimiperf/weights`.\n")
    problems = _problems(page)
    assert problems == [
        "--kimiperf-bootz: no such option",
        "--deployment: the short alias; the docs spell options --kimiperf-*",
        "make perff: no such Makefile target",
        f".kimiperf/launches: the code keeps nothing in .kimiperf/ (it uses {CACHE})",
        "ci/no-such-file.sh: not in the repository",
        "python -m pytest_kimiperf.nope: no such module",
        "~/.cache/pytest-kimiperf/weights: the code keeps no 'weights' in its cache",
    ], problems


def test_a_kimiperf_compare_command_is_checked_against_its_own_options(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```bash\nkimiperf compare --a x --b y --deployment tiny-cpu --same-servers\n```\n")
    assert _problems(page) == ["--same-servers: no such kimiperf compare option"]
