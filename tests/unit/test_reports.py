"""Reports: terminal summary lines, JSON schema (golden), Markdown (snapshot), plots, plugin glue.

The results are synthetic but decided by the real gate: baselines are written with
``storage.update_baseline`` and judged with ``gate.judge_metric``, floors with
``gate.check_floor``, profiles compared with ``profiles.compare_profiles``. Set
``KIMIPERF_UPDATE_GOLDEN=1`` to rewrite the golden files after an intended change, then review
their diff like code.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_kimiperf.judge import baselines
from pytest_kimiperf.judge.baselines import LoadedBaselines
from pytest_kimiperf.storage import baselines as storage
from pytest_kimiperf.storage.baselines import load_baselines

from pytest_kimiperf.judge import gate
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.notes import FloorNote
from pytest_kimiperf.judge.verdicts import BaselineLine, BaselineState, MetricResult, TestResult, WarningKind
from pytest_kimiperf.config.metric_specs import metric_spec
from pytest_kimiperf.measure.results import RunSummary
from pytest_kimiperf.numbers import fmt_value
from pytest_kimiperf.reports.outputs import (
    SCHEMA_VERSION,
    build_json_report,
    dumps_json_report,
)
from pytest_kimiperf.reports.outputs import render_markdown, write_markdown
from pytest_kimiperf.reports.answers import answer_lines, spread_line
from pytest_kimiperf.reports.answers import missing_baseline_warning
from pytest_kimiperf.reports.model import (
    BaselineUpdate,
    ProfileFacts,
    SessionReport,
    build_session_report,
)
from pytest_kimiperf.reports.terminal import MAX_WIDTH, render_summary
from pytest_kimiperf.reports.reporter import SessionReporter
from tests import helpers

GOLDEN = helpers.DATA / "reports"
UPDATE_GOLDEN = os.environ.get("KIMIPERF_UPDATE_GOLDEN") == "1"
DECODE_TEST = "perf_tests/test_decode.py::test_single_stream_decode"
FINGERPRINT = Fingerprint(
    hard={"gpu.count": "0", "cpu.model": "Test CPU", "cpu.cores": "2", "cpu.isa": "avx2"},
    soft={"host.name": "ci-runner"},
)
DEPLOYMENT = {"name": "tiny-cpu", "decode_floor_tok_s": 60.0, "decode_target_tok_s": 85.0}
PRIOR_SPREAD = 0.01  # the declared boot-to-boot spread of the tiny CPU deployment


def samples(seed: int, center: float, spread: float, n: int = 20) -> list[float]:
    """Normal samples rounded to 3 decimals, as stable as a golden file needs."""
    rng = np.random.default_rng(seed)
    return [round(float(x), 3) for x in rng.normal(center, center * spread, n)]


def measured(profile: str, *, decode: float, itl: float, ttft: float, seed: int,
             test: str = DECODE_TEST, boot: int = 1) -> TestResult:
    """A result of the decode test on ``boot`` of ``profile`` with three metrics, not yet judged."""
    slot = profile if boot == 1 else f"{profile}-boot{boot}"
    res = TestResult(
        test=test, nodeid=f"{test}[{slot}]", profile=profile, deployment="tiny-cpu",
        scenario="single-stream", boot=boot,
        profile_env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"} if profile == "ring-ll" else {},
    )
    for metric, center, spread, offset in (("decode_tok_s", decode, 0.01, 0), ("itl_ms", itl, 0.01, 1),
                                           ("ttft_ms", ttft, 0.02, 2)):
        spec = metric_spec(metric)
        res.metrics[metric] = MetricResult(
            metric, spec.unit, spec.direction.value, spec.default_tolerance,
            samples(seed + offset, center, spread), boot_label=f"{profile} boot {boot}")
    rng = np.random.default_rng(seed + 3)
    res.itl_timeline_ms = [round(float(x), 3) for x in rng.gamma(20.0, itl / 20.0, 120)]
    # ring-ll's second boot sent two requests more than it measured decode and TTFT of: their
    # first chunks came in a read the client's hold joined.
    lost = 2 if (test, profile, boot) == (DECODE_TEST, "ring-ll", 2) else 0
    withheld = {"client-held": lost} if lost else {}
    figures = {name: {"sent": 20 + lost, "measured": 20 + (lost if name in ("itl_ms", "e2el_ms") else 0),
                      "withheld": {} if name in ("itl_ms", "e2el_ms") else withheld}
               for name in ("decode_tok_s", "itl_ms", "tpot_ms", "ttft_ms", "e2el_ms")}
    res.run = RunSummary.from_json({"scenario": "single-stream", "completed": 20 + lost, "failed": 0,
                                    "median_ttft_ms": res.metrics["ttft_ms"].summary()["median"],
                                    "measured": {"figures": figures, "gaps_measured": 120, "gaps_client_held": 3 * lost,
                                                 "client_held_requests": lost, "loop_max_ms": 41.5 if lost else 0.4,
                                                 "stream": {"requests": 20 + lost, "counted_requests": 20 + lost,
                                                            "tokens_per_chunk_max": 1}}})
    return res


def judge(res: TestResult, view: LoadedBaselines | None,
          earlier: list[TestResult] = ()) -> TestResult:  # type: ignore[assignment]
    """What the recorder does after measuring: floor, then each metric against its baseline,
    on this boot and the ``earlier`` boots of the same test and profile."""
    decode = res.metrics["decode_tok_s"].summary()["median"]
    assert decode is not None
    fr = gate.check_floor(float(decode), floor=DEPLOYMENT["decode_floor_tok_s"],
                          target=DEPLOYMENT["decode_target_tok_s"])
    res.floor = fr
    if fr.warned:
        res.warn(WarningKind.BELOW_TARGET, FloorNote(fr))
    for mres in res.metrics.values():
        current = [r.metrics[mres.metric].boot_summary() for r in (*earlier, res)]
        comparison, line = gate.judge_metric(mres, test=res.test, profile=res.profile, baselines=view,
                                             profile_env=res.profile_env, current=current,
                                             prior_spread=PRIOR_SPREAD)
        mres.baseline_line = line
        if comparison is not None:
            mres.baseline = comparison
            if comparison.unresolved_beyond_tolerance or comparison.verdict.value == "improvement":
                res.warn(WarningKind.OTHER, line)
    return res


@pytest.fixture
def view(tmp_path: Path) -> LoadedBaselines:
    """A baseline file holding the default profile only (ring-ll has no baseline)."""
    stored = FINGERPRINT
    base = measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=100)
    # today's TTFT is ~21% slower: a REGRESSION on 2 boots against 1 even with the boot spread
    # declared at its default 3 df (t at 4 df puts the bound 8.3 standard errors out)
    base.metrics["ttft_ms"].samples = samples(102, 33.0, 0.02)
    entries, not_recorded = baselines.baseline_entries([base], git_commit=None)
    assert not_recorded == []
    path = storage.baseline_path(tmp_path, "tiny-cpu", FINGERPRINT.key)
    storage.update_baseline(path, "tiny-cpu", stored, entries)
    return load_baselines(tmp_path, "tiny-cpu", stored)


@pytest.fixture
def results(view: LoadedBaselines) -> list[TestResult]:
    """Two boots of each profile, interleaved A B B A: one boot can screen, never convict."""
    default = judge(measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1), view)
    ring_ll = judge(measured("ring-ll", decode=81.9, itl=12.2, ttft=44.0, seed=10), view)
    return [
        default,
        ring_ll,
        judge(measured("ring-ll", decode=82.1, itl=12.2, ttft=44.3, seed=30, boot=2), view, [ring_ll]),
        judge(measured("default", decode=81.2, itl=12.3, ttft=40.2, seed=20, boot=2), view, [default]),
    ]


def make_report(results: list[TestResult], *, profiles: list[ProfileFacts] | None = None,
                reference: str = "default") -> SessionReport:
    facts = profiles if profiles is not None else [
        ProfileFacts("default", "NCCL's own choices", {}, {"VLLM_CPU_KVCACHE_SPACE": "1"},
                     boots=1, boot_s=42.3, log_path="logs/server-tiny-cpu-default.log"),
        ProfileFacts("ring-ll", "Ring/LL", {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
                     {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
                     overridden_shell_env={"NCCL_ALGO": ("Tree", "Ring")},
                     boots=1, boot_s=40.6, log_path="logs/server-tiny-cpu-ring-ll.log"),
    ]
    report = build_session_report(
        results=results, reference_profile=reference, profiles=facts, deployment=DEPLOYMENT,
        fingerprint=FINGERPRINT.to_json(), created_at="2026-01-02T03:04:05Z",
        generator="pytest-kimiperf test", baselines_path=f"baselines/tiny-cpu/{FINGERPRINT.key}.json",
    )
    report.record_command = "make baseline"  # as the Makefile sets KIMIPERF_RECORD_COMMAND
    return report


@pytest.fixture
def report(results: list[TestResult]) -> SessionReport:
    return make_report(results)


class FakeReporter:
    """Records what the summary asks pytest's terminal reporter to write."""

    def __init__(self, verbosity: int = 0) -> None:
        self.verbosity = verbosity
        self.calls: list[tuple[str, str, dict[str, bool]]] = []

    def write_sep(self, sep: str, title: str | None = None, **markup: bool) -> None:
        self.calls.append(("sep", f"{sep} {title}", markup))

    def write_line(self, line: str, **markup: bool) -> None:
        self.calls.append(("line", line, markup))

    def lines(self) -> list[str]:
        return [text for _, text, _ in self.calls]


