"""A run whose only failures are INVALID measurements exits 75 and marks them in JUnit XML, so CI
can act on the INVALID's cause instead of blaming the build; any other failure keeps pytest's 1.

The stub server is measured by the real client; a client-bound bound no process can meet
(``max_cpu_fraction`` 1e-6) makes its measurement INVALID on demand, on any host.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.helpers import stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_TESTS = """
from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.measure.workload import SingleStream

STARVED = SingleStream(prompt_tokens=8, output_tokens=8, requests=3, warmup_requests=0,
                       bounds=HealthBounds(max_cpu_fraction=1e-6))
FINE = SingleStream(prompt_tokens=8, output_tokens=8, requests=3, warmup_requests=0)

def test_client_bound(perf):
    perf.check(perf.measure(STARVED), ["decode_tok_s"])

def test_fine(perf):
    perf.check(perf.measure(FINE), ["decode_tok_s"])
"""


@pytest.fixture
def project(pytester: pytest.Pytester, stub_project) -> pytest.Pytester:
    stub_project(stub_deployment_toml(), ini='kimiperf_deployment = "stub"')
    pytester.makepyfile(test_perf=PERF_TESTS)
    return pytester


def _properties(junit: str, name: str) -> dict[str, str]:
    case = next(c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name", "").startswith(name))
    return {p.get("name", ""): p.get("value", "") for p in case.iter("property")}


def test_invalid_measurements_alone_exit_75_with_a_junit_property(project: pytest.Pytester) -> None:
    junit = str(project.path / "junit.xml")
    result = project.runpytest_subprocess("--junitxml", junit, "-p", "no:randomly", timeout=120)
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 75
    result.stdout.fnmatch_lines([
        "*INVALID measurement: client-bound: *",
        "kimiperf: every failure was an INVALID measurement (1 test, nothing learned about the build): exit status "
        "75 (EX_TEMPFAIL); give the client CPUs of its own (more cores than the server uses, or client_processes) or "
        "quieten the host: a rerun on the same loaded host is held off again",
    ])
    assert _properties(junit, "test_client_bound")["kimiperf_outcome"] == "invalid"
    assert _properties(junit, "test_client_bound")["kimiperf_invalid_cause"] == "client-held"
    assert "kimiperf_outcome" not in _properties(junit, "test_fine")


def test_invalid_measurements_under_xdist_reach_the_controller(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-n", "2", "-p", "no:randomly", timeout=180)
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 75


def test_another_failure_beside_an_invalid_one_is_pytests_1(project: pytest.Pytester) -> None:
    project.makepyfile(test_plain="def test_broken():\n    assert 1 == 2\n")
    result = project.runpytest_subprocess("-p", "no:randomly", timeout=120)
    result.assert_outcomes(passed=1, failed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "every failure was an INVALID measurement" not in result.stdout.str()
