"""One naming scheme: ``--kimiperf-<name>`` and its ini twin ``kimiperf_<name>``, three short
aliases, and the old spellings still working as deprecated aliases that say what to use."""

from __future__ import annotations

import re

import pytest

from pytest_kimiperf.config.options import OPTIONS


def test_help_shows_each_option_with_its_default_and_hides_the_old_spellings(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = re.sub(r"\s+", " ", result.stdout.str())
    for opt in OPTIONS:
        assert f"{opt.flag}" in text, opt.flag
        default = re.sub(r"\s+", " ", opt.shown_default)
        assert f"(default: {default})" in text, opt.flag
        for old in opt.deprecated:
            assert f"{old}=" not in text and f"{old} " not in text, old
    result.stdout.fnmatch_lines(["*--kimiperf-profile=PROFILE*", "*--nccl-profile=PROFILE*", "*alias of --kimiperf-profile*"])


def test_old_spellings_still_work_and_each_warns_once_naming_the_new_one(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkimiperf_nccl_profiles = ring-ll\n")
    pytester.makepyfile("def test_ok():\n    pass\n")
    baselines = pytester.path / "old-dir"
    result = pytester.runpytest_subprocess("--deployment", "tiny-cpu", "--perf-strict", "--baselines-dir",
                                           str(baselines), "-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    # The values took effect as the new spellings' would.
    result.stdout.fnmatch_lines(["kimiperf: profile ring-ll: *", f"*{baselines}*"])
    for said in ("kimiperf: --perf-strict is deprecated: use --kimiperf-strict",
                 "kimiperf: --baselines-dir is deprecated: use --kimiperf-baselines-dir",
                 "kimiperf: the ini option kimiperf_nccl_profiles is deprecated: use kimiperf_profile"):
        assert out.count(said) == 1, (said, out)
    assert "KimiperfDeprecationWarning" in out


def test_the_new_spelling_wins_over_an_old_one_in_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nkimiperf_nccl_profiles = ring-ll\nkimiperf_profile = default\n")
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("--deployment", "tiny-cpu", "-p", "no:cacheprovider", timeout=60)
    result.stdout.fnmatch_lines(["kimiperf: profile default: *"])
    assert "kimiperf: profile ring-ll" not in result.stdout.str()


@pytest.mark.parametrize("args", [("--kimiperf-profile", "default", "--nccl-profile", "ring-ll"),
                                  ("--nccl-profile", "default", "--kimiperf-profile", "ring-ll"),
                                  ("--kimiperf-profile", "default", "--kimiperf-nccl-profile", "ring-ll")])
def test_two_values_in_one_place_are_a_usage_error_whatever_the_spellings(pytester: pytest.Pytester,
                                                                           args: tuple[str, ...]) -> None:
    # argparse would keep the last: a profile dropped without a word (issue 60).
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("--deployment", "tiny-cpu", *args, "-p", "no:cacheprovider", timeout=60)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kimiperf-profile is given twice on the command line, as 'default' and 'ring-ll'*"
                                 "give it once: --kimiperf-profile default,ring-ll*"])


def test_the_command_line_overrides_the_ini_files_addopts_as_pytests_own_options_do(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\naddopts = --kimiperf-profile default --kimiperf-boots 2\n")
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("--deployment", "tiny-cpu", "--nccl-profile", "ring-ll", "-p",
                                           "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["kimiperf: profile ring-ll: *"])
    assert "kimiperf: profile default" not in result.stdout.str()
