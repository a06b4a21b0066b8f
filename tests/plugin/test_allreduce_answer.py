"""What an NCCL profile could reach, through the plugin: the stub prints vLLM's all-reduce lines.

The stub server (tests/fakes/stub_vllm.py --all-reduce-lines) logs at boot what vLLM 0.32 logs
on 8 NVLink-joined H100s (tests/data/boot_logs/allreduce/h100_tp8_nvlink.log): FlashInfer, the
custom all-reduce and torch symmetric memory ahead of PyNccl. The boot accounts read it, travel to
the controller, and the answers, the Markdown and the NCCL check say that ring-ll could not reach
decode's all-reduces, and how to put them on NCCL.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import stub_deployment_toml

PERF_TEST = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=8, output_tokens=16, requests=4, warmup_requests=1)

def test_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"])
"""


@pytest.mark.usefixtures("isolated_state")
def test_an_nvlink_boots_answer_says_decode_never_reached_nccl(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml(extra_args=("--tok-per-s", "400", "--nccl-lines",
                                                  "--all-reduce-lines", "h100_tp8_nvlink")))
    pytester.makepyfile(test_perf=PERF_TEST)
    result = pytester.runpytest_subprocess(
        "--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1",
        "--kimiperf-max-boots", "1", "--kimiperf-nccl-debug", "--kimiperf-json", "r.json",
        "--kimiperf-markdown", "summary.md", timeout=120)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        # the header forecasts from the deployment as declared: the stub is declared a CPU engine
        "kimiperf: NCCL reach: the CPU engine runs its collectives on gloo, not NCCL (and at TP=1 none runs): *",
        "*= kimiperf: answers =*",
        "ring-ll vs default, decode tok/s (decode)*",
        # the answer is what each boot's log said
        "ring-ll vs default, what NCCL could reach: not decode's all-reduces: vLLM ran them on FlashInfer",
        "*kimiperf: NCCL variables in the server logs (--kimiperf-nccl-debug)*",
        "*note: decode's all-reduces did not reach NCCL's algorithms: vLLM ran them on FlashInfer*",
    ])
    summary = (pytester.path / "summary.md").read_text()
    assert ("**What NCCL could reach:** not decode's all-reduces: vLLM ran them on FlashInfer (FLASHINFER), vLLM's "
            "custom all-reduce (CUSTOM) and torch symmetric memory (SYMM\\_MEM) before NCCL (TP=8, both boots), so "
            "ring-ll's NCCL settings touched only prefill's larger all-reduces and the all-gathers; for NCCL on "
            "decode, add --disable-custom-all-reduce to the deployment's command or every profile's args, and "
            "VLLM\\_ALLREDUCE\\_USE\\_FLASHINFER=0 VLLM\\_ALLREDUCE\\_USE\\_SYMM\\_MEM=0 to its env or every "
            "profile's.") in summary
    data = json.loads((pytester.path / "r.json").read_text())
    (account,) = data["profiles"]["ring-ll"]["boot_accounts"]
    assert account["all_reduce"]["backends"] == ["FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"]
    assert data["profiles"]["ring-ll"]["nccl_debug"]["reach"]["via"] == ["FLASHINFER", "CUSTOM", "SYMM_MEM"]
