"""NVML's cumulative counters across a measured window: throttled time and energy under load.

Clock-event reasons are instantaneous and the watch samples them at the window's two ends, both
idle moments; the violation counters (nvmlDeviceGetViolationStatus, ns since the driver loaded),
total energy (nvmlDeviceGetTotalEnergyConsumption, mJ) and the driver's own clock samples
(nvmlDeviceGetSamples) see what happened in between.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pytest_kimiperf.config.deployments import HostBounds
from pytest_kimiperf.measure.hostwatch import GpuReading, merge_gpu_samples
from pytest_kimiperf.measure.hostwatch import HostReading, HostWatch
from pytest_kimiperf.measure.invalid_causes import InvalidCause
from pytest_kimiperf.measure.runner import cause_of, host_busy
from tests.unit.test_hostwatch import FakeNvml

pynvml = pytest.importorskip("pynvml")


class CountingNvml(FakeNvml):
    """The recorded-answer fake, plus the two cumulative counters in pynvml's own types."""

    NVML_PERF_POLICY_POWER = pynvml.NVML_PERF_POLICY_POWER
    NVML_PERF_POLICY_THERMAL = pynvml.NVML_PERF_POLICY_THERMAL

    def nvmlDeviceGetViolationStatus(self, handle: dict[str, Any], policy: int) -> Any:
        key = {pynvml.NVML_PERF_POLICY_POWER: "power_violation_ns",
               pynvml.NVML_PERF_POLICY_THERMAL: "thermal_violation_ns"}[policy]
        return pynvml.c_nvmlViolationTime_t(referenceTime=0, violationTime=self._value(handle, key))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "energy_mj")

    NVML_PROCESSOR_CLK_SAMPLES = pynvml.NVML_PROCESSOR_CLK_SAMPLES

    def nvmlDeviceGetSamples(self, handle: dict[str, Any], kind: int, since_us: int) -> Any:
        # The driver's ring buffer as pynvml returns it: (value type, [nvmlSample_t]); the test's
        # clocks are stamped relative to the call, as the driver stamps them in CPU microseconds.
        assert kind == pynvml.NVML_PROCESSOR_CLK_SAMPLES
        samples = []
        for offset_us, mhz in handle.get("clock_samples", []):
            value = pynvml.c_nvmlValue_t()
            value.uiVal = mhz
            samples.append(pynvml.c_nvmlSample_t(timeStamp=since_us + offset_us, sampleValue=value))
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, samples


def _sample(**counters: int | None) -> dict[str, Any]:
    # Both ends of the window idle: 2100 MHz, no reason but gpu_idle, 60 W.
    return {"sm_clock_mhz": 2100, "temperature_c": 40, "power_mw": 60000, "clocks_event_reasons": 1,
            "compute_processes": [], **counters}


# A 1-minute window on one GPU: 2.1 s held back by the power limit, none by temperature, 18 kJ used.
WINDOW = {"gpus": {"0": [
    _sample(power_violation_ns=1_200_000_000, thermal_violation_ns=5_000_000, energy_mj=1_000_000),
    _sample(power_violation_ns=3_300_000_000, thermal_violation_ns=5_000_000, energy_mj=19_000_000,
            # Held at 1800-1900 MHz under load, before the idle end read 2100; one stamp before the start.
            clock_samples=[(-5, 2100), (1_000_000, 1890), (2_000_000, 1800), (3_000_000, 1850)]),
]}}


def test_throttling_between_two_idle_ends_is_seen_through_the_counters() -> None:
    nvml = CountingNvml(WINDOW)
    watch = HostWatch(own_pids=list, gpu_indices=[0], nvml=nvml)
    watch.start()
    reading = watch.stop()
    (gpu,) = reading.gpus
    assert gpu.throttle_reasons == ("gpu_idle",)  # what the two ends alone say: nothing
    assert (gpu.power_violation_ms, gpu.thermal_violation_ms, gpu.energy_j) == (2100.0, 0.0, 18000.0)
    assert gpu.sm_clock_mhz == 2100 and gpu.sm_clock_under_load_mhz == 1850  # the median inside the window
    minute = HostReading(wall_s=60.0, cpu_count=2, foreign_cpu_share=0.0, steal_share=0.0, psi={},
                         top_foreign=(), gpus=reading.gpus)
    # Only our load was on the GPU: its power capping is part of the measurement, reported.
    assert minute.disturbances(HostBounds()) == []
    assert minute.own_throttling() == [
        "GPU 0 ran at its power limit for 2100 ms of the 60.0 s window, average 300 W, SM clock 1850 MHz under load"]
    assert minute.describe_busy(HostBounds()).endswith("; " + minute.own_throttling()[0])
    # Another process on the GPU: the same capping is no longer the measured load's alone.
    (gpu,) = minute.gpus
    shared = dataclasses.replace(minute, gpus=(dataclasses.replace(gpu, foreign_processes=((4242, 2**30),)),))
    assert [line for line in shared.disturbances(HostBounds()) if "power limit" in line] == [
        "GPU 0 clocks held back by the power limit for 2100 ms of the 60.0 s window "
        "(NVML violation counters, average 300 W, SM clock 1850 MHz under load)"]
    assert shared.own_throttling() == []
    allowed = HostBounds(max_foreign_gpu_processes=1, forbidden_throttle_reasons=("hw_slowdown", "sw_thermal_slowdown"))
    assert shared.disturbances(allowed) == []


