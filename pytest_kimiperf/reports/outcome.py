"""How a run ends when its only failures are INVALID or UNRESOLVED: an exit status of each.

A measurement is INVALID when the host was busy (the host watch) or the load generator, not the
server, limited it (the client's self-check): nothing was learned about the build. pytest would
exit 1 for it, as for a regression, and CI could not tell "retry on a quiet runner" from "this
build is slower". A run whose every failed test failed on an INVALID measurement, and nothing
else, exits :data:`INVALID_ONLY_EXIT` instead: 75, ``EX_TEMPFAIL`` in sysexits.h ("a temporary
failure ... the user is invited to retry"). Each such test carries the JUnit property
``kimiperf_outcome = invalid`` (``item.user_properties``, which pytest's junitxml writes and
xdist carries to the controller with the report), which is also how the controller counts them.

A test fails as UNRESOLVED when it saw a change beyond the tolerance that this run can never
convict: one boot of an attached server without a ``restart_command`` (judge/gate.py). Nothing
says the build is slower yet, nor that it is not; a run whose failures are all UNRESOLVED (or
INVALID, with at least one UNRESOLVED) exits :data:`UNRESOLVED_EXIT`, 76, and its tests carry
``kimiperf_outcome = unresolved``: CI can rerun with a restart_command, or boot the server itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

INVALID_ONLY_EXIT = 75
UNRESOLVED_EXIT = 76
OUTCOME_PROPERTY = "kimiperf_outcome"
INVALID_OUTCOME = "invalid"
UNRESOLVED_OUTCOME = "unresolved"
# pytest.ExitCode.TESTS_FAILED, without importing pytest here.
_TESTS_FAILED = 1


def failure_outcome(when: str, user_properties: Iterable[tuple[str, object]]) -> str | None:
    """A failed report's kimiperf outcome (INVALID_OUTCOME or UNRESOLVED_OUTCOME) when its call
    phase carries one; None for every other failure."""
    if when != "call":
        return None
    marked = {value for name, value in user_properties if name == OUTCOME_PROPERTY}
    for outcome in (INVALID_OUTCOME, UNRESOLVED_OUTCOME):
        if outcome in marked:
            return outcome
    return None


@dataclass
class FailureTally:
    """The run's failed tests, split into INVALID measurements and everything else."""

    invalid: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)

    def add(self, nodeid: str, *, invalid: bool = False, outcome: str | None = None) -> None:
        """Count one failed report (a test can fail in setup, call and teardown: each counts)."""
        outcome = INVALID_OUTCOME if invalid else outcome
        {INVALID_OUTCOME: self.invalid, UNRESOLVED_OUTCOME: self.unresolved}.get(outcome or "", self.other).append(nodeid)

    @property
    def only_invalid(self) -> bool:
        """Whether every failure was an INVALID measurement (and there was one)."""
        return bool(self.invalid) and not self.other and not self.unresolved

    @property
    def only_unresolved(self) -> bool:
        """Whether every failure was UNRESOLVED or INVALID, with an UNRESOLVED one among them."""
        return bool(self.unresolved) and not self.other

    def exit_status(self, status: int) -> int:
        """:data:`INVALID_ONLY_EXIT` or :data:`UNRESOLVED_EXIT` where pytest would exit 1 for
        those failures alone."""
        if status != _TESTS_FAILED:
            return status
        if self.only_unresolved:
            return UNRESOLVED_EXIT
        return INVALID_ONLY_EXIT if self.only_invalid else status

    def summary_line(self) -> str:
        """The terminal's last word on a run that ends so."""
        if self.only_unresolved:
            tests = len(dict.fromkeys(self.unresolved))
            return (f"kimiperf: every failure was UNRESOLVED ({tests} test{'s' * (tests != 1)}: a change beyond the "
                    "tolerance that one boot of an attached server cannot convict): exit status "
                    f"{UNRESOLVED_EXIT}; give the deployment a restart_command so the run can take more boots")
        tests = len(dict.fromkeys(self.invalid))
        return (f"kimiperf: every failure was an INVALID measurement ({tests} test{'s' * (tests != 1)}: a busy host or "
                f"a client-bound load, nothing learned about the build): exit status {INVALID_ONLY_EXIT} "
                "(EX_TEMPFAIL), rerun on a quiet runner")
