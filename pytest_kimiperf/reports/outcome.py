"""How a run ends when its only failures are INVALID measurements: an exit status of its own.

A measurement is INVALID when the host was busy (the host watch) or the load generator, not the
server, limited it (the client's self-check): nothing was learned about the build. pytest would
exit 1 for it, as for a regression, and CI could not tell "retry on a quiet runner" from "this
build is slower". A run whose every failed test failed on an INVALID measurement, and nothing
else, exits :data:`INVALID_ONLY_EXIT` instead: 75, ``EX_TEMPFAIL`` in sysexits.h ("a temporary
failure ... the user is invited to retry"). Each such test carries the JUnit property
``kimiperf_outcome = invalid`` (``item.user_properties``, which pytest's junitxml writes and
xdist carries to the controller with the report), which is also how the controller counts them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

INVALID_ONLY_EXIT = 75
OUTCOME_PROPERTY = "kimiperf_outcome"
INVALID_OUTCOME = "invalid"
# pytest.ExitCode.TESTS_FAILED, without importing pytest here.
_TESTS_FAILED = 1


def is_invalid_failure(when: str, user_properties: Iterable[tuple[str, object]]) -> bool:
    """Whether a failed report is a perf test's INVALID measurement (its call phase, marked)."""
    return when == "call" and (OUTCOME_PROPERTY, INVALID_OUTCOME) in list(user_properties)


@dataclass
class FailureTally:
    """The run's failed tests, split into INVALID measurements and everything else."""

    invalid: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def add(self, nodeid: str, *, invalid: bool) -> None:
        """Count one failed report (a test can fail in setup, call and teardown: each counts)."""
        (self.invalid if invalid else self.other).append(nodeid)

    @property
    def only_invalid(self) -> bool:
        """Whether every failure was an INVALID measurement (and there was one)."""
        return bool(self.invalid) and not self.other

    def exit_status(self, status: int) -> int:
        """:data:`INVALID_ONLY_EXIT` where pytest would exit 1 for INVALID measurements alone."""
        return INVALID_ONLY_EXIT if status == _TESTS_FAILED and self.only_invalid else status

    def summary_line(self) -> str:
        """The terminal's last word on a run that ends so."""
        tests = len(dict.fromkeys(self.invalid))
        return (f"kimiperf: every failure was an INVALID measurement ({tests} test{'s' * (tests != 1)}: a busy host or "
                f"a client-bound load, nothing learned about the build): exit status {INVALID_ONLY_EXIT} "
                "(EX_TEMPFAIL), rerun on a quiet runner")
