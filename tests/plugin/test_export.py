"""--kimiperf-export: bench-serve result files other tools read, and the request records as JSON Lines."""

from __future__ import annotations

import ast
import importlib.util
import json
from datetime import datetime
from pathlib import Path

import pytest

from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.measure.results import RoundResult, RunResult
from pytest_kimiperf.reports.outputs import REQUESTS_FILE, bench_serve_result, write_exports
from pytest_kimiperf.reports.model import SessionReport, build_session_report
from pytest_kimiperf.measure.workload import Concurrency, load_facts

MS = 1_000_000


def record(i: int, *, ok: bool = True, ttft_ms: float = 20, gap_ms: float = 10) -> RequestRecord:
    """A request sent at i*100 ms: first token ``ttft_ms`` later, then 4 more chunks ``gap_ms`` apart."""
    send = 1_000 * MS + i * 100 * MS
    chunks = tuple(send + int((ttft_ms + k * gap_ms) * MS) for k in range(5)) if ok else ()
    return RequestRecord(
        ok=ok, error="" if ok else "HTTP 500: boom", prompt_tokens=32, output_tokens=5 if ok else 0,
        t_send_ns=send, chunk_ns=chunks, t_done_ns=(chunks[-1] if chunks else send) + MS,
        scheduled_send_ns=send, request_id=f"r{i}", t_start_ns=send - MS,
    )


def result(profile: str = "default", concurrency: int = 4, boot: int = 1) -> TestResult:
    """At 4 streams: TTFT 20 ms, gaps 10 ms, 0.5 s; more streams wait longer and finish sooner."""
    scenario = Concurrency(concurrency=concurrency, prompt_tokens=32, output_tokens=5, requests=4)
    slower = 1.1 if profile == "ring-ll" else 1.0
    records = tuple(record(i, ok=i != 3, ttft_ms=5 * concurrency * slower,
                           gap_ms=(10 + (concurrency - 4) / 2) * slower) for i in range(4))
    run = RunResult(
        scenario_name=scenario.scenario_name, bounds=HealthBounds(),
        rounds=(RoundResult(records=records, wall_s=2 / concurrency * slower),),
        load={**load_facts(scenario), "endpoint": "chat"},
    )
    return TestResult(test=f"test_perf.py::test_throughput[{concurrency}]",
                      nodeid=f"test_perf.py::test_throughput[{concurrency}-{profile}]",
                      profile=profile, deployment="tiny-cpu", scenario=scenario.scenario_name,
                      run=run.summary(), boot=boot)


def report_of(results: list[TestResult]) -> SessionReport:
    return build_session_report(
        results=results, reference_profile="default", profiles=[],
        deployment={"name": "tiny-cpu", "model": "org/tiny", "served_model_name": "tiny"},
        fingerprint=None, created_at="2026-01-02T03:04:05Z", generator="test",
    )


# --------------------------------------------------------------------------- vLLM's own field list


def _serve_source() -> str:
    spec = importlib.util.find_spec("vllm.benchmarks.serve")  # located, never imported (torch)
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed: nothing to compare the export with")
    return Path(spec.origin).read_text(encoding="utf-8")


def bench_serve_fields() -> tuple[set[str], set[str]]:
    """(fields of every ``--save-result`` file of a text-generation run, fields only
    ``--save-detailed`` keeps), read from the installed vllm/benchmarks/serve.py."""
    tree = ast.parse(_serve_source())
    functions = {node.name: node for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    fields: set[str] = set()
    # main(): result_json["..."] = ... at the function's own level (not under an if: ramp-up).
    main = next(f for f in functions.values() if any(
        isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "result_json"
        and isinstance(n.slice, ast.Constant) and n.slice.value == "date" for n in ast.walk(f)))
    for stmt in main.body:
        if isinstance(stmt, ast.Assign):
            target = stmt.targets[0]
            if (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                    and target.value.id == "result_json" and isinstance(target.slice, ast.Constant)):
                fields.add(target.slice.value)
    # benchmark(): the generation branch's result = {...} (its first dict literal assigned to result).
    bench = functions["benchmark"]
    literal = next(n.value for n in ast.walk(bench) if isinstance(n, (ast.Assign, ast.AnnAssign))
                   and isinstance(n.value, ast.Dict)
                   and any(isinstance(t, ast.Name) and t.id == "result"
                           for t in (n.targets if isinstance(n, ast.Assign) else [n.target])))
    fields |= {k.value for k in literal.keys if isinstance(k, ast.Constant)}
    # The latency statistics of process_one_metric("ttft"|"tpot"|"itl"|"e2el") at the default
    # --metric-percentiles.
    percentiles = next(
        kw.value.value for n in ast.walk(tree) if isinstance(n, ast.Call)
        and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value == "--metric-percentiles"
        for kw in n.keywords if kw.arg == "default")
    for n in ast.walk(bench):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id == "process_one_metric" and isinstance(n.args[0], ast.Constant)
                and n.args[0].value in ("ttft", "tpot", "itl", "e2el")):
            stem = n.args[0].value
            fields |= {f"mean_{stem}_ms", f"median_{stem}_ms", f"std_{stem}_ms"}
            fields |= {f"p{p.strip()}_{stem}_ms" for p in percentiles.split(",")}
    # main(): `for field in [...]: del result_json[field]` under `if not args.save_detailed`.
    detailed: set[str] = set()
    for n in ast.walk(main):
        if isinstance(n, ast.For) and isinstance(n.iter, ast.List) and any(
                isinstance(d, ast.Delete) for d in ast.walk(n)):
            detailed = {e.value for e in n.iter.elts if isinstance(e, ast.Constant)}
    assert {"date", "model_id", "request_rate", "completed", "ttfts"} <= fields, "serve.py changed shape"
    assert "ttfts" in detailed
    return fields, detailed


