"""The result-file readers of `kimiperf compare`, on files the real tools wrote
(tests/data/compare, scripts/compare_data.sh) and on damaged copies of them made here: each
damage is an error that names the file and the field, never a half-read run."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_kimiperf.compare.readers import read_run_file
from pytest_kimiperf.compare.runs import SINGLE_STREAM, ResultFileError
from tests.helpers import DATA

COMPARE = DATA / "compare"
VLLM_DETAILED = COMPARE / "vllm" / "boot1-detailed.json"
VLLM_SUMMARY = COMPARE / "vllm" / "boot1-summary.json"
AIPERF = COMPARE / "aiperf" / "boot1.json"
GUIDELLM = COMPARE / "guidellm" / "boot1.json"


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _write(tmp_path: Path, name: str, data: Any) -> Path:
    out = tmp_path / name
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("path", [VLLM_DETAILED, VLLM_SUMMARY], ids=["detailed", "summary"])
def test_a_bench_serve_result_is_one_run_with_vllms_own_figures(path: Path) -> None:
    data = _load(path)
    [run] = read_run_file(path)
    assert (run.tool, run.load, run.load_kind) == ("vllm bench serve", "one stream", SINGLE_STREAM)
    assert (run.requests, run.failed_requests) == (data["completed"] + data["failed"], data["failed"])
    assert run.figures["ttft_ms"].value == data["median_ttft_ms"]
    assert run.figures["ttft_ms"].field == "median_ttft_ms"
    assert run.figures["p99_e2el_ms"].value == data["p99_e2el_ms"]
    assert run.figures["output_throughput"].value == data["output_throughput"]
    # Decode is the plugin's per-request figure, 1000 / TPOT, at vLLM's median TPOT.
    assert run.figures["decode_tok_s"].value == pytest.approx(1000.0 / data["median_tpot_ms"])
    # ITL pools every gap of every request, so its figures rest on the gaps.
    assert run.figures["p99_itl_ms"].n == data["total_output_tokens"] - data["completed"]
    assert run.figures["ttft_ms"].n == data["completed"]


def test_the_detailed_and_the_summary_results_of_one_tool_read_the_same_metrics() -> None:
    [detailed], [summary] = read_run_file(VLLM_DETAILED), read_run_file(VLLM_SUMMARY)
    assert set(detailed.figures) == set(summary.figures)


def test_an_aiperf_export_is_one_run_read_at_its_medians_and_counts() -> None:
    data = _load(AIPERF)
    [run] = read_run_file(AIPERF)
    assert (run.tool, run.version, run.load_kind) == ("aiperf", data["aiperf_version"], SINGLE_STREAM)
    assert run.requests == data["request_count"]["avg"] == 20
    assert run.figures["ttft_ms"].value == data["time_to_first_token"]["p50"]
    assert run.figures["ttft_ms"].n == data["time_to_first_token"]["count"]
    # AIPerf's inter_token_latency is vLLM's TPOT; its inter-chunk gap is vLLM's ITL.
    assert run.figures["tpot_ms"].value == data["inter_token_latency"]["p50"]
    assert run.figures["itl_ms"].value == data["inter_chunk_latency"]["p50"]
    assert run.figures["decode_tok_s"].value == data["output_token_throughput_per_user"]["p50"]
    assert run.figures["output_throughput"].value == data["output_token_throughput"]["avg"]


def test_a_guidellm_report_is_one_run_a_benchmark_in_the_tables_units() -> None:
    data = _load(GUIDELLM)
    bench = data["benchmarks"][0]["metrics"]
    [run] = read_run_file(GUIDELLM)
    assert (run.tool, run.version, run.load_kind) == ("guidellm", data["metadata"]["guidellm_version"], SINGLE_STREAM)
    assert run.requests == bench["request_totals"]["total"] == 20
    # request_latency is in seconds; the table's e2el in ms.
    assert run.figures["e2el_ms"].value == pytest.approx(1000.0 * bench["request_latency"]["successful"]["median"])
    assert run.figures["tpot_ms"].value == bench["inter_token_latency_ms"]["successful"]["median"]
    # A distribution over tokens rests on the requests, not on the tokens.
    assert run.figures["p99_tpot_ms"].n == bench["request_totals"]["successful"]


def test_the_plugins_own_json_report_gives_a_run_per_valid_test_boot() -> None:
    runs = read_run_file(DATA / "reports" / "report.json")
    report = _load(DATA / "reports" / "report.json")
    valid = [t for t in report["tests"] if not t["invalid"]]
    assert len(runs) == len(valid)
    first = runs[0]
    assert first.tool == "pytest-kimiperf"
    assert first.figures["decode_tok_s"].value == pytest.approx(valid[0]["metrics"]["decode_tok_s"]["summary"]["median"])


def test_a_baseline_file_gives_a_run_per_stored_boot() -> None:
    runs = read_run_file(DATA / "baselines" / "schema1.json")
    assert runs and {run.tool for run in runs} == {"pytest-kimiperf"}
    assert {run.load for run in runs} == {"single_stream [default]", "single_stream [ring-ll]"}


def _drop(*keys: str) -> Callable[[Any], None]:
    def edit(data: Any) -> None:
        target = data
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return edit


def _set(value: Any, *keys: str | int) -> Callable[[Any], None]:
    def edit(data: Any) -> None:
        target = data
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


def _drop_medians(data: Any) -> None:
    for key in [k for k in data if k.startswith("median_")]:
        del data[key]


DAMAGES = [
    # (file, edit, words the error must hold besides the file's path)
    (VLLM_SUMMARY, _drop("completed"), "field 'completed' is missing"),
    (VLLM_SUMMARY, _set("fast", "median_ttft_ms"), "field 'median_ttft_ms' is 'fast', not a finite number"),
    (VLLM_SUMMARY, _set(0, "completed"), "field 'completed' is 0"),
    (VLLM_SUMMARY, _drop_medians, "none of the fields 'median_ttft_ms'"),
    (VLLM_SUMMARY, _drop("max_concurrency"), "field 'max_concurrency' is missing"),
    (VLLM_DETAILED, lambda d: d["ttfts"].pop(), "per-request field 'ttfts' holds 19 entries"),
    (VLLM_DETAILED, _drop("itls"), "per-request field 'itls' is missing"),
    (AIPERF, _set("2.0", "schema_version"), "field 'schema_version' is '2.0'"),
    (AIPERF, _set("s", "time_to_first_token", "unit"), "field 'time_to_first_token.unit' is 's', not 'ms'"),
    (AIPERF, _set(True, "was_cancelled"), "field 'was_cancelled'"),
    (AIPERF, _drop("time_to_first_token", "p50"), "field 'time_to_first_token.p50' is missing"),
    (AIPERF, _drop("input_config", "phases"), "field 'input_config.phases' is missing"),
    (AIPERF, _drop("request_count"), "field 'request_count' is missing"),
    (GUIDELLM, _set(3, "metadata", "version"), "field 'metadata.version' is 3"),
    (GUIDELLM, _drop("benchmarks", 0, "metrics", "request_latency"),
     "field 'benchmarks[0].metrics.request_latency' is missing"),
    (GUIDELLM, _set(None, "benchmarks", 0, "metrics", "time_to_first_token_ms", "successful", "median"),
     "field 'benchmarks[0].metrics.time_to_first_token_ms.successful.median' is None"),
    (GUIDELLM, _set("sweep", "benchmarks", 0, "config", "strategy", "type_"),
     "field 'benchmarks[0].config.strategy.type_' is 'sweep'"),
]


@pytest.mark.parametrize(("source", "edit", "words"), DAMAGES,
                         ids=[f"{d[0].parent.name}-{d[2][:40]}" for d in DAMAGES])
def test_a_damaged_or_moved_file_is_an_error_naming_the_file_and_the_field(
        tmp_path: Path, source: Path, edit: Callable[[Any], None], words: str) -> None:
    data = copy.deepcopy(_load(source))
    edit(data)
    path = _write(tmp_path, source.name, data)
    with pytest.raises(ResultFileError) as caught:
        read_run_file(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert words in str(caught.value)


def test_a_file_cut_short_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text(VLLM_SUMMARY.read_text()[:300])
    with pytest.raises(ResultFileError, match=r"cut.json: not valid JSON \(line 1, column \d+"):
        read_run_file(path)


def test_an_unknown_file_names_what_it_holds_and_what_is_read(tmp_path: Path) -> None:
    path = _write(tmp_path, "other.json", {"results": [], "tool": "k6"})
    with pytest.raises(ResultFileError, match=r"other.json: not a result file this command reads \(its top level: "
                       r"'results', 'tool'\); it reads vLLM"):
        read_run_file(path)


def test_a_damaged_report_entry_names_its_place(tmp_path: Path) -> None:
    data = _load(DATA / "reports" / "report.json")
    data["tests"][0]["metrics"]["decode_tok_s"]["samples"] = "many"
    path = _write(tmp_path, "report.json", data)
    with pytest.raises(ResultFileError, match=r"field 'tests\[0\].metrics.decode_tok_s.samples' is missing or not a list"):
        read_run_file(path)


def test_the_plugins_report_of_the_same_load_on_a_real_server_reads_as_one_single_stream_run() -> None:
    path = COMPARE / "one-boot" / "kimiperf.json"
    [test] = _load(path)["tests"]
    [run] = read_run_file(path)
    assert (run.tool, run.load, run.load_kind) == ("pytest-kimiperf", "single_stream [default]", SINGLE_STREAM)
    assert set(run.figures) == set(test["metrics"])
    # The boot's figure is the gate's summary of its samples: the median of the 20 requests.
    assert run.figures["decode_tok_s"].value == pytest.approx(test["metrics"]["decode_tok_s"]["summary"]["median"])
    assert run.figures["decode_tok_s"].n == 20


@pytest.mark.parametrize("name", ["vllm.json", "aiperf.json", "guidellm.json"])
def test_every_tools_file_of_the_one_boot_reads_the_same_load(name: str) -> None:
    [run] = read_run_file(COMPARE / "one-boot" / name)
    assert (run.load, run.load_kind, run.requests) == ("one stream", SINGLE_STREAM, 20)
