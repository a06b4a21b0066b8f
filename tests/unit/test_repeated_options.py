"""An option given twice never loses a value in silence: ``kimiperf compare``'s groups and lists
add up, and every option that takes one value (the plugin's and compare's) names both values of a
repeat as a usage error. Given in two places (the ini's addopts, PYTEST_ADDOPTS, the command
line), the later wins, as pytest's own options do."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from pytest_kimiperf.compare import cli
from pytest_kimiperf.compare.cli import USAGE_EXIT, main
from pytest_kimiperf.config.options import GIVEN_DEST, OPTIONS, SPELLINGS_DEST, arg_sources, read_raw_options
from pytest_kimiperf.errors import ConfigError
from tests.unit.test_compare_command import A, B


def _compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        status = main(list(args))
    except SystemExit as exc:  # argparse's own usage errors exit from parse_args
        status = int(exc.code or 0)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_repeated_a_and_b_add_their_files_as_one_list_does(capsys: pytest.CaptureFixture[str]) -> None:
    _, listed, _ = _compare(capsys, "--a", *A, "--b", *B, "--deployment", "tiny-cpu")
    status, repeated, _ = _compare(capsys, "--a", A[0], "--b", B[0], "--a", A[1], "--b", B[1], "--deployment", "tiny-cpu")
    assert status == 0
    assert "(tolerance 25%, 2 vs 2 boots;" in repeated
    assert repeated == listed


@pytest.mark.parametrize(("args", "words"), [
    (["--deployment", "tiny-cpu", "--deployment", "tiny-cpu-tp2"], "--deployment: given twice, as 'tiny-cpu' and "
                                                                   "'tiny-cpu-tp2'"),
    (["--boot-spread", "0.02", "--boot-spread", "0.05"], "--boot-spread: given twice, as '0.02' and '0.05'"),
    (["--json", "a.json", "--json", "b.json"], "--json: given twice, as 'a.json' and 'b.json'"),
    (["--markdown", "a.md", "--markdown", "b.md"], "--markdown: given twice, as 'a.md' and 'b.md'"),
    (["--tolerance", "0.1", "--tolerance", "0.2"], "--tolerance given twice for every metric, as '0.1' and '0.2'"),
    (["--tolerance", "ttft_ms=0.1", "--tolerance", "ttft_ms=0.2"],
     "--tolerance given twice for ttft_ms, as 'ttft_ms=0.1' and 'ttft_ms=0.2'"),
])
def test_a_compare_option_of_one_value_given_two_is_a_usage_error_naming_both(
        capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    status, _, err = _compare(capsys, "--a", *A, "--b", *B, *args)
    assert status == USAGE_EXIT
    assert words in err


def test_one_metrics_tolerance_beats_every_metrics_whatever_the_order() -> None:
    for order in (["--tolerance", "ttft_ms=0.2", "--tolerance", "0.1"], ["--tolerance", "0.1", "--tolerance", "ttft_ms=0.2"]):
        rules = cli._rules(cli.parser().parse_args(["--a", "x", *order]))
        assert rules.tolerances["ttft_ms"] == 0.2 and rules.tolerances["decode_tok_s"] == 0.1


def test_every_compare_option_adds_up_or_takes_one_value() -> None:
    """The rule, for every option the command has: a list that extends or appends, a switch, or
    one value that a second one cannot silently replace."""
    for action in cli.parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        adds = isinstance(action, (argparse._AppendAction, argparse._ExtendAction))
        switch = isinstance(action, argparse._StoreTrueAction)
        assert adds or switch or isinstance(action, cli._Once), action.option_strings


def _cli(given: dict[str, list[tuple[str, Any]]]) -> Any:
    """A getoption over what argparse kept: each dest's last value, spellings and values given."""
    namespace = {dest: values[-1][1] for dest, values in given.items()}
    namespace[SPELLINGS_DEST] = {dest: [s for s, _ in values] for dest, values in given.items()}
    namespace[GIVEN_DEST] = given
    return namespace.get


def test_a_plugin_option_given_two_values_on_the_command_line_is_a_config_error_naming_both() -> None:
    getoption = _cli({"kimiperf_boots": [("--kimiperf-boots", "3"), ("--kimiperf-boots", "4")]})
    sources = arg_sources([], {}, ["--kimiperf-boots", "3", "--kimiperf-boots=4"])
    with pytest.raises(ConfigError, match=r"--kimiperf-boots is given twice on the command line, as '3' and '4'"):
        read_raw_options(getoption, lambda name: None, {}, sources=sources)
    # A list names how to give both; a second spelling of one option is the same option.
    getoption = _cli({"kimiperf_nccl_profiles": [("--kimiperf-profile", "default"), ("--nccl-profile", "ring-ll")]})
    sources = arg_sources([], {}, ["--kimiperf-profile", "default", "--nccl-profile", "ring-ll"])
    with pytest.raises(ConfigError, match=r"as 'default' and 'ring-ll'.*give it once: --kimiperf-profile default,ring-ll"):
        read_raw_options(getoption, lambda name: None, {}, sources=sources)


def test_the_same_value_twice_or_one_value_a_place_is_no_repeat() -> None:
    getoption = _cli({"kimiperf_boots": [("--kimiperf-boots", "3"), ("--kimiperf-boots", "3")]})
    raw = read_raw_options(getoption, lambda name: None, {},
                           sources=arg_sources([], {}, ["--kimiperf-boots", "3", "--kimiperf-boots", "3"]))
    assert raw["boots"].value == "3"
    # addopts, then PYTEST_ADDOPTS, then the command line: each later place overrides.
    getoption = _cli({"kimiperf_boots": [("--kimiperf-boots", "2"), ("--kimiperf-boots", "5"), ("--kimiperf-boots", "3")]})
    raw = read_raw_options(getoption, lambda name: None, {}, sources=arg_sources(
        ["--kimiperf-boots", "2"], {"PYTEST_ADDOPTS": "--kimiperf-boots 5"}, ["--kimiperf-boots", "3"]))
    assert (raw["boots"].value, raw["boots"].source) == ("3", "command line --kimiperf-boots")
    # ... but two values in PYTEST_ADDOPTS are a repeat there.
    getoption = _cli({"kimiperf_boots": [("--kimiperf-boots", "5"), ("--kimiperf-boots", "6"), ("--kimiperf-boots", "3")]})
    with pytest.raises(ConfigError, match="given twice in PYTEST_ADDOPTS, as '5' and '6'"):
        read_raw_options(getoption, lambda name: None, {}, sources=arg_sources(
            [], {"PYTEST_ADDOPTS": "--kimiperf-boots 5 --kimiperf-boots=6"}, ["--kimiperf-boots", "3"]))


def test_every_plugin_option_of_one_value_is_checked_for_repeats() -> None:
    for opt in OPTIONS:
        if opt.kind == "bool":
            continue  # a switch given twice is still on
        getoption = _cli({opt.dest: [(opt.flag, "x1"), (opt.flag, "x2")]})
        with pytest.raises(ConfigError, match=f"{opt.flag} is given twice on the command line, as 'x1' and 'x2'"):
            read_raw_options(getoption, lambda name: None, {},
                             sources=arg_sources([], {}, [opt.flag, "x1", opt.flag, "x2"]))
