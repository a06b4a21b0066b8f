"""The package's layers, as docs/explanation/architecture.md draws them, hold in the code.

Each module may import only from its own layer or lower ones (lazy imports inside functions and
TYPE_CHECKING imports count: they are dependencies all the same); the package root is the top,
which may import anything and which nothing inside the package imports; an import of a module the
package lacks is a fault, not a guess. Only the pytest glue imports pytest, no module grows past
one concept's size, no modules import each other (the package's, and ci/'s among themselves),
the judge touches no file, process, socket, environment or terminal, and no module outside
reports/ writes a sentence (defines a ``say_*``).

The checks are functions of an import graph or of the parsed code, so the tests show each one
failing on a small made-up package that holds the fault.
"""

from __future__ import annotations

import ast
from collections import Counter, deque
import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "pytest_kimiperf"
TOP = PACKAGE.name

# Lowest first. A module's layer is its subpackage, or its own name at the top level.
LAYERS: dict[str, int] = {
    "errors": 0, "paths": 0, "files": 0, "numbers": 0, "warning_types": 0, "hookspec": 0,
    # Leaves that any layer may read without importing the root: the version and the export table.
    "version": 0, "public_names": 0,
    "config": 1,
    "server": 2,
    "measure": 3,
    "judge": 4,
    # Loads, saves and merges what the judge judges against (the baseline files): above the
    # judge, whose value types it builds, and below everything that asks it for them.
    "storage": 5,
    "roofline": 6,
    "reports": 7,
    "session": 8, "recorder": 8, "hooks": 8, "xdist_scheduling": 8, "plugin": 8, "node_agent": 8,
    "merge_driver": 8, "history_steps": 8,
    # `kimiperf compare` (python -m pytest_kimiperf compare): reads other tools' files, judges, renders.
    "compare": 8, "__main__": 8,
}
# The root names every layer (its lazy export table, read by type checkers through TYPE_CHECKING
# imports), so it stands above them all: a module that imports it imports every layer.
ROOT_LAYER = max(LAYERS.values()) + 1
# The repository around the package: it uses the package, never the other way round.
ABOVE_THE_PACKAGE = {"ci", "tests", "benchmarks", "perf_tests", "scripts", "conftest"}
PYTEST_GLUE = {"plugin", "hooks", "hookspec", "warning_types", "xdist_scheduling"}
# Modules are split by concept (one module, one thing a reader looks for), not to stay under a
# line count: splitting at 470 lines gave three terminal* and five host* modules. This bound is
# only the point at which a module has surely grown two concepts.
MAX_LINES = 1000

Graph = dict[str, list[tuple[int, str]]]
"""A module's dotted name -> each import it makes, as (line, the module it names), lazy and
TYPE_CHECKING ones too. ``from M import n`` names ``M.n`` where that is a module, else ``M``."""


