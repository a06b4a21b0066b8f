"""The plugin at home in a user's repository: their own options, unit tests beside perf tests,
warnings they can escalate, pytest-timeout, and a gate that fails without a baseline."""

from __future__ import annotations

import re

import os
import stat
from pathlib import Path

import pytest

from tests.helpers import stub_deployment_toml
from tests import helpers

UNIT_AND_PERF = """
from pytest_kimiperf import SingleStream

def test_unit():
    assert 1 + 1 == 2

def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=4, output_tokens=8, requests=5))
    perf.check(run, ["decode_tok_s"])
"""


def _no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    tool = bindir / "nvidia-smi"
    tool.write_text("#!/bin/sh\nexit 9\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_a_user_conftest_may_add_port_grace_api_key_and_deployment_options(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        def pytest_addoption(parser):
            parser.addoption("--port", default="8080")
            parser.addoption("--grace", default="1")
            parser.addoption("--api-key", default="")
            parser.addoption("--deployment", default="prod")
            parser.addoption("--server-url", default="http://mine")
            parser.addini("port", "the user's own port")

        def pytest_report_header(config):
            return (f"user port {config.getoption('port')}, user deployment {config.getoption('deployment')}, "
                    f"user url {config.getoption('server_url')}")
    """)
    pytester.makepyfile("def test_ok(pytestconfig):\n    assert pytestconfig.getoption('port') == '9'\n")
    result = pytester.runpytest_subprocess("--port", "9", "--grace", "2", "--kimiperf-grace", "3",
                                           "--deployment", "staging", "--kimiperf-deployment", "tiny-cpu",
                                           "--server-url", "http://theirs", timeout=60)
    result.assert_outcomes(passed=1)
    # Their --deployment is theirs, and so is --server-url (an old spelling of ours): the plugin's
    # stay reachable under its prefix, and nothing warns of a deprecated spelling they never used.
    result.stdout.fnmatch_lines(["kimiperf: deployment tiny-cpu *",
                                 "user port 9, user deployment staging, user url http://theirs"])
    assert "deprecated" not in result.stdout.str()


def test_the_documented_short_flags_work_where_no_conftest_takes_them(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--deployment", "tiny-cpu", "--nccl-profile", "ring-ll", timeout=60)
    result.stdout.fnmatch_lines(["kimiperf: deployment tiny-cpu *", "kimiperf: profile ring-ll: *"])


def test_every_option_keeps_its_value_under_a_kimiperf_dest(pytester: pytest.Pytester) -> None:
    from pytest_kimiperf.config.options import OPTIONS

    assert all(opt.dest.startswith("kimiperf_") for opt in OPTIONS)
    assert all(opt.flag.startswith("--kimiperf-") for opt in OPTIONS)
    # One naming scheme: the ini twin is the flag's own name.
    assert all(opt.ini is None or opt.ini == opt.flag[2:].replace("-", "_") for opt in OPTIONS)
    assert {opt.short for opt in OPTIONS} - {None} == {"--deployment", "--nccl-profile", "--update-baselines"}
    spellings = [s for opt in OPTIONS for s in (opt.flag, opt.short, *opt.deprecated) if s]
    assert len(spellings) == len(set(spellings))


@pytest.mark.parametrize("args", [(), ("--collect-only",), ("-m", "not kimiperf")])
def test_without_the_gpus_unit_tests_still_run_and_no_run_exits_4(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    _no_gpus(tmp_path, monkeypatch)
    pytester.makepyfile(UNIT_AND_PERF)  # default deployment: Kimi at TP=8
    result = pytester.runpytest_subprocess(*args, timeout=60)
    assert result.ret != pytest.ExitCode.USAGE_ERROR, result.stderr.str()
    if not args:
        result.assert_outcomes(passed=1, errors=1)
        result.stdout.fnmatch_lines(["*ERROR at setup of test_decode*",
                                     "*needs 8x NVIDIA GPU*found no NVIDIA GPU*"])
    elif args[0] == "-m":
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines(["*1 passed, * deselected*"])
    assert "starting" not in result.stdout.str()


def test_perf_tests_carry_the_kimiperf_marker(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_unit_and_perf=UNIT_AND_PERF)
    result = pytester.runpytest_subprocess("--deployment", "stub", "-m", "kimiperf", "--co", "-q",
                                           "--kimiperf-max-boots", "1", timeout=60)
    assert [line for line in result.stdout.lines if "::" in line] == ["test_unit_and_perf.py::test_decode[default]"]


def test_a_missing_baseline_fails_the_gate_and_warns_at_a_terminal(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_gate=UNIT_AND_PERF)
    args = ("--deployment", "stub", "--kimiperf-max-boots", "1", "-p", "no:cacheprovider")
    result = pytester.runpytest_subprocess(*args, "--kimiperf-missing-baseline", "fail", timeout=120)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*missing baseline (--kimiperf-missing-baseline=fail): *no baseline for this hardware*"])
    # escalated, the session's one warning fails the run (no test is to blame for it)
    result = pytester.runpytest_subprocess(*args, "-W", "error::pytest_kimiperf.MissingBaselineWarning", timeout=120)
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*ERROR: MissingBaselineWarning (an error by -W or filterwarnings): kimiperf: "
                                 "no baseline for this hardware*"])
    result = pytester.runpytest_subprocess(*args, timeout=120)  # warn, the default: once for the session
    result.assert_outcomes(passed=2, warnings=1)
    # A few lines: what it covers and the command, with what recording accepts.
    result.stdout.fnmatch_lines([
        "*MissingBaselineWarning: kimiperf: no baseline for this hardware (*) for 1 metric of 1 test, judged "
        "against no history:",
        "    test_gate.py::test_decode [[]default[]]: decode",
        "    next: python -m pytest * --deployment stub --kimiperf-max-boots 1 -p no:cacheprovider "
        "--kimiperf-update-baselines (1 boot per profile, as this run) (it records this run's figures as the new "
        "baseline: review the diff)",
        "",
        "*= kimiperf: answers =*",
    ])
    # The summary wraps at the terminal's width, and where depends on the fingerprint's length.
    showed = " ".join(result.stdout.str().split("\nrun passed: ")[1].split())
    assert re.search(r"^no baseline for this machine \(\S+\) yet: this run measured but judged nothing\. "
                     r"Next: python -m pytest \S+ --deployment stub --kimiperf-max-boots 1 -p no:cacheprovider "
                     r"--kimiperf-update-baselines \(it records this run's figures as the new baseline: review the "
                     r"diff\), then", showed), showed
    assert result.stdout.str().count("MissingBaselineWarning: kimiperf") == 1
    result.stdout.fnmatch_lines(["*/baselines/stub/*.json:1: MissingBaselineWarning: kimiperf: *"])


def test_a_bad_missing_baseline_policy_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkimiperf_missing_baseline = sometimes\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*missing-baseline policy 'sometimes' (from ini option "
                                 "kimiperf_missing_baseline); allowed: warn, fail*"])


def test_the_boot_is_not_charged_to_the_first_tests_timeout(pytester: pytest.Pytester, stub_project) -> None:
    pytest.importorskip("pytest_timeout")
    # The stub takes 4 s to load; the test's own timeout is 3 s.
    stub_project(stub_deployment_toml(load_seconds=4), ini="timeout = 3")
    pytester.makepyfile("""
        def test_first(kimiperf_server):
            pass

        def test_own_work_is_still_timed(kimiperf_server):
            import time
            time.sleep(6)
    """)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-max-boots", "1", timeout=120)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*Timeout (>3.0s)*"])


PERF_TESTS = helpers.PERF_TESTS


@pytest.mark.parametrize("mode", ["prepend", "importlib"])
def test_the_shipped_suite_collects_under_every_import_mode(pytester: pytest.Pytester, mode: str) -> None:
    import shutil

    shutil.copytree(PERF_TESTS, pytester.path / "perf_tests", ignore=shutil.ignore_patterns("__pycache__"))
    result = pytester.runpytest_subprocess("perf_tests", f"--import-mode={mode}", "--co", "-q",
                                           "--deployment", "tiny-cpu", "--kimiperf-max-boots", "1", timeout=60)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert sum("::" in line for line in result.stdout.lines) >= 3


def test_the_report_records_the_resolved_server_command(pytester: pytest.Pytester, stub_project) -> None:
    import json
    import sys

    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_unit_and_perf=UNIT_AND_PERF)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-max-boots", "1",
                                           "--kimiperf-json", "report.json", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2, warnings=1)
    command = json.loads((pytester.path / "report.json").read_text())["deployment"]["server_command"]
    assert command.startswith(f"{sys.executable} ") and "stub_vllm.py" in command
    result.stdout.fnmatch_lines([f"kimiperf: server command: {sys.executable} *stub_vllm.py*"])
