"""The decode ceiling next to the measurement: gather the roofline's inputs for this session and
place each single-stream decode median against the ceilings ``ceiling.estimate`` computes.

Which inputs, in which order, each with its source: docs/explanation/measurement.md, "The decode
ceiling". A missing input is never an error: the report says the ceiling is unknown and why.
Nothing here imports pytest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.judge.gate import FLOOR_METRIC
from pytest_kimiperf.judge.verdicts import TestResult
from pytest_kimiperf.measure.workload import SINGLE_STREAM
from pytest_kimiperf.numbers import fmt_share
from pytest_kimiperf.roofline import ceiling
from pytest_kimiperf.roofline.weights import ModelConfigLookup, find_model_config, read_model_config, text_config


# Server L3 caches reach 32-64 MiB per socket (ceiling.measure_cpu_copy_bandwidth_gbs): weights
# smaller than this stay in cache between tokens, so DRAM bandwidth does not bind them.
_CPU_CACHE_BYTES = 64 * 1024 * 1024
_CPU_COPY_DURATION_S = 0.5
_CPU_COPY_BUFFER_MIB = 256

# Fingerprint "gpu.interconnect" values -> ceiling.default_allreduce_latency_us keys.
_INTERCONNECTS = {"PCIe": "pcie", "NVLink": "nvlink"}


@dataclass(frozen=True)
class RooflineInput:
    """One roofline input: its value (None when unknown) and where it came from, or why it is missing."""

    value: float | None
    source: str
    measured: bool = False


@dataclass(frozen=True)
class DecodeAgainstCeiling:
    """One single-stream decode median placed against the ceilings."""

    test: str
    profile: str
    median_tok_s: float
    fraction_of_bandwidth_ceiling: float | None
    fraction_of_ceiling: float | None  # with the communication term; None when it is unknown
    boot: int = 1

    @property
    def label(self) -> str:
        """``ring-ll`` for a profile's first boot, ``ring-ll boot 2`` for its second (as the tables)."""
        return self.profile if self.boot == 1 else f"{self.profile} boot {self.boot}"

    def line(self) -> str:
        """``ring-ll: 81.4 tok/s = 27% of the bandwidth ceiling, 58% of the ceiling with communication``."""
        text = f"{self.label}: {_sig(self.median_tok_s)} tok/s"
        if self.fraction_of_bandwidth_ceiling is None:
            return text
        text += f" = {fmt_share(self.fraction_of_bandwidth_ceiling)} of the bandwidth ceiling"
        # At tp=1 there is no communication term: the two ceilings are one.
        if self.fraction_of_ceiling is not None and self.fraction_of_ceiling != self.fraction_of_bandwidth_ceiling:
            text += f", {fmt_share(self.fraction_of_ceiling)} of the ceiling with communication"
        return text

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (the report's ``roofline.measurements[]``)."""
        return {
            "test": self.test, "profile": self.profile, "boot": self.boot, "median_tok_s": self.median_tok_s,
            "fraction_of_bandwidth_ceiling": self.fraction_of_bandwidth_ceiling,
            "fraction_of_ceiling": self.fraction_of_ceiling, "line": self.line(),
        }


@dataclass(frozen=True)
class RooflineReport:
    """The session's decode ceilings and each decode median against them, or why they are unknown."""

    deployment: str
    tensor_parallel_size: int
    model_config: ModelConfigLookup
    bandwidth: RooflineInput
    allreduce_latency: RooflineInput
    estimate: ceiling.Roofline | None
    measurements: tuple[DecodeAgainstCeiling, ...]
    unknown_reason: str | None = None  # why no ceiling could be computed
    notes: tuple[str, ...] = field(default=())

    @property
    def known(self) -> bool:
        """Whether a bandwidth ceiling was computed."""
        return self.estimate is not None

    @property
    def comm_term_known(self) -> bool:
        """Whether the ceiling with communication is known (no collectives, or a latency for them)."""
        return self.estimate is not None and self.estimate.comm_term_known

    @property
    def ceiling_tok_s(self) -> float | None:
        """The ceiling with the communication term; None when that term is unknown."""
        return self.estimate.ceiling_tok_s if self.estimate is not None and self.comm_term_known else None

    @property
    def binding_term(self) -> str | None:
        """``memory bandwidth`` or ``allreduce latency``; None when the communication term is unknown."""
        return self.estimate.binding_term if self.estimate is not None and self.comm_term_known else None

    def arithmetic_line(self) -> str:
        """The ceiling as one line of arithmetic, or why it is unknown."""
        if self.estimate is None:
            return f"decode ceiling unknown: {self.unknown_reason}"
        est = self.estimate
        text = (
            f"{_bytes(est.weight_bytes.per_gpu_bytes)} read per GPU per token (tp={est.weight_bytes.tp})"
            f" at {_sig(est.bandwidth_gbs)} GB/s ({self.bandwidth.source})"
            f" -> {_sig(est.bandwidth_ceiling_tok_s)} tok/s bandwidth ceiling"
        )
        if est.collectives_per_token == 0:
            return text + f"; no collectives at tp=1; bound by {est.binding_term}"
        if est.allreduce_latency_us is None:
            return text + (
                f"; {est.collectives_per_token} collectives per token of unknown latency "
                f"({self.allreduce_latency.source}): communication term unknown"
            )
        return text + (
            f"; with {est.collectives_per_token} collectives x {est.allreduce_latency_us:g} us "
            f"({self.allreduce_latency.source}) -> {_sig(est.ceiling_tok_s)} tok/s; "
            f"bound by {est.binding_term}"
        )

    def _comm_time_us(self) -> float | None:
        est = self.estimate
        if est is None or not self.comm_term_known:
            return None
        if est.allreduce_latency_us is None:  # no collectives (tp=1)
            return 0.0
        return est.collectives_per_token * est.allreduce_latency_us

    def to_json(self) -> dict[str, Any]:
        """JSON-able form: the arithmetic, every input with its source, and each measurement."""
        est = self.estimate
        data: dict[str, Any] = {
            "known": self.known,
            "unknown_reason": self.unknown_reason,
            "deployment": self.deployment,
            "tensor_parallel_size": self.tensor_parallel_size,
            "model_config": {
                "path": str(self.model_config.path) if self.model_config.path else None,
                "source": self.model_config.source,
                "reason": self.model_config.reason,
            },
            "bandwidth_gbs": self.bandwidth.value,
            "bandwidth_source": self.bandwidth.source,
            "bandwidth_measured": self.bandwidth.measured,
            "allreduce_latency_us": self.allreduce_latency.value,
            "allreduce_latency_source": self.allreduce_latency.source,
            "bytes_per_gpu_per_token": est.weight_bytes.per_gpu_bytes if est else None,
            "bytes_total_per_token": est.weight_bytes.total_bytes if est else None,
            "bytes_breakdown": {
                name: {"total": b.total_bytes, "per_gpu": b.per_gpu_bytes}
                for name, b in est.weight_bytes.breakdown.items()
            } if est else None,
            "collectives_per_token": est.collectives_per_token if est else None,
            "memory_time_us_per_token": (
                est.weight_bytes.per_gpu_bytes / (est.bandwidth_gbs * 1e9) * 1e6 if est else None
            ),
            "comm_time_us_per_token": self._comm_time_us(),
            "bandwidth_ceiling_tok_s": est.bandwidth_ceiling_tok_s if est else None,
            "ceiling_tok_s": self.ceiling_tok_s,
            "binding_term": self.binding_term,
            "arithmetic": self.arithmetic_line(),
            "notes": list(self.notes),
            "measurements": [m.to_json() for m in self.measurements],
        }
        return data


# -- inputs -----------------------------------------------------------------------------------


def _resolve_bandwidth(
    deployment: Any,
    fingerprint: Any,
    *,
    measure_cpu_gbs: Callable[[], float],
) -> RooflineInput:
    """Memory bandwidth per device (GB/s): deployment override, GPU datasheet, or measured CPU copy."""
    if deployment.memory_bandwidth_gbs is not None:
        return RooflineInput(deployment.memory_bandwidth_gbs, f"memory_bandwidth_gbs of deployment {deployment.name}")
    if deployment.needs_gpus:
        hard = getattr(fingerprint, "hard", None)
        if not hard:
            return RooflineInput(None, "no GPU fingerprint of this host; set memory_bandwidth_gbs in the deployment")
        if hard.get("gpu.count", "0") == "0":
            return RooflineInput(None, "no GPU found on this host; set memory_bandwidth_gbs in the deployment")
        name = hard.get("gpu.name", "")
        try:
            return RooflineInput(ceiling.gpu_bandwidth_gbs(name), f"datasheet peak of {name}")
        except ConfigError as exc:
            return RooflineInput(None, f"{exc}; or set memory_bandwidth_gbs in the deployment")
    try:
        gbs = measure_cpu_gbs()
    except (ConfigError, MemoryError, OSError) as exc:
        return RooflineInput(None, f"measuring this host's copy bandwidth failed: {exc}")
    return RooflineInput(gbs, "measured on this host: best single-thread copy of a "
                        f"{_CPU_COPY_BUFFER_MIB} MiB buffer in {_CPU_COPY_DURATION_S:g} s", measured=True)


def _resolve_allreduce_latency(deployment: Any, fingerprint: Any) -> RooflineInput:
    """One decode-sized allreduce's latency (us): deployment override or the interconnect's default."""
    if deployment.tensor_parallel_size == 1:
        return RooflineInput(None, "tp=1: no collectives")
    if deployment.allreduce_latency_us is not None:
        return RooflineInput(deployment.allreduce_latency_us, f"allreduce_latency_us of deployment {deployment.name}")
    if not deployment.needs_gpus:
        return RooflineInput(None, "the CPU engine's gloo allreduce has no default latency, it varies with the "
                             "host; set allreduce_latency_us in the deployment")
    hard = getattr(fingerprint, "hard", None) or {}
    interconnect = _INTERCONNECTS.get(str(hard.get("gpu.interconnect", "")))
    if interconnect is None:
        return RooflineInput(None, f"GPU interconnect {hard.get('gpu.interconnect', 'unknown')!r} has no default "
                             "latency; set allreduce_latency_us in the deployment")
    value = ceiling.default_allreduce_latency_us(interconnect)
    return RooflineInput(value, f"default for {hard['gpu.interconnect']}, a guide, not a measurement")


def _measured_allreduce_latency(deployment: Any, config: Mapping[str, Any], default: RooflineInput,
                               measure: Callable[[int, int], tuple[float, str] | None]) -> RooflineInput:
    """One decode step's allreduce (the bf16 hidden state of one token: 2 x hidden_size bytes)
    measured on this host's GPUs where nccl-tests is installed; ``default`` otherwise, and where
    the deployment gives its own latency. A failed run keeps the default and says why."""
    if default.value is None or deployment.allreduce_latency_us is not None or not deployment.needs_gpus:
        return default
    hidden = text_config(config, source="model config").get("hidden_size")
    if not isinstance(hidden, int) or hidden <= 0:
        return default
    found = measure(2 * hidden, int(deployment.tensor_parallel_size))
    if found is None:
        return default
    value, how = found
    if not math.isfinite(value):
        return RooflineInput(default.value, f"{default.source}; {how}")
    return RooflineInput(value, how, measured=True)


def _measure_cpu_bandwidth_gbs() -> float:
    """This host's copy bandwidth, measured once at session end (about half a second)."""
    return ceiling.measure_cpu_copy_bandwidth_gbs(_CPU_COPY_DURATION_S, buffer_mib=_CPU_COPY_BUFFER_MIB)


# -- the report -------------------------------------------------------------------------------


def decode_results(results: Iterable[TestResult]) -> list[tuple[TestResult, float]]:
    """The single-stream decode results (checked against the floor, or a single-stream scenario)
    that have a valid decode_tok_s median, with that median."""
    found = []
    for res in results:
        mres = res.metrics.get(FLOOR_METRIC)
        if res.invalid or mres is None:
            continue
        if not (res.floor or (res.run is not None and res.run.load.get("kind") == SINGLE_STREAM)):
            continue  # a concurrent run's per-request decode rate is not single-stream decode
        median = mres.summary()["median"]
        if median is not None and math.isfinite(median) and median > 0:
            found.append((res, float(median)))
    return found


def build_roofline_report(
    results: Iterable[TestResult],
    deployment: Any,
    fingerprint: Any,
    *,
    rootpath: Path | None = None,
    environ: Mapping[str, str] | None = None,
    measure_cpu_gbs: Callable[[], float] = _measure_cpu_bandwidth_gbs,
    tiny_model_dir: Path | None = None,
    external: bool = False,
    measure_allreduce: Callable[[int, int], tuple[float, str] | None] = ceiling.measure_allreduce_latency,
) -> RooflineReport | None:
    """The ceilings for the session's single-stream decode results; None when there are none."""
    decoded = decode_results(results)
    if not decoded:
        return None
    tp = int(deployment.tensor_parallel_size)
    lookup = find_model_config(deployment, rootpath=rootpath, environ=environ, tiny_model_dir=tiny_model_dir)
    latency = _resolve_allreduce_latency(deployment, fingerprint)

    def unknown(reason: str, bandwidth: RooflineInput) -> RooflineReport:
        return RooflineReport(
            deployment=deployment.name, tensor_parallel_size=tp, model_config=lookup,
            bandwidth=bandwidth, allreduce_latency=latency, estimate=None,
            measurements=tuple(DecodeAgainstCeiling(r.test, r.profile, m, None, None, boot=r.boot)
                               for r, m in decoded),
            unknown_reason=reason,
        )

    if lookup.path is None:
        # Without the model there is nothing to divide by: the bandwidth is not even measured.
        return unknown(f"no model config ({lookup.reason})", RooflineInput(None, "not needed: no model config"))
    bandwidth = _resolve_bandwidth(deployment, fingerprint, measure_cpu_gbs=measure_cpu_gbs)
    if bandwidth.value is None:
        return unknown(f"no memory bandwidth ({bandwidth.source})", bandwidth)
    try:
        config = read_model_config(lookup.path)
        if not external:
            latency = _measured_allreduce_latency(deployment, config, latency, measure_allreduce)
        est = ceiling.estimate(config, tp=tp, bandwidth_gbs=bandwidth.value,
                                allreduce_latency_us=latency.value, source=str(lookup.path))
    except ConfigError as exc:
        return unknown(str(exc), bandwidth)
    measurements = tuple(
        DecodeAgainstCeiling(
            res.test, res.profile, median,
            fraction_of_bandwidth_ceiling=median / est.bandwidth_ceiling_tok_s,
            fraction_of_ceiling=median / est.ceiling_tok_s if est.comm_term_known else None,
            boot=res.boot,
        )
        for res, median in decoded
    )
    notes: list[str] = []
    if not deployment.needs_gpus and deployment.memory_bandwidth_gbs is None and \
            est.weight_bytes.per_gpu_bytes < _CPU_CACHE_BYTES:
        notes.append(
            f"the weights read per token ({_bytes(est.weight_bytes.per_gpu_bytes)}) fit in the CPU "
            "caches, so DRAM bandwidth does not bind this model: the distance to the ceiling is "
            "per-token overhead (scheduling, Python, kernel launches), not memory traffic"
        )
    if external:
        notes.append("the server was attached with --kimiperf-server-url: the hardware inputs describe this "
                     "host, which may not be the server's")
    limit = est.ceiling_tok_s if est.comm_term_known else est.bandwidth_ceiling_tok_s
    above = [m.profile for m in measurements if m.median_tok_s > limit * 1.02]
    if above:
        notes.append(f"{', '.join(sorted(set(above)))} measured above the ceiling: check the bandwidth, "
                     "latency and quantization inputs")
    return RooflineReport(
        deployment=deployment.name, tensor_parallel_size=tp, model_config=lookup,
        bandwidth=bandwidth, allreduce_latency=latency, estimate=est,
        measurements=measurements, notes=tuple(notes),
    )


# -- formatting -------------------------------------------------------------------------------


def _sig(value: float) -> str:
    """Four significant digits with thousands separators, never e-notation (297.2, 14,850)."""
    if value >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _bytes(n: int) -> str:
    """Decimal units as the roofline module uses (GB = 10**9 bytes): ``6.03 GB``, ``673.3 kB``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"