class FakeRun:
    """The run facts the reporter reads; ``broken`` makes building the report raise."""

    settings: Any = None

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def fingerprint(self) -> Fingerprint:
        return FINGERPRINT

    def known_fingerprint(self) -> Fingerprint | None:
        if self.broken:
            raise RuntimeError("state went away")
        return FINGERPRINT

    def baselines_path(self) -> Path | None:
        return None

    def server_records(self) -> None:
        return None

    def weight_cache_facts(self) -> None:
        return None


def reporter_for(report: SessionReport | None, output_error: str | None = None,
                 run: FakeRun | None = None) -> SessionReporter:
    return SessionReporter(run=run or FakeRun(), rootpath=Path("."), update_json=lambda data: None,
                           results=list(report.results) if report else [], report=report,
                           output_errors=[output_error] if output_error else [])


def summary(report: SessionReport, verbosity: int = 0, output_error: str | None = None) -> FakeReporter:
    terminal = FakeReporter(verbosity)
    reporter_for(report, output_error).write_summary(terminal)
    return terminal


def golden(name: str, text: str) -> str:
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path.read_text(encoding="utf-8")


# -- terminal ---------------------------------------------------------------------------------


def test_profile_table_has_medians_iqr_change_ci_and_verdict_in_aligned_columns(report: SessionReport) -> None:
    lines = summary(report, verbosity=1).lines()  # -v: the per-boot sections
    assert "= kimiperf: profiles vs default" in lines
    # "default boot 2" is too wide for a metric column beside it: metrics stack above their rows
    header = next(line for line in lines if line.lstrip().startswith("profile") and "change" in line)
    assert "  time to first token ms" in lines
    ttft = report.results[2].metrics["ttft_ms"].summary()  # ring-ll boot 2
    row = next(line for line in lines if "ring-ll boot 2" in line and f"{ttft['median']:.4g}" in line)
    comparison = next(c.comparison for c in report.profile_comparisons
                      if c.metric == "ttft_ms" and c.comparison is not None)
    # boots are the samples: both boots of ring-ll against both boots of default
    assert (comparison.boots_current, comparison.boots_reference) == (2, 2)
    assert f"{comparison.change * 100:+.1f}%" in row
    assert f"{comparison.ci_low * 100:+.1f}..{comparison.ci_high * 100:+.1f}%" in row
    assert f"{ttft['q1']:.4g}-{ttft['q3']:.4g}" in row
    assert row.endswith("worse")  # ~+11% TTFT on ring-ll, far beyond 5% tolerance
    # the comparison rests on every boot, so it is shown once, on the profile's last boot
    first = report.results[1].metrics["ttft_ms"].summary()  # ring-ll boot 1
    first_row = next(line for line in lines if line.split()[:2] == ["ring-ll", f"{first['median']:.4g}"])
    assert first_row.endswith(f"{first['q1']:.4g}-{first['q3']:.4g}")
    # the verdict column starts where its header does, on every row of the table
    table = lines[lines.index(header) + 1: next(i for i, line in enumerate(lines) if "against baselines" in line)]
    verdicts = ("reference", "within tolerance", "no detectable change", "inconclusive", "worse")
    rows = [line for line in table if not line.startswith(" " * 6)]  # without -v's detail lines
    assert [line.find(v) for line in rows for v in verdicts if v in line] == [header.index("verdict")] * 9
    assert max(len(line) for line in lines) <= MAX_WIDTH


