"""Messages name options by their full ``--kimiperf-*`` name. A short alias (``--deployment``) or
an old bare spelling is registered only where no conftest of the user's took the name first, so
an error that tells a user to pass ``--deployment`` may send them to their own option."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pytest_kimiperf.config.options import OPTIONS, OWN_PREFIX

PACKAGE = Path(__file__).resolve().parents[2] / "pytest_kimiperf"
# Every spelling that is not an option's own flag: the short aliases, the old bare flags and the
# old prefixed ones (--kimiperf-nccl-profile, now --kimiperf-profile).
OTHER_SPELLINGS = {s for opt in OPTIONS for s in (opt.short, *opt.deprecated) if s}
SPELLING = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, OTHER_SPELLINGS), key=len, reverse=True))
                      + r")(?![\w-])")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes: they document the code for its readers, not users."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spellings_in_messages(source: str) -> list[str]:
    """``line: spelling`` for each alias or old spelling in a string the code may show a user.

    A string that is exactly a spelling is where the option table defines it, not a message."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value in OTHER_SPELLINGS:
                continue
            found += [(node.lineno, node.col_offset, m.start(), m.group()) for m in SPELLING.finditer(node.value)]
    return [f"{line}: {spelling}" for line, _, _, spelling in sorted(found)]


def test_the_spellings_checked_include_the_aliases_and_old_flags() -> None:
    assert {"--deployment", "--nccl-profile", "--update-baselines", "--perf-json",
            "--kimiperf-nccl-profile"} <= OTHER_SPELLINGS
    assert not any(opt.flag in OTHER_SPELLINGS for opt in OPTIONS)
    assert all(s.startswith("--") for s in OTHER_SPELLINGS) and OWN_PREFIX == "--kimiperf-"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_message_names_the_full_option(path: Path) -> None:
    assert spellings_in_messages(path.read_text(encoding="utf-8")) == []


def test_the_check_finds_an_alias_in_a_message_and_not_in_a_definition_or_docstring() -> None:
    source = '''
"""Selected by ``--nccl-profile``."""
SHORT = "--deployment"
def boot(name):
    """Run with --update-baselines."""
    raise ValueError(f"no deployment {name}: run with --deployment tiny-cpu")
HINT = "record with --update-baselines --kimiperf-boots 3, or --kimiperf-nccl-profile x"
FULL = "run with --kimiperf-deployment tiny-cpu --kimiperf-update-baselines"
'''
    assert spellings_in_messages(source) == [
        "6: --deployment", "7: --update-baselines", "7: --kimiperf-nccl-profile"]
