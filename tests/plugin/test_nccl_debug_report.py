"""``--kimiperf-nccl-debug`` verdicts: each profile variable against what NCCL logged, in every report.

Logs: tests/data/nccl_logs (README there says which are recorded and which are built in NCCL's
formats). The plugin runs boot the stub server, which prints NCCL-format lines on request.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import stub_deployment_toml
from pytest_kimiperf.config.nccl.profiles import BUILTIN_PROFILES
from pytest_kimiperf.reports.outputs import build_json_report
from pytest_kimiperf.reports.outputs import render_markdown
from pytest_kimiperf.reports.model import ProfileFacts, build_session_report
from pytest_kimiperf.reports.nccl import (
    APPLIED,
    CPU_ENGINE_NOTE,
    DIFFERENT,
    NOT_SEEN,
    check_server_log,
)
from pytest_kimiperf.reports.terminal import render_summary
from tests import helpers

LOGS = helpers.DATA / "nccl_logs"
TUNED = dict(BUILTIN_PROFILES["ring-ll-tuned"].env)


def statuses(check: object) -> dict[str, str]:
    return {v.variable: v.message for v in check.variables}  # type: ignore[attr-defined]


def test_gpu_log_shows_each_tuned_variable_applied_and_cuda_ones_unseen() -> None:
    check = check_server_log("ring-ll-tuned", TUNED, LOGS / "nccl_tp2_ring_ll_tuned.log", cpu_engine=False)
    assert statuses(check) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": NOT_SEEN,
        "NCCL_ALGO": APPLIED,
        "NCCL_BUFFSIZE": APPLIED,  # logged "16777216." by param.cc: the period is not part of it
        "NCCL_MAX_NCHANNELS": APPLIED,
        "NCCL_PROTO": APPLIED,
    }
    assert check.error is None and not check.mismatches
    assert check.notes == ("NCCL never logs CUDA_* variables, so they always read 'not seen in the log'",)


# A profile asking for Tree everywhere (the built-in tree-ll's env before issue 23): the log's
# NCCL_ALGO=Ring is then a mismatch the reports must show.
TREE = {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}


def test_a_value_nccl_did_not_take_is_named_with_what_it_logged() -> None:
    check = check_server_log("tree-ll", TREE, LOGS / "nccl_tp2_ring_ll_tuned.log", cpu_engine=False)
    assert statuses(check) == {"NCCL_ALGO": f"{DIFFERENT}: Ring", "NCCL_PROTO": APPLIED}
    (mismatch,) = check.mismatches
    assert (mismatch.expected, mismatch.logged) == ("Tree", "Ring")


def test_line_prefixes_legacy_levels_and_rejected_values() -> None:
    env = {"NCCL_P2P_LEVEL": "2", "NCCL_NTHREADS": "99999999999999999999", "NCCL_BUFFSIZE": "8388608",
           "NCCL_PROTO": "^LL128;allreduce:LL", "NCCL_COLLNET_ENABLE": "0", "NCCL_IB_HCA": "mlx5"}
    check = check_server_log("odd", env, LOGS / "nccl_line_prefixes.log", cpu_engine=False)
    assert statuses(check) == {
        "NCCL_BUFFSIZE": APPLIED,  # behind mpirun's "[1,0]<stdout>:" prefix
        "NCCL_COLLNET_ENABLE": APPLIED,
        "NCCL_IB_HCA": NOT_SEEN,
        "NCCL_NTHREADS": f"{DIFFERENT}: -2",  # "Invalid value ..., using default -2."
        "NCCL_P2P_LEVEL": APPLIED,  # legacy 2 is logged by name, PXB
        "NCCL_PROTO": APPLIED,  # behind an NCCL_DEBUG_TIMESTAMP_FORMAT stamp
    }


@pytest.mark.parametrize("log", ["vllm_cpu_tp1_gloo.log", "torch_gloo_nccl_debug_info.log"])
def test_cpu_engine_logs_have_no_nccl_line_and_say_why(log: str) -> None:
    """Recorded on this project's CPU machine: gloo runs the collectives, NCCL writes nothing.

    ``cpu_engine=False`` here: the note must come from the log's own ``backend=gloo`` line too.
    """
    env = dict(BUILTIN_PROFILES["ring-ll"].env)
    check = check_server_log("ring-ll", env, LOGS / log, cpu_engine=False)
    assert statuses(check) == {"NCCL_ALGO": NOT_SEEN, "NCCL_PROTO": NOT_SEEN}
    assert CPU_ENGINE_NOTE in check.notes


def test_profile_without_nccl_variables_and_an_unreadable_log(tmp_path: Path) -> None:
    # on the CPU engine too: the gloo note would only repeat that there is nothing to see
    default = check_server_log("default", {}, LOGS / "vllm_cpu_tp1_gloo.log", cpu_engine=True)
    assert default.variables == ()
    assert default.notes == ("the profile sets no NCCL_*/CUDA_* variable: nothing to check",)
    missing = tmp_path / "server.log"
    check = check_server_log("ring-ll", {"NCCL_PROTO": "LL"}, missing, cpu_engine=True)
    assert check.variables == ()
    assert check.error == f"cannot read the server log {missing}: No such file or directory"


def _report(checks: list[object]) -> object:
    facts = [ProfileFacts(c.profile, profile_env={}, nccl_debug=c) for c in checks]  # type: ignore[attr-defined]
    return build_session_report(results=[], reference_profile="default", profiles=facts, deployment={"name": "x"},
                                fingerprint=None, created_at="2026-01-02T03:04:05Z", generator="test")


def test_reports_show_the_verdicts_and_quiet_keeps_only_mismatches() -> None:
    tuned = check_server_log("ring-ll-tuned", TUNED, LOGS / "nccl_tp2_ring_ll_tuned.log", cpu_engine=False)
    tree = check_server_log("tree-ll", TREE,
                            LOGS / "nccl_tp2_ring_ll_tuned.log", cpu_engine=False)
    report = _report([tuned, tree])
    lines = render_summary(report, verbosity=0)  # type: ignore[arg-type]
    texts = [line.text for line in lines]
    assert texts[0] == "kimiperf: NCCL variables in the server logs (--kimiperf-nccl-debug)" and lines[0].sep == "="
    # one column width across profiles, set by the widest variable of any of them
    assert "    NCCL_ALGO=Tree                 seen with a different value: Ring" in texts
    assert "    NCCL_BUFFSIZE=16777216         applied" in texts
    marked = {line.text.split()[0]: dict(line.markup) for line in lines if line.text.startswith("    NCCL_")}
    assert marked["NCCL_ALGO=Tree"] == {"red": True} and marked["NCCL_PROTO=LL"] == {"green": True}
    quiet = [line.text for line in render_summary(report, verbosity=-1)]  # type: ignore[arg-type]
    assert [t for t in quiet if t.startswith("    ")] == ["    NCCL_ALGO=Tree  seen with a different value: Ring"]
    markdown = render_markdown(report)  # type: ignore[arg-type]
    assert "| `tree-ll` | `NCCL_ALGO` | `Tree` | `Ring` | **seen with a different value: Ring** |" in markdown
    assert "| `ring-ll-tuned` | `CUDA_DEVICE_MAX_CONNECTIONS` | `1` |  | not seen in the log |" in markdown
    data = build_json_report(report)  # type: ignore[arg-type]
    assert data["profiles"]["tree-ll"]["nccl_debug"]["variables"]["NCCL_ALGO"] == {
        "expected": "Tree", "status": DIFFERENT, "logged": "Ring", "message": f"{DIFFERENT}: Ring"}
    assert report.warnings() == [(  # type: ignore[attr-defined]
        "NCCL profile tree-ll: NCCL_ALGO=Tree did not take effect, NCCL logged NCCL_ALGO=Ring "
        f"({LOGS / 'nccl_tp2_ring_ll_tuned.log'})")]


def test_nccls_per_process_files_are_read_instead_of_the_log_and_the_matrix_shows_use(tmp_path: Path) -> None:
    import shutil

    for name in ("server-tiny-gpu-tree-ll.nccl.gpu-node.4711", "server-tiny-gpu-tree-ll.nccl.gpu-node.4712"):
        shutil.copy(LOGS / "tree_ll_debug_files" / name, tmp_path / name)
    log = tmp_path / "server-tiny-gpu-tree-ll.log"
    log.write_text("(Worker_TP0 pid=4711) INFO NCCL_ALGO set by environment to allre\n")  # a torn line
    check = check_server_log("tree-ll", dict(BUILTIN_PROFILES["tree-ll"].env), log, cpu_engine=False)
    assert statuses(check) == {"NCCL_ALGO": APPLIED, "NCCL_PROTO": APPLIED}
    assert check.notes == (
        f"read from NCCL's 2 per-process debug file(s) {tmp_path}/server-tiny-gpu-tree-ll.nccl.*",
        "NCCL's enabled algorithm/protocol matrix (rank 0) is what the profile asks for: the setting was read",
    )
    ring = check_server_log("ring-ll", dict(BUILTIN_PROFILES["ring-ll"].env), log, cpu_engine=False)
    assert "differs from the profile: " in ring.notes[1] and "AllReduce algorithm: NCCL enabled Tree" in ring.notes[1]


# -- through the plugin ----------------------------------------------------------------------------

SERVER_TEST = """
def test_server(kimiperf_server):
    assert kimiperf_server.base_url