def test_baseline_section_shows_verdicts_and_the_missing_baseline(report: SessionReport) -> None:
    lines = summary(report, verbosity=1).lines()  # -v: the per-boot sections
    start = lines.index(f"= kimiperf: against baselines (baselines/tiny-cpu/{FINGERPRINT.key}.json)")
    section = lines[start:]
    assert any(line.strip().startswith("time to first token ms") and line.endswith("REGRESSION")
               for line in section)
    assert f"{DECODE_TEST} [ring-ll]" in section
    at = section.index(f"{DECODE_TEST} [ring-ll]") + 1
    missing = " ".join(line.strip() for line in section[at:at + 2])
    assert missing == (f"no baseline for this hardware ({FINGERPRINT.key}): record it with make baseline (it "
                       "records this run's figures as the new baseline: review the diff)")


def test_floor_and_warnings_and_files(report: SessionReport) -> None:
    report.outputs = {"json": "out/report.json", "plots": "out/plots"}
    report.plot_files = ["a.png", "b.png"]
    lines = summary(report, verbosity=1).lines()
    floor = [line for line in lines if "target of 85 tok/s" in line]
    assert len(floor) == 4 and all("below the target" in line for line in floor)  # one per boot
    assert "= kimiperf: warnings" in lines
    assert "server default: booted 1x, ready after 42 s; log: logs/server-tiny-cpu-default.log" in lines
    assert "  profile ring-ll overrides NCCL_ALGO='Tree' from the shell with 'Ring'" in lines
    assert "JSON report: out/report.json" in lines
    assert "plots: out/plots (2 PNG files)" in lines


def test_quiet_keeps_only_verdict_lines(report: SessionReport) -> None:
    lines = summary(report, verbosity=-1).lines()
    assert not any("servers and files" in line or "each boot's median" in line for line in lines)
    assert lines[:2] == ["= kimiperf", DECODE_TEST]
    verdicts = lines[2:lines.index("= kimiperf: what this run showed")]
    # What the run did not measure, in one line under the verdicts (the lines of -v, together).
    unmeasured = next(i for i, line in enumerate(verdicts) if line.startswith("kimiperf: not measured: "))
    said = " ".join(" ".join(verdicts[unmeasured:]).split())
    held = "2 (2 whose stamps the client's hold spoiled; the client was held off the CPU (its loop ran up to 41.5 ms late))"
    assert said == (f"kimiperf: not measured: single_stream_decode, decode: {held} | single_stream_decode, time to "
                    f"first token: {held}")
    verdicts = verdicts[:unmeasured]
    # an earlier boot of a profile has no verdict of its own: -q shows the comparison on the last
    compared = [line for line in verdicts if " vs default " in line]
    assert [line.split(":")[1].split()[0:3] for line in compared] == [["ring-ll", "boot", "2"]] * 3
    assert [line.split()[-1] for line in compared] == ["tolerance", "tolerance", "worse"]
    assert verdicts[5].startswith("  [default] time to first token ms: ")
    # one boot screens, never convicts; against one baseline boot it states no sign either
    assert verdicts[5].endswith("inconclusive")
    assert verdicts[8].startswith("  [default boot 2] time to first token ms: ")
    assert verdicts[8].endswith("REGRESSION")  # the second boot convicts
    assert verdicts[9].startswith("  [default] decode ") and verdicts[9].endswith(
        "tok/s: below target (floor 60, target 85)")
    assert " ".join(" ".join(verdicts[-2:]).split()) == (
        f"baselines: no baseline for this hardware ({FINGERPRINT.key}): record it with make baseline (it records "
        "this run's figures as the new baseline: review the diff) (6 metrics)")
    assert len(verdicts) == 15
    outcome = " ".join(line.strip() for line in lines[lines.index("= kimiperf: what this run showed") + 1:])
    assert outcome == ("against this machine's baseline, each test's last boot: 1 REGRESSION, 2 no detectable change; "
                       "besides, ring-ll against default and the decode floor. 3 metrics had no baseline: make "
                       "baseline (it records this run's figures as the new baseline: review the diff)")


def test_verbose_adds_every_sample_and_the_boots_and_spread(report: SessionReport) -> None:
    normal = summary(report).lines()
    verbose = summary(report, verbosity=1).lines()
    assert not any("samples:" in line for line in normal)
    sample_text = " ".join(verbose)
    for value in report.results[1].metrics["decode_tok_s"].samples:
        assert f"{value:.4g}" in sample_text
    words = " ".join(sample_text.split())  # details wrap to the width
    # The profile comparison's spread is never below the declared one (judge/profiles.py).
    assert ("rests on 2 boots (40 samples) vs 2 reference boots; boot spread 1% (declared 1%) (default), "
            "tolerance 5%") in words
    assert ("IQR 39.26-41.01, 2 boot(s) vs 1 baseline boots, boot spread 1.2% (declared 1%; 2 + 1 boots "
            "measured 0.14%), tolerance 5%") in words
    assert max(len(line) for line in verbose) <= MAX_WIDTH


def test_colour_goes_through_reporter_markup(report: SessionReport) -> None:
    calls = summary(report).calls
    regression = next(markup for _, text, markup in calls if text.endswith("REGRESSION"))
    worse = next(markup for _, text, markup in calls if text.endswith("worse"))
    plain = next(markup for _, text, markup in calls if text.startswith("server default"))
    assert regression == {"red": True, "bold": True} and worse == {"red": True} and plain == {}


