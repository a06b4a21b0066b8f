"""Unit tests for pytest_kimiperf.config.nccl: profiles, validation, selection, env and log checks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.nccl.debug_log import (
    NCCL_DEBUG_ENV,
    applied_status,
    debug_file_lines,
    debug_files,
    matrix_status,
    nccl_debug_env,
    parse_enabled_matrix,
    parse_nccl_env_lines,
)
from pytest_kimiperf.config.nccl.profiles import (
    BUILTIN_PROFILES,
    NcclProfile,
    describe_env,
    inherited_nccl_env,
    profile_server_env,
    resolve_profiles,
    select_profiles,
)
from pytest_kimiperf.config.nccl.values import (
    KNOWN_NCCL_VARIABLES,
    VLLM_COLLECTIVES,
    enabled_choices,
    validate_profile,
)
from tests import helpers

LOGS = helpers.DATA / "nccl_logs"
TABLE = "pyproject.toml [tool.kimiperf.profiles]"


def _profile(env: dict[str, str], name: str = "probe") -> NcclProfile:
    return NcclProfile(name, "test profile", env, source="test")


def _log_lines(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8").splitlines(keepends=True)


# ------------------------------------------------------------------------------------------
# Profiles and built-ins
# ------------------------------------------------------------------------------------------


def test_builtins_are_the_specified_set() -> None:
    assert {name: dict(p.env) for name, p in BUILTIN_PROFILES.items()} == {
        "default": {},
        "ring-ll": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
        "ring-simple": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
        "tree-ll": {"NCCL_ALGO": "allreduce:Tree", "NCCL_PROTO": "LL"},
        "tree-simple": {"NCCL_ALGO": "allreduce:Tree", "NCCL_PROTO": "Simple"},
        "ring-ll-tuned": {
            "NCCL_PROTO": "LL",
            "NCCL_ALGO": "Ring",
            "NCCL_MAX_NCHANNELS": "16",
            "NCCL_BUFFSIZE": "16777216",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        "p2p-off": {"NCCL_P2P_DISABLE": "1"},
    }
    for profile in BUILTIN_PROFILES.values():
        assert profile.source == "built-in"
        assert profile.description and "\n" not in profile.description


@pytest.mark.parametrize("pcie_only", [True, False, None])
def test_builtins_validate_without_warnings_but_the_tree_profiles_version_note(pcie_only: bool | None) -> None:
    for profile in BUILTIN_PROFILES.values():
        warnings = validate_profile(profile, pcie_only=pcie_only)
        if profile.name.startswith("tree-"):
            # NCCL_ALGO=allreduce:Tree: the per-collective form, which NCCL before 2.24 misreads.
            assert len(warnings) == 1 and "needs NCCL 2.24+" in warnings[0], warnings
        else:
            assert warnings == [], profile.name


def test_profile_is_frozen_hashable_and_detached_from_the_callers_dict() -> None:
    env = {"NCCL_PROTO": "LL"}
    profile = NcclProfile("p", "d", env)
    env["NCCL_PROTO"] = "Simple"
    assert profile.env["NCCL_PROTO"] == "LL"
    with pytest.raises(TypeError):
        profile.env["NCCL_PROTO"] = "Simple"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.name = "q"  # type: ignore[misc]
    same = NcclProfile("p", "d", {"NCCL_PROTO": "LL"})
    assert profile == same and len({profile, same}) == 1
    assert profile != NcclProfile("p", "d", {"NCCL_PROTO": "Simple"})


def test_nccl_debug_env_is_info_and_read_only() -> None:
    assert dict(NCCL_DEBUG_ENV) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,TUNING"}
    with pytest.raises(TypeError):
        NCCL_DEBUG_ENV["NCCL_DEBUG"] = "WARN"  # type: ignore[index]


# ------------------------------------------------------------------------------------------
# --kimiperf-nccl-debug: one file per process, and NCCL's enabled matrix (issue 23 item 4)
# ------------------------------------------------------------------------------------------

TREE_FILES = LOGS / "tree_ll_debug_files"


def test_nccl_debug_writes_one_file_per_process_beside_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server-kimi-tree-ll.log"
    assert nccl_debug_env(log) == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,TUNING",
                                   "NCCL_DEBUG_FILE": f"{tmp_path}/server-kimi-tree-ll.nccl.%h.%p"}
    # Each boot's files go with that boot's log only.
    for name in ("server-kimi-tree-ll.nccl.gpu-node.11", "server-kimi-tree-ll-boot2.nccl.gpu-node.12"):
        (tmp_path / name).write_text("")
    assert [f.name for f in debug_files(log)] == ["server-kimi-tree-ll.nccl.gpu-node.11"]
    assert [f.name for f in debug_files(tmp_path / "server-kimi-tree-ll-boot2.log")] == [
        "server-kimi-tree-ll-boot2.nccl.gpu-node.12"]


def test_the_per_process_files_show_each_value_and_the_matrix_shows_it_was_used() -> None:
    files = debug_files(TREE_FILES / "server-tiny-gpu-tree-ll.log")
    assert len(files) == 2
    tree_ll = BUILTIN_PROFILES["tree-ll"].env
    logged = parse_nccl_env_lines(debug_file_lines(files))
    assert logged == {"NCCL_PROTO": "LL", "NCCL_ALGO": "allreduce:Tree"}
    assert applied_status(tree_ll, logged) == {"NCCL_ALGO": "applied", "NCCL_PROTO": "applied"}
    matrix = parse_enabled_matrix(debug_file_lines(files))
    assert matrix is not None and set(matrix) == {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"}
    assert matrix["AllReduce"] == {"LL": 1, "LL128": 0, "Simple": 0, "Tree": 1, "Ring": 0, "CollNetDirect": 0,
                                   "CollNetChain": 0, "NVLS": 0, "NVLSTree": 0, "PAT": 0}
    assert matrix_status(tree_ll, matrix) == []
    wrong = matrix_status(BUILTIN_PROFILES["ring-ll"].env, matrix)
    assert len(wrong) == 5 and "AllReduce algorithm: NCCL enabled Tree, the profile asks for Ring" in wrong
    assert parse_enabled_matrix(_log_lines("nccl_tp2_ring_ll_tuned.log")) is None  # no matrix: None


def test_a_shared_stdout_splits_lines_where_the_per_process_files_do_not() -> None:
    # NCCL's stdout is block-buffered (debug.cc v2.28.9-1 lines 34 and 385): two ranks' 4 KiB
    # blocks land in the server log one after the other, the boundary anywhere in a line.
    rank0, rank1 = (f.read_text() for f in debug_files(TREE_FILES / "server-tiny-gpu-tree-ll.log"))
    cut = rank0.index("allreduce:Tree") + len("allre")
    shared = rank0[:cut] + rank1 + rank0[cut:]
    # The value regex takes rank 1's text as rank 0's value (the review's prediction).
    assert parse_nccl_env_lines(shared.splitlines(keepends=True))["NCCL_ALGO"] == (
        "allregpu-node:4712:4712 [1] NCCL INFO cudaDriverVersion 12090 | allreduce:Tree")
    assert parse_nccl_env_lines(debug_file_lines(debug_files(TREE_FILES / "server-tiny-gpu-tree-ll.log")))[
        "NCCL_ALGO"] == "allreduce:Tree"


def test_module_does_not_import_pytest() -> None:
    code = (
        "import sys, pytest_kimiperf.config.nccl.profiles, pytest_kimiperf.config.nccl.values, "
        "pytest_kimiperf.config.nccl.debug_log; sys.exit('pytest' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=helpers.ROOT, timeout=60)
    assert done.returncode == 0


# ------------------------------------------------------------------------------------------
# resolve_profiles
# ------------------------------------------------------------------------------------------


def test_user_profile_converts_ints_and_records_its_table() -> None:
    profiles = resolve_profiles(
        {"mine": {"description": "eight channels", "env": {"NCCL_MAX_NCHANNELS": 8, "OMP_NUM_THREADS": "4"}}},
        TABLE,
    )
    mine = profiles["mine"]
    assert dict(mine.env) == {"NCCL_MAX_NCHANNELS": "8", "OMP_NUM_THREADS": "4"}
    assert mine.source == "pyproject.toml [tool.kimiperf.profiles.mine]"
    assert mine.description == "eight channels"
    assert list(profiles)[: len(BUILTIN_PROFILES)] == list(BUILTIN_PROFILES)


def test_empty_table_gives_the_builtins() -> None:
    assert resolve_profiles({}, TABLE) == dict(BUILTIN_PROFILES)


def test_extends_chain_merges_parent_first_child_wins() -> None:
    profiles = resolve_profiles(
        {
            "leaf": {"extends": "mid", "env": {"NCCL_PROTO": "Simple"}},
            "mid": {"extends": "ring-ll-tuned", "env": {"NCCL_MAX_NCHANNELS": 8, "NCCL_NTHREADS": 256}},
        },
        TABLE,
    )
    assert dict(profiles["leaf"].env) == {
        "NCCL_PROTO": "Simple",
        "NCCL_ALGO": "Ring",
        "NCCL_MAX_NCHANNELS": "8",
        "NCCL_BUFFSIZE": "16777216",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_NTHREADS": "256",
    }
    # Without a description a profile says what it adds to what.
    assert profiles["leaf"].description == "mid + NCCL_PROTO=Simple"
    assert profiles["mid"].description == "ring-ll-tuned + NCCL_MAX_NCHANNELS=8 NCCL_NTHREADS=256"


def test_redefined_builtin_replaces_it_in_place_and_is_what_children_extend() -> None:
    profiles = resolve_profiles(
        {
            "ring-ll": {
                "description": "site ring-ll",
                "env": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL,Simple"},
            },
            "child": {"extends": "ring-ll", "env": {"NCCL_NTHREADS": 128}},
        },
        TABLE,
    )
    assert list(profiles) == [*BUILTIN_PROFILES, "child"]
    assert profiles["ring-ll"].source == "pyproject.toml [tool.kimiperf.profiles.ring-ll]"
    assert profiles["ring-ll"].env["NCCL_PROTO"] == "LL,Simple"
    assert profiles["child"].env["NCCL_PROTO"] == "LL,Simple"
    assert BUILTIN_PROFILES["ring-ll"].env["NCCL_PROTO"] == "LL"


@pytest.mark.parametrize(
    ("tables", "chain"),
    [
        ({"a": {"extends": "b"}, "b": {"extends": "c"}, "c": {"extends": "a"}}, "a -> b -> c -> a"),
        ({"a": {"extends": "a"}}, "a -> a"),
        ({"ring-ll": {"extends": "ring-ll"}}, "ring-ll -> ring-ll"),
        # x is outside the cycle: the message names the cycle, not x
        ({"x": {"extends": "a"}, "a": {"extends": "b"}, "b": {"extends": "a"}}, "'a' (from"),
    ],
)
def test_extends_cycle_names_the_chain(tables: dict[str, dict[str, object]], chain: str) -> None:
    with pytest.raises(ConfigError, match="extends cycle") as excinfo:
        resolve_profiles(tables, TABLE)
    assert chain in str(excinfo.value)
    assert "pyproject.toml [tool.kimiperf.profiles." in str(excinfo.value)


def test_extends_unknown_parent_names_chain_and_known_profiles() -> None:
    with pytest.raises(ConfigError) as excinfo:
        resolve_profiles({"a": {"extends": "b"}, "b": {"extends": "ring-lll"}}, TABLE)
    message = str(excinfo.value)
    assert "unknown profile 'ring-lll'" in message
    assert "a -> b -> ring-lll" in message
    assert "did you mean 'ring-ll'" in message
    for name in BUILTIN_PROFILES:
        assert name in message


@pytest.mark.parametrize(
    ("tables", "fragments"),
    [
        ({"a": {"envs": {}}}, ["unknown key 'envs'", "description, env, args, extends", "did you mean 'env'"]),
        ({"a": "NCCL_PROTO=LL"}, ["must be a table"]),
        ({"a": {"env": "NCCL_PROTO=LL"}}, ["env must be a table"]),
        ({"a": {"env": {"NCCL_P2P_DISABLE": True}}}, ["NCCL_P2P_DISABLE", "bool", "1/0"]),
        ({"a": {"env": {"NCCL_BUFFSIZE": 4.5}}}, ["NCCL_BUFFSIZE", "float", "string or an integer"]),
        ({"a": {"env": {"NCCL_PROTO": ["LL"]}}}, ["NCCL_PROTO", "list"]),
        ({"a": {"env": {"1NCCL": "x"}}}, ["'1NCCL' is not a valid environment variable name"]),
        ({"a": {"env": {"NCCL-PROTO": "LL"}}}, ["'NCCL-PROTO' is not a valid environment variable name"]),
        ({"a": {"description": ""}}, ["description must be a non-empty string"]),
        ({"a": {"description": 3}}, ["description must be a non-empty string"]),
        ({"a": {"extends": 3}}, ["extends must be the name of another profile"]),
        ({"all": {}}, ["'all'", "reserved"]),
        ({"../etc": {}}, ["invalid profile name '../etc'"]),
        ({"": {}}, ["invalid profile name ''"]),
    ],
)
def test_bad_tables_are_config_errors(tables: dict[str, object], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as excinfo:
        resolve_profiles(tables, TABLE)  # type: ignore[arg-type]
    for fragment in fragments:
        assert fragment in str(excinfo.value)
    assert "pyproject.toml [tool.kimiperf.profiles" in str(excinfo.value)


def test_profiles_table_that_is_not_a_table() -> None:
    with pytest.raises(ConfigError, match=r"must be a table of profiles"):
        resolve_profiles(["ring-ll"], TABLE)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# validate_profile: one rule at a time
# ------------------------------------------------------------------------------------------

GOOD_VALUES = [
    ("NCCL_PROTO", "LL"),
    ("NCCL_PROTO", "ll"),
    ("NCCL_PROTO", "LL,Simple"),
    ("NCCL_PROTO", "^LL128"),
    ("NCCL_PROTO", "LL128"),  # fine when the hardware is unknown (pcie_only=None)
    ("NCCL_ALGO", "Ring"),
    ("NCCL_ALGO", "Ring,tree"),
    ("NCCL_ALGO", "^Tree"),
    ("NCCL_ALGO", "Ring,CollnetDirect,CollnetChain,NVLS,NVLSTree,PAT"),
    ("NCCL_MIN_NCHANNELS", "1"),
    ("NCCL_MIN_NCHANNELS", "32"),
    ("NCCL_MAX_NCHANNELS", "1"),
    ("NCCL_MAX_NCHANNELS", "64"),
    ("NCCL_MIN_CTAS", "1"),
    ("NCCL_MAX_CTAS", "64"),
    ("NCCL_BUFFSIZE", "4194304"),
    ("NCCL_BUFFSIZE", "1024"),
    ("NCCL_NTHREADS", "64"),
    ("NCCL_NTHREADS", "128"),
    ("NCCL_NTHREADS", "256"),
    ("NCCL_NTHREADS", "512"),
    *[("NCCL_P2P_LEVEL", level) for level in ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS", "0", "4")],
    *[
        (var, flag)
        for var in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")
        for flag in ("0", "1")
    ],
    ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "32"),
    # Known but not value-checked, and non-NCCL variables: accepted as they are.
    ("NCCL_SOCKET_IFNAME", "=eth0"),
    ("NCCL_DEBUG_SUBSYS", "INIT,ENV"),
    ("NCCL_IB_HCA", "^=mlx5_1"),
    ("NCCL_CUMEM_ENABLE", "0"),
    ("NCCL_DEBUG", "INFO"),
    ("VLLM_ALLREDUCE_USE_SYMM_MEM", "0"),
    ("OMP_NUM_THREADS", "4"),
    ("CUDA_VISIBLE_DEVICES", "0,1"),
]


@pytest.mark.parametrize(("var", "value"), GOOD_VALUES)
def test_good_values_pass_without_warnings(var: str, value: str) -> None:
    assert validate_profile(_profile({var: value}), pcie_only=None) == []


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("NCCL_PROTO", "Simple;allreduce:LL"),
        ("NCCL_PROTO", "^LL128;allreduce:LL"),
        ("NCCL_ALGO", "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"),
        ("NCCL_ALGO", "allreduce:^tree"),
        ("NCCL_ALGO", "AllGather:Ring;ReduceScatter:Ring"),
    ],
)
def test_per_collective_form_is_accepted_with_a_version_warning(var: str, value: str) -> None:
    warnings = validate_profile(_profile({var: value}), pcie_only=None)
    assert len(warnings) == 1
    assert "NCCL 2.24+" in warnings[0] and var in warnings[0]


BAD_VALUES = [
    ("NCCL_PROTO", "LL256", ["unknown protocol 'LL256'", "did you mean 'LL128'", "LL, LL128, Simple"]),
    ("NCCL_PROTO", "Ring", ["unknown protocol 'Ring'"]),
    ("NCCL_PROTO", "", ["empty list"]),
    ("NCCL_PROTO", "LL, Simple", ["' Simple'", "does not strip spaces"]),
    ("NCCL_PROTO", "allreduce:LL;LL", ["entry 'LL' has no 'function:' prefix", "first entry"]),
    ("NCCL_PROTO", ";LL", ["no 'function:' prefix"]),
    ("NCCL_PROTO", "allgathr:LL", ["unknown collective 'allgathr'", "did you mean 'AllGather'"]),
    ("NCCL_PROTO", "allreduce:", ["lists no protocol"]),
    ("NCCL_PROTO", "allreduce:LL:Simple", ["more than one ':'"]),
    ("NCCL_ALGO", "Collnet", ["unknown algorithm 'Collnet'", "CollnetDirect"]),
    ("NCCL_ALGO", "Rings", ["did you mean 'Ring'"]),
    ("NCCL_ALGO", "LL", ["unknown algorithm 'LL'"]),
    ("NCCL_MIN_NCHANNELS", "0", ["positive decimal integer"]),
    ("NCCL_MIN_NCHANNELS", "33", ["out of range", "1-32"]),
    ("NCCL_MIN_NCHANNELS", "-1", ["positive decimal integer"]),
    ("NCCL_MIN_NCHANNELS", "08", ["octal"]),
    ("NCCL_MAX_NCHANNELS", "0", ["positive decimal integer"]),
    ("NCCL_MAX_NCHANNELS", "16M", ["silently dropped"]),
    ("NCCL_MAX_NCHANNELS", " 4", ["positive decimal integer"]),
    ("NCCL_MIN_CTAS", "65", ["1-64"]),
    ("NCCL_MAX_CTAS", "0", ["positive decimal integer"]),
    ("NCCL_BUFFSIZE", "0", ["positive decimal integer"]),
    ("NCCL_BUFFSIZE", "4MiB", ["positive decimal integer"]),
    ("NCCL_BUFFSIZE", "0x400000", ["positive decimal integer"]),
    ("NCCL_BUFFSIZE", "1.5", ["positive decimal integer"]),
    ("NCCL_NTHREADS", "32", ["64, 128, 256, 512"]),
    ("NCCL_NTHREADS", "1024", ["64, 128, 256, 512"]),
    ("NCCL_NTHREADS", "500", ["64, 128, 256, 512"]),
    ("NCCL_P2P_LEVEL", "pix", ["case-sensitive", "LOC, NVL, PIX, PXB, PHB, SYS"]),
    ("NCCL_P2P_LEVEL", "NVLINK", ["LOC, NVL, PIX, PXB, PHB, SYS", "0-4"]),
    ("NCCL_P2P_LEVEL", "5", ["0-4"]),
    ("NCCL_P2P_DISABLE", "2", ["0 or 1"]),
    ("NCCL_P2P_DISABLE", "true", ["0 or 1"]),
    ("NCCL_SHM_DISABLE", "on", ["0 or 1"]),
    ("NCCL_IB_DISABLE", "", ["0 or 1"]),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "0", ["positive decimal integer"]),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "33", ["1-32"]),
]


@pytest.mark.parametrize(("var", "value", "fragments"), BAD_VALUES)
def test_bad_values_name_profile_variable_value_and_what_is_allowed(
    var: str, value: str, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        validate_profile(_profile({var: value}, name="site-x"), pcie_only=None)
    message = str(excinfo.value)
    assert "'site-x'" in message and "(from test)" in message
    assert f"{var}={value!r}" in message
    for fragment in fragments:
        assert fragment in message


# ------------------------------------------------------------------------------------------
# Every collective vLLM runs keeps an algorithm (issue 23 item 1)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pcie_only", [None, True, False])
def test_a_bare_tree_is_rejected_because_nccl_has_no_tree_allgather(pcie_only: bool | None) -> None:
    # tuning.cc v2.28.9-1 lines 273-277: AllGather runs on Ring, CollnetDirect, NVLS or PAT only.
    with pytest.raises(ConfigError) as excinfo:
        validate_profile(_profile({"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}, name="old-tree"), pcie_only=pcie_only)
    message = str(excinfo.value)
    assert "'old-tree' (from test)" in message and "NCCL_ALGO='Tree'" in message
    assert "leaves AllGather with no algorithm/protocol" in message
    assert "AllGather with Ring, CollnetDirect, NVLS, PAT only" in message
    assert "NCCL_ALGO='allreduce:Tree'" in message


def test_the_builtin_tree_profiles_keep_ring_for_the_logits_allgather_on_a_pcie_node() -> None:
    for name, protocol in (("tree-ll", "LL"), ("tree-simple", "Simple")):
        profile = BUILTIN_PROFILES[name]
        choices = enabled_choices(profile.env, pcie_only=True)
        assert choices["AllReduce"] == [("Tree", protocol)]
        assert choices["AllGather"] == [("Ring", protocol)]
        (warning,) = validate_profile(profile, pcie_only=True)
        assert "NCCL 2.24+" in warning


def test_every_builtin_profile_leaves_each_collective_an_algorithm_on_a_pcie_node() -> None:
    for profile in BUILTIN_PROFILES.values():
        choices = enabled_choices(profile.env, pcie_only=True)
        assert all(choices[f] for f in choices), (profile.name, choices)
    assert set(VLLM_COLLECTIVES) == {"AllReduce", "AllGather"}


@pytest.mark.parametrize(
    ("env", "pcie_only", "collective"),
    [
        ({"NCCL_ALGO": "PAT"}, None, "AllReduce"),  # PAT has no AllReduce (tuning.cc line 277)
        ({"NCCL_ALGO": "NVLS", "NCCL_PROTO": "LL"}, None, "AllGather and AllReduce"),  # NVLS: Simple only
        ({"NCCL_ALGO": "NVLS"}, True, "AllGather and AllReduce"),  # no NVSwitch on a PCIe node
        ({"NCCL_ALGO": "Ring;allgather:PAT"}, True, "AllGather"),  # PAT: one GPU per node
        ({"NCCL_ALGO": "allgather:^Ring"}, True, "AllGather"),
        ({"NCCL_PROTO": "LL128"}, None, None),  # forced LL128 still runs Ring: no error
    ],
)
def test_a_list_that_starves_a_collective_vllm_runs_is_an_error(
    env: dict[str, str], pcie_only: bool | None, collective: str | None
) -> None:
    if collective is None:
        validate_profile(_profile(env), pcie_only=pcie_only)
        return
    with pytest.raises(ConfigError, match=f"leaves {collective} with no algorithm/protocol"):
        validate_profile(_profile(env), pcie_only=pcie_only)


def test_starving_a_collective_vllm_does_not_run_is_only_a_warning() -> None:
    warnings = validate_profile(_profile({"NCCL_ALGO": "Tree;allgather:Ring;allreduce:Ring"}), pcie_only=True)
    starved = [w for w in warnings if "no algorithm/protocol" in w]
    assert [w.split(" leaves ")[1].split(" ")[0] for w in starved] == ["Broadcast", "Reduce", "ReduceScatter"]
    assert all("vLLM does not run it" in w for w in starved)


@pytest.mark.parametrize(
    ("low", "high"), [("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS"), ("NCCL_MIN_CTAS", "NCCL_MAX_CTAS")]
)
def test_minimum_above_maximum_is_an_error(low: str, high: str) -> None:
    with pytest.raises(ConfigError, match=f"{low}=16 is above {high}=8"):
        validate_profile(_profile({low: "16", high: "8"}), pcie_only=None)
    assert validate_profile(_profile({low: "8", high: "8"}), pcie_only=None) == []


def test_buffsize_not_a_power_of_two_warns() -> None:
    warnings = validate_profile(_profile({"NCCL_BUFFSIZE": "3000000"}), pcie_only=None)
    assert len(warnings) == 1 and "NCCL_BUFFSIZE=3000000 is not a power of two" in warnings[0]


def test_p2p_level_with_p2p_disabled_warns() -> None:
    warnings = validate_profile(_profile({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "PXB"}), pcie_only=True)
    assert len(warnings) == 1 and "NCCL_P2P_LEVEL=PXB has no effect" in warnings[0]
    assert (
        validate_profile(_profile({"NCCL_P2P_DISABLE": "0", "NCCL_P2P_LEVEL": "PXB"}), pcie_only=True) == []
    )


def test_misspelled_nccl_variable_warns_with_the_closest_name() -> None:
    warnings = validate_profile(_profile({"NCCL_PROTOCOL": "LL"}), pcie_only=None)
    assert len(warnings) == 1
    assert "NCCL_PROTOCOL" in warnings[0] and "did you mean 'NCCL_PROTO'" in warnings[0]


def test_unknown_nccl_variable_without_close_match_still_warns() -> None:
    warnings = validate_profile(_profile({"NCCL_ZZZZZZZZZZZZZZZZZZ": "1"}), pcie_only=None)
    assert len(warnings) == 1 and "no close match" in warnings[0]


def test_lowercase_nccl_name_warns_that_names_are_case_sensitive() -> None:
    warnings = validate_profile(_profile({"nccl_proto": "LL"}), pcie_only=None)
    assert len(warnings) == 1
    assert "case-sensitive" in warnings[0] and "did you mean 'NCCL_PROTO'" in warnings[0]


@pytest.mark.parametrize(
    ("proto", "pcie_only", "forced"),
    [
        ("LL128", True, "every collective"),
        ("LL,LL128,Simple", True, "every collective"),
        ("^LL", True, "every collective"),  # '^' lists switch on whatever they do not name
        ("^LL128;allreduce:LL128", True, "AllReduce"),
        ("Simple;allreduce:^Simple", True, "AllReduce"),
        ("^LL128", True, None),
        ("LL", True, None),
        ("allreduce:^LL128", True, None),
        ("LL128", False, None),
        ("LL128", None, None),
    ],
)
def test_ll128_enabled_on_pcie_only_host_warns(
    proto: str, pcie_only: bool | None, forced: str | None
) -> None:
    warnings = [
        w
        for w in validate_profile(_profile({"NCCL_PROTO": proto}), pcie_only=pcie_only)
        if "LL128" in w and "corrupt" in w
    ]
    if forced is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and f"turns LL128 on ({forced})" in warnings[0]


def test_known_variable_list_holds_the_variables_the_rules_cover() -> None:
    ruled = {
        "NCCL_PROTO",
        "NCCL_ALGO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_CTAS",
        "NCCL_MAX_CTAS",
        "NCCL_BUFFSIZE",
        "NCCL_NTHREADS",
        "NCCL_P2P_LEVEL",
        "NCCL_P2P_DISABLE",
        "NCCL_SHM_DISABLE",
        "NCCL_IB_DISABLE",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_CUMEM_ENABLE",
        "NCCL_NVLS_ENABLE",
    }
    assert ruled <= KNOWN_NCCL_VARIABLES


# ------------------------------------------------------------------------------------------
# select_profiles
# ------------------------------------------------------------------------------------------


def test_selection_keeps_order_and_strips_spaces() -> None:
    chosen = select_profiles(" ring-ll , default,p2p-off ", BUILTIN_PROFILES, source="--nccl-profile")
    assert [p.name for p in chosen] == ["ring-ll", "default", "p2p-off"]


def test_all_selects_every_known_profile_in_order() -> None:
    known = resolve_profiles({"mine": {"env": {"NCCL_NTHREADS": 256}}}, TABLE)
    assert [p.name for p in select_profiles("all", known, source="--nccl-profile")] == list(known)


def test_unknown_profile_lists_every_known_profile_with_its_description() -> None:
    known = resolve_profiles({"mine": {"description": "site special", "env": {"NCCL_NTHREADS": 256}}}, TABLE)
    with pytest.raises(ConfigError) as excinfo:
        select_profiles("default,ring-l", known, source="ini nccl_profile")
    message = str(excinfo.value)
    assert "unknown profile 'ring-l' (from ini nccl_profile)" in message
    assert "did you mean 'ring-ll'" in message
    for profile in known.values():
        assert profile.name in message and profile.description in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty profile selection"),
        ("   ", "empty profile selection"),
        ("ring-ll,,default", "has an empty name"),
        ("ring-ll,ring-ll", "'ring-ll' is selected twice"),
        ("all,ring-ll", "mixes 'all' with names"),
    ],
)
def test_bad_selections_are_config_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        select_profiles(spec, BUILTIN_PROFILES, source="--nccl-profile")
    assert fragment in str(excinfo.value) and "--nccl-profile" in str(excinfo.value)


# ------------------------------------------------------------------------------------------
# Server environment and header text
# ------------------------------------------------------------------------------------------


def test_server_env_layers_profile_on_base_and_reports_changed_shell_values() -> None:
    base = {"PATH": "/usr/bin", "NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}
    env, overridden = profile_server_env(BUILTIN_PROFILES["ring-ll"], base)
    assert env == {"PATH": "/usr/bin", "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    assert overridden == {"NCCL_PROTO": ("Simple", "LL")}  # NCCL_ALGO had the same value
    env["PATH"] = "changed"
    assert base == {"PATH": "/usr/bin", "NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}


def test_server_env_does_not_touch_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    before = dict(os.environ)
    env, overridden = profile_server_env(BUILTIN_PROFILES["ring-ll-tuned"], os.environ)
    assert dict(os.environ) == before
    assert env["NCCL_ALGO"] == "Ring" and overridden == {"NCCL_PROTO": ("Simple", "LL")}


def test_inherited_nccl_env_lists_shell_variables_the_profile_leaves_alone() -> None:
    base = {"NCCL_PROTO": "LL128", "NCCL_IB_HCA": "mlx5", "CUDA_DEVICE_MAX_CONNECTIONS": "8", "PATH": "/bin"}
    assert inherited_nccl_env(BUILTIN_PROFILES["ring-ll"], base) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "8",
        "NCCL_IB_HCA": "mlx5",
    }
    assert inherited_nccl_env(BUILTIN_PROFILES["default"], base) == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "8",
        "NCCL_IB_HCA": "mlx5",
        "NCCL_PROTO": "LL128",
    }


def test_describe_env() -> None:
    assert describe_env(BUILTIN_PROFILES["default"]) == "(no overrides)"
    assert describe_env(BUILTIN_PROFILES["ring-ll"]) == "NCCL_ALGO=Ring NCCL_PROTO=LL"
    assert describe_env({"NCCL_PROTO": "^LL128;allreduce:LL"}) == "NCCL_PROTO='^LL128;allreduce:LL'"


# ------------------------------------------------------------------------------------------
# --kimiperf-nccl-debug: reading what NCCL logged
# ------------------------------------------------------------------------------------------


def test_two_rank_log_shows_ring_ll_tuned_applied_except_the_unlogged_cuda_variable() -> None:
    seen = parse_nccl_env_lines(_log_lines("nccl_tp2_ring_ll_tuned.log"))
    assert seen == {
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
    }
    assert applied_status(BUILTIN_PROFILES["ring-ll-tuned"].env, seen) == {
        "NCCL_PROTO": "applied",
        "NCCL_ALGO": "applied",
        "NCCL_MAX_NCHANNELS": "applied",
        "NCCL_BUFFSIZE": "applied",
        # NCCL never logs CUDA_* variables: the honest answer is "not seen".
        "CUDA_DEVICE_MAX_CONNECTIONS": "not seen in the log",
    }


def test_every_line_shape_is_read() -> None:
    assert parse_nccl_env_lines(_log_lines("nccl_line_prefixes.log")) == {
        "NCCL_BUFFSIZE": "8388608",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_PROTO": "^LL128;allreduce:LL",
        "NCCL_ALGO": "ring,tree",
        "NCCL_P2P_LEVEL": "PXB",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_COLLNET_ENABLE": "0",
        "NCCL_SOCKET_IFNAME": "=eth0",
        "NCCL_NTHREADS": "-2",  # "Invalid value ... using default -2."
        "NCCL_TOPO_DUMP_FILE": "/tmp/topo.xml",
    }


@pytest.mark.parametrize("log", ["vllm_cpu_tp1_gloo.log", "torch_gloo_nccl_debug_info.log"])
def test_cpu_engine_logs_have_no_nccl_lines_so_nothing_is_seen(log: str) -> None:
    text = (LOGS / log).read_text(encoding="utf-8")
    assert "backend=gloo" in text  # the recording is what it claims to be
    seen = parse_nccl_env_lines(text.splitlines())
    assert seen == {}
    profile_env = BUILTIN_PROFILES["ring-ll-tuned"].env
    assert applied_status(profile_env, seen) == {var: "not seen in the log" for var in profile_env}


def test_gloo_recording_was_made_with_nccl_debug_info() -> None:
    assert "NCCL_DEBUG=INFO" in (LOGS / "torch_gloo_nccl_debug_info.log").read_text(encoding="utf-8")


def test_ranks_that_disagree_are_all_reported() -> None:
    lines = [
        "gpu-node:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL\r\n",
        "gpu-node:2:2 [1] NCCL INFO NCCL_PROTO set by environment to Simple\n",
        "gpu-node:1:1 [0] NCCL INFO NCCL_PROTO set by environment to LL\n",
    ]
    seen = parse_nccl_env_lines(lines)
    assert seen == {"NCCL_PROTO": "LL | Simple"}
    assert applied_status({"NCCL_PROTO": "LL"}, seen) == {
        "NCCL_PROTO": "seen with a different value: LL | Simple"
    }


def test_lines_not_from_nccl_are_ignored() -> None:
    lines = [
        "host:1:1 [0] FLAGCX INFO FLAGCX_TOPO_FILE set by environment to /x\n",
        "NCCL_PROTO set by environment to LL\n",  # no "NCCL INFO": not NCCL's logger
        "(Worker pid=1) INFO 11-30 07:41:41 [parallel_state.py:1906] world_size=1 backend=gloo\n",
    ]
    assert parse_nccl_env_lines(lines) == {}


@pytest.mark.parametrize(
    ("var", "wanted", "logged", "status"),
    [
        ("NCCL_P2P_LEVEL", "2", "PXB", "applied"),  # ncclGetLevel logs legacy integers by name
        ("NCCL_P2P_LEVEL", "3", "PXB", "seen with a different value: PXB"),
        ("NCCL_BUFFSIZE", "16777216", "16777216", "applied"),
        ("NCCL_MAX_CTAS", "8", "16", "seen with a different value: 16"),  # e.g. vLLM's EPLB sets it
        ("NCCL_PROTO", "LL", "Simple", "seen with a different value: Simple"),
    ],
)
def test_applied_status_compares_like_nccl_logs(var: str, wanted: str, logged: str, status: str) -> None:
    assert applied_status({var: wanted}, {var: logged}) == {var: status}


def test_applied_status_covers_only_nccl_and_cuda_variables() -> None:
    env = {"NCCL_PROTO": "LL", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "4", "VLLM_X": "1"}
    assert set(applied_status(env, {})) == {"NCCL_PROTO", "CUDA_DEVICE_MAX_CONNECTIONS"}


# ------------------------------------------------------------------------------------------
# What NCCL ran: the TUNING lines (issue 48 item 4)
# ------------------------------------------------------------------------------------------

from pytest_kimiperf.config.nccl.debug_log import (  # noqa: E402
    TuningChoice,
    chosen_differently,
    describe_bytes,
    parse_tuning_lines,
    tuning_note,
)

TREE_LL = {"NCCL_ALGO": "allreduce:Tree", "NCCL_PROTO": "LL"}


def _tuning(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def test_tuning_lines_of_nccl_2_26_and_later_give_each_size_once() -> None:
    choices = parse_tuning_lines(_tuning("tuning_tree_ll_rank0_2.28.log"))
    assert choices == [
        TuningChoice("AllReduce", 8192, "TREE", "LL"),  # logged twice (two calls), kept once
        TuningChoice("AllReduce", 65536, "TREE", "LL"),
        TuningChoice("AllGather", 14336, "RING", "LL"),
        TuningChoice("AllReduce", 2097152, "RING", "SIMPLE"),
        TuningChoice("AllReduce", 4096, "symmetric kernel AllReduce_AGxLL_R", ""),
    ]


def test_tuning_lines_of_nccl_2_21_to_2_25_name_algorithms_by_number() -> None:
    assert parse_tuning_lines(_tuning("tuning_ring_ll_rank0_2.23_2.21.log")) == [
        TuningChoice("AllReduce", 8192, "RING", "LL"),
        TuningChoice("AllReduce", 4194304, "TREE", "SIMPLE"),
        TuningChoice("", 1048576, "RING", "SIMPLE"),
    ]


def test_where_nccl_ran_other_than_asked_each_size_says_so() -> None:
    choices = parse_tuning_lines(_tuning("tuning_tree_ll_rank0_2.28.log"))
    # AllGather is left to NCCL's algorithms by allreduce:Tree; LL applies to every collective.
    assert chosen_differently(TREE_LL, choices) == [
        "AllReduce: asked Tree/LL, NCCL chose RING/SIMPLE for 2 MiB",
        "AllReduce: asked Tree/LL, NCCL chose symmetric kernel AllReduce_AGxLL_R for 4 KiB",
    ]
    ring_ll = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    old = parse_tuning_lines(_tuning("tuning_ring_ll_rank0_2.23_2.21.log"))
    assert chosen_differently(ring_ll, old) == [
        "AllReduce: asked Ring/LL, NCCL chose TREE/SIMPLE for 4 MiB",
        "a collective: asked Ring/LL, NCCL chose RING/SIMPLE for 1 MiB",  # 2.21 names none: judged as AllReduce
    ]
    assert chosen_differently({"NCCL_MAX_NCHANNELS": "16"}, old) == []  # nothing asked, nothing differs


def test_the_tuning_note_says_what_ran_or_where_it_differs() -> None:
    lines = _tuning("tuning_tree_ll_rank0_2.28.log")
    assert tuning_note(TREE_LL, lines) == (
        "what NCCL ran (TUNING, rank 0) differs from the profile: AllReduce: asked Tree/LL, NCCL chose RING/SIMPLE "
        "for 2 MiB; AllReduce: asked Tree/LL, NCCL chose symmetric kernel AllReduce_AGxLL_R for 4 KiB")
    assert tuning_note(TREE_LL, lines[:6]) == (
        "what NCCL ran (TUNING, rank 0) is what the profile asks for: AllReduce 8 KiB: TREE/LL; AllReduce 64 KiB: "
        "TREE/LL; AllGather 14 KiB: RING/LL")
    assert tuning_note(TREE_LL, (TREE_FILES / "server-tiny-gpu-tree-ll.nccl.gpu-node.4711").read_text().splitlines()) is None


def test_sizes_read_in_binary_units_where_whole() -> None:
    assert [describe_bytes(n) for n in (8192, 2**20, 14336, 1536, 3 * 2**30)] == ["8 KiB", "1 MiB", "14 KiB", "1536 B", "3 GiB"]


def test_the_nccl_check_adds_what_ran_beside_what_was_read(tmp_path: Path) -> None:
    from pytest_kimiperf.reports.nccl import check_server_log

    for path in TREE_FILES.iterdir():
        (tmp_path / path.name).write_text(path.read_text())
    rank0 = tmp_path / "server-tiny-gpu-tree-ll.nccl.gpu-node.4711"
    rank0.write_text(rank0.read_text() + (LOGS / "tuning_tree_ll_rank0_2.28.log").read_text())
    check = check_server_log("tree-ll", TREE_LL, tmp_path / "server-tiny-gpu-tree-ll.log", cpu_engine=False)
    assert check.notes[-2] == ("NCCL's enabled algorithm/protocol matrix (rank 0) is what the profile asks for: "
                               "the setting was read")
    assert check.notes[-1].startswith("what NCCL ran (TUNING, rank 0) differs from the profile: AllReduce: asked "
                                      "Tree/LL, NCCL chose RING/SIMPLE for 2 MiB")
