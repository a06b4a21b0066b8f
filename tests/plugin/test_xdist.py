"""pytest-xdist: one boot per profile for all workers, no overlapping measurements, one writer.

The stub server counts its boots; the perf tests measure it with the real client.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import expect_outcomes_with_decode_lost, measured_count, stub_deployment_toml

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_FILE = """
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=8, output_tokens=16, requests=5, warmup_requests=1)

def test_decode_{n}(perf):
    run = perf.measure(SCENARIO)
    perf.check(run, ["decode_tok_s"], floor=True)
"""

FUNCTIONAL_FILE = """
import os, time
import pytest

@pytest.mark.parametrize("i", range(6))
def test_functional(i):
    time.sleep(0.2)
    print("WORKER", os.environ.get("PYTEST_XDIST_WORKER"))
"""


def _project(pytester: pytest.Pytester, stub_project, boots: Path) -> None:
    # 100 tok/s, a token every 10 ms: at 400 a loaded host read whole windows' first chunks in
    # shared reads, and a window with no decode figure fails its floor (test_benchmark_bridge.py).
    stub_project(stub_deployment_toml(boot_count=boots, extra_args=("--tok-per-s", "100")),
                 ini='kimiperf_deployment = "stub"')
    for n in range(3):
        pytester.makepyfile(**{f"test_perf_{n}": PERF_FILE.format(n=n)})
    pytester.makepyfile(test_functional=FUNCTIONAL_FILE)


def _decode_measured(report: dict) -> dict[str, int]:
    """Each test's decode figures, as its run reports them, by baseline key (test|profile|metric)."""
    return {f"{t['test']}|{t['profile']}|decode_tok_s": measured_count(t["run"], "decode_tok_s")
            for t in report["tests"]}


def _intervals_never_overlap(report: dict) -> None:
    spans = sorted(tuple(t["interval_ns"]) for t in report["tests"])
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end, f"measurements overlap: {spans}"


@pytest.mark.parametrize("workers", [2, 4])
def test_each_profile_boots_once_for_all_workers(pytester: pytest.Pytester, stub_project,
                                                 tmp_path: Path, workers: int) -> None:
    boots = tmp_path / "boots"
    _project(pytester, stub_project, boots)
    out = tmp_path / "report.json"
    result = pytester.runpytest_subprocess(
        "-n", str(workers), "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1", "--kimiperf-json", str(out), timeout=180
    )
    lines = boots.read_text().splitlines()
    assert len(lines) == 2, f"expected one boot per profile, got {lines}"
    report = json.loads(out.read_text())
    expect_outcomes_with_decode_lost(result, report, passed=12)
    assert sorted((t["test"].split("::")[-1], t["profile"]) for t in report["tests"]) == sorted(
        (f"test_decode_{n}", p) for n in range(3) for p in ("default", "ring-ll")
    )
    _intervals_never_overlap(report)
    boots_by_profile = {name: p["boots"] for name, p in report["profiles"].items()}
    assert boots_by_profile == {"default": 1, "ring-ll": 1}
    # The worker's boot progress reaches the controller's output, as it happens.
    for profile in ("default", "ring-ll"):
        result.stdout.fnmatch_lines([
            f"[[]gw?[]] kimiperf: starting stub server for profile {profile} on *; log: *",
            f"[[]gw?[]] kimiperf [[]{profile}[]] loading weights*elapsed",
            f"[[]gw?[]] kimiperf: stub server ({profile}) ready after *s",
        ])
    summary = result.stdout.lines.index(next(line for line in result.stdout.lines if "passed" in line))
    assert not any("] kimiperf" in line for line in result.stdout.lines[summary:])


def test_update_baselines_under_xdist_writes_every_entry_once(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    _project(pytester, stub_project, boots)
    out = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("-n", "2", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1",
                                           "--update-baselines", "--kimiperf-json", str(out), timeout=180)
    report = json.loads(out.read_text())
    expect_outcomes_with_decode_lost(result, report, passed=12)
    measured = _decode_measured(report)
    assert sorted(measured) == sorted(
        f"test_perf_{n}.py::test_decode_{n}|{p}|decode_tok_s" for n in range(3) for p in ("default", "ring-ll")
    )
    files = list((pytester.path / "baselines" / "stub").glob("*.json"))
    assert len(files) == 1, files
    entries = json.loads(files[0].read_text())["entries"]
    # Each entry once, holding the decode samples its run measured: 5 requests sent, as many
    # samples as the run reports it measured (a stream read in one piece gives none, and says so).
    assert {key: e["n"] for key, e in entries.items()} == {key: n for key, n in measured.items() if n}, (entries, measured)


def test_other_dist_modes_are_refused_for_perf_tests(pytester: pytest.Pytester, stub_project,
                                                     tmp_path: Path) -> None:
    _project(pytester, stub_project, tmp_path / "boots")
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-k", "decode_0", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs --dist load (the default of -n) or loadgroup*"])


def test_workers_on_another_host_fail_perf_tests_before_any_boot(pytester: pytest.Pytester, stub_project,
                                                                 tmp_path: Path) -> None:
    boots = tmp_path / "boots"
    _project(pytester, stub_project, boots)
    # What a --tx ssh=... worker sees: the controller's scheduling folder is not on its disk.
    pytester.makeconftest("""
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_configure_node(node):
            node.workerinput["kimiperf_server_ids_dir"] = "/nonexistent/kimiperf-xdist-elsewhere"
    """)
    result = pytester.runpytest_subprocess("-n", "2", "-k", "decode", timeout=120)
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines(["*perf tests need xdist workers on this machine*this worker runs on another host*"])
    assert not boots.exists()
