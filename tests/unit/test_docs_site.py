"""The docs site builds strictly: no broken link or anchor, no page left out of the nav.

mkdocs.yml makes each of those a warning and ``strict: true`` makes a warning fail the build;
this test fails on either, so ``make test`` catches what the site's CI job would.
"""

from __future__ import annotations

import importlib.util
import os
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