def test_an_answers_colour_follows_its_facts_not_its_words(view: LoadedBaselines) -> None:
    # A profile named like a failure whose figures match the reference's: its answer is plain.
    # The colour once came from matching words in the line ("INVALID" at its start made it loud).
    for name in ("INVALID-probe",):
        res = [judge(measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1), view),
               judge(measured(name, decode=81.4, itl=12.3, ttft=40.0, seed=1), view)]
        facts = [ProfileFacts("default", "", {}, {}, boots=1), ProfileFacts(name, "", {}, {}, boots=1)]
        calls = summary(make_report(res, profiles=facts)).calls
        answer = next((text, markup) for _, text, markup in calls if text.startswith(f"{name} vs default, "))
        assert "worse" not in answer[0] and answer[1] == {}, answer


def test_leftovers_and_errors_are_loud_even_with_q(results: list[TestResult]) -> None:
    report = make_report(results, profiles=[
        ProfileFacts("default", boots=1, leftovers=("pid 4242 VLLM::EngineCore (ppid 1)",)),
        ProfileFacts("ring-ll", boots=1, error="server exited with code 1 before it was ready"),
    ])
    calls = summary(report, verbosity=-1, output_error="cannot write baseline x: disk full").calls
    texts = [text for _, text, _ in calls]
    assert "! kimiperf: server trouble" in texts
    leftover = next(c for c in calls if "LEFTOVER" in c[1])
    assert leftover[2] == {"red": True, "bold": True} and "pid 4242" in leftover[1]
    assert "server ring-ll failed: server exited with code 1 before it was ready" in texts
    assert "ERROR: cannot write baseline x: disk full" in texts


def test_an_output_error_and_a_later_one_are_each_listed_once(results: list[TestResult]) -> None:
    # A report output that failed, then the session's missing-baseline warning escalated to an
    # error: two lines, the first not repeated inside the second.
    report = make_report(results)
    report.errors.append("cannot write report.json: disk full")
    reporter = reporter_for(report)
    reporter.add_output_error("MissingBaselineWarning (an error by -W or filterwarnings): kimiperf: none")
    terminal = FakeReporter(0)
    reporter.write_summary(terminal)
    errors = [text for _, text, _ in terminal.calls if text.startswith("ERROR: ")]
    assert errors == ["ERROR: cannot write report.json: disk full",
                      "ERROR: MissingBaselineWarning (an error by -W or filterwarnings): kimiperf: none"]


def test_many_profiles_stack_the_metric_above_its_rows_to_stay_in_width(view: LoadedBaselines) -> None:
    names = ["default", "ring-ll-with-a-long-name", "tree-simple-with-a-long-name"]
    results = [measured(name, decode=81.0 + i, itl=12.3, ttft=40.0, seed=10 * i)
               for i, name in enumerate(names)]
    report = make_report(results, profiles=[ProfileFacts(n, boots=1) for n in names])
    lines = summary(report, verbosity=1).lines()
    assert "  decode tok/s" in lines  # the metric on a line of its own
    assert max(len(line) for line in lines) <= MAX_WIDTH
    compact = summary(report).lines()  # the first screen names the test above its rows instead
    assert "  single_stream_decode" in compact
    assert max(len(line) for line in compact) <= MAX_WIDTH


def test_invalid_run_and_missing_reference_are_not_compared(results: list[TestResult]) -> None:
    results[1].invalid = "client event loop lagged (p99 3.1 ms > 1 ms)"
    lines = summary(make_report(results), verbosity=1).lines()  # -v: the INVALID boot's own rows
    invalid = [line for line in lines if "INVALID measurement" in line]
    assert invalid and all("worse" not in line for line in invalid)
    first_screen = summary(make_report(results)).lines()
    assert any(line.startswith("INVALID, no verdict (1 test boot") for line in first_screen)
    results[1].invalid = None
    no_reference = make_report([results[1], measured("tree", decode=80, itl=12, ttft=40, seed=5)],
                               reference="default")
    lines = summary(no_reference, verbosity=1).lines()
    assert sum("no valid result of the reference profile default" in line for line in lines) == 6
    rows = [line for line in summary(no_reference).lines() if line.endswith("no valid result of the reference "
                                                                            "profile default")]
    assert len(rows) == 6  # one row per metric and profile (ring-ll, tree) on the first screen


def test_a_broken_state_writes_one_line_instead_of_raising(report: SessionReport) -> None:
    terminal = FakeReporter()
    reporter = reporter_for(None, run=FakeRun(broken=True))
    reporter.results = list(report.results)
    reporter.write_summary(terminal)
    message = "kimiperf: could not write the perf summary: RuntimeError: state went away"
    assert terminal.calls == [("line", message, {"red": True})]


def test_single_profile_has_no_profile_table(results: list[TestResult]) -> None:
    lines = summary(make_report(results[:1], profiles=[ProfileFacts("default", boots=1)])).lines()
    assert not any(" vs default" in line for line in lines)
    assert any("against the baseline" in line for line in lines)