def read_graph(folder: Path) -> Graph:
    """The import graph of every module under ``folder`` (its ``__init__`` included), each named
    as Python names it with ``folder``'s parent on the path."""
    names = {path: ".".join(path.relative_to(folder.parent).with_suffix("").parts).removesuffix(".__init__")
             for path in sorted(folder.rglob("*.py"))}
    known = set(names.values())
    graph: Graph = {}
    for path, name in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[tuple[int, str]] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {(node.lineno, alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up for each dot past the first
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found |= {(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base) for a in node.names}
        graph[name] = sorted(found)
    return graph


@cache
def _package_graph() -> Graph:
    return read_graph(PACKAGE)


def _layer(module: str) -> int | None:
    return ROOT_LAYER if module == TOP else LAYERS.get(module.split(".")[1])


def upward_imports(graph: Graph) -> list[str]:
    """Each import in a package's ``graph`` that runs up a layer, names the package root or the
    repository around the package, or names a module the package lacks; and each module in no layer."""
    faults = []
    for module, imports in sorted(graph.items()):
        own = _layer(module)
        if own is None:
            faults.append(f"{module}: in no layer")
            continue
        for line, target in imports:
            where = f"{module} line {line}"
            first = target.split(".")[0]
            if first in ABOVE_THE_PACKAGE:
                faults.append(f"{where}: imports {target}, from the repository around the package")
            elif first != TOP:
                continue
            elif target not in graph:
                faults.append(f"{where}: imports {target}, which is no module of the package")
            elif target == TOP and module != TOP:
                faults.append(f"{where}: imports the package root, which names every layer")
            elif (up := _layer(target)) is not None and up > own:
                faults.append(f"{where}: imports {target} (layer {up} > {own})")
    return faults


def pytest_outside_the_glue(graph: Graph) -> list[str]:
    """Each import of pytest in a package's ``graph`` by a module that is not the pytest glue."""
    return [f"{module} line {line}: imports {target}, but only the pytest glue may"
            for module, imports in sorted(graph.items()) if module == TOP or module.split(".")[1] not in PYTEST_GLUE
            for line, target in imports if target.split(".")[0] in {"pytest", "_pytest"}]


def circles(graph: Graph) -> list[str]:
    """Each import circle among ``graph``'s modules, as ``a -> b -> a``: the shortest way back
    from the first of its modules, once for each set of modules."""
    edges = {module: sorted({t for _, t in imports if t in graph and t != module}) for module, imports in graph.items()}
    found: dict[frozenset[str], str] = {}
    for start in sorted(edges):
        came_from: dict[str, str] = {}
        todo = deque([start])
        while todo:
            current = todo.popleft()
            if start in edges[current]:
                ring = [current]
                while ring[-1] != start:
                    ring.append(came_from[ring[-1]])
                found.setdefault(frozenset(ring), " -> ".join([*reversed(ring), start]))
                break
            for following in edges[current]:
                if following not in came_from:
                    came_from[following] = current
                    todo.append(following)
    return sorted(found.values())


def test_no_import_runs_up_a_layer_to_the_root_or_to_a_module_that_is_not_there() -> None:
    faults = upward_imports(_package_graph())
    assert not faults, "\n".join(faults)


def test_only_the_glue_imports_pytest() -> None:
    faults = pytest_outside_the_glue(_package_graph())
    assert not faults, "\n".join(faults)


def test_no_two_modules_import_each_other_even_through_others() -> None:
    found = circles(_package_graph())
    assert not found, "import circles:\n" + "\n".join(found)


def test_no_two_ci_modules_import_each_other_even_through_others() -> None:
    found = circles(read_graph(ROOT / "ci"))
    assert not found, "import circles:\n" + "\n".join(found)


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_stays_small_enough_to_read_whole(path: Path) -> None:
    assert len(path.read_text().splitlines()) <= MAX_LINES


# -- the module map -----------------------------------------------------------------------------

ARCHITECTURE_PAGE = ROOT / "docs" / "explanation" / "architecture.md"
MAP_ROW = re.compile(r"^\| `([\w/]+\.py)` \| (.*?) \|$", re.MULTILINE)


def map_rows(page: str) -> list[tuple[str, str]]:
    """(module path under the package, its line) for each row of the page's "Module map" section."""
    section = page.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0] if "\n## Module map\n" in page else ""
    return [(match.group(1), match.group(2).strip()) for match in MAP_ROW.finditer(section)]


def map_faults(rows: list[tuple[str, str]], modules: set[str]) -> list[str]:
    """Each module the map leaves out, names twice or gives no line, and each row naming no module."""
    named = Counter(path for path, _ in rows)
    return ([f"{m}: not on the module map" for m in sorted(modules - named.keys())]
            + [f"{p}: on the module map, but the package has no such module" for p in sorted(named.keys() - modules)]
            + [f"{p}: on the module map {n} times" for p, n in sorted(named.items()) if n > 1]
            + [f"{p}: on the module map without its line" for p, line in rows if not line])


def package_modules(folder: Path) -> set[str]:
    """Every module of a package by its path inside it; a subpackage's ``__init__.py`` only marks it."""
    return {str(path.relative_to(folder)) for path in folder.rglob("*.py")
            if path.name != "__init__.py" or path.parent == folder}


def test_every_module_is_on_the_architecture_page_once_with_its_line() -> None:
    faults = map_faults(map_rows(ARCHITECTURE_PAGE.read_text()), package_modules(PACKAGE))
    assert not faults, "\n".join(faults)


def test_the_map_rule_names_a_module_left_out_a_stale_row_a_double_and_a_row_without_a_line(tmp_path: Path) -> None:
    for name in ("__init__.py", "judge/__init__.py", "judge/gate.py", "judge/stats.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    page = ("# Architecture\n\n## Module map\n\n| module | what |\n| --- | --- |\n| `__init__.py` | the exports |\n"
            "| `judge/gate.py` | the gate |\n| `judge/gate.py` | again |\n| `judge/old.py` | gone |\n"
            "| `judge/stats.py` |  |\n\n## Next\n\n| `judge/missing.py` | after the section: not read |\n")
    assert map_faults(map_rows(page), package_modules(tmp_path)) == [
        "judge/old.py: on the module map, but the package has no such module",
        "judge/gate.py: on the module map 2 times",
        "judge/stats.py: on the module map without its line",
    ]
    assert map_faults([], package_modules(tmp_path)) == [
        "__init__.py: not on the module map", "judge/gate.py: not on the module map", "judge/stats.py: not on the module map"]


def _fake(folder: Path, files: dict[str, str]) -> Graph:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return read_graph(folder)


def test_the_layer_rule_fails_on_an_upward_import_the_root_and_a_module_that_is_not_there(tmp_path: Path) -> None:
    graph = _fake(tmp_path / TOP, {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_kimiperf.reports.model import Row\n",
        "reports/model.py": "class Row: ...\n",
        "config/lazy.py": "def f():\n    from pytest_kimiperf.reports import model\n",
        "server/engine.py": "from pytest_kimiperf import __version__\nfrom pytest_kimiperf.nowhere import x\n",
        "server/relative.py": "from ..reports.model import Row\n",
        "errors.py": "import ci.gpu_lent\n",
        "stray.py": "",
    })
    assert upward_imports(graph) == [
        "pytest_kimiperf.config.lazy line 2: imports pytest_kimiperf.reports.model (layer 7 > 1)",
        "pytest_kimiperf.errors line 1: imports ci.gpu_lent, from the repository around the package",
        "pytest_kimiperf.server.engine line 1: imports the package root, which names every layer",
        "pytest_kimiperf.server.engine line 2: imports pytest_kimiperf.nowhere, which is no module of the package",
        "pytest_kimiperf.server.relative line 1: imports pytest_kimiperf.reports.model (layer 7 > 2)",
        "pytest_kimiperf.stray: in no layer",
    ]


def test_the_circle_rule_fails_on_a_circle_through_others_in_the_package_and_in_ci(tmp_path: Path) -> None:
    package = _fake(tmp_path / TOP, {
        "__init__.py": "",
        "config/a.py": "from pytest_kimiperf.config import b\n",
        "config/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pytest_kimiperf.config.c import C\n",
        "config/c.py": "class C: ...\ndef f():\n    from pytest_kimiperf.config import a\n",
        "config/d.py": "from pytest_kimiperf.config import a\n",
    })
    assert circles(package) == ["pytest_kimiperf.config.a -> pytest_kimiperf.config.b -> pytest_kimiperf.config.c"
                                " -> pytest_kimiperf.config.a"]
    ci = _fake(tmp_path / "ci", {"check.py": "from ci import steps\n", "steps.py": "from ci.check import save\n",
                                 "lent.py": "from ci import check\nimport pytest_kimiperf\n"})
    assert circles(ci) == ["ci.check -> ci.steps -> ci.check"]


def test_both_rules_fail_on_a_module_that_takes_the_version_from_the_root(tmp_path: Path) -> None:
    # The fault issue 67 found: the root names the engine for type checkers, the engine takes
    # the version from the root.
    graph = _fake(tmp_path / TOP, {
        "__init__.py": ("from typing import TYPE_CHECKING\n__version__ = '1'\n"
                        "if TYPE_CHECKING:\n    from pytest_kimiperf.server.engine import Engine as Engine\n"),
        "server/engine.py": "from pytest_kimiperf import __version__\nclass Engine: ...\n",
    })
    assert upward_imports(graph) == ["pytest_kimiperf.server.engine line 1: imports the package root, which names every layer"]
    assert circles(graph) == ["pytest_kimiperf -> pytest_kimiperf.server.engine -> pytest_kimiperf"]


# What starts a process or opens a connection: the probes' business (measure/host_facts.py,
# server/), never the judge's, which decides from the facts it is handed.
PROBING = {"subprocess", "socket", "ssl", "http", "urllib", "httpx", "httpcore", "multiprocessing", "asyncio",
           "psutil", "pynvml", "concurrent"}


def reaches(graph: Graph, start: str) -> dict[str, str]:
    """Every outside module ``start`` imports, itself or through the graph's modules it imports
    (lazy ones too): {module: the graph's module that imports it}."""
    seen: set[str] = set()
    found: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for _, target in graph[current]:
            if target in graph:
                todo.append(target)
            elif target.split(".")[0] != TOP:
                found.setdefault(target.split(".")[0], current)
    return found


@pytest.mark.parametrize("module", [m for m in _package_graph() if m.startswith(f"{TOP}.judge")])
def test_the_judge_reaches_nothing_that_starts_a_process_or_opens_a_socket(module: str) -> None:
    probing = {name: via for name, via in reaches(_package_graph(), module).items() if name in PROBING}
    assert not probing, f"{module} reaches {probing} (module: imported by)"


def test_the_probe_rule_sees_an_import_through_another_module(tmp_path: Path) -> None:
    graph = _fake(tmp_path / TOP, {"judge/bad.py": "from pytest_kimiperf.config import helper\n",
                                   "config/helper.py": "def f():\n    import subprocess\n"})
    assert reaches(graph, f"{TOP}.judge.bad") == {"subprocess": f"{TOP}.config.helper"}


# What the judge may not do itself: it decides from the values it is handed. storage/ reads and
# writes the files, measure/ probes the host and runs processes, the CLI and the plugin print.
# A module's ``if __name__ == "__main__":`` block is a command's edge (the planner's answer
# printed, the exit status of the merge driver's old command) and is not the judge's work.
NO_IO_MODULES = {"os", "subprocess", "socket", "filelock", "shutil", "tempfile", "glob", "io", "fcntl"}
NO_IO_CALLS = {"open", "print", "input", "exit", "quit", "breakpoint"}
SYS_IO = {"exit", "stdin", "stdout", "stderr", "argv"}
# Path methods that touch the file system; a Path as a value (a baseline file's name) is fine.
PATH_IO = {"read_text", "write_text", "read_bytes", "write_bytes", "open", "exists", "is_file", "is_dir", "glob",
           "rglob", "iterdir", "mkdir", "unlink", "rmdir", "touch", "lstat", "chmod", "rename", "resolve",
           "samefile", "expanduser", "cwd", "home"}


def _main_guard(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _io_uses(path: Path) -> list[str]:
    """Each file, process, socket, environment or terminal use in ``path``, as ``line N: what``."""
    tree = ast.parse(path.read_text())
    edge = {id(n) for stmt in tree.body if _main_guard(stmt) for n in ast.walk(stmt)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in edge:
            continue
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [(line, f"import {a.name}") for a in node.names if a.name.split(".")[0] in NO_IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            names = [a.name for a in node.names]
            if root in NO_IO_MODULES or (root == "sys" and SYS_IO & set(names)):
                found.append((line, f"from {node.module} import {', '.join(names)}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in NO_IO_CALLS:
            found.append((line, f"{node.func.id}()"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PATH_IO:
            found.append((line, f".{node.func.attr}()"))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys"
              and node.attr in SYS_IO):
            found.append((line, f"sys.{node.attr}"))
        elif isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(raised, ast.Name) and raised.id == "SystemExit":
                found.append((line, "raise SystemExit"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


@pytest.mark.parametrize("path", sorted((PACKAGE / "judge").glob("*.py")), ids=lambda p: p.name)
def test_the_judge_touches_no_file_process_socket_environment_or_terminal(path: Path) -> None:
    found = _io_uses(path)
    assert not found, f"{path.relative_to(PACKAGE)}: {found}"


def test_the_io_rule_names_the_module_the_line_and_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    judge = tmp_path / "pytest_kimiperf" / "judge"
    judge.mkdir(parents=True)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", tmp_path / "pytest_kimiperf")
    bad = judge / "bad.py"
    bad.write_text("import os\nimport sys\nfrom pathlib import Path\n\n\n"
                   "def f(p: Path) -> str:\n    print(os.environ)\n    sys.exit(1)\n    return p.read_text()\n\n\n"
                   "if __name__ == '__main__':\n    print(f(Path('x')))\n")
    with pytest.raises(AssertionError) as failed:
        test_the_judge_touches_no_file_process_socket_environment_or_terminal(bad)
    assert str(failed.value).splitlines()[0] == (
        "judge/bad.py: ['line 1: import os', 'line 7: print()', 'line 8: sys.exit', 'line 9: .read_text()']")


# Every word a user reads about a measurement or a verdict is written in reports/sentences.py:
# outside reports/ no function or method is named say_* (or say). The layers below it return
# facts (a typed reason, a count) and reports/ words them. What a part says as it works stays
# where it is said: an error raised to the user where it happens, a progress line handed to
# the status line (``announce``), a value's one-line ``describe()`` for logs.
WORDS_HOME = "reports"


def _says(name: str) -> bool:
    bare = name.lstrip("_")
    return bare == "say" or bare.startswith("say_")


def sentences_outside_reports(folder: Path) -> list[str]:
    """Each function or method named ``say_*`` in a module of the package ``folder`` outside its
    reports/, as ``module line N: name``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        if relative.parts[0] == WORDS_HOME:
            continue
        found += [f"{relative} line {node.lineno}: {node.name}" for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _says(node.name)]
    return found


def test_the_words_a_user_reads_are_written_in_reports() -> None:
    found = sentences_outside_reports(PACKAGE)
    assert not found, "sentences written outside reports/ (word the facts in reports/sentences.py):\n" + "\n".join(found)


def test_the_words_rule_finds_a_sentence_below_reports_and_leaves_errors_and_progress_lines(tmp_path: Path) -> None:
    _fake(tmp_path / TOP, {
        "measure/results.py": ("def say_run_invalid(reason):\n    return f'no valid request ({reason})'\n\n\n"
                               "def check(n):\n    if n < 0:\n        raise ValueError(f'{n} < 0')\n"),
        "server/manager.py": ("class Manager:\n    def _say_view(self):\n        async def say(line): ...\n\n"
                              "    def _announce_ready(self, boot_s):\n        self.announce(f'ready after {boot_s:.0f}s')\n\n"
                              "    def describe(self):\n        return 'pid 7'\n"),
        "reports/sentences.py": "def say_run_invalid(reason):\n    return 'no measured requests'\n",
        "recorder.py": "def essay_length(): ...\n",
    })
    assert sentences_outside_reports(tmp_path / TOP) == [
        "measure/results.py line 1: say_run_invalid",
        "server/manager.py line 2: _say_view",
        "server/manager.py line 3: say",
    ]
