"""Every place that branches over verdict kinds names each one, so a kind one of them forgets
fails the type check (``make test`` runs mypy; typing.assert_never closes each match).

The check is shown on the real modules: mypy reads a copy with one arm deleted in place of the
module (``--shadow-file``) and must name the kind that arm handled.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

mypy_api = pytest.importorskip("mypy.api", reason="mypy comes with the dev extra")

# (module, the arm deleted from it, the kind mypy must then name)
FORGOTTEN = [
    ("pytest_kimiperf/judge/gate.py",
     "        case VerdictKind.INSUFFICIENT_SAMPLES:\n            result.warn(WarningKind.OTHER, VerdictNote(comparison))\n",
     "INSUFFICIENT_SAMPLES"),
    ("pytest_kimiperf/reports/sentences.py",
     "            case VerdictKind.NOT_COMPARABLE:\n"
     "                body = f\"not comparable to the baseline ({change}, {ci}; reported only\"\n",
     "NOT_COMPARABLE"),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One mypy cache for the module's runs, this process's own (xdist workers do not share it).

    It starts as a copy of the project's cache where there is one (`make test` runs mypy on the
    whole package just before pytest, with the same configuration): mypy then checks only the
    module it is handed, in a second, instead of every module it imports, 25-45 s cold on a
    2-core host. mypy checks each cached module's source hash, so a stale copy costs time, never
    a wrong answer. Removed after the module's runs (it is ~200 MB).
    """
    cache = tmp_path_factory.mktemp("mypy-cache")
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", cache, dirs_exist_ok=True)
    yield cache
    shutil.rmtree(cache, ignore_errors=True)


def _mypy(module: str, shadow: Path, cache: Path) -> tuple[str, int]:
    out, err, status = mypy_api.run([
        "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
        "--shadow-file", str(ROOT / module), str(shadow), str(ROOT / module),
    ])
    return out + err, status


@pytest.mark.parametrize(("module", "arm", "kind"), FORGOTTEN, ids=[m for m, _, _ in FORGOTTEN])
def test_a_verdict_kind_a_branch_forgets_fails_the_type_check(module: str, arm: str, kind: str,
                                                               tmp_path: Path, cache: Path) -> None:
    source = (ROOT / module).read_text()
    assert source.count(arm) == 1, f"{module} no longer has the arm this test deletes"
    whole = tmp_path / "whole.py"
    whole.write_text(source)
    said, status = _mypy(module, whole, cache)
    assert status == 0, said
    forgetful = tmp_path / "forgetful.py"
    forgetful.write_text(source.replace(arm, ""))
    said, status = _mypy(module, forgetful, cache)
    assert status == 1, said
    assert '"assert_never"' in said and f"VerdictKind.{kind}" in said, said


# Where a new verdict kind must be placed: its leaning beside the enum (every word and colour that
# only tells worse from better follows from it), what the gate does with it, and its sentence.
BRANCHING_ON_KINDS = {"pytest_kimiperf/judge/stats.py", "pytest_kimiperf/judge/gate.py",
                      "pytest_kimiperf/reports/sentences.py"}


def _matches_on_kinds(path: Path) -> bool:
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.match_case):
            for sub in ast.walk(node.pattern):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "VerdictKind":
                    return True
    return False


def test_a_new_verdict_kind_is_placed_in_three_files() -> None:
    branching = {str(p.relative_to(ROOT)) for p in (ROOT / "pytest_kimiperf").rglob("*.py") if _matches_on_kinds(p)}
    assert branching == BRANCHING_ON_KINDS
