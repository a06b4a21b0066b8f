"""The decode ceiling in the reports: where each input comes from, the arithmetic, the layout.

Inputs are hand-built (deployments, fingerprints, Hugging Face cache trees in tmp_path) around
the real model configs in tests/data/model_configs; the byte counts they lead to are derived by
hand in tests/unit/test_roofline.py. One pytester run boots the stub server and reads the section
back from the plugin's outputs. ``KIMIPERF_UPDATE_GOLDEN=1`` rewrites the golden files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import stub_deployment_toml
from pytest_kimiperf.judge.notes import FloorResult, FloorStatus
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult
from pytest_kimiperf.measure.results import RunResult
from pytest_kimiperf.measure.workload import SINGLE_STREAM
from pytest_kimiperf.config.deployment_tables import resolve_deployments
from pytest_kimiperf.config.deployments import BUILTIN_DEPLOYMENTS, TINY_MODEL, Deployment
from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.config.metric_specs import metric_spec
from pytest_kimiperf.reports.outputs import build_json_report, dumps_json_report
from pytest_kimiperf.reports.outputs import render_markdown
from pytest_kimiperf.reports.model import ProfileFacts, build_session_report
from pytest_kimiperf.reports.terminal import MAX_WIDTH, render_summary
from pytest_kimiperf.roofline.inputs import build_roofline_report, decode_results
from pytest_kimiperf.roofline.weights import find_model_config, hub_cache_dir
from tests import helpers

DATA = helpers.DATA
CONFIGS = DATA / "model_configs"
GOLDEN = DATA / "reports"
UPDATE_GOLDEN = os.environ.get("KIMIPERF_UPDATE_GOLDEN") == "1"

KIMI = BUILTIN_DEPLOYMENTS["kimi-k25-int4-tp8"]
TINY_CPU = BUILTIN_DEPLOYMENTS["tiny-cpu"]
TINY_CPU_TP2 = BUILTIN_DEPLOYMENTS["tiny-cpu-tp2"]
# Hand-derived in tests/unit/test_roofline.py (test_kimi_k25_bytes_per_token_at_tp8, tiny Llama).
KIMI_BYTES_PER_GPU_TP8 = 6_030_252_032
TINY_BYTES_TP1 = 673_280
TINY_BYTES_PER_GPU_TP2 = 337_408

RTX_PRO_PCIE = Fingerprint(
    hard={"gpu.count": "8", "gpu.name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
          "gpu.interconnect": "PCIe"},
    soft={},
)
H100_NVLINK = Fingerprint(
    hard={"gpu.count": "8", "gpu.name": "NVIDIA H100 80GB HBM3", "gpu.interconnect": "NVLink"}, soft={})


def decode_result(profile: str, samples: list[float], *, scenario: str = "single-stream-128in-128out",
                  floor: bool = True, test: str = "perf_tests/test_decode.py::test_single_stream_decode",
                  invalid: str | None = None, load_kind: str = SINGLE_STREAM) -> TestResult:
    run = dataclasses.replace(RunResult(scenario_name=scenario, rounds=()).summary(), load={"kind": load_kind})
    res = TestResult(test=test, nodeid=f"{test}[{profile}]", profile=profile, deployment="d",
                          scenario=scenario, invalid=invalid, run=run)
    spec = metric_spec("decode_tok_s")
    res.metrics["decode_tok_s"] = MetricResult("decode_tok_s", spec.unit, spec.direction.value,
                                                    spec.default_tolerance, samples)
    if floor:
        res.floor = FloorResult("single-stream decode", "tok/s", sorted(samples)[len(samples) // 2], 40.0, 50.0,
                                FloorStatus.OK)
    return res


class Never:
    """A CPU bandwidth 'measurement' that must not be taken; records that it was asked."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        raise AssertionError("the CPU bandwidth was measured although it was not needed")


def kimi_with_config(**fields: object) -> Deployment:
    return dataclasses.replace(KIMI, model_config=str(CONFIGS / "kimi-k2.5"), **fields)  # type: ignore[arg-type]


# -- the arithmetic --------------------------------------------------------------------------


