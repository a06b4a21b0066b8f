"""A profile's server arguments through pytest: checked before any boot, merged into the booted
server's command, and said in the header and the JSON report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import stub_deployment_toml

ARGS_SEEN = """
import psutil

def test_the_server_runs_the_profiles_arguments(kimiperf_server, kimiperf_profile):
    argv = psutil.Process(kimiperf_server.pid).cmdline()
    expected = "0.05" if kimiperf_profile.name == "quick-load" else "0.4"
    assert argv[argv.index("--load-seconds") + 1] == expected and argv.count("--load-seconds") == 1, argv
"""


def test_a_misspelled_argument_is_a_usage_error_naming_the_closest_before_any_boot(
    pytester: pytest.Pytester,
) -> None:
    pytester.makefile(".toml", pyproject='[tool.kimiperf.profiles.eager]\nargs = ["--enforce-eagr"]\n')
    pytester.makepyfile("def test_decode(kimiperf_server):\n    raise AssertionError('booted')\n")
    result = pytester.runpytest_subprocess("--deployment", "tiny-cpu", "--kimiperf-profile", "eager", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*pytest-kimiperf: profile 'eager' (from *pyproject.toml [[]tool.kimiperf.profiles.eager[]]) args: "
        "'--enforce-eagr' is not an argument of vLLM 0.32.0's serve parser (did you mean '--enforce-eager'?)*"])
    assert "booted" not in result.stdout.str()


def test_a_hook_profiles_argument_replaces_the_deployments_and_the_reports_say_so(
    pytester: pytest.Pytester, tmp_path: Path,
) -> None:
    pytester.makefile(".toml", pyproject=stub_deployment_toml())
    pytester.makeconftest("""
        def pytest_kimiperf_add_profiles(config):
            return {"quick-load": {"args": ["--load-seconds", "0.05"]}}
    """)
    pytester.makepyfile(test_args=ARGS_SEEN)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-profile", "default,quick-load", "--kimiperf-boots", "1",
                                           "--kimiperf-json", str(report), timeout=120)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "kimiperf: profile quick-load: args --load-seconds 0.05 (not checked: the deployment's command is not "
        "vLLM's server); replaces the deployment's --load-seconds 0.4 -> --load-seconds 0.05",
        "kimiperf: profile quick-load replaces the deployment's --load-seconds 0.4 -> --load-seconds 0.05",
    ])
    profiles = json.loads(report.read_text())["profiles"]
    assert profiles["quick-load"]["profile_args"] == ["--load-seconds", "0.05"]
    assert profiles["quick-load"]["replaced_args"] == ["--load-seconds 0.4 -> --load-seconds 0.05"]
    assert profiles["default"]["replaced_args"] == []
