"""Git facts of the checkout a run records from: the commit a baseline's boots were measured at,
and the branch --kimiperf-append-on-pass appends on. Read once at session end, where the
baselines are written; never by the judge.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping


def current_git_commit(repo_dir: str | os.PathLike[str]) -> str | None:
    """The HEAD commit of the git checkout at ``repo_dir``, or None (no git, not a checkout)."""
    try:
        proc = subprocess.run(["git", "-C", os.fspath(repo_dir), "rev-parse", "--verify", "-q", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    commit = proc.stdout.strip()
    if proc.returncode != 0 or len(commit) not in (40, 64):
        return None
    return commit


def current_git_branch(repo_dir: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> str | None:
    """The branch this run builds: the CI system's own (GitHub Actions' ``GITHUB_REF_NAME``, which
    is ``<n>/merge`` for a pull request; GitLab's ``CI_COMMIT_BRANCH``, unset in a merge request
    pipeline; Buildkite's ``BUILDKITE_BRANCH``), else the checkout's (None when detached or not
    a checkout)."""
    env = os.environ if environ is None else environ
    if env.get("GITHUB_ACTIONS") == "true":
        return env.get("GITHUB_REF_NAME") or None
    if env.get("GITLAB_CI") == "true":
        return env.get("CI_COMMIT_BRANCH") or None
    if env.get("BUILDKITE") == "true":
        return env.get("BUILDKITE_BRANCH") or None
    try:
        proc = subprocess.run(["git", "-C", os.fspath(repo_dir), "symbolic-ref", "--short", "-q", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    branch = proc.stdout.strip() if proc.returncode == 0 else ""
    return branch or None
