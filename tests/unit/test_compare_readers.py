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


# AIPerf's per-request records: boot 1's profile_export.jsonl, kept beside its summary under the
# names AIPerf gives them with --profile-export-prefix boot1 (boot1.json, boot1.jsonl).
AIPERF_RECORDS = COMPARE / "aiperf" / "boot1.jsonl"


def _aiperf_artifacts(tmp_path: Path, records: str, summary: Path = AIPERF) -> Path:
    """A copy of an AIPerf artifact directory as AIPerf names it: the summary and its records."""
    (tmp_path / "profile_export.jsonl").write_text(records)
    out = tmp_path / "profile_export_aiperf.json"
    out.write_text(summary.read_text())
    return out


def _records_lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in AIPERF_RECORDS.read_text().splitlines()]


def _jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def test_aiperf_records_beside_their_summary_agree_with_it_figure_by_figure(tmp_path: Path) -> None:
    # The real pair reads, under AIPerf's own names and under a prefix's (boot1.json, boot1.jsonl),
    # with the summary's figures: every one of them was recomputed from the records and matched.
    summary = _aiperf_artifacts(tmp_path, AIPERF_RECORDS.read_text())
    [run] = read_run_file(summary)
    assert run.figures == read_run_file(AIPERF)[0].figures
    lines = _records_lines()
    assert sum(1 for r in lines if r["metadata"]["benchmark_phase"] == "profiling") == run.requests == 20


def test_records_of_another_run_beside_a_summary_are_an_error(tmp_path: Path) -> None:
    # Boot 1's records beside boot 2's summary: the same counts, other figures.
    summary = _aiperf_artifacts(tmp_path, AIPERF_RECORDS.read_text(), summary=COMPARE / "aiperf" / "boot2.json")
    with pytest.raises(ResultFileError) as caught:
        read_run_file(summary)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'profile_export.jsonl'} (the per-request records of "
                              "profile_export_aiperf.json): field 'metrics.time_to_first_token.value' of the records "
                              "gives p50 ")
    assert "the summary's 'time_to_first_token.p50' is" in message


def _drop_profiling_record(records: list[dict[str, Any]]) -> None:
    del records[-1]


def _fail_a_request(records: list[dict[str, Any]]) -> None:
    records[5]["error"] = {"code": 500, "type": "Internal Server Error", "message": "boom"}


def _edit_metric(value: Any, name: str = "request_latency", index: int = 7) -> Callable[[list[dict[str, Any]]], None]:
    def edit(records: list[dict[str, Any]]) -> None:
        records[index]["metrics"][name]["value"] = value
    return edit


def _set_unit(records: list[dict[str, Any]]) -> None:
    records[3]["metrics"]["time_to_first_token"]["unit"] = "s"


def _drop_metadata(records: list[dict[str, Any]]) -> None:
    del records[4]["metadata"]


def _phase(records: list[dict[str, Any]]) -> None:
    records[2]["metadata"]["benchmark_phase"] = "cooldown"


RECORD_DAMAGES = [
    # (edit of the parsed lines, words the error holds after the records file's path)
    (_drop_profiling_record, "19 good and 0 failed profiling requests, but the summary's 'request_count.avg' and "
                             "'error_summary' say 20 and 0"),
    (_fail_a_request, "19 good and 1 failed profiling requests"),
    # A request's latency far beyond the others moves the summary's p99 (an edit that moves none of
    # the percentiles read cannot be seen, and changes nothing the judge reads).
    (_edit_metric(1e6), "field 'metrics.request_latency.value' of the records gives p"),
    (_edit_metric("slow"), "line 8: field 'metrics.request_latency.value' is 'slow', not a finite number"),
    (_edit_metric([1.0, None], "inter_chunk_latency", 9), "line 10: field 'metrics.inter_chunk_latency.value' is "
                                                         "[1.0, None], not a finite number"),
    (_set_unit, "line 4: field 'metrics.time_to_first_token.unit' is 's', not 'ms' as in the summary"),
    (_drop_metadata, "line 5: field 'metadata' is missing"),
    (_phase, "line 3: field 'metadata.benchmark_phase' is 'cooldown', not one of warmup, profiling"),
]


@pytest.mark.parametrize(("edit", "words"), RECORD_DAMAGES, ids=[d[1][:40] for d in RECORD_DAMAGES])
def test_damaged_aiperf_records_are_an_error_naming_the_file_the_line_and_the_field(
        tmp_path: Path, edit: Callable[[list[dict[str, Any]]], None], words: str) -> None:
    records = _records_lines()
    edit(records)
    summary = _aiperf_artifacts(tmp_path, _jsonl(records))
    with pytest.raises(ResultFileError) as caught:
        read_run_file(summary)
    assert str(caught.value).startswith(f"{tmp_path / 'profile_export.jsonl'}")
    assert words in str(caught.value)


def test_aiperf_records_cut_short_name_their_last_line(tmp_path: Path) -> None:
    text = AIPERF_RECORDS.read_text()
    summary = _aiperf_artifacts(tmp_path, text[: len(text) - 200])
    with pytest.raises(ResultFileError, match=r"profile_export.jsonl: line 22 is not valid JSON \(column \d+: "):
        read_run_file(summary)


def test_aiperf_records_on_their_own_point_to_their_summary() -> None:
    with pytest.raises(ResultFileError, match=r"boot1.jsonl: AIPerf's per-request records, which are read with the "
                       r"summary AIPerf writes beside them: give profile_export_aiperf.json"):
        read_run_file(AIPERF_RECORDS)
