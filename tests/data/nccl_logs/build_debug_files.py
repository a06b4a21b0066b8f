"""Writes tree_ll_debug_files/: what NCCL 2.24+ writes with NCCL_DEBUG=INFO and NCCL_DEBUG_FILE set,
for a TP=2 engine booted with the tree-ll profile (NCCL_ALGO=allreduce:Tree NCCL_PROTO=LL).

*Built*, not recorded (no GPU here): each line follows NCCL's own format strings, cited below,
and the matrix is what parseList (src/graph/tuning.cc v2.28.9-1 lines 55-120) leaves: NCCL_PROTO=LL
has no prefix, so every collective gets LL only; NCCL_ALGO=allreduce:Tree resets AllReduce's row
to Tree only and leaves the others at their default (every algorithm on).

    python tests/data/nccl_logs/build_debug_files.py
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).with_name("tree_ll_debug_files")
PROTOCOLS = ("LL", "LL128", "Simple")  # ncclProtoStr, src/init.cc v2.28.9-1 line 51
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")  # line 50
FUNCTIONS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # line 49
PROTO_ENABLE = {f: (1, 0, 0) for f in FUNCTIONS}
ALGO_ENABLE = {f: (1,) * len(ALGORITHMS) for f in FUNCTIONS} | {"AllReduce": (1, 0, 0, 0, 0, 0, 0)}


def matrix() -> str:
    """tuning.cc v2.28.9-1 lines 430-456, the same snprintf formats."""
    text = "\n     Function | " + "".join("%8s  " % p for p in PROTOCOLS) + " | "
    text += "".join("%13s  " % a for a in ALGORITHMS) + "\n"
    for f in FUNCTIONS:
        text += "%13s | " % f + "".join("%8d  " % v for v in PROTO_ENABLE[f]) + " | "
        text += "".join("%13d  " % v for v in ALGO_ENABLE[f]) + "\n"
    return text


def line(pid: int, tid: int, dev: int, message: str) -> str:
    """debug.cc ncclDebugLogV: "%s:%d:%d [%d] NCCL INFO " then the message and a newline."""
    return f"gpu-node:{pid}:{tid} [{dev}] NCCL INFO {message}\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for rank, pid in ((0, 4711), (1, 4712)):
        tid = pid + 79
        text = line(pid, pid, rank, "cudaDriverVersion 12090")
        text += line(pid, tid, rank, f"comm 0x55d0c8a1b2c{rank} rank {rank} nRanks 2 nNodes 1 localRanks 2 "
                                     f"localRank {rank} MNNVL 0")
        # tuning.cc v2.28.9-1 lines 446-447 and 451-452: the strings as given, no period.
        text += line(pid, tid, rank, "NCCL_PROTO set by environment to LL")
        text += line(pid, tid, rank, "NCCL_ALGO set by environment to allreduce:Tree")
        if rank == 0:
            text += line(pid, tid, rank, "Enabled NCCL Func/Proto/Algo Matrix:" + matrix())
        text += line(pid, tid, rank, f"ncclCommInitRank comm 0x55d0c8a1b2c{rank} rank {rank} nranks 2 - Init COMPLETE")
        # The file name NCCL_DEBUG_FILE=<log stem>.nccl.%h.%p expands to (debug.cc lines 224-263).
        (OUT / f"server-tiny-gpu-tree-ll.nccl.gpu-node.{pid}").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
