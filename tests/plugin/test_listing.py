"""``--kimiperf-list``: deployments, profiles and metrics with where each is defined; nothing runs."""

from __future__ import annotations

import pytest

PROJECT = """
[tool.kimiperf.deployments.mine]
model = "/models/llama"
command = ["vllm", "serve", "{model}", "--port", "{port}"]
tolerances = {decode_tok_s = 0.07}

[tool.kimiperf.profiles.eager]
description = "no torch.compile"
args = ["--enforce-eager"]
"""


@pytest.mark.usefixtures("vllm_serve_parser")  # the profile's args are checked: the import is not timed
def test_the_list_names_every_deployment_profile_and_metric_and_runs_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(PROJECT)
    pytester.makepyfile("def test_never():\n    raise AssertionError('a listing ran a test')\n")
    result = pytester.runpytest_subprocess("--kimiperf-list", "--deployment", "mine", "--nccl-profile",
                                           "default,eager", timeout=60)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "kimiperf deployments (--kimiperf-deployment; * selected):",
        "    kimi-k25-int4-tp8  built-in: Kimi-K2.5 (1T, INT4, MLA) on vLLM at TP=8*",
        "  * mine               */pyproject.toml [[]tool.kimiperf[]] [[]deployments.mine[]]: user deployment from *",
        "    tiny-cpu           built-in: real vLLM on the CPU*",
        "kimiperf profiles (--kimiperf-profile, comma-separated, or 'all'; * selected):",
        "  * default        built-in: (no overrides)",
        "  * eager          */pyproject.toml [[]tool.kimiperf.profiles.eager[]]: (no overrides); args --enforce-eager",
        "    ring-ll        built-in: NCCL_ALGO=Ring NCCL_PROTO=LL",
        "kimiperf metrics (perf.check names; tolerance of deployment mine; defined in "
        "pytest_kimiperf/config/metric_specs.py):",
        "  decode_tok_s        decode                     tok/s  higher is better  tolerance 7%",
        "  ttft_ms             time to first token        ms     lower is better   tolerance 5%",
    ])
    out = result.stdout.str()
    assert "collected" not in out and "a listing ran a test" not in out


def test_a_bad_setting_is_still_a_usage_error_when_listing(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--kimiperf-list", "--deployment", "kimi-typo", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown deployment 'kimi-typo' (from command line --deployment)*"])


def test_the_plan_says_boots_load_time_and_resolution_and_boots_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(PROJECT)
    pytester.makepyfile("def test_never():\n    raise AssertionError('a plan ran a test')\n")
    result = pytester.runpytest_subprocess("--kimiperf-plan", "--deployment", "tiny-cpu", "--nccl-profile",
                                           "default,ring-ll", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "kimiperf plan for deployment tiny-cpu (nothing boots):",
        "  boots: 2 profiles (default, ring-ll) x 2 = 4 boots",
        "  loading: 2 min a boot (declared by deployment tiny-cpu (load_s)): 6 min of loading",
        "  profiles against each other (2 boots each, boot spread 18% declared): decode changes of * or more are "
        "told apart (90% power)",
        "  against the baseline: none recorded for this hardware yet (--kimiperf-update-baselines records one)"])
    assert "a plan ran a test" not in result.stdout.str()
    result = pytester.runpytest_subprocess("--kimiperf-plan", "--kimiperf-boots", "0", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