def test_kimi_on_eight_pcie_gpus_is_bound_by_allreduce_latency() -> None:
    results = [decode_result("default", [81.2, 81.4, 81.6]), decode_result("ring-ll", [81.7, 81.9, 82.1])]
    roof = build_roofline_report(results, kimi_with_config(), RTX_PRO_PCIE, measure_cpu_gbs=Never())
    assert roof is not None and roof.known
    est = roof.estimate
    assert est is not None
    assert est.weight_bytes.per_gpu_bytes == KIMI_BYTES_PER_GPU_TP8
    # 1792 GB/s: NVIDIA's datasheet for the RTX PRO 6000 Blackwell (512-bit GDDR7)
    assert roof.bandwidth.value == 1792.0 and "datasheet" in roof.bandwidth.source
    assert roof.allreduce_latency.value == 30.0 and "PCIe" in roof.allreduce_latency.source
    assert est.collectives_per_token == 2 * 61 + 2
    memory_s = KIMI_BYTES_PER_GPU_TP8 / 1792e9
    comm_s = 124 * 30e-6
    assert est.bandwidth_ceiling_tok_s == pytest.approx(1 / memory_s)
    assert roof.ceiling_tok_s == pytest.approx(1 / (memory_s + comm_s))
    assert roof.binding_term == "allreduce latency"  # 3.72 ms of allreduces > 3.37 ms of reading
    default, ring = roof.measurements
    assert default.median_tok_s == 81.4 and ring.median_tok_s == 81.9
    assert default.fraction_of_bandwidth_ceiling == pytest.approx(81.4 * memory_s)
    assert default.fraction_of_ceiling == pytest.approx(81.4 * (memory_s + comm_s))
    assert default.line() == "default: 81.4 tok/s = 27% of the bandwidth ceiling, 58% of the ceiling with communication"
    data = roof.to_json()
    assert data["memory_time_us_per_token"] == pytest.approx(memory_s * 1e6)
    assert data["comm_time_us_per_token"] == pytest.approx(124 * 30.0)
    assert sum(b["per_gpu"] for b in data["bytes_breakdown"].values()) == KIMI_BYTES_PER_GPU_TP8


def test_deployment_overrides_win_over_datasheet_and_default() -> None:
    dep = kimi_with_config(memory_bandwidth_gbs=1500.0, allreduce_latency_us=12.5)
    roof = build_roofline_report([decode_result("default", [80.0])], dep, RTX_PRO_PCIE)
    assert roof is not None and roof.estimate is not None
    assert roof.bandwidth.value == 1500.0 and "memory_bandwidth_gbs of deployment" in roof.bandwidth.source
    assert roof.allreduce_latency.value == 12.5 and "allreduce_latency_us" in roof.allreduce_latency.source
    memory_s = KIMI_BYTES_PER_GPU_TP8 / 1500e9
    assert roof.ceiling_tok_s == pytest.approx(1 / (memory_s + 124 * 12.5e-6))
    assert roof.binding_term == "memory bandwidth"  # 1.55 ms of allreduces < 4.02 ms of reading


def test_nvlink_uses_its_own_default_latency() -> None:
    roof = build_roofline_report([decode_result("default", [80.0])], kimi_with_config(), H100_NVLINK)
    assert roof is not None and roof.estimate is not None
    assert roof.allreduce_latency.value == 10.0 and "NVLink" in roof.allreduce_latency.source
    assert roof.bandwidth.value == 3350.0  # H100 SXM datasheet


def test_cpu_at_tp2_without_latency_gives_the_bandwidth_ceiling_only() -> None:
    dep = dataclasses.replace(TINY_CPU_TP2, model_config=str(CONFIGS / "tiny-llama"))
    roof = build_roofline_report([decode_result("default", [150.0, 160.0, 170.0])], dep, None,
                                 measure_cpu_gbs=lambda: 10.0)
    assert roof is not None and roof.known and not roof.comm_term_known
    assert roof.estimate is not None and roof.estimate.collectives_per_token == 2 * 2 + 2
    assert roof.estimate.bandwidth_ceiling_tok_s == pytest.approx(10e9 / TINY_BYTES_PER_GPU_TP2)
    assert roof.ceiling_tok_s is None and roof.binding_term is None
    assert "gloo" in roof.allreduce_latency.source and "allreduce_latency_us" in roof.allreduce_latency.source
    assert "communication term unknown" in roof.arithmetic_line()
    (m,) = roof.measurements
    assert m.fraction_of_ceiling is None
    assert m.line() == f"default: 160 tok/s = {160 / (10e9 / TINY_BYTES_PER_GPU_TP2) * 100:.2g}% of the bandwidth ceiling"
    # the tiny model's weights sit in cache: the report says the DRAM ceiling does not bind it
    assert any("fit in the CPU caches" in note for note in roof.notes)
    assert roof.to_json()["comm_time_us_per_token"] is None