def test_the_first_screen_opens_with_the_answers_and_fits_make_perfs_shape(tmp_path: Path) -> None:
    # make perf's shape: 5 tests, 12 metrics, 2 profiles x 3 boots interleaved A B B A A B, with
    # baselines for both profiles (the run after make baseline): the summary is the answers, one
    # row per metric and profile, and the files; every boot stays in -v and the Markdown.
    tests = [f"perf_tests/test_t.py::test_decode_{i}" for i in range(5)]

    def shaped(res: TestResult) -> TestResult:
        if res.test in tests[1:4]:
            del res.metrics["ttft_ms"]  # 3 + 2 + 2 + 2 + 3 = 12 metrics
        return res

    recorded = [shaped(measured(p, decode=81.4, itl=12.3, ttft=40.0, seed=7 + i, test=test))
                for i, test in enumerate(tests) for p in ("default", "ring-ll")]
    entries, _ = baselines.baseline_entries(recorded, git_commit=None)
    storage.update_baseline(storage.baseline_path(tmp_path, "tiny-cpu", FINGERPRINT.key), "tiny-cpu",
                              FINGERPRINT, entries)
    view = load_baselines(tmp_path, "tiny-cpu", FINGERPRINT)
    results: list[TestResult] = []
    for t_index, test in enumerate(tests):
        earlier: dict[str, list[TestResult]] = {"default": [], "ring-ll": []}
        for boot, profile in enumerate(["default", "ring-ll", "ring-ll", "default", "default", "ring-ll"]):
            number = len(earlier[profile]) + 1
            res = judge(shaped(measured(profile, decode=81.4, itl=12.3, ttft=40.0, seed=1000 * t_index + 10 * boot,
                                        test=test, boot=number)), view, earlier[profile])
            earlier[profile].append(res)
            results.append(res)
    report = make_report(results)
    report.outputs = {"json": "perf-results/report.json", "markdown": "perf-results/summary.md",
                      "plots": "perf-results/plots"}
    lines = summary(report).lines()
    assert lines[0] == "= kimiperf: answers"
    assert lines[1].startswith("ring-ll vs default, decode tok/s (decode_0): ")
    assert " (68%): " in lines[1] or " (90%): " in lines[1]  # the interval says its level
    assert len(lines) <= 60, "\n".join(lines)
    rows = [line for line in lines if line.lstrip("* ").startswith(("decode_tok_s", "decode_"))]
    assert len(rows) == 5 + 5 * 2, "\n".join(lines)  # each test's first row: vs default, and vs the baseline
    # decode is each test's primary metric (its first here): its rows say so, the others do not.
    assert sum(" * decode_tok_s " in line for line in lines) == 5 + 5 * 2
    assert not any(" * itl_ms " in line or " * ttft_ms " in line for line in lines)
    assert "  * the test's primary metric, the one its answer line speaks of; the other rows are secondary" in lines
    assert not any("boot 2" in line or "samples:" in line for line in lines[lines.index(
        "= kimiperf: ring-ll vs default, on all boots (-v: each boot)"):])
    verbose = summary(report, verbosity=1).lines()
    assert len(verbose) > 3 * len(lines)
    assert sum("ring-ll boot 3" in line for line in render_markdown(report).splitlines()) >= 5 * 3


def test_render_summary_without_report_only_reports_the_error() -> None:
    lines = render_summary(None, verbosity=0, output_error="boom")
    assert [line.text for line in lines] == ["kimiperf: reports and baselines", "ERROR: boom"]


# -- JSON ---------------------------------------------------------------------------------------


def _approx(value: Any) -> Any:
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-9, abs=1e-12)
    if isinstance(value, dict):
        return {k: _approx(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_approx(v) for v in value]
    return value


def test_json_report_matches_the_golden_schema(report: SessionReport) -> None:
    report.outputs = {"json": "out/report.json"}
    data = build_json_report(report)
    text = dumps_json_report(data)
    expected = json.loads(golden("report.json", text))
    assert json.loads(text) == _approx(expected)
    # field names that follow vLLM bench serve stay where dashboards look for them
    test = data["tests"][0]
    assert data["schema_version"] == SCHEMA_VERSION == 1
    assert test["run"]["completed"] == 20 and "median_ttft_ms" in test["run"]
    assert set(test["metrics"]) == {"decode_tok_s", "itl_ms", "ttft_ms"}
    assert data["profiles"]["ring-ll"]["overridden_shell_env"] == {
        "NCCL_ALGO": {"shell": "Tree", "profile": "Ring"}}


def test_json_report_turns_failed_samples_into_null(report: SessionReport) -> None:
    report.results[0].metrics["ttft_ms"].samples[3] = math.nan
    data = build_json_report(report)
    ttft = data["tests"][0]["metrics"]["ttft_ms"]
    assert ttft["samples"][3] is None
    assert ttft["summary"]["n"] == 19 and ttft["summary"]["n_failed"] == 1
    assert "NaN" not in dumps_json_report(data)


def test_json_report_rejects_what_a_hook_made_unserializable(report: SessionReport) -> None:
    data = build_json_report(report)
    data["extra"] = {"when": object()}
    with pytest.raises(Exception, match="pytest_kimiperf_update_json"):
        dumps_json_report(data)


# -- Markdown -------------------------------------------------------------------------------------


def test_markdown_matches_the_snapshot(report: SessionReport) -> None:
    text = render_markdown(report)
    assert text == golden("summary.md", text)


def test_terminal_summary_matches_the_snapshot(report: SessionReport) -> None:
    text = "\n".join(summary(report).lines()) + "\n"
    assert text == golden("terminal.txt", text)


def tail_results(view: LoadedBaselines) -> list[TestResult]:
    """The decode test with a tail metric (p90 TTFT, 40 requests a boot) beside its median, and
    one boot of ring-ll with 20 requests: too few for a p90 (30 needed)."""
    def with_tail(res: TestResult, seed: int, center: float, n: int = 40) -> TestResult:
        spec = metric_spec("p90_ttft_ms")
        res.metrics = {"decode_tok_s": res.metrics["decode_tok_s"], "ttft_ms": res.metrics["ttft_ms"],
                       "p90_ttft_ms": MetricResult(
            "p90_ttft_ms", spec.unit, spec.direction.value, spec.default_tolerance,
            samples(seed, center, 0.05, n), boot_label=res.metrics["ttft_ms"].boot_label)}
        res.metrics["ttft_ms"].samples = samples(seed, center, 0.05, n)
        return res
    default = judge(with_tail(measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1), 41, 40.0), view)
    ring_ll = judge(with_tail(measured("ring-ll", decode=81.9, itl=12.2, ttft=44.0, seed=10), 42, 44.0, n=20), view)
    return [
        default, ring_ll,
        judge(with_tail(measured("ring-ll", decode=82.1, itl=12.2, ttft=44.3, seed=30, boot=2), 43, 44.3), view,
              [ring_ll]),
        judge(with_tail(measured("default", decode=81.2, itl=12.3, ttft=40.2, seed=20, boot=2), 44, 40.2), view,
              [default]),
    ]


