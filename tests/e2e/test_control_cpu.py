"""--kimiperf-control on the real CPU engine: the recorded build (here the identical server,
served by the deployment's control_command) boots beside the candidate, and an A/A gets no direction.

The same four boots show the boot cost: the first, with an empty compile cache, compiles from
scratch; the three after it reuse what it wrote (one command line, one cache key), and their
compile phases are shorter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS
from tests.e2e.test_e2e_cpu import no_servers_before_and_after  # noqa: F401 - a fixture

DECODE = """
from pytest_kimiperf.measure.scenarios import SingleStream

SCENARIO = SingleStream(prompt_tokens=64, output_tokens=64, requests=12, warmup_requests=2)

def test_single_stream_decode(perf):
    perf.check(perf.measure(SCENARIO), ["decode_tok_s"])
"""


def test_the_identical_server_as_its_own_control_boots_interleaved_and_gets_no_direction(
    pytester: pytest.Pytester, no_servers_before_and_after, tmp_path: Path
) -> None:
    command = list(BUILTIN_DEPLOYMENTS["tiny-cpu"].command)
    cache = tmp_path / "compile-cache"  # empty: the first boot compiles from scratch
    pytester.makepyprojecttoml('[tool.kimiperf.deployments.tiny-control]\nextends = "tiny-cpu"\n'
                               f"control_command = {json.dumps(command)}\n"
                               f'env = {{ VLLM_CACHE_ROOT = "{cache / "vllm"}", '
                               f'TORCHINDUCTOR_CACHE_DIR = "{cache / "inductor"}" }}\n')
    pytester.makepyfile(test_e2e=DECODE)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        "--deployment", "tiny-control", "--kimiperf-control", "--kimiperf-boots", "2", "--kimiperf-json", str(report),
        "-p", "no:cacheprovider", timeout=1200)
    # An A/A: the candidate and its control are one server; no baseline, so nothing else judges.
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=4)
    starts = [line.split("for profile ")[1].split()[0] for line in result.outlines
              if "starting tiny-control server for profile" in line]
    assert starts == ["default", "default@control", "default@control", "default"], starts
    result.stdout.fnmatch_lines(["kimiperf: control command (default@control): * -m vllm.entrypoints.openai.api_server *"])
    data = json.loads(report.read_text())
    assert data["control"] is True and data["reference_profile"] == "default@control"
    [decode] = [c for c in data["profile_comparisons"] if c["unit"] == "tok/s"]
    assert decode["boots_current"] == 2 and decode["boots_reference"] == 2
    # tiny-cpu declares spawn modes: the comparison weighs them (judge/gate.compare_with_control).
    assert decode["verdict"] not in ("regression", "improvement"), decode
    assert "slower than the control" not in result.stdout.str()

    # The boot cost: every boot has a compile phase; the first builds the cache, the others reuse it.
    accounts = sorted((a for p in data["profiles"].values() for a in p["boot_accounts"]),
                      key=lambda a: a["log_path"] or "")
    compiles = {(a["profile"], a["boot"]): sum(ph["seconds"] for ph in a["phases"] if ph["phase"] == "compiling")
                for a in accounts}
    print("compile phase per boot (s):", compiles)
    first = [a for a in accounts if a["first_of_deployment"]]
    assert [(a["profile"], a["boot"]) for a in first] == [("default", 1)], accounts
    others = [v for k, v in compiles.items() if k != ("default", 1)]
    assert len(others) == 3 and compiles[("default", 1)] > max(others) and min(others) > 0, compiles
    assert all(a["weights_source"] == "disk" for a in accounts), accounts
    logs = [Path(a["log_path"]).read_text() for a in accounts]
    assert len(logs) == 4 and not any("Compiling model again due to a load failure" in log for log in logs)