def test_cpu_bandwidth_is_measured_on_this_host_and_reported_as_measured(tmp_path: Path) -> None:
    tiny_dir = tmp_path / "tiny"
    shutil.copytree(CONFIGS / "tiny-llama", tiny_dir)
    roof = build_roofline_report([decode_result("default", [200.0])], TINY_CPU, None, tiny_model_dir=tiny_dir)
    assert roof is not None and roof.estimate is not None
    assert roof.bandwidth.measured and roof.bandwidth.source.startswith("measured on this host")
    assert roof.bandwidth.value is not None and roof.bandwidth.value > 0
    assert roof.estimate.bandwidth_ceiling_tok_s == pytest.approx(roof.bandwidth.value * 1e9 / TINY_BYTES_TP1)
    assert roof.to_json()["bandwidth_measured"] is True
    assert roof.binding_term == "memory bandwidth" and roof.estimate.collectives_per_token == 0


def test_a_measurement_above_the_ceiling_is_flagged() -> None:
    dep = dataclasses.replace(TINY_CPU, model_config=str(CONFIGS / "tiny-llama"), memory_bandwidth_gbs=0.05)
    roof = build_roofline_report([decode_result("ring-ll", [100.0])], dep, None, measure_cpu_gbs=Never())
    assert roof is not None and roof.estimate is not None
    assert roof.estimate.bandwidth_ceiling_tok_s == pytest.approx(0.05e9 / TINY_BYTES_TP1)  # 74.3 tok/s
    assert any(note.startswith("ring-ll measured above the ceiling") for note in roof.notes)


# -- which results --------------------------------------------------------------------------------


def test_only_valid_single_stream_decode_results_are_placed() -> None:
    results = [
        decode_result("default", [80.0]),
        decode_result("ring-ll", [80.0], invalid="client-bound"),
        decode_result("default", [20.0], scenario="concurrency-8-128in-64out", floor=False,
                      test="perf_tests/test_throughput.py::test_output_throughput[8]", load_kind="concurrency"),
        decode_result("default", [70.0], scenario="single-stream-1024in-8out", floor=False,
                      test="perf_tests/test_latency.py::test_ttft"),
        # The load's kind decides, not the scenario's name, which a test may choose.
        decode_result("default", [60.0], scenario="long-prompt", floor=False,
                      test="perf_tests/test_latency.py::test_named"),
        decode_result("default", [30.0], scenario="single-stream-like", floor=False,
                      test="perf_tests/test_throughput.py::test_named", load_kind="concurrency"),
    ]
    placed = [(res.test, res.profile, median) for res, median in decode_results(results)]
    assert placed == [("perf_tests/test_decode.py::test_single_stream_decode", "default", 80.0),
                      ("perf_tests/test_latency.py::test_ttft", "default", 70.0),
                      ("perf_tests/test_latency.py::test_named", "default", 60.0)]
    assert build_roofline_report(results[1:3], kimi_with_config(), RTX_PRO_PCIE) is None


# -- where the model config comes from ----------------------------------------------------------