def test_thermal_throttling_under_our_own_load_is_still_a_disturbance() -> None:
    gpu = GpuReading(0, 1500, 88, 700.0, ("sw_thermal_slowdown",), (), power_violation_ms=0.0,
                     thermal_violation_ms=900.0, energy_j=42000.0)
    reading = HostReading(wall_s=60.0, cpu_count=2, foreign_cpu_share=0.0, steal_share=0.0, psi={},
                          top_foreign=(), gpus=(gpu,))
    assert reading.disturbances(HostBounds()) == [
        "GPU 0 clocks held back by temperature for 900 ms of the 60.0 s window "
        "(NVML violation counters, average 700 W)",
        "GPU 0 clocks held back by sw_thermal_slowdown (SM 1500 MHz, 88 C, 700 W)"]
    # Held back by heat alone, an INVALID's cause is the GPU's, and so is its advice; with other
    # work beside it, the busy host's.
    assert cause_of(host_busy([reading], HostBounds(), attempts=3)) is InvalidCause.GPU_THROTTLE  # type: ignore[arg-type]
    busy = dataclasses.replace(reading, foreign_cpu_share=0.6)
    assert cause_of(host_busy([busy], HostBounds(), attempts=3)) is InvalidCause.BUSY_HOST  # type: ignore[arg-type]


def test_a_counter_that_went_back_or_is_missing_says_nothing() -> None:
    start = GpuReading(0, 2100, 40, 60.0, (), (), power_violation_ms=500.0, energy_j=None)
    reset = GpuReading(0, 2100, 40, 60.0, (), (), power_violation_ms=10.0, energy_j=5.0)  # driver reloaded
    merged = merge_gpu_samples([start, reset], own_pids=())
    assert (merged.power_violation_ms, merged.thermal_violation_ms, merged.energy_j) == (None, None, None)


def test_a_reading_with_counters_survives_a_json_round_trip() -> None:
    gpu = GpuReading(0, 2100, 40, 60.0, ("gpu_idle",), (), power_violation_ms=2100.0, thermal_violation_ms=0.0,
                     energy_j=18000.0, sm_clock_under_load_mhz=1850)
    reading = HostReading(wall_s=60.0, cpu_count=2, foreign_cpu_share=0.0, steal_share=0.0, psi={},
                          top_foreign=(), gpus=(gpu,))
    assert HostReading.from_json(reading.to_json()) == reading


class FieldValueNvml(FakeNvml):
    """The same window as CountingNvml answers it, through what replaces the calls marked for
    removal in CUDA 14 (pynvml 13.615): the perf-policy counters as field values in pynvml's own
    c_nvmlFieldValue_t, and nvmlDeviceGetTemperatureV; the old calls are gone."""

    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_FI_DEV_PERF_POLICY_POWER = pynvml.NVML_FI_DEV_PERF_POLICY_POWER
    NVML_FI_DEV_PERF_POLICY_THERMAL = pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL
    NVML_PERF_POLICY_POWER = pynvml.NVML_PERF_POLICY_POWER
    NVML_PERF_POLICY_THERMAL = pynvml.NVML_PERF_POLICY_THERMAL
    nvmlDeviceGetTemperature = None  # removed

    def nvmlDeviceGetTemperatureV(self, handle: dict[str, Any], sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._value(handle, "temperature_c")

    def nvmlDeviceGetFieldValues(self, handle: dict[str, Any], field_ids: list[int]) -> Any:
        keys = {pynvml.NVML_FI_DEV_PERF_POLICY_POWER: "power_violation_ns",
                pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: "thermal_violation_ns"}
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field in zip(values, field_ids, strict=True):
            value.fieldId, value.nvmlReturn = field, pynvml.NVML_SUCCESS
            value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            value.value.ullVal = self._value(handle, keys[field])
        return values

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "energy_mj")


def test_counters_and_temperature_are_read_without_the_calls_cuda_14_removes() -> None:
    watch = HostWatch(own_pids=list, gpu_indices=[0], nvml=FieldValueNvml(WINDOW))
    watch.start()
    (gpu,) = watch.stop().gpus
    assert (gpu.power_violation_ms, gpu.thermal_violation_ms, gpu.energy_j) == (2100.0, 0.0, 18000.0)
    assert gpu.temperature_c == 40


class MismatchedNvml(CountingNvml):
    """Bindings newer than the driver: pynvml's throwOnVersionMismatch turns the missing
    nvmlDeviceGetComputeRunningProcesses_v3 into NVMLLibraryMismatchError, not an NVMLError."""

    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> Any:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")


def test_bindings_newer_than_the_driver_lose_the_process_list_not_the_window() -> None:
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)  # why it needs its own catch
    watch = HostWatch(own_pids=list, gpu_indices=[0], nvml=MismatchedNvml(WINDOW))
    watch.start()
    (gpu,) = watch.stop().gpus
    assert gpu.foreign_processes == () and gpu.power_violation_ms == 2100.0

    from pytest_kimiperf.server import gpu as gpu_module

    # The guard ask_driver and the GPU probe share (NVML itself cannot load on a host without GPUs).
    assert pynvml.NVMLLibraryMismatchError in gpu_module.nvml_failures(pynvml)
