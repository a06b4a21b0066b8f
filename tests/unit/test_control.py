"""--kimiperf-control: the recorded build booted beside the candidate, and judged against it in one session."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_kimiperf.config.options import OPTIONS
from pytest_kimiperf.config.settings import RawOption, Settings, build_settings
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge import baselines
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.profiles import InSessionRules, compare_in_session, smallest_drop
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.noise import smallest_change
from pytest_kimiperf.judge.stats import GATE_CRITICAL
from pytest_kimiperf.reports.header import plan_lines

CONTROL = ["/opt/vllm-main/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
           "--port", "{port}", "--tensor-parallel-size", "{tp}"]
FP = Fingerprint(hard={"gpu.count": "8", "gpu.name": "RTX PRO 6000"}, soft={})


def _settings(tmp_path: Path, control_command: list[str] | None = CONTROL, **given: object) -> Settings:
    table = '[tool.kimiperf.deployments.gpu]\nextends = "kimi-k25-int4-tp8"\nsession_spread = 0.02\n'
    if control_command is not None:
        table += "control_command = [" + ", ".join(f'"{part}"' for part in control_command) + "]\n"
    (tmp_path / "pyproject.toml").write_text(table)
    raw = {opt.name: RawOption(opt.default, "default") for opt in OPTIONS}
    raw["deployment"] = RawOption("gpu", "command line --deployment")
    raw.update({name: RawOption(value, f"command line --{name}") for name, value in given.items()})
    return build_settings(raw, rootpath=tmp_path)


def test_the_control_is_the_selected_profile_served_by_the_control_command_and_is_the_reference(
        tmp_path: Path) -> None:
    s = _settings(tmp_path, control=True, nccl_profiles="ring-ll")
    assert [p.name for p in s.profiles] == ["ring-ll", "ring-ll@control"]
    candidate, control = s.profiles
    assert control.control_of == "ring-ll" and dict(control.env) == dict(candidate.env)
    assert s.reference_profile is control and s.control
    argv = s.deployment.argv(model_path="/m", host="h", port=8000, control=True)
    assert argv[1:] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "8000",
                        "--tensor-parallel-size", "8"]
    assert s.deployment.argv(model_path="/m", host="h", port=8000)[1:3] != argv[1:3]  # the candidate's own
    assert not _settings(tmp_path, nccl_profiles="ring-ll").control  # off unless asked


@pytest.mark.parametrize("given, control_command, message", [
    ({}, None, "--kimiperf-control (from command line --control): deployment gpu declares no control_command"),
    ({"nccl_profiles": "default,ring-ll"}, CONTROL,
     "judges one profile against its control; select one with --kimiperf-profile, not default, ring-ll"),
    ({"server_url": "http://127.0.0.1:8000"}, CONTROL,
     "with --kimiperf-server-url http://127.0.0.1:8000: an attached server is one build"),
    ({"update_baselines": True}, CONTROL, "with --kimiperf-update-baselines: the control is the recorded build"),
    ({"boots": "1"}, CONTROL, "--kimiperf-control with 1 boot per profile (from command line --boots): one boot a "
                              "side never gives a direction"),
    ({}, [p for p in CONTROL if p not in ("--port", "{port}")], "control_command .* has no {port}"),
])
def test_what_the_control_needs_is_checked_before_any_boot(tmp_path: Path, given: dict[str, object],
                                                          control_command: list[str] | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _settings(tmp_path, control_command, control=True, **given)


def test_no_weight_cache_daemon_holds_weights_beside_a_control() -> None:
    from pytest_kimiperf.server.weight_cache import why_not_used

    reason = why_not_used(setting="auto", gpu_count=8, command=CONTROL, model="m", control=True)
    assert reason is not None and reason.startswith("--kimiperf-control: both sides load from disk alike")


def test_a_control_across_nodes_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kimiperf.deployments.two]\nextends = "tiny-cpu-2node"\n'
        'control_command = ["{python}", "-m", "x", "--port", "{port}"]\n')
    raw = {opt.name: RawOption(opt.default, "default") for opt in OPTIONS}
    raw["deployment"] = RawOption("two", "command line --deployment")
    raw["control"] = RawOption(True, "command line --kimiperf-control")
    with pytest.raises(ConfigError, match="spans 2 nodes, whose other nodes start the deployment's own command"):
        build_settings(raw, rootpath=tmp_path)


def test_a_control_command_must_be_a_list_of_strings(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.kimiperf.deployments.gpu]\nextends = "kimi-k25-int4-tp8"\ncontrol_command = "vllm serve"\n')
    raw = {opt.name: RawOption(opt.default, "default") for opt in OPTIONS}
    raw["deployment"] = RawOption("gpu", "command line --deployment")
    with pytest.raises(ConfigError, match="control_command"):
        build_settings(raw, rootpath=tmp_path)


def _history(tmp_path: Path, sessions: int) -> baselines.BaselineFile:
    from pytest_kimiperf.judge.noise import BootOrigin

    medians = [81.4 * (1 + 0.01 * ((i % 3) - 1)) for i in range(sessions)]
    entry = baselines.make_entry(
        test="perf_tests/test_decode.py::test_single_stream_decode", profile="ring-ll", metric="decode_tok_s",
        unit="tok/s", direction=Direction.HIGHER_IS_BETTER, samples=medians, git_commit=None, profile_env={},
        boot_samples=[[m] * 20 for m in medians], boot_origins=[BootOrigin(f"s{i}", "h", {}) for i in range(sessions)])
    path = storage.baseline_path(tmp_path / "b", "gpu", FP.key)
    storage.update_baseline(path, "gpu", FP, [entry])
    return storage.load_baseline(path)


def test_the_plan_offers_the_control_with_its_cost_where_the_session_level_stands_in_the_way(tmp_path: Path) -> None:
    history = _history(tmp_path, 3)
    lines = plan_lines(_settings(tmp_path, nccl_profiles="ring-ll"), history)
    drop = smallest_change(0.01, 2, reference_boots=2, tolerance=0.03, critical=GATE_CRITICAL)
    # A 2% session effect on a 3% tolerance: no history can; the control can, at twice the boots.
    assert any(line.startswith("  no history convicts a decode regression") for line in lines)
    assert lines[-1] == (f"  or judge it against the recorded build booted beside it: --kimiperf-control convicts a "
                         f"decode regression of {drop:.1%} or more (3 more boots, about 1 h 24 min more loading; the "
                         "session and host levels cancel)")  # the control's 2, and the candidate's second
    controlled = plan_lines(_settings(tmp_path, control=True, nccl_profiles="ring-ll"), history)
    assert controlled[1].startswith("  boots: 2 profiles (ring-ll, ring-ll@control) x 2 = 4 boots")
    assert controlled[3] == (f"  against the control (ring-ll@control: the deployment's control_command, the recorded "
                             f"build, booted beside it, 2 boots each): a decode regression of {drop:.1%} or more is "
                             "convicted beyond the 3% tolerance (90% power); the session and host levels cancel")
    # Without a control_command, the plan says what it needs; with two profiles, it offers none.
    bare = plan_lines(_settings(tmp_path, None, nccl_profiles="ring-ll"), history)
    assert bare[-1].endswith("would be convicted: declare the deployment's control_command and add --kimiperf-control")
    two = plan_lines(_settings(tmp_path, nccl_profiles="default,ring-ll"), history)
    assert not any("--kimiperf-control" in line for line in two)


def test_the_smallest_drop_the_control_convicts_is_convicted_where_its_boots_fall_as_expected() -> None:
    rules = InSessionRules(0.01)
    drop = smallest_drop(2, 0.03, rules)
    assert smallest_drop(3, 0.03, rules) < drop < smallest_drop(2, 0.05, rules)
    # Boots one boot spread apart around a true drop beyond the 90% power point: convicted.
    sd = math.log1p(0.01)
    ref = [BootSummary(median=100 * math.exp(x), n=20, se_log=0.002) for x in (-sd / 2, sd / 2)]
    cur = [BootSummary(median=100 * (1 - drop) * math.exp(x), n=20, se_log=0.002) for x in (-sd / 2, sd / 2)]
    c = compare_in_session(cur, ref, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03, rules=rules)
    assert c.verdict.value == "regression"


@pytest.mark.parametrize("invocation, expected", [
    (("perf_tests", "--kimiperf-control"), "python -m pytest perf_tests --kimiperf-update-baselines"),
    (("perf_tests",), "python -m pytest perf_tests --kimiperf-update-baselines -o kimiperf_control=false"),
])
def test_the_command_that_records_a_baseline_leaves_the_control_out(tmp_path: Path, invocation: tuple[str, ...],
                                                                    expected: str) -> None:
    from pytest_kimiperf.reports.reporter import SessionReporter

    class Run:
        settings = _settings(tmp_path, control=True, nccl_profiles="ring-ll")

    reporter = SessionReporter(run=Run(), rootpath=tmp_path, update_json=lambda data: None,  # type: ignore[arg-type]
                               invocation=invocation)
    # The second: the control set by an ini file, which a recording run must turn off.
    assert reporter.record_command == expected
