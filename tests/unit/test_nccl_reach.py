"""What an NCCL profile could reach, as the header, the answers, the Markdown and the NCCL check say it.

The facts come from vLLM 0.32's own log lines (tests/data/boot_logs/allreduce, README there);
the lines are pinned whole, as the house pins every message a user reads.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from pytest_kimiperf.config.deployments import KIMI_K25_INT4_TP8, TINY_CPU
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES, NcclProfile
from pytest_kimiperf.reports.outputs import build_json_report
from pytest_kimiperf.reports.outputs import render_markdown
from pytest_kimiperf.reports.model import ProfileFacts, SessionReport
from pytest_kimiperf.reports.nccl import CPU_ENGINE_NOTE, check_server_log
from pytest_kimiperf.reports.nccl import forecast_line
from pytest_kimiperf.reports.terminal import render_summary
from pytest_kimiperf.server.allreduce_path import decode_reach, read_all_reduce_path
from pytest_kimiperf.server.boot_account import BootAccount, account_boot
from tests import helpers
from tests.unit.test_reports import make_report, measured

LOGS = helpers.DATA / "boot_logs" / "allreduce"
CPU_TP1 = helpers.DATA / "nccl_logs" / "vllm_cpu_tp1_gloo.log"
PROFILES = [BUILTIN_PROFILES["default"], BUILTIN_PROFILES["ring-ll"]]
FORCE = ("add --disable-custom-all-reduce to the deployment's command or every profile's args, and "
         "VLLM_ALLREDUCE_USE_FLASHINFER=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 to its env or every profile's")


# -- the header, before any boot ---------------------------------------------------------------

def test_the_header_forecasts_vllms_own_paths_on_a_gpu_deployment_and_how_to_force_nccl() -> None:
    assert forecast_line(KIMI_K25_INT4_TP8, PROFILES) == (
        "kimiperf: NCCL reach: at TP=8 vLLM runs decode-sized all-reduces on its custom all-reduce (off only on "
        "more than two PCIe-only GPUs), FlashInfer and torch symmetric memory before NCCL where the GPUs allow, "
        "and the profiles' NCCL settings then reach only prefill's larger all-reduces and the all-gathers (each "
        "boot's log says which path vLLM took; the answers report it). For NCCL on decode, " + FORCE)


def test_the_header_names_only_the_switches_still_missing() -> None:
    flagged = replace(KIMI_K25_INT4_TP8, command=(*KIMI_K25_INT4_TP8.command, "--disable-custom-all-reduce"))
    assert forecast_line(flagged, PROFILES) == (
        "kimiperf: NCCL reach: at TP=8 vLLM runs decode-sized all-reduces on FlashInfer and torch symmetric memory "
        "before NCCL where the GPUs allow, and the profiles' NCCL settings then reach only prefill's larger "
        "all-reduces and the all-gathers (each boot's log says which path vLLM took; the answers report it). For "
        "NCCL on decode, add VLLM_ALLREDUCE_USE_FLASHINFER=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 to the deployment's env "
        "or every profile's")
    nccl = replace(flagged, env={"VLLM_ALLREDUCE_USE_FLASHINFER": "0", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"})
    on_nccl = ("kimiperf: NCCL reach: at TP=8 decode's all-reduces go to NCCL: every profile turns vLLM's custom, "
               "FlashInfer and symmetric-memory all-reduce off (each boot's log confirms it)")
    assert forecast_line(nccl, PROFILES) == on_nccl
    # the servers inherit the shell's environment, where a switch may be set too
    assert forecast_line(flagged, PROFILES, {"VLLM_ALLREDUCE_USE_FLASHINFER": "0",
                                             "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}) == on_nccl


def test_the_header_says_when_profiles_ask_for_different_paths() -> None:
    on_nccl = NcclProfile("ring-ll-decode", "ring-ll with decode on NCCL", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL",
                          "VLLM_ALLREDUCE_USE_FLASHINFER": "0", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"},
                          args=("--disable-custom-all-reduce",))
    line = forecast_line(KIMI_K25_INT4_TP8, [BUILTIN_PROFILES["default"], on_nccl])
    assert line is not None and line.endswith(
        ". The profiles ask for different paths (default leaves --disable-custom-all-reduce "
        "VLLM_ALLREDUCE_USE_FLASHINFER=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 unset; ring-ll-decode leaves nothing unset): "
        "the comparison also changes where they run")


def test_the_header_says_one_rank_and_the_cpu_engine_reach_nothing_and_is_silent_without_nccl_variables() -> None:
    assert forecast_line(TINY_CPU, PROFILES) == (
        "kimiperf: NCCL reach: the CPU engine runs its collectives on gloo, not NCCL (and at TP=1 none runs): the "
        "profiles' NCCL settings reach nothing here")
    assert forecast_line(replace(KIMI_K25_INT4_TP8, tensor_parallel_size=1), PROFILES) == (
        "kimiperf: NCCL reach: TP=1 runs no all-reduce: the profiles' NCCL settings reach no collective, and NCCL "
        "prints no TUNING line with one rank")
    # vLLM's custom all-reduce declines 3 ranks: only FlashInfer and symmetric memory are left to name
    three = forecast_line(replace(KIMI_K25_INT4_TP8, tensor_parallel_size=3), PROFILES)
    assert three is not None and "on FlashInfer and torch symmetric memory before NCCL" in three
    assert forecast_line(KIMI_K25_INT4_TP8, [BUILTIN_PROFILES["default"]]) is None


def test_the_settings_header_carries_the_forecast_after_the_server_command(tmp_path: Path) -> None:
    from pytest_kimiperf.config.settings import build_settings
    from pytest_kimiperf.reports.header import settings_lines
    from tests.unit.test_serve_args import _options

    lines = settings_lines(build_settings(_options("tiny-cpu", "default,ring-ll"), rootpath=tmp_path), {})
    command = next(i for i, line in enumerate(lines) if line.startswith("kimiperf: server command: "))
    assert lines[command + 1] == forecast_line(TINY_CPU, PROFILES)
    alone = settings_lines(build_settings(_options("tiny-cpu", "default"), rootpath=tmp_path), {})
    assert not any(line.startswith("kimiperf: NCCL reach") for line in alone)


# -- the answers and the Markdown, after the boots ------------------------------------------------

def account(profile: str, boot: int, log: Path) -> BootAccount:
    """The account of one boot whose log is ``log`` (its phases do not matter here)."""
    return account_boot(log.read_text(encoding="utf-8"), profile=profile, ordinal=boot, first_of_deployment=boot == 1,
                        started_at=datetime(2026, 1, 5, 9, 0, 0), total_s=60.0)


def report_with(logs: dict[str, list[Path]]) -> SessionReport:
    results = [measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1),
               measured("ring-ll", decode=81.9, itl=12.2, ttft=44.0, seed=10),
               measured("ring-ll", decode=82.1, itl=12.2, ttft=44.3, seed=30, boot=2),
               measured("default", decode=81.2, itl=12.3, ttft=40.2, seed=20, boot=2)]
    env = {"default": {}, "ring-ll": dict(BUILTIN_PROFILES["ring-ll"].env)}
    facts = [ProfileFacts(name, profile_env=env[name], boots=len(paths),
                          boot_accounts=tuple(account(name, i + 1, p) for i, p in enumerate(paths)))
             for name, paths in logs.items()]
    return make_report(results, profiles=facts)


def answers_of(report: SessionReport) -> str:
    """The answers section as one text, its wrapped lines joined again."""
    lines = render_summary(report, verbosity=0)
    start = next(i for i, line in enumerate(lines) if line.text == "kimiperf: answers")
    end = next(i for i, line in enumerate(lines[start + 1:], start + 1) if line.sep)
    return " ".join(line.text.strip() for line in lines[start + 1:end])


NVLINK_ANSWER = (
    "ring-ll vs default, what NCCL could reach: not decode's all-reduces: vLLM ran them on FlashInfer (FLASHINFER), "
    "vLLM's custom all-reduce (CUSTOM) and torch symmetric memory (SYMM_MEM) before NCCL (TP=8, all 4 boots), so "
    "ring-ll's NCCL settings touched only prefill's larger all-reduces and the all-gathers; for NCCL on decode, "
    + FORCE)


def test_an_nvlink_comparison_answers_that_decode_never_reached_nccl_and_how_to_force_it() -> None:
    nvlink = LOGS / "h100_tp8_nvlink.log"
    report = report_with({"default": [nvlink, nvlink], "ring-ll": [nvlink, nvlink]})
    text = answers_of(report)
    assert NVLINK_ANSWER in text
    assert text.index("ring-ll vs default, decode") < text.index(NVLINK_ANSWER)  # right after its comparison
    markdown = render_markdown(report)
    said = NVLINK_ANSWER.split("what NCCL could reach: ", 1)[1].replace("_", "\\_")  # Markdown escapes _
    assert f"**What NCCL could reach:** {said}." in markdown
    assert markdown.index("### Profiles vs `default`") < markdown.index("**What NCCL could reach:**")
    # the boots' facts reach the JSON report with their accounts
    data = build_json_report(report)
    path = data["profiles"]["ring-ll"]["boot_accounts"][0]["all_reduce"]
    assert path["backends"] == ["FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"]


def test_pcie_boots_whose_decode_reached_nccl_add_no_answer() -> None:
    pcie = LOGS / "rtx_pro_6000_tp8_pcie.log"
    report = report_with({"default": [pcie, pcie], "ring-ll": [pcie, pcie]})
    assert "what NCCL could reach" not in answers_of(report)
    assert "What NCCL could reach" not in render_markdown(report)


def test_one_rank_answers_that_the_profile_reached_nothing() -> None:
    report = report_with({"default": [CPU_TP1, CPU_TP1], "ring-ll": [CPU_TP1, CPU_TP1]})
    assert ("ring-ll vs default, what NCCL could reach: nothing: one rank runs no all-reduce (TP=1, all 4 boots), so "
            "ring-ll's NCCL settings touched no collective, and NCCL prints no TUNING line with one rank"
            ) in answers_of(report)


def test_profiles_on_different_paths_are_named_each() -> None:
    report = report_with({"default": [LOGS / "h100_tp8_nvlink.log"], "ring-ll": [LOGS / "h100_tp8_nccl_only.log"]})
    assert ("ring-ll vs default, what NCCL could reach: decode's all-reduces took different paths (default: vLLM "
            "ran them on FlashInfer (FLASHINFER), vLLM's custom all-reduce (CUSTOM) and torch symmetric memory "
            "(SYMM_MEM) before NCCL (TP=8); ring-ll: NCCL ran them (TP=8), as --disable-custom-all-reduce turns "
            "vLLM's custom all-reduce off), so the comparison changes where they run as well as the NCCL settings"
            ) in answers_of(report)


def test_no_answer_without_nccl_variables_or_without_the_logs_facts() -> None:
    nvlink = LOGS / "h100_tp8_nvlink.log"
    report = report_with({"default": [nvlink], "ring-ll": [nvlink]})
    plain = make_report(report.results, profiles=[replace(p, profile_env={}) for p in report.profiles])
    assert "what NCCL could reach" not in answers_of(plain)
    # the stub's and older reports' boots carry no path: nothing is claimed
    silent = make_report(report.results)
    assert "what NCCL could reach" not in answers_of(silent)


# -- the NCCL check (--kimiperf-nccl-debug) --------------------------------------------------------

def test_the_nccl_check_says_one_rank_prints_no_tuning_line_instead_of_reading_as_a_failure() -> None:
    env = dict(BUILTIN_PROFILES["ring-ll"].env)
    reach = decode_reach(read_all_reduce_path(CPU_TP1.read_text().splitlines()))
    check = check_server_log("ring-ll", env, CPU_TP1, cpu_engine=True, reach=reach)
    assert check.said() == (CPU_ENGINE_NOTE, (
        "TP=1: one rank runs no all-reduce (vLLM makes no PyNccl communicator for it), so NCCL prints no TUNING "
        "line: none is the expected answer here, not a failed check"))
    assert check.to_json()["reach"] == {"reach": "one-rank", "tensor_parallel_size": 1, "via": [], "logged": True,
                                        "custom_off": None, "interconnect": None}
    assert check.to_json()["notes"] == list(check.said())
    default = check_server_log("default", {}, CPU_TP1, cpu_engine=True, reach=reach)
    assert default.said() == ("the profile sets no NCCL_*/CUDA_* variable: nothing to check",)


def test_the_nccl_check_says_what_its_tuning_lines_cannot_show_when_decode_took_another_path(tmp_path: Path) -> None:
    log = tmp_path / "server-kimi-ring-ll.log"
    log.write_text((LOGS / "h100_tp8_disable_custom.log").read_text())
    reach = decode_reach(read_all_reduce_path(log.read_text().splitlines()))
    check = check_server_log("ring-ll", dict(BUILTIN_PROFILES["ring-ll"].env), log, cpu_engine=False, reach=reach)
    assert check.said()[-1] == (
        "decode's all-reduces did not reach NCCL's algorithms: vLLM ran them on FlashInfer (FLASHINFER) and torch "
        "symmetric memory (SYMM_MEM) before NCCL (TP=8); NCCL's TUNING lines show prefill's larger all-reduces and "
        "the all-gathers only; for NCCL on decode, add VLLM_ALLREDUCE_USE_FLASHINFER=0 VLLM_ALLREDUCE_USE_SYMM_MEM=0 "
        "to the deployment's env or every profile's")
    report = make_report([], profiles=[ProfileFacts("ring-ll", profile_env={}, nccl_debug=check)])
    shown = " ".join(line.text.strip() for line in render_summary(report, verbosity=0))
    assert "note: decode's all-reduces did not reach NCCL's algorithms: vLLM ran them on FlashInfer" in shown
    assert "decode's all-reduces did not reach NCCL's algorithms" in render_markdown(report)


# -- the docs' first-screen format knows the line ---------------------------------------------------

def test_the_docs_excerpt_check_knows_the_reach_answer() -> None:
    spec = importlib.util.spec_from_file_location("docs_excerpt", helpers.ROOT / "scripts" / "docs_excerpt.py")
    assert spec is not None and spec.loader is not None
    docs_excerpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_excerpt)
    assert docs_excerpt.REACH.match(NVLINK_ANSWER)
    assert not docs_excerpt.REACH.match("ring-ll vs default, decode tok/s (single_stream_decode): +0.6%")