def test_an_exported_file_has_every_field_the_installed_bench_serve_saves(tmp_path: Path) -> None:
    fields, detailed = bench_serve_fields()
    write_exports(report_of([result()]), tmp_path, detailed=False)
    data = json.loads((tmp_path / "test_perf.py--test_throughput_4--default--boot1.json").read_text())
    assert fields - detailed <= set(data), f"missing: {sorted(fields - detailed - set(data))}"
    assert not detailed & set(data), "without --kimiperf-export-detailed the per-request arrays are left out"


def test_a_detailed_export_keeps_the_per_request_arrays_bench_serve_saves_detailed(tmp_path: Path) -> None:
    fields, detailed = bench_serve_fields()
    write_exports(report_of([result()]), tmp_path, detailed=True)
    data = json.loads((tmp_path / "test_perf.py--test_throughput_4--default--boot1.json").read_text())
    assert fields <= set(data), f"missing: {sorted(fields - set(data))}"
    assert len(data["ttfts"]) == len(data["input_lens"]) == data["num_prompts"] == 4


def test_the_export_uses_bench_serve_units_and_rules() -> None:
    data = bench_serve_result(result(), model_id="tiny", tokenizer_id="org/tiny", date="20260102-030405",
                              detailed=True)
    assert data["date"] == "20260102-030405"
    assert (data["request_rate"], data["burstiness"], data["max_concurrency"]) == ("inf", 1.0, 4)
    assert (data["completed"], data["failed"]) == (3, 1)
    assert data["output_lens"] == [5, 5, 5, 0]  # a failed request produced nothing
    assert data["duration"] == 0.5
    assert data["output_throughput"] == pytest.approx(15 / 0.5)
    assert data["ttfts"][:3] == pytest.approx([0.020] * 3)  # seconds, as bench serve
    assert data["itls"][0] == pytest.approx([0.010] * 4)
    assert data["median_ttft_ms"] == pytest.approx(20.0)  # milliseconds
    assert data["mean_tpot_ms"] == pytest.approx(10.0)  # (60 - 20) ms / (5 - 1)
    assert data["p99_itl_ms"] == pytest.approx(10.0)
    assert data["errors"][3] == "HTTP 500: boom"
    assert data["max_concurrent_requests"] == 3  # the three good ones all end within 1 s
    assert data["backend"] == "openai-chat"


def test_request_records_are_one_json_line_per_request_with_every_chunk(tmp_path: Path) -> None:
    results = [result("default"), result("ring-ll", boot=2)]
    files = write_exports(report_of(results), tmp_path, detailed=False, now=datetime(2026, 1, 2))
    assert tmp_path / REQUESTS_FILE in files
    lines = [json.loads(line) for line in (tmp_path / REQUESTS_FILE).read_text().splitlines()]
    assert len(lines) == 8
    first = lines[0]
    assert {k: first[k] for k in ("profile", "boot", "test", "status", "error", "output_tokens")} == {
        "profile": "default", "boot": 1, "test": "test_perf.py::test_throughput[4]",
        "status": "ok", "error": None, "output_tokens": 5}
    assert first["ttft_ms"] == pytest.approx(20.0)
    assert len(first["chunk_ns"]) == 5 and first["chunk_ns"][0] - first["t_send_ns"] == 20 * MS
    assert lines[3]["status"] == "error" and lines[3]["error"] == "HTTP 500: boom"
    assert (lines[4]["profile"], lines[4]["boot"]) == ("ring-ll", 2)


# --------------------------------------------------------------------------- through the plugin

EXPORTED = """
from pytest_kimiperf.measure.workload import Concurrency

def test_streams(perf):
    perf.check(perf.measure(Concurrency(concurrency=2, prompt_tokens=4, output_tokens=8, requests=6, rounds=1)),
               ["decode_tok_s"])
"""


@pytest.mark.usefixtures("isolated_state")
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist-controller"])
def test_perf_export_writes_a_bench_serve_file_and_request_records_at_session_end(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, xdist: list[str]
) -> None:
    from tests.helpers import stub_deployment_toml

    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_exported=EXPORTED)
    out = tmp_path / "export"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-export", str(out),
                                           "--kimiperf-export-detailed", *xdist, timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"vLLM bench serve results: {out}"])  # the summary says where they went
    data = json.loads((out / "test_exported.py--test_streams--default--boot1.json").read_text())
    assert (data["completed"], data["max_concurrency"], data["request_rate"]) == (6, 2, "inf")
    assert len(data["itls"]) == 6 and data["model_id"] == "stub-model"
    lines = (out / REQUESTS_FILE).read_text().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["test"] == "test_exported.py::test_streams"


@pytest.mark.usefixtures("isolated_state")
def test_a_detailed_export_without_a_directory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kimiperf-export-detailed")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kimiperf-export-detailed*give --kimiperf-export DIR too*"])
