"""The docs site builds strictly: no broken link or anchor, no page left out of the nav.

mkdocs.yml makes each of those a warning and ``strict: true`` makes a warning fail the build;
this test fails on either, so ``make test`` catches what the site's CI job would.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT


def test_the_docs_site_builds_strictly_without_a_warning(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs or mkdocs-material is not installed: both come with the dev extra (pip install -e '.[dev]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    warnings = [line for line in output.splitlines() if line.lstrip().startswith(("WARNING", "ERROR"))]
    assert result.returncode == 0 and not warnings, output
    assert (tmp_path / "site" / "reference" / "options" / "index.html").is_file()


OUTSIDE_THE_SITE = ["README.md", "ci/README.md", "benchmarks/README.md"]


@pytest.mark.parametrize("name", OUTSIDE_THE_SITE)
def test_a_readme_outside_the_site_links_only_to_files_that_exist(name: str) -> None:
    page = ROOT / name
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a web address or an anchor of the page itself
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{name} links to missing files: {broken}"
