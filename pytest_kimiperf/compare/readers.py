"""Which reader a file needs, from what its JSON holds (never from its name): vLLM's bench serve
result, AIPerf's profile export, guidellm's report, or the plugin's own report or baseline."""

from __future__ import annotations

from pathlib import Path

from pytest_kimiperf.compare import read_aiperf, read_guidellm, read_kimiperf, read_vllm
from pytest_kimiperf.compare.read_aiperf_records import is_records_file
from pytest_kimiperf.compare.runs import ResultFileError, ToolRun, load_json

KNOWN = ("vLLM `bench serve --save-result` JSON, AIPerf's profile_export_aiperf.json, guidellm's JSON report, "
         "the plugin's --kimiperf-json report or a baseline file")


def read_run_file(path: Path) -> list[ToolRun]:
    """The runs a result file holds, read whole; ResultFileError naming the file and the field
    for anything unknown, damaged or moved."""
    if is_records_file(path):
        raise ResultFileError(f"{path}: AIPerf's per-request records, which are read with the summary AIPerf writes "
                              "beside them: give profile_export_aiperf.json (or NAME.json beside NAME.jsonl) instead")
    data = load_json(path)
    if read_vllm.looks_like(data):
        return read_vllm.read(path, data)
    if read_aiperf.looks_like(data):
        return read_aiperf.read(path, data)
    if read_guidellm.looks_like(data):
        return read_guidellm.read(path, data)
    if read_kimiperf.is_report(data):
        return read_kimiperf.read_report(path, data)
    if read_kimiperf.is_baseline(data):
        return read_kimiperf.read_baseline(path, path.read_text(encoding="utf-8"))
    keys = ", ".join(repr(k) for k in list(data)[:8]) if isinstance(data, dict) else f"a JSON {type(data).__name__}"
    raise ResultFileError(f"{path}: not a result file this command reads (its top level: {keys}); it reads {KNOWN}")