def test_a_tail_row_shows_each_boots_quantile_and_its_bootstrap_interval(view: LoadedBaselines) -> None:
    report = make_report(tail_results(view))
    lines = summary(report, verbosity=1).lines()  # -v: every boot's row
    assert "each boot's median (IQR of its samples), or for a pNN metric its pNN (90% bootstrap interval);" in lines
    [header] = [line for line in lines if "median or pNN" in line]
    assert header.split()[:7] == ["profile", "median", "or", "pNN", "IQR", "or", "90%"]
    default = report.results[0]
    boot = default.metrics["p90_ttft_ms"].boot_summary()
    ttft = default.metrics["ttft_ms"].summary()
    assert boot.median > float(ttft["median"] or 0) * 1.03, "the p90 row holds the p90, not the median"
    low, high = boot.median * math.exp(-1.6449 * boot.se_log), boot.median * math.exp(1.6449 * boot.se_log)
    # the rows, without -v's detail lines (samples, what the comparison rests on) under them
    p90_rows = [line for line in lines[lines.index("  p90 time to first token ms") + 1:] if not line.startswith(" " * 6)]
    assert p90_rows[0].split()[:3] == ["default", fmt_value(boot.median), f"{fmt_value(low)}-{fmt_value(high)}"]
    # a boot with too few requests for its p90 shows its figure and why it does not count
    assert p90_rows[2].split()[0] == "ring-ll"
    assert p90_rows[2].endswith("not counted: 20 samples, a p90 needs 30")
    text = "\n".join(lines) + "\n"
    assert text == golden("tails_terminal.txt", text)
    markdown = render_markdown(report)
    assert markdown == golden("tails_summary.md", markdown)


def test_markdown_escapes_pipes_in_test_ids(results: list[TestResult]) -> None:
    for res in results:
        res.test = "perf_tests/test_x.py::test_y[a|b]"
    text = render_markdown(make_report(results))
    table = [line for line in text.splitlines() if "test_y" in line]
    assert table and all("`perf_tests/test_x.py::test_y[a\\|b]`" in line for line in table)
    # every row of the profile table still has exactly the header's cell count
    header = next(line for line in text.splitlines() if line.startswith("| test | metric"))
    rows = text.splitlines()[text.splitlines().index(header):]
    rows = rows[: rows.index("")]
    assert {line.replace("\\|", "").count("|") for line in rows} == {header.count("|")}


def test_markdown_appends_to_the_step_summary(tmp_path: Path, report: SessionReport) -> None:
    step = tmp_path / "step_summary.md"
    step.write_text("## earlier step\n", encoding="utf-8")
    text = render_markdown(report)
    write_markdown(step, text, append=True, source="$GITHUB_STEP_SUMMARY")
    assert step.read_text(encoding="utf-8") == "## earlier step\n\n" + text


# -- plots ---------------------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def test_plots_are_valid_pngs_of_sensible_size(tmp_path: Path, report: SessionReport) -> None:
    pytest.importorskip("matplotlib")
    from pytest_kimiperf.reports.plots import render_plots

    files = render_plots(report, tmp_path / "plots")
    names = sorted(p.name for p in files)
    slug = "perf_tests_test_decode.py--test_single_stream_decode"
    assert names == sorted([f"{slug}--decode_tok_s.png", f"{slug}--itl_ms.png", f"{slug}--ttft_ms.png",
                            f"{slug}--itl-timeline.png"])
    for path in files:
        width, height = png_size(path)
        assert 600 <= width <= 1200 and 300 <= height <= 1200, (path.name, width, height)
        assert path.stat().st_size > 10_000  # an empty canvas compresses to a few kB


def test_plots_without_matplotlib_name_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                 report: SessionReport, tmp_path: Path) -> None:
    from pytest_kimiperf.errors import ConfigError
    from pytest_kimiperf.reports.plots import render_plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an absent package looks like
    with pytest.raises(ConfigError, match=r"pip install 'pytest-kimiperf\[plots\]'"):
        render_plots(report, tmp_path / "plots")
    assert not (tmp_path / "plots").exists()


# -- through the plugin -----------------------------------------------------------------------------


def slot_id(res: TestResult) -> str:
    """The boot slot's parameter id, as boots.BootSlot.id spells it."""
    return res.profile if res.boot == 1 else f"{res.profile}-boot{res.boot}"


PLUGIN_TEST = """
import json
from pathlib import Path

import pytest

from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.hooks import RESULT_KEY

RESULTS = json.loads(Path(__file__).with_name("results.json").read_text())


@pytest.mark.parametrize("slot", list(RESULTS))
def test_single_stream_decode(request, slot):
    request.node.stash[RESULT_KEY] = TestResult.from_json(RESULTS[slot])
"""


def test_plugin_writes_reports_and_baselines_and_summarizes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, results: list[TestResult]
) -> None:
    """The plugin's session end: results travel from the test reports to every output."""
    step = pytester.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    payload = {}
    for res in results:
        res.test = "test_perf.py::test_single_stream_decode"
        payload[slot_id(res)] = res.to_json()
    (pytester.path / "results.json").write_text(json.dumps(payload))
    pytester.makepyfile(test_perf=PLUGIN_TEST)
    outcome = pytester.runpytest(
        "-p", "no:cacheprovider", "--deployment", "tiny-cpu", "--nccl-profile", "default,ring-ll",
        "--kimiperf-json", "out/report.json", "--kimiperf-markdown", "out/summary.md",
        "--update-baselines", "--kimiperf-baselines-dir", "bl",
    )
    outcome.assert_outcomes(passed=4)
    outcome.stdout.fnmatch_lines([
        "*= kimiperf: answers =*",
        "ring-ll vs default, decode tok/s (single_stream_decode): *",
        "*kimiperf: ring-ll vs default, on all boots*",
        # tiny-cpu declares an 18% boot spread: two boots a side cannot tell +11% apart
        "*ttft_ms*+11.3%*-*..+*% (90%)*inconclusive",
        "*baselines written: *bl/tiny-cpu/*.json (6 entries)",
    ])
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    assert [(t["profile"], t["boot"]) for t in data["tests"]] == [
        ("default", 1), ("ring-ll", 1), ("ring-ll", 2), ("default", 2)]
    assert data["baselines"]["entries_written"] == 6
    assert data["fingerprint"]["key"] in data["baselines"]["path"]
    written = storage.load_baseline(data["baselines"]["path"])
    assert written is not None and len(written.entries) == 6
    assert step.read_text().startswith("## kimiperf: tiny-cpu")
    assert (pytester.path / "out" / "summary.md").read_text() == step.read_text()


