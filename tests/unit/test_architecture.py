"""The package's layers, as docs/architecture.md draws them, hold in the code.

Each module may import only from its own layer or lower ones (lazy imports inside functions and
TYPE_CHECKING imports count: they are dependencies all the same), only the pytest glue imports
pytest, and no module grows past the size a reader can hold.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "pytest_kimiperf"

# Lowest first. A module's layer is its subpackage, or its own name at the top level.
LAYERS: dict[str, int] = {
    "errors": 0, "paths": 0, "files": 0, "numbers": 0, "warning_types": 0, "hookspec": 0,
    "config": 1,
    "server": 2,
    "measure": 3,
    "judge": 4,
    "roofline": 5,
    "reports": 6,
    "session": 7, "recorder": 7, "xdist_scheduling": 7, "fixtures": 7, "plugin": 7, "node_agent": 7,
}
PYTEST_GLUE = {"plugin", "fixtures", "hookspec", "warning_types", "xdist_scheduling"}
MAX_LINES = 470


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def _unit(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "pytest_kimiperf":
                found += [(node.lineno, f"pytest_kimiperf.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_every_module_belongs_to_a_layer() -> None:
    assert {_unit(p) for p in _modules()} <= set(LAYERS)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_its_own_layer_or_lower_ones(path: Path) -> None:
    own = LAYERS[_unit(path)]
    upward = []
    for line, module in _imports(path):
        if module.startswith("pytest_kimiperf."):
            target = module.split(".")[1]
            if LAYERS.get(target, 0) > own:
                upward.append(f"line {line}: {module} (layer {LAYERS[target]} > {own})")
        if module.split(".")[0] in {"pytest", "_pytest"} and _unit(path) not in PYTEST_GLUE:
            upward.append(f"line {line}: imports {module}, but only the pytest glue may")
    assert not upward, upward


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_stays_small_enough_to_read_whole(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_layer_rule_catches_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "pytest_kimiperf" / "config"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("def f():\n    from pytest_kimiperf.reports import model\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path / "pytest_kimiperf")
    with pytest.raises(AssertionError, match="pytest_kimiperf.reports"):
        test_a_module_imports_only_its_own_layer_or_lower_ones(fake / "bad.py")
