"""The package as a user gets it: one version, a licence, a changelog entry for that version,
metadata a package index shows, and ``python -m build`` making both a wheel and an sdist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest_kimiperf

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_version_lives_in_one_place() -> None:
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    build_version = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]["version"]
    assert build_version == {"attr": "pytest_kimiperf.version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", pytest_kimiperf.__version__)


def test_the_changelog_has_an_entry_for_the_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{pytest_kimiperf.__version__}]" in changelog
    assert "## [Unreleased]" in changelog


def test_the_license_file_is_the_licence_pyproject_names() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def _ci_python_versions() -> set[str]:
    workflows = (ROOT / ".github" / "workflows").glob("*.yml")
    return {v for wf in workflows for v in re.findall(r'python-version: "(3\.\d+)"', wf.read_text())}


def test_the_index_page_says_only_what_holds() -> None:
    # Authors without an address that takes no mail; the Python versions CI runs, from
    # requires-python's floor. (No project.urls until the repository has a public address.)
    assert PROJECT["authors"] and not any(a.get("email", "").endswith(".example") for a in PROJECT["authors"])
    assert "Framework :: Pytest" in PROJECT["classifiers"]
    versions = {c.rsplit(" ", 1)[-1] for c in PROJECT["classifiers"] if c.startswith("Programming Language :: Python :: 3.")}
    assert versions == _ci_python_versions() and "3.11" in versions


def test_build_makes_a_wheel_and_an_sdist_with_the_version(tmp_path: Path) -> None:
    # Built from a copy, so the checkout gains no build/ or egg-info.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "pytest_kimiperf", source / "pytest_kimiperf", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "perf_tests", source / "perf_tests", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    version = pytest_kimiperf.__version__
    wheel = tmp_path / "dist" / f"pytest_kimiperf-{version}-py3-none-any.whl"
    sdist = tmp_path / "dist" / f"pytest_kimiperf-{version}.tar.gz"
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        metadata = whl.read(f"pytest_kimiperf-{version}.dist-info/METADATA").decode()
    assert "pytest_kimiperf/plugin.py" in names and "pytest_kimiperf/py.typed" in names
    assert f"pytest_kimiperf-{version}.dist-info/licenses/LICENSE" in names
    assert f"Version: {version}" in metadata and "License-Expression: Apache-2.0" in metadata
    assert "Classifier: Framework :: Pytest" in metadata and "Author: pytest-kimiperf maintainers" in metadata
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "perf_tests/test_decode.py", "pytest_kimiperf/plugin.py"} <= members


def test_the_shipped_perf_suite_uses_only_the_public_api() -> None:
    # Users copy perf_tests/ as a template: what it imports is what they learn to import.
    for path in sorted((ROOT / "perf_tests").glob("*.py")):
        for line in path.read_text().splitlines():
            found = re.match(r"\s*(?:from|import)\s+(pytest_kimiperf[\w.]*)", line)
            assert found is None or found.group(1) == "pytest_kimiperf", f"{path.name}: {line.strip()}"


INSTALL_PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "quickstart.md"]


def _install_lines() -> list[str]:
    return [line for page in INSTALL_PAGES for line in re.findall(r"pip install [^\n`]*", page.read_text())]


def test_the_install_lines_name_extras_pins_and_a_wheel_the_project_has() -> None:
    # What a user without a clone types: each extra exists, each pin is the one CI installs
    # (ci/setup-venv.sh for the CPU engine, ci/gpu-constraints.txt for the GPU one), and the
    # wheel's file name is the one `python -m build` makes of this version.
    extras = set(PROJECT["optional-dependencies"])
    torch_pin = re.search(r'TORCH="(torch==[^"]+)"', (ROOT / "ci" / "setup-venv.sh").read_text()).group(1)
    gpu_pins = set(re.findall(r"^([\w-]+==\S+)$", (ROOT / "ci" / "gpu-constraints.txt").read_text(), re.M))
    lines = _install_lines()
    assert any("[cpu,plots]" in line for line in lines) and any("[gpu,plots]" in line for line in lines)
    for line in lines:
        for named in re.findall(r"(?:pytest-kimiperf|\.whl)\[([\w,]+)\]", line):
            assert set(named.split(",")) <= extras, line
        for wheel in re.findall(r"pytest_kimiperf-[^'\[]+\.whl", line):
            assert wheel == f"pytest_kimiperf-{pytest_kimiperf.__version__}-py3-none-any.whl", line
        for pin in re.findall(r"'((?:torch|vllm|nvidia-ml-py)==[^']+)'", line):
            assert pin == torch_pin if pin.startswith("torch") else pin in gpu_pins, line