def hub_tree(cache: Path, repo: str, commit: str, *, ref: str | None = "main") -> Path:
    """A Hugging Face hub cache entry laid out as huggingface_hub writes it."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    shutil.copy(CONFIGS / "kimi-k2.5" / "config.json", snapshot / "config.json")
    if ref is not None:
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


def test_hub_id_is_found_through_refs_main_in_the_hf_cache(tmp_path: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = hub_tree(tmp_path / "home" / "hub", "moonshotai/Kimi-K2.5", commit)
    found = find_model_config(KIMI, environ={"HF_HOME": str(tmp_path / "home")})
    assert found.path == snapshot / "config.json"
    assert found.source == "Hugging Face cache, main -> 0123456789ab"
    roof = build_roofline_report([decode_result("default", [81.4])], KIMI, RTX_PRO_PCIE,
                                 environ={"HF_HOME": str(tmp_path / "home")})
    assert roof is not None and roof.estimate is not None
    assert roof.estimate.weight_bytes.per_gpu_bytes == KIMI_BYTES_PER_GPU_TP8


def test_hf_hub_cache_wins_over_hf_home_and_a_pinned_revision_is_honoured(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "direct"), "HF_HOME": str(tmp_path / "home")}
    assert hub_cache_dir(env) == tmp_path / "direct"
    assert hub_cache_dir({"XDG_CACHE_HOME": str(tmp_path / "xdg")}) == tmp_path / "xdg" / "huggingface" / "hub"
    commit = "fedcba9876543210fedcba9876543210fedcba98"
    hub_tree(tmp_path / "direct", "moonshotai/Kimi-K2.5", commit, ref=None)
    pinned = dataclasses.replace(KIMI, revision=commit)
    found = find_model_config(pinned, environ=env)
    assert found.path is not None and found.path.parent.name == commit
    other = dataclasses.replace(KIMI, revision="v2")
    missing = find_model_config(other, environ=env)
    assert missing.path is None and "revision 'v2' of moonshotai/Kimi-K2.5" in (missing.reason or "")


def test_no_config_anywhere_is_one_line_that_says_why(tmp_path: Path) -> None:
    never = Never()
    roof = build_roofline_report([decode_result("default", [81.4])], KIMI, RTX_PRO_PCIE,
                                 environ={"HF_HOME": str(tmp_path)}, measure_cpu_gbs=never)
    assert roof is not None and not roof.known
    line = roof.arithmetic_line()
    assert line.startswith("decode ceiling unknown: no model config (moonshotai/Kimi-K2.5 is not in the "
                           "Hugging Face cache")
    assert str(tmp_path / "hub" / "models--moonshotai--Kimi-K2.5") in line and "set model_config" in line
    assert never.calls == 0
    assert roof.to_json()["measurements"][0]["fraction_of_bandwidth_ceiling"] is None
    lines = [x.text for x in render_summary(report_with(roof), verbosity=1)]
    assert lines[lines.index("decode ceiling (roofline)") + 1].startswith("  decode ceiling unknown: no model config")


def test_model_config_override_relative_to_the_rootdir_and_its_errors(tmp_path: Path) -> None:
    dep = dataclasses.replace(KIMI, model_config="model_configs/kimi-k2.5")
    found = find_model_config(dep, rootpath=DATA)
    assert found.path == DATA / "model_configs" / "kimi-k2.5" / "config.json"
    assert found.source == "model_config of deployment kimi-k25-int4-tp8"
    typo = dataclasses.replace(KIMI, model_config="model_configs/kimi-k3")
    missing = find_model_config(typo, rootpath=DATA)
    assert missing.path is None
    assert missing.reason == (f"model_config 'model_configs/kimi-k3' of deployment kimi-k25-int4-tp8: "
                              f"{DATA / 'model_configs' / 'kimi-k3'} does not exist")


def test_tiny_model_and_local_directories(tmp_path: Path) -> None:
    assert TINY_CPU.model == TINY_MODEL
    unbuilt = find_model_config(TINY_CPU, tiny_model_dir=tmp_path / "nope")
    assert unbuilt.path is None and "the tiny model is not built yet" in (unbuilt.reason or "")
    local = tmp_path / "llama"
    shutil.copytree(CONFIGS / "tiny-llama", local)
    dep = dataclasses.replace(TINY_CPU, model=str(local))
    assert find_model_config(dep).path == local / "config.json"
    (local / "config.json").unlink()
    assert find_model_config(dep).reason == f"{local / 'config.json'} does not exist"


def test_unknown_gpu_and_missing_gpus_name_the_fix() -> None:
    odd = Fingerprint(hard={"gpu.count": "2", "gpu.name": "NVIDIA Quadro Imaginary", "gpu.interconnect": "PCIe"},
                      soft={})
    roof = build_roofline_report([decode_result("default", [50.0])], kimi_with_config(), odd)
    assert roof is not None and not roof.known
    assert "no memory bandwidth known for GPU 'NVIDIA Quadro Imaginary'" in (roof.unknown_reason or "")
    assert "set memory_bandwidth_gbs in the deployment" in (roof.unknown_reason or "")
    none = Fingerprint(hard={"gpu.count": "0", "cpu.model": "x"}, soft={})
    roof = build_roofline_report([decode_result("default", [50.0])], kimi_with_config(), none)
    assert roof is not None and roof.unknown_reason == (
        "no memory bandwidth (no GPU found on this host; set memory_bandwidth_gbs in the deployment)")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("memory_bandwidth_gbs", "0", "memory_bandwidth_gbs = 0.0; must be a number of GB/s > 0"),
    ("allreduce_latency_us", "-1", "allreduce_latency_us = -1.0; must be a number of microseconds >= 0"),
    ("model_config", '" "', "model_config is empty"),
    ("memory_bandwidth_gbs", '"fast"', ("memory_bandwidth_gbs = 'fast' has the wrong type; expected an "
                                        "integer or a number")),
])
def test_bad_roofline_fields_are_refused_naming_field_and_table(key: str, value: str, message: str) -> None:
    import tomllib

    table = tomllib.loads(f'[d]\nextends = "tiny-cpu"\n{key} = {value}\n')
    with pytest.raises(ConfigError) as info:
        resolve_deployments(table, source="pyproject.toml [tool.kimiperf]")
    assert "pyproject.toml [tool.kimiperf] [deployments.d]" in str(info.value)
    assert message in str(info.value)


# -- in the reports (golden) ----------------------------------------------------------------------


def report_with(roof: object, results: list[TestResult] | None = None) -> object:
    return build_session_report(
        results=results or [decode_result("default", [81.4])], reference_profile="default",
        profiles=[ProfileFacts("default"), ProfileFacts("ring-ll", profile_env={"NCCL_PROTO": "LL"})],
        deployment={"name": KIMI.name}, fingerprint=RTX_PRO_PCIE.to_json(),
        created_at="2026-01-02T03:04:05Z", generator="pytest-kimiperf test", roofline=roof,  # type: ignore[arg-type]
    )


def golden(name: str, text: str) -> str:
    path = GOLDEN / name
    if UPDATE_GOLDEN:
        path.write_text(text, encoding="utf-8")
    return path.read_text(encoding="utf-8")


def kimi_report() -> object:
    results = [decode_result("default", [81.2, 81.4, 81.6]), decode_result("ring-ll", [81.7, 81.9, 82.1])]
    dep = dataclasses.replace(KIMI, model_config="model_configs/kimi-k2.5")
    roof = build_roofline_report(results, dep, RTX_PRO_PCIE, rootpath=DATA, measure_cpu_gbs=Never())
    return report_with(roof, results)


def test_roofline_json_matches_the_golden_file() -> None:
    data = build_json_report(kimi_report())  # type: ignore[arg-type]
    text = dumps_json_report(data["roofline"]).replace(str(DATA), "<tests/data>")
    assert json.loads(text) == json.loads(golden("roofline_kimi.json", text))


def test_roofline_in_the_terminal_and_markdown_match_the_snapshots() -> None:
    report = kimi_report()
    lines = render_summary(report, verbosity=1)  # type: ignore[arg-type]
    assert all(len(line.text) <= MAX_WIDTH for line in lines if line.sep is None)
    text = "\n".join(line.text for line in lines) + "\n"
    assert text == golden("roofline_terminal.txt", text)
    # right under the floor table, not a section of its own
    texts = [line.text for line in lines]
    floor_at = texts.index("kimiperf: decode floor of kimi-k25-int4-tp8 (floor 40 tok/s, target 50 tok/s)")
    ceiling_at = texts.index("decode ceiling (roofline)")
    assert floor_at < ceiling_at and not any(line.sep for line in lines[floor_at + 1:ceiling_at + 1])
    markdown = render_markdown(report).replace(str(DATA), "<tests/data>")  # type: ignore[arg-type]
    assert markdown == golden("roofline_summary.md", markdown)


def test_without_a_floor_check_the_ceiling_gets_its_own_section() -> None:
    results = [decode_result("default", [81.4], floor=False)]
    roof = build_roofline_report(results, kimi_with_config(), RTX_PRO_PCIE)
    lines = render_summary(report_with(roof, results), verbosity=1)  # type: ignore[arg-type]
    titles = [line.text for line in lines if line.sep]
    assert "kimiperf: decode ceiling (roofline)" in titles
    assert not any(title.startswith("kimiperf: decode floor") for title in titles)


# -- through the plugin --------------------------------------------------------------------------


PERF_TEST = """
from pytest_kimiperf.measure.workload import SingleStream