def test_plugin_quiet_summary_and_hook_edit(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                            results: list[TestResult]) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    payload = {slot_id(res): {**res.to_json(), "test": "test_perf.py::test_single_stream_decode"}
               for res in results}
    (pytester.path / "results.json").write_text(json.dumps(payload))
    pytester.makepyfile(test_perf=PLUGIN_TEST)
    pytester.makeconftest(
        "def pytest_kimiperf_update_json(config, report):\n"
        "    report['ci'] = {'job': 'nightly'}\n"
    )
    outcome = pytester.runpytest("-q", "-p", "no:cacheprovider", "--deployment", "tiny-cpu",
                                 "--nccl-profile", "default,ring-ll", "--kimiperf-json", "r.json")
    outcome.assert_outcomes(passed=4)
    outcome.stdout.fnmatch_lines(["*time to first token ms: ring-ll boot 2 * vs default *: +11.3% (*) inconclusive"])
    assert "servers and files" not in outcome.stdout.str()
    assert json.loads((pytester.path / "r.json").read_text())["ci"] == {"job": "nightly"}


def test_plugin_reports_results_from_xdist_workers(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                   results: list[TestResult]) -> None:
    """Under xdist the results reach the controller serialized in the reports; only it writes."""
    pytest.importorskip("xdist")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    payload = {slot_id(res): {**res.to_json(), "test": "test_perf.py::test_single_stream_decode"}
               for res in results}
    (pytester.path / "results.json").write_text(json.dumps(payload))
    pytester.makepyfile(test_perf=PLUGIN_TEST)
    outcome = pytester.runpytest("-n", "2", "-p", "no:cacheprovider", "--deployment", "tiny-cpu",
                                 "--nccl-profile", "default,ring-ll", "--kimiperf-json", "r.json")
    outcome.assert_outcomes(passed=4)
    outcome.stdout.fnmatch_lines(["*ttft_ms*+11.3%*inconclusive", "*not started by this process*"])
    data = json.loads((pytester.path / "r.json").read_text())
    assert sorted((t["profile"], t["boot"]) for t in data["tests"]) == [
        ("default", 1), ("default", 2), ("ring-ll", 1), ("ring-ll", 2)]
    assert data["profiles"]["default"]["boots"] is None  # booted (if at all) on a worker


