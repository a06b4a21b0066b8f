"""The shipped perf suite (perf_tests/) runs whole against the stub deployment.

`make perf` runs it on the real CPU engine; this checks, in the test suite, that every shipped
test collects, measures and is judged (floor, profile comparison, baseline round trip), so a
change that breaks the suite's own files fails here and not first on the GPU runner.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import measured_count, stub_deployment_toml
from pytest_kimiperf.config.metric_specs import SampleKind, metric_spec
from pytest_kimiperf.judge.stats import MIN_SAMPLES_PER_BOOT, tail_min_samples
from tests import helpers

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_TESTS = helpers.PERF_TESTS


def _boot_stands(run: dict, metric: str) -> bool:
    """Whether a boot's run has the samples ``metric`` needs, by the counts the run reports: a
    request's figure or a gap it could not measure (chunks in shared reads, measure/coverage.py)
    is no sample, and which ones a loaded host loses is its scheduling. A metric of rounds or of
    the boot does not rest on reads."""
    spec = metric_spec(metric)
    if spec.sample is SampleKind.REQUEST:
        return measured_count(run, metric) >= MIN_SAMPLES_PER_BOOT
    if spec.sample is SampleKind.TAIL and spec.base is not None and spec.quantile is not None:
        n = run["measured"]["gaps_measured"] if spec.base == "itl_ms" else measured_count(run, spec.base)
        return n >= tail_min_samples(spec.quantile)
    return True


def test_shipped_perf_suite_runs_records_and_compares(pytester: pytest.Pytester, stub_project) -> None:
    # What this test checks is plumbing: every shipped test collects, measures and is judged
    # against the boot the recording run stored, and the summary puts the profiles side by
    # side. The verdicts themselves are not asserted: the suite gates p99 ITL (a tail of host
    # scheduling jitter) and 64-stream throughput (the stub and the client share this host's
    # cores), figures of the host, not of the stub. The verdict tests (tests/plugin/test_attach.py,
    # test_control.py) set changes of 5x on the stub's set schedule instead.
    stub_project(stub_deployment_toml(extra_args=("--tok-per-s", "1000")))
    shutil.copytree(PERF_TESTS, pytester.path / "perf_tests")
    # One boot a profile, none on demand: the profile comparison's booking (judge/profiles.py)
    # has its own test in test_boots.py, and here the count of runs is the plumbing checked.
    args = ("perf_tests", "--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1",
            "--kimiperf-max-boots", "1", "-p", "no:randomly")
    recorded_report = pytester.path / "recorded.json"
    recorded = pytester.runpytest_subprocess(*args, "--update-baselines", "--kimiperf-json", str(recorded_report),
                                             timeout=600)
    recorded.assert_outcomes(passed=10)
    reference_runs = {(t["test"], t["profile"]): t["run"] for t in json.loads(recorded_report.read_text())["tests"]}
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(*args, "--kimiperf-json", str(report), timeout=600)
    data = json.loads(report.read_text())
    # A first boot that looks worse than the tolerance asks for a second boot of its profile:
    # those items run on top of the 10.
    on_demand = [t for t in data["tests"] if t["boot"] > 1]
    outcomes = result.parseoutcomes()
    assert not outcomes.get("errors") and outcomes.get("passed", 0) + outcomes.get("failed", 0) == 10 + len(on_demand), \
        result.stdout.str()[-4000:]
    # A test fails here only by a verdict on a metric, never by an error of the plumbing.
    failures = [f for t in data["tests"] for f in t["failures"]]
    assert len([t for t in data["tests"] if t["failures"]]) == outcomes.get("failed", 0), failures
    assert all(": REGRESSION " in f or ": UNRESOLVED" in f for f in failures), failures
    for extra in on_demand:
        (first,) = [t for t in data["tests"] if (t["test"], t["profile"], t["boot"]) == (
            extra["test"], extra["profile"], extra["boot"] - 1)]
        assert any(m.startswith(f"boot {extra['boot']} of {extra['profile']} asked for") for m in first["messages"])
    tests = {(t["test"].split("::")[-1], t["profile"]) for t in data["tests"]}
    assert tests == {(name, p) for p in ("default", "ring-ll") for name in (
        "test_single_stream_decode", "test_ttft", "test_output_throughput[8]", "test_output_throughput[32]",
        "test_output_throughput[64]")}
    # Every metric is judged against the one boot the recording run stored, on this run's boots,
    # where each side's boot has the samples the metric needs by the counts its run reports (at
    # 1000 tok/s a loaded host reads a TTFT's first two chunks together now and then, and the p90
    # needs 30 of its 40 requests); where one does not, the verdict says so.
    judged = 0
    for test in data["tests"]:
        reference = reference_runs[(test["test"], test["profile"])]
        boots = [t["run"] for t in data["tests"] if (t["test"], t["profile"]) == (test["test"], test["profile"])
                 and t["boot"] <= test["boot"]]
        for name, metric in test["metrics"].items():
            baseline, judged = metric["baseline"], judged + 1
            standing = sum(_boot_stands(run, name) for run in boots)
            assert baseline is not None, (test["test"], name)
            if standing and _boot_stands(reference, name):
                assert baseline["verdict"] != "insufficient samples" and baseline["boots_reference"] == 1 \
                    and baseline["boots_current"] == standing and baseline["n_reference"] >= MIN_SAMPLES_PER_BOOT, \
                    (test["test"], test["profile"], name, baseline)
            else:
                assert baseline["verdict"] == "insufficient samples", (test["test"], test["profile"], name, baseline)
    assert judged
    result.stdout.fnmatch_lines(["*= kimiperf: answers =*", "ring-ll vs default, decode tok/s (single_stream_decode): *",
                                 "decode floor 1 tok/s: *", "*kimiperf: ring-ll vs default, on all boots*",
                                 "*kimiperf: against the baseline, on each profile's boots*"])