"""


@pytest.mark.usefixtures("isolated_state")
def test_plugin_reads_the_stub_servers_nccl_lines(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml(extra_args=("--nccl-lines", "--nccl-log-value", "NCCL_ALGO=Tree")))
    pytester.makepyfile(test_srv=SERVER_TEST)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                           "--kimiperf-nccl-debug", "--kimiperf-json", "r.json", timeout=120)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "*kimiperf: NCCL variables in the server logs (--kimiperf-nccl-debug)*",
        "  default (log: *server-stub-default.log)",
        "    note: the profile sets no NCCL_*/CUDA_* variable: nothing to check",
        "  ring-ll (log: *server-stub-ring-ll.log)",
        "    NCCL_ALGO=Ring  seen with a different value: Tree",
        "    NCCL_PROTO=LL   applied",
    ])
    data = json.loads((pytester.path / "r.json").read_text())
    variables = data["profiles"]["ring-ll"]["nccl_debug"]["variables"]
    assert {var: v["status"] for var, v in variables.items()} == {"NCCL_ALGO": DIFFERENT, "NCCL_PROTO": APPLIED}
    assert data["profiles"]["default"]["nccl_debug"]["variables"] == {}
    # NCCL writes one line-buffered file per process beside the server log (issue 23 item 4).
    server_env = data["profiles"]["ring-ll"]["server_env"]
    assert server_env["NCCL_DEBUG"] == "INFO"
    assert server_env["NCCL_DEBUG_FILE"].endswith("/server-stub-ring-ll.nccl.%h.%p")


@pytest.mark.usefixtures("isolated_state")
def test_plugin_under_xdist_says_not_seen_for_an_engine_without_nccl(pytester: pytest.Pytester,
                                                                    stub_project) -> None:
    """The stub without --nccl-lines is a CPU engine: no NCCL line; the record comes from a worker."""
    pytest.importorskip("xdist")
    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_srv=SERVER_TEST)
    result = pytester.runpytest_subprocess("-n", "2", "--deployment", "stub", "--nccl-profile", "ring-ll",
                                           "--kimiperf-nccl-debug", "--kimiperf-json", "r.json", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*kimiperf: NCCL variables in the server logs (--kimiperf-nccl-debug)*",
        "    NCCL_ALGO=Ring  not seen in the log",
        "    NCCL_PROTO=LL   not seen in the log",
        "    note: the CPU engine (vllm-cpu) runs its collectives on gloo, not NCCL, so no NCCL variable*",
    ])
    check = json.loads((pytester.path / "r.json").read_text())["profiles"]["ring-ll"]["nccl_debug"]
    assert check["log_path"].endswith("server-stub-ring-ll.log") and CPU_ENGINE_NOTE in check["notes"]


@pytest.mark.usefixtures("isolated_state")
def test_without_nccl_debug_there_is_no_verdict(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml(extra_args=("--nccl-lines",)))
    pytester.makepyfile(test_srv=SERVER_TEST)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "ring-ll",
                                           "--kimiperf-json", "r.json", timeout=120)
    result.assert_outcomes(passed=1)
    assert "--kimiperf-nccl-debug" not in result.stdout.str()
    assert json.loads((pytester.path / "r.json").read_text())["profiles"]["ring-ll"]["nccl_debug"] is None