def test_decode(perf):
    run = perf.measure(SingleStream(prompt_tokens=8, output_tokens=16, requests=5, warmup_requests=1))
    perf.check(run, ["decode_tok_s"], floor=True)
"""


@pytest.mark.usefixtures("isolated_state")
def test_plugin_puts_the_ceiling_next_to_the_stub_servers_decode(
    pytester: pytest.Pytester, stub_project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(pytester.path / "empty-hf-home"))
    with_config = stub_deployment_toml(extra_args=("--tok-per-s", "400")) + (
        f'model_config = "{CONFIGS / "tiny-llama"}"\nmemory_bandwidth_gbs = 10\n')
    without = stub_deployment_toml("stub-bare", extra_args=("--tok-per-s", "400"))
    stub_project(with_config, without)
    pytester.makepyfile(test_perf=PERF_TEST)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-json", "r.json",  # -v: the ceiling
                                           "--kimiperf-markdown", "s.md", "-v", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*kimiperf: decode floor of stub*",
        "decode ceiling (roofline)",
        "  673.3 kB read per GPU per token (tp=1) at 10 GB/s (memory_bandwidth_gbs of deployment stub) ->",
        "      14,853 tok/s bandwidth ceiling; no collectives at tp=1; bound by memory bandwidth",
        "    default: * tok/s = *% of the bandwidth ceiling",
    ])
    data = json.loads((pytester.path / "r.json").read_text())
    roof = data["roofline"]
    median = data["tests"][0]["metrics"]["decode_tok_s"]["summary"]["median"]
    assert roof["known"] and roof["model_config"]["path"] == str(CONFIGS / "tiny-llama" / "config.json")
    assert roof["bytes_per_gpu_per_token"] == TINY_BYTES_TP1 and roof["bandwidth_measured"] is False
    assert roof["measurements"][0]["fraction_of_bandwidth_ceiling"] == pytest.approx(median * TINY_BYTES_TP1 / 10e9)
    assert data["deployment"]["memory_bandwidth_gbs"] == 10.0
    assert "### Decode ceiling (roofline)" in (pytester.path / "s.md").read_text()

    bare = pytester.runpytest_subprocess("--deployment", "stub-bare", "--kimiperf-json", "r2.json", "-v", timeout=120)
    bare.assert_outcomes(passed=1)
    bare.stdout.fnmatch_lines([
        "decode ceiling (roofline)",
        "  decode ceiling unknown: no model config (stub-model is not in the Hugging Face cache*",
    ])
    assert json.loads((pytester.path / "r2.json").read_text())["roofline"]["known"] is False


def test_a_second_boot_is_labelled_as_the_tables_label_it() -> None:
    from pytest_kimiperf.roofline.inputs import DecodeAgainstCeiling

    second = DecodeAgainstCeiling("t.py::test_decode", "ring-ll", 870.0, 0.015, 0.015, boot=2)
    assert second.line() == "ring-ll boot 2: 870 tok/s = 1.5% of the bandwidth ceiling"
    assert (second.to_json()["profile"], second.to_json()["boot"]) == ("ring-ll", 2)


# -- the collective ceiling measured where nccl-tests is installed ---------------------------

from pytest_kimiperf.roofline import ceiling  # noqa: E402

NCCL_TESTS = DATA / "nccl_tests"


@pytest.fixture(autouse=True)
def no_nccl_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """all_reduce_perf is never run from these tests, on any host."""
    real = shutil.which
    monkeypatch.setattr(ceiling.shutil, "which", lambda name, *a, **k: None if name == "all_reduce_perf" else real(name, *a, **k))


def test_all_reduce_perf_output_is_read_row_by_row() -> None:
    rows = ceiling.parse_all_reduce_perf((NCCL_TESTS / "all_reduce_perf_8gpu_intranode.txt").read_text())
    assert len(rows) == 32 and rows[0] == ceiling.AllReduceRow(8, 2, "float", 20.25, 0.0, 0, 19.36)
    assert rows[-1].size_bytes == 17179869184 and rows[-1].busbw_gbs == 842.91
    # Kimi's decode all-reduce: 2 x 7168 bytes (bf16 hidden state), read at the next size run.
    assert ceiling.latency_us_at(rows, 14336) == (26.69, 16384)
    assert ceiling.latency_us_at(rows, 2**40) is None
    trimmed = ceiling.parse_all_reduce_perf((NCCL_TESTS / "all_reduce_perf_4gpu_gb200_trimmed.txt").read_text())
    assert [r.size_bytes for r in trimmed] == [8, 1048576, 268435456, 8589934592] and trimmed[3].time_us == 21286.0
    with pytest.raises(ValueError, match="10 fields"):
        ceiling.parse_all_reduce_perf("        8  2  float  sum  -1  20.25  0.00  0.00  0  19.36\n")


def test_one_all_reduce_perf_run_at_the_decode_size_is_the_latency() -> None:
    recorded = (NCCL_TESTS / "all_reduce_perf_8gpu_intranode.txt").read_text()
    asked: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        return subprocess.CompletedProcess(argv, 0, recorded, "")

    value, how = ceiling.measure_allreduce_latency(16384, 8, exe="/opt/nccl-tests/all_reduce_perf", run=run)  # type: ignore[misc]
    assert value == 26.69 and how.startswith("measured: all_reduce_perf -b 16384 -e 16384 -g 8 -d bfloat16 -G 100")
    assert asked[0][:7] == ["/opt/nccl-tests/all_reduce_perf", "-b", "16384", "-e", "16384", "-g", "8"]
    failing = ceiling.measure_allreduce_latency(
        16384, 8, exe="x", run=lambda argv, **_: subprocess.CompletedProcess(argv, 2, "", "NCCL failure common.cu:1131"))
    assert failing is not None and math.isnan(failing[0]) and "exit 2: NCCL failure common.cu:1131" in failing[1]
    assert ceiling.measure_allreduce_latency(16384, 8) is None  # not installed here


def test_a_measured_all_reduce_replaces_the_default_in_the_roofline() -> None:
    asked: list[tuple[int, int]] = []

    def measure(nbytes: int, gpus: int) -> tuple[float, str]:
        asked.append((nbytes, gpus))
        return 26.69, "measured: all_reduce_perf -b 14336 ..."

    roof = build_roofline_report([decode_result("default", [80.0])], kimi_with_config(), RTX_PRO_PCIE,
                                 measure_allreduce=measure)
    assert roof is not None and roof.estimate is not None
    assert asked == [(2 * 7168, 8)]
    assert roof.allreduce_latency.value == 26.69 and roof.allreduce_latency.measured
    assert roof.estimate.allreduce_latency_us == 26.69
    # A failed run keeps the default and says so; a deployment's own figure is never replaced.
    failed = build_roofline_report([decode_result("default", [80.0])], kimi_with_config(), RTX_PRO_PCIE,
                                   measure_allreduce=lambda n, g: (float("nan"), "all_reduce_perf ... failed (exit 2)"))
    assert failed is not None and failed.allreduce_latency.value == 30.0
    assert failed.allreduce_latency.source.endswith("; all_reduce_perf ... failed (exit 2)")
    own = build_roofline_report([decode_result("default", [80.0])], kimi_with_config(allreduce_latency_us=12.5),
                                RTX_PRO_PCIE, measure_allreduce=measure)
    assert own is not None and own.allreduce_latency.value == 12.5 and len(asked) == 1