def test_plugin_reports_a_baseline_it_cannot_write_and_still_writes_the_json(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, results: list[TestResult]
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    payload = {slot_id(res): {**res.to_json(), "test": "test_perf.py::test_single_stream_decode"}
               for res in results}
    (pytester.path / "results.json").write_text(json.dumps(payload))
    (pytester.path / "not-a-dir").write_text("a file where the baselines directory should be\n")
    pytester.makepyfile(test_perf=PLUGIN_TEST)
    outcome = pytester.runpytest("-p", "no:cacheprovider", "--deployment", "tiny-cpu",
                                 "--nccl-profile", "default,ring-ll", "--kimiperf-json", "r.json",
                                 "--update-baselines", "--kimiperf-baselines-dir", "not-a-dir")
    assert outcome.ret == pytest.ExitCode.TESTS_FAILED
    outcome.stdout.fnmatch_lines(["*kimiperf: reports and baselines*",
                                  "ERROR: cannot write baseline *not-a-dir/tiny-cpu/*.json*"])
    assert "Traceback" not in outcome.stdout.str()
    data = json.loads((pytester.path / "r.json").read_text())
    assert data["baselines"]["updated"] is False
    assert len(data["errors"]) == 1 and "cannot write baseline" in data["errors"][0]


def test_the_servers_view_is_shown_next_to_the_clients(results: list[TestResult]) -> None:
    res = results[0]
    # one run extended by one round: two /metrics views, pooled by their counts
    assert res.run is not None
    res.run = RunSummary.from_json({
                    **res.run.to_json(), "mean_ttft_ms": 17.4, "mean_itl_ms": 1.30, "total_output_tokens": 2560,
                    "mean_tpot_ms": 1.3,
                    "server_metrics": [
                        {"ttft_count": 10, "mean_ttft_ms": 17.0, "itl_count": 1270, "mean_itl_ms": 1.2,
                         "generation_tokens": 1280.0, "itl_metric": "vllm:inter_token_latency_seconds",
                         "engine_tpot_ms": 1.25},
                        {"ttft_count": 30, "mean_ttft_ms": 18.0, "itl_count": 3810, "mean_itl_ms": 1.4,
                         "generation_tokens": 1280.0, "itl_metric": "vllm:inter_token_latency_seconds"}]})
    rep = make_report(results)
    (row,) = rep.server_views()
    assert (row.server_ttft_ms, row.client_ttft_ms) == (pytest.approx(17.75), 17.4)
    assert (row.server_itl_ms, row.client_itl_ms) == (pytest.approx(1.35), 1.3)
    assert (row.server_tokens, row.client_tokens) == (2560.0, 2560.0)
    text = [line.text for line in render_summary(rep, verbosity=1)]  # -v: the server's view
    title = text.index("kimiperf: the server's view (vLLM /metrics) next to the client's")
    assert text[title + 2] == res.test
    # The run's fidelity: the client's TPOT over the engine's over the same window.
    assert (row.engine_tpot_ms, row.client_tpot_ms) == (1.25, 1.3) and row.client_over_engine == pytest.approx(1.04)
    assert text[title + 4].split() == [res.profile, "17.75", "17.4", "1.35", "1.3", "2560", "2560"]
    fidelity = text.index("each run's fidelity: what lies between the engine's clock and the client's")
    assert text[fidelity + 2].split()[-3:] == ["1.25", "1.3", "1.040"]
    assert all(len(line) <= MAX_WIDTH for line in text)
    markdown = render_markdown(rep)
    assert "### The server's view (vLLM /metrics) next to the client's" in markdown
    assert f"| {res.profile} | 17.75 | 17.4 | 1.35 | 1.3 | 2560 | 2560 | 1.25 | 1.3 | 1.040 |" in markdown


def test_the_servers_view_labels_each_boot_as_the_comparison_table_does(results: list[TestResult]) -> None:
    for res in results:
        assert res.run is not None
        res.run = RunSummary.from_json({
                        **res.run.to_json(), "mean_ttft_ms": 17.4, "mean_itl_ms": 1.30, "total_output_tokens": 2560,
                        "server_metrics": [{"ttft_count": 20, "mean_ttft_ms": 17.0, "itl_count": 2540,
                                            "mean_itl_ms": 1.2, "generation_tokens": 2560.0}]})
    rep = make_report(results)
    assert [row.profile for row in rep.server_views()] == ["default", "ring-ll", "ring-ll boot 2", "default boot 2"]
    text = [line.text for line in render_summary(rep, verbosity=1)]  # -v: the server's view
    title = text.index("kimiperf: the server's view (vLLM /metrics) next to the client's")
    assert [line.split()[0:3] for line in text[title + 4:title + 8]] == [
        ["default", "17", "17.4"], ["ring-ll", "17", "17.4"], ["ring-ll", "boot", "2"], ["default", "boot", "2"]]


def outcome_of(lines: list[str]) -> str:
    """The answer block's run line (``run passed: ...``), its wrapped lines joined."""
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    end = next((i for i, line in enumerate(lines[start + 1:], start + 1) if not line.startswith("    ")), len(lines))
    return " ".join(line.strip() for line in lines[start:end]).split(": ", 1)[1]


def test_a_first_run_says_once_what_it_judged_and_the_command_that_records_the_baseline(
        results: list[TestResult]) -> None:
    for res in results:
        for mres in res.metrics.values():
            mres.baseline = None
            mres.baseline_line = BaselineLine(BaselineState.MISSING, metric_spec(mres.metric).label,
                                              fingerprint=FINGERPRINT.key)
    report = make_report(results)
    warning = missing_baseline_warning(report, report.record_command)
    # A few lines: what it covers, test by test, and the command with what it accepts.
    assert warning == (
        f"no baseline for this hardware ({FINGERPRINT.key}) for 6 metrics of 1 test, judged against no history:\n"
        f"  {DECODE_TEST} [default, ring-ll]: decode, inter-token latency, time to first token\n"
        "  next: make baseline (2 boots per profile, as this run) (it records this run's figures as the new "
        "baseline: review the diff)")
    lines = summary(report, verbosity=1).lines()
    start = lines.index(f"= kimiperf: against baselines (baselines/tiny-cpu/{FINGERPRINT.key}.json)")
    assert " ".join(" ".join(line.strip() for line in lines[start + 1:start + 3]).split()) == (
        f"no baseline for this hardware ({FINGERPRINT.key}): record it with make baseline (it records this run's "
        "figures as the new baseline: review the diff) (12 metrics)")
    first_screen = summary(report).lines()
    assert not any("against the baseline" in line for line in first_screen)  # the run line says it once
    outcome = outcome_of(first_screen)
    assert outcome == (f"no baseline for this machine ({FINGERPRINT.key}) yet: this run judged ring-ll against "
                       "default and the decode floor, nothing against history. Next: make baseline (it records this "
                       "run's figures as the new baseline: review the diff), then the run you just made judges "
                       "against it")
    # the run that records: no warning, and the rows say this run records them
    report.baselines_update = BaselineUpdate(path="baselines/tiny-cpu/x.json", entries=6,
                                             not_recorded=("t [ring-ll, boot 1]: INVALID: host busy",))
    assert missing_baseline_warning(report, report.record_command) is None
    lines = summary(report, verbosity=1).lines()
    start = lines.index(f"= kimiperf: against baselines (baselines/tiny-cpu/{FINGERPRINT.key}.json)")
    assert lines[start + 1] == f"no baseline for this hardware ({FINGERPRINT.key}): this run records it (12 metrics)"
    outcome = outcome_of(lines)
    assert outcome == ("recorded 6 baseline entries in baselines/tiny-cpu/x.json; 1 test boot not recorded (listed "
                       "above); the same run without --kimiperf-update-baselines now judges against them")


def test_an_invalid_boot_is_named_where_its_verdict_would_be(results: list[TestResult]) -> None:
    invalid = results[2]  # ring-ll boot 2
    invalid.invalid = "host busy: other processes used 25% of the host's CPU (bound 10%)"
    for mres in invalid.metrics.values():
        mres.baseline, mres.baseline_line = None, None
    report = make_report(results)
    rows = [row for row in report.baseline_rows() if row.profile == "ring-ll boot 2"]
    assert {row.message for row in rows} == {
        "not compared: INVALID measurement (host busy: other processes used 25% of the host's CPU (bound 10%))"}
    assert f"{DECODE_TEST} [ring-ll boot 2]: INVALID measurement: host busy: other processes used 25% of the " \
        "host's CPU (bound 10%)" in report.warnings()
    lines = summary(report).lines()
    assert ("INVALID, no verdict (1 test boot, each failure above says why; the first: host busy: other processes "
            "used 25% of the host's CPU (bound 10%)): single_stream_decode [ring-ll boot 2]") in " ".join(
                line.strip() for line in lines)
    assert outcome_of(lines).endswith(". 1 test boot measured INVALID (no verdict from a busy host or an untrusted client: "
                            "the failures above say which)")


def test_boots_wider_than_the_declared_spread_get_one_line_in_the_answers_and_the_markdown(
        view: LoadedBaselines) -> None:
    # The second boot of each profile 12% off its first, where the deployment declares 1%: the
    # boots within this session say the declaration is too small (judge/noise.py).
    default = judge(measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1), view)
    ring_ll = judge(measured("ring-ll", decode=81.9, itl=12.2, ttft=44.0, seed=10), view)
    wide = make_report([
        default, ring_ll,
        judge(measured("ring-ll", decode=72.1, itl=13.8, ttft=44.3, seed=30, boot=2), view, [ring_ll]),
        judge(measured("default", decode=71.6, itl=13.9, ttft=40.2, seed=20, boot=2), view, [default]),
    ])
    [line] = [a.text for a in answer_lines(wide) if a.text.startswith("spreads wider than declared")]
    assert "(1% over 6 checks): boot spread 9.9% where 1% is declared" in line
    assert line.endswith("declare boot_spread = 0.099 in deployment 'tiny-cpu', or find what spreads the boots "
                         "(the judge already used the larger)")
    assert f"**Spreads:** {line}" in render_markdown(wide).replace("\\", "")
    # The golden report's boots agree with the declaration: no line.
    assert spread_line(make_report([default, ring_ll])) is None
