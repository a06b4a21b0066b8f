"""pytest-benchmark bridge: a perf test's scenario also lands in pytest-benchmark's JSON.

The stub server is measured with the real client; pytest-benchmark is the real plugin. The gate
must work the same with pytest-benchmark active, disabled, skipped, absent, or under xdist.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import expect_outcomes_with_decode_lost, measured_count, stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_TEST = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=8, output_tokens=16, requests=5, warmup_requests=1)

def test_decode(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s", "ttft_ms", "itl_ms"], floor=True)
"""


@pytest.fixture
def project(pytester: pytest.Pytester, stub_project) -> pytest.Pytester:
    # 100 tok/s: a token every 10 ms. A stream whose first two chunks came in one read, or that
    # came in bursts, gives no decode figure (measure/coverage.py). Beside a CPU hog
    # (scripts/stress_suite.sh) at 400 tok/s 19 of 160 streams lost theirs, at 100 none of 60;
    # but a client held off for 80 ms at a time still lost a whole window's 5 once, and a floor
    # fails a test without a decode median: the outcomes expect that from the reported counts.
    stub_project(stub_deployment_toml(extra_args=("--tok-per-s", "100")), ini='kimiperf_deployment = "stub"')
    pytester.makepyfile(test_perf=PERF_TEST)
    return pytester


def test_benchmark_json_carries_the_llm_figures_and_the_fingerprint(project: pytest.Pytester) -> None:
    bench_json = project.path / "bench.json"
    perf_json = project.path / "perf.json"
    result = project.runpytest_subprocess("--benchmark-json", str(bench_json), "--kimiperf-json", str(perf_json),
                                          timeout=120)
    bench = json.loads(bench_json.read_text())
    perf = json.loads(perf_json.read_text())
    expect_outcomes_with_decode_lost(result, perf, passed=1)
    assert len(bench["benchmarks"]) == 1
    entry = bench["benchmarks"][0]
    test = perf["tests"][0]
    info = entry["extra_info"]
    assert entry["fullname"] == test["nodeid"]
    assert {k: info[k] for k in ("profile", "deployment", "scenario", "completed", "failed", "valid")} == {
        "profile": "default", "deployment": "stub", "scenario": test["scenario"],
        "completed": 5, "failed": 0, "valid": True}
    # the same run the gate judged: the figures match the perf report's
    for key in ("median_ttft_ms", "median_itl_ms", "output_throughput", "median_decode_tok_s"):
        assert info[key] == pytest.approx(test["run"][key]), key
    assert info["median_decode_tok_s"] == pytest.approx(test["metrics"]["decode_tok_s"]["summary"]["median"])
    # one round of one call, timed around the whole scenario: at least the measured rounds'
    # wall time, at most the span perf.measure recorded around it
    stats = entry["stats"]
    assert stats["rounds"] == 1 and stats["iterations"] == 1 and len(stats["data"]) == 1
    start_ns, end_ns = test["interval_ns"]
    assert test["run"]["duration"] <= stats["data"][0] <= (end_ns - start_ns) / 1e9
    assert bench["machine_info"]["kimiperf"] == perf["fingerprint"]


def test_the_benchmark_table_leaves_out_the_scenarios_one_round_and_keeps_a_users_own(project: pytest.Pytester) -> None:
    project.makepyfile(test_own="def test_sum(benchmark):\n    benchmark(sum, range(100))\n")
    bench_json = project.path / "bench.json"
    perf_json = project.path / "perf.json"
    result = project.runpytest_subprocess("--benchmark-json", str(bench_json), "--kimiperf-json", str(perf_json),
                                          "-v", timeout=120)  # -v: the note
    expect_outcomes_with_decode_lost(result, json.loads(perf_json.read_text()), passed=2)
    out = result.stdout.str()
    # the user's benchmark has a table of its own rounds; the perf scenario's single round has none
    result.stdout.fnmatch_lines(["*benchmark: 1 tests*", "*test_sum*"])
    assert "test_decode[default]" not in out.split("benchmark: 1 tests")[1].split("Legend")[0]
    result.stdout.fnmatch_lines(["pytest-benchmark: its table leaves out 1 perf test (one round each, the scenario's "
                                 "wall time, is no", "    distribution to tabulate); its JSON and storage keep them, *"])
    entries = {e["name"]: e for e in json.loads(bench_json.read_text())["benchmarks"]}
    assert set(entries) == {"test_decode[default]", "test_sum"}
    assert entries["test_decode[default]"]["extra_info"]["kimiperf_timed"].startswith("one round: the scenario's")
    assert entries["test_sum"]["stats"]["rounds"] > 1


