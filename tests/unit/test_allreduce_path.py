"""vLLM's all-reduce path per boot, read from its log, and what an NCCL profile can reach.

Logs: tests/data/boot_logs/allreduce (built in vLLM 0.32's formats; the README there gives each
line's source) and the recorded CPU boot tests/data/nccl_logs/vllm_cpu_tp1_gloo.log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimiperf.server.allreduce_path import (
    AllReducePath,
    DecodeReach,
    Disabled,
    AllReduceRoute,
    BackendOffReason,
    decode_reach,
    predict_reach,
    read_all_reduce_path,
)
from tests import helpers

LOGS = helpers.DATA / "boot_logs" / "allreduce"
CPU_TP1 = helpers.DATA / "nccl_logs" / "vllm_cpu_tp1_gloo.log"
ALL_POTENTIAL = ("['FLASHINFER_PCIE_IPC', 'FLASHINFER', 'NCCL_SYMM_MEM', 'QUICK_REDUCE', 'AITER_CUSTOM', 'CUSTOM', "
                 "'SYMM_MEM', 'PYNCCL']")


def read(path: Path) -> AllReducePath | None:
    return read_all_reduce_path(path.read_text(encoding="utf-8").splitlines())


def backend_line(backends: str, group: str = "tp:0") -> str:
    # cuda_communicator.py:353 as the global first rank logs it
    return (f"(Worker pid=7) INFO 01-05 09:00:45 [cuda_communicator.py:353] Using {backends} all-reduce backends "
            f"(in dispatch order) for group '{group}' out of potential backends: {ALL_POTENTIAL}.")


def test_an_nvlink_boot_names_vllms_paths_before_pynccl() -> None:
    path = read(LOGS / "h100_tp8_nvlink.log")
    assert path == AllReducePath(tensor_parallel_size=8, device="cuda", custom_flag_off=False,
                                 backends=("FLASHINFER", "CUSTOM", "SYMM_MEM", "PYNCCL"), nccl_version="2.28.9")
    reach = decode_reach(path)
    assert reach == DecodeReach(AllReduceRoute.OTHER_PATH, 8, ("FLASHINFER", "CUSTOM", "SYMM_MEM"))
    assert reach.bypasses_nccl
    assert reach.switches == ("VLLM_ALLREDUCE_USE_FLASHINFER=0", "--disable-custom-all-reduce",
                              "VLLM_ALLREDUCE_USE_SYMM_MEM=0")


def test_the_flag_alone_leaves_flashinfer_and_symmetric_memory_before_nccl() -> None:
    path = read(LOGS / "h100_tp8_disable_custom.log")
    assert path is not None and path.custom_flag_off is True and path.why_off("CUSTOM") is BackendOffReason.FLAG
    reach = decode_reach(path)
    assert (reach.reach, reach.via, reach.custom_off) == (AllReduceRoute.OTHER_PATH, ("FLASHINFER", "SYMM_MEM"), BackendOffReason.FLAG)
    assert reach.switches == ("VLLM_ALLREDUCE_USE_FLASHINFER=0", "VLLM_ALLREDUCE_USE_SYMM_MEM=0")


def test_with_every_path_of_vllms_own_off_decode_reaches_nccl() -> None:
    reach = decode_reach(read(LOGS / "h100_tp8_nccl_only.log"))
    assert reach == DecodeReach(AllReduceRoute.NCCL, 8, (), custom_off=BackendOffReason.FLAG)
    assert not reach.bypasses_nccl and reach.switches == ()


def test_eight_pcie_only_gpus_say_why_each_path_is_off_once() -> None:
    path = read(LOGS / "rtx_pro_6000_tp8_pcie.log")
    assert path is not None
    assert path.backends == ("PYNCCL",)
    # every rank logs its warnings; each reason is kept once
    assert path.disabled == (Disabled("SYMM_MEM", BackendOffReason.CAPABILITY), Disabled("FLASHINFER", BackendOffReason.WORLD_SIZE),
                             Disabled("CUSTOM", BackendOffReason.PCIE_ONLY))
    assert decode_reach(path) == DecodeReach(AllReduceRoute.NCCL, 8, (), custom_off=BackendOffReason.PCIE_ONLY)


def test_every_reason_vllm_gives_is_read() -> None:
    path = read(LOGS / "disabled_reasons.log")
    assert path is not None
    assert [(d.backend, d.why) for d in path.disabled] == [
        ("CUSTOM", BackendOffReason.NO_LIBRARY), ("CUSTOM", BackendOffReason.WORLD_SIZE), ("CUSTOM", BackendOffReason.MULTI_NODE), ("CUSTOM", BackendOffReason.PCIE_ONLY),
        ("CUSTOM", BackendOffReason.NO_P2P),  # the second multi-node line (line 353) is the same fact as the first
        ("QUICK_REDUCE", BackendOffReason.NO_LIBRARY), ("QUICK_REDUCE", BackendOffReason.MULTI_NODE), ("QUICK_REDUCE", BackendOffReason.WORLD_SIZE),
        ("SYMM_MEM", BackendOffReason.NOT_CUDA), ("SYMM_MEM", BackendOffReason.CAPABILITY), ("SYMM_MEM", BackendOffReason.WORLD_SIZE),
        ("SYMM_MEM", BackendOffReason.INIT_FAILED), ("SYMM_MEM", BackendOffReason.NO_MULTICAST),
        ("FLASHINFER", BackendOffReason.NO_LIBRARY), ("FLASHINFER", BackendOffReason.NOT_CUDA), ("FLASHINFER", BackendOffReason.WORLD_SIZE),
        ("FLASHINFER", BackendOffReason.NO_BACKEND), ("FLASHINFER", BackendOffReason.NO_MULTICAST), ("FLASHINFER", BackendOffReason.INIT_FAILED),
    ]
    # every line is read on its own (two lines of one reason are one fact above)
    for line in LOGS.joinpath("disabled_reasons.log").read_text().splitlines():
        alone = read_all_reduce_path([line])
        assert alone is not None and len(alone.disabled) == 1, line


def test_one_rank_makes_no_communicator_and_reaches_nothing() -> None:
    gpu = read(LOGS / "h100_tp1.log")
    assert gpu == AllReducePath(tensor_parallel_size=1, device="cuda", custom_flag_off=False)
    assert decode_reach(gpu) == DecodeReach(AllReduceRoute.ONE_RANK, 1)
    recorded = read(CPU_TP1)  # the recorded CPU boot: one rank on the CPU engine
    assert recorded == AllReducePath(tensor_parallel_size=1, device="cpu", custom_flag_off=True)
    assert decode_reach(recorded).reach is AllReduceRoute.ONE_RANK and decode_reach(recorded).bypasses_nccl


def test_the_cpu_engine_at_two_ranks_runs_gloo() -> None:
    # the config line of the recorded CPU boot at tensor_parallel_size=2: CpuCommunicator logs no backend line
    line = CPU_TP1.read_text(encoding="utf-8").splitlines()[20].replace("tensor_parallel_size=1", "tensor_parallel_size=2")
    assert "[core.py:133]" in line
    reach = decode_reach(read_all_reduce_path([line]))
    assert (reach.reach, reach.tensor_parallel_size, reach.custom_off) == (AllReduceRoute.GLOO, 2, BackendOffReason.FLAG)


def test_only_the_tensor_parallel_groups_list_counts_and_nccls_symmetric_kernels_are_their_own_case() -> None:
    lines = [backend_line("['PYNCCL']", group="pp:0"), backend_line("['NCCL_SYMM_MEM', 'PYNCCL']")]
    path = read_all_reduce_path(lines)
    assert path == AllReducePath(backends=("NCCL_SYMM_MEM", "PYNCCL"))
    reach = decode_reach(path)
    assert (reach.reach, reach.switches) == (AllReduceRoute.NCCL_SYMMETRIC, ("VLLM_USE_NCCL_SYMM_MEM=0",))
    assert reach.bypasses_nccl  # NCCL runs them, but NCCL_ALGO / NCCL_PROTO do not choose its symmetric kernels
    empty = decode_reach(read_all_reduce_path([backend_line("[]")]))  # VLLM_DISABLE_PYNCCL: torch's NCCL all-reduce
    assert empty.reach is AllReduceRoute.NCCL


def test_custom_all_reduce_declines_every_all_reduce_above_eight_ranks() -> None:
    config = (LOGS / "h100_tp8_nvlink.log").read_text().splitlines()[0].replace("tensor_parallel_size=8",
                                                                                "tensor_parallel_size=16")
    path = read_all_reduce_path([config, backend_line("['CUSTOM', 'PYNCCL']")])
    assert decode_reach(path) == DecodeReach(AllReduceRoute.NCCL, 16, ())


def test_a_log_without_the_facts_reads_as_none_and_reaches_unknown() -> None:
    assert read_all_reduce_path(["INFO:     Application startup complete.", ""]) is None
    assert decode_reach(None) == DecodeReach(AllReduceRoute.UNKNOWN)
    # the stub's short config line: an engine, no size
    stub = "(EngineCore pid=2) INFO 01-02 10:00:20 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ..."
    assert read_all_reduce_path([stub]) is None


@pytest.mark.parametrize(("tp", "cpu", "interconnect", "off", "expected"), [
    (1, False, "NVLink", None, DecodeReach(AllReduceRoute.ONE_RANK, 1, logged=False)),
    (2, True, None, None, DecodeReach(AllReduceRoute.GLOO, 2, logged=False, custom_off=BackendOffReason.NO_LIBRARY)),
    # two GPUs: the custom all-reduce runs over PCIe too (custom_all_reduce.py:270 asks for more than two)
    (2, False, "PCIe", None, DecodeReach(AllReduceRoute.OTHER_PATH, 2, ("CUSTOM",), logged=False, interconnect="PCIe")),
    (8, False, "NVLink", None, DecodeReach(AllReduceRoute.OTHER_PATH, 8, ("CUSTOM",), logged=False, interconnect="NVLink")),
    (8, False, "PCIe", None, DecodeReach(AllReduceRoute.NCCL, 8, logged=False, custom_off=BackendOffReason.PCIE_ONLY, interconnect="PCIe")),
    (8, False, None, None, DecodeReach(AllReduceRoute.UNKNOWN, 8, logged=False)),
    (8, False, "NVLink", BackendOffReason.FLAG, DecodeReach(AllReduceRoute.NCCL, 8, logged=False, custom_off=BackendOffReason.FLAG,
                                               interconnect="NVLink")),
    (3, False, None, None, DecodeReach(AllReduceRoute.NCCL, 3, logged=False, custom_off=BackendOffReason.WORLD_SIZE)),
    (16, False, "NVLink", None, DecodeReach(AllReduceRoute.NCCL, 16, logged=False, custom_off=BackendOffReason.WORLD_SIZE,
                                            interconnect="NVLink")),
])
def test_the_prediction_follows_vllms_custom_all_reduce_rule(tp: int, cpu: bool, interconnect: str | None,
                                                              off: BackendOffReason | None, expected: DecodeReach) -> None:
    assert predict_reach(tensor_parallel_size=tp, cpu_engine=cpu, interconnect=interconnect, custom_off=off) == expected


def test_a_gpu_log_cut_before_the_backend_line_is_predicted_from_its_topology() -> None:
    config = (LOGS / "h100_tp8_nvlink.log").read_text().splitlines()[0]
    path = read_all_reduce_path([config])
    assert decode_reach(path, interconnect="NVLink") == DecodeReach(
        AllReduceRoute.OTHER_PATH, 8, ("CUSTOM",), logged=False, interconnect="NVLink")
    assert decode_reach(path, interconnect="PCIe").reach is AllReduceRoute.NCCL
    assert decode_reach(path).reach is AllReduceRoute.UNKNOWN


def test_the_facts_travel_as_json() -> None:
    for name in ("h100_tp8_nvlink.log", "rtx_pro_6000_tp8_pcie.log", "h100_tp1.log"):
        path = read(LOGS / name)
        assert path is not None
        assert AllReducePath.from_json(json.loads(json.dumps(path.to_json()))) == path


def test_each_boot_account_keeps_its_path_and_sends_it_as_json() -> None:
    from datetime import datetime

    from pytest_kimiperf.server.boot_account import BootAccount, account_boot

    text = CPU_TP1.read_text(encoding="utf-8")
    account = account_boot(text, profile="ring-ll", ordinal=1, first_of_deployment=True,
                           started_at=datetime(2026, 11, 30, 7, 41, 10), total_s=60.0)
    assert account.all_reduce == AllReducePath(tensor_parallel_size=1, device="cpu", custom_flag_off=True)
    assert BootAccount.from_json(json.loads(json.dumps(account.to_json()))) == account
    # an account a worker sent before the field existed
    old = account.to_json()
    del old["all_reduce"]
    assert BootAccount.from_json(old).all_reduce is None