def test_under_xdist_benchmark_stands_aside_and_the_gate_still_judges(project: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    bench_json = project.path / "bench.json"
    perf_json = project.path / "perf.json"
    result = project.runpytest_subprocess("-n", "2", "--benchmark-json", str(bench_json),
                                          "--kimiperf-json", str(perf_json), timeout=180)
    perf = json.loads(perf_json.read_text())
    if not expect_outcomes_with_decode_lost(result, perf, passed=1):
        result.stdout.fnmatch_lines(["decode floor 1 tok/s: every boot above it (lowest *, default boot 1)"])
        assert perf["tests"][0]["floor"]["status"] == "ok"
    # the samples judged are the ones the run reports it measured (of 5 sent: a stream read in
    # one piece gives none, and the run counts it)
    test = perf["tests"][0]
    assert test["metrics"]["decode_tok_s"]["summary"]["n"] == measured_count(test["run"], "decode_tok_s")
    # pytest-benchmark disables itself under xdist: nothing timed, nothing saved
    assert not bench_json.exists()


@pytest.mark.parametrize("flags", [["--benchmark-disable"], ["--benchmark-skip"], ["-p", "no:benchmark"]],
                         ids=["disabled", "skipped", "absent"])
def test_the_perf_test_runs_and_is_judged_without_benchmark_timing(project: pytest.Pytester,
                                                                    flags: list[str]) -> None:
    """--benchmark-skip skips tests that ask for ``benchmark``; a perf test only borrows it."""
    bench_json = project.path / "bench.json"
    perf_json = project.path / "perf.json"
    args = [*flags, "--kimiperf-json", str(perf_json)]
    if "no:benchmark" not in flags:
        args += ["--benchmark-json", str(bench_json)]
    result = project.runpytest_subprocess(*args, timeout=120)
    perf = json.loads(perf_json.read_text())
    if not expect_outcomes_with_decode_lost(result, perf, passed=1):
        assert perf["tests"][0]["floor"]["status"] == "ok"
    assert not bench_json.exists()


def test_extra_info_is_json_safe_for_a_run_without_valid_requests() -> None:
    """A run whose every request failed has no medians: null, never NaN, in pytest-benchmark's JSON."""
    from pytest_kimiperf.reports.reporter import extra_info
    from pytest_kimiperf.measure.results import RunResult

    run = RunResult(scenario_name="single-stream-8in-16out", rounds=())
    info = extra_info(run, profile="ring-ll", deployment="tiny-cpu")
    assert info["valid"] is False and info["invalid_reason"] == "no measured requests"
    assert info["completed"] == 0 and info["median_decode_tok_s"] is None
    assert json.loads(json.dumps(info, allow_nan=False)) == info


def test_machine_info_gets_the_fingerprint_only_when_one_was_taken() -> None:
    from pytest_kimiperf.reports.reporter import add_fingerprint
    from pytest_kimiperf.judge.baselines import Fingerprint

    info: dict[str, object] = {"node": "ci"}
    add_fingerprint(info, None)
    assert info == {"node": "ci"}
    fp = Fingerprint(hard={"gpu.count": "0", "cpu.model": "Test CPU"}, soft={})
    add_fingerprint(info, fp)
    assert info["kimiperf"] == {"key": fp.key, "hard": dict(fp.hard), "soft": {}}
