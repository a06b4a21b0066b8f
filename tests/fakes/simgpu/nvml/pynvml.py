"""``pynvml`` for the simulated GPU: nvidia-ml-py's own bindings over a stand-in for libnvidia-ml.

Put this folder first on ``sys.path`` (``PYTHONPATH``) and ``import pynvml`` gives the real
nvidia-ml-py module, run from its installed source, with one change: the ``nvmlLib`` it would
load with ``CDLL("libnvidia-ml.so.1")`` is :class:`SimLib`, whose functions take the C
arguments the bindings pass (``byref`` pointers, string buffers, struct arrays) and fill them
from the simulated host's state (``../state.py``, ``$SIMGPU_STATE``). So every value the plugin
reads went through the bindings' own wrappers, structures, error classes and two-call size
protocols, as on a real driver; only the numbers come from the test.

The C functions follow nvml.h (the signatures the bindings call with); what the simulated host
cannot say returns NVML_ERROR_NOT_SUPPORTED, as a GPU that lacks a counter does.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent.parent))  # tests/fakes: the simulated host's state module
from simgpu import state as _state  # noqa: E402

del sys.path[0]


def _real_bindings() -> Path:
    """nvidia-ml-py's pynvml.py: the first one on the path that is not this file."""
    for entry in sys.path:
        candidate = Path(entry or ".").resolve() / "pynvml.py"
        if candidate.is_file() and candidate.parent != _HERE:
            return candidate
    raise ImportError("the simulated GPU's pynvml wraps nvidia-ml-py's bindings, which are not installed")


_spec = importlib.util.spec_from_file_location(__name__, _real_bindings())
assert _spec is not None and _spec.loader is not None
exec(compile(_spec.loader.get_source(__name__) or "", _spec.origin or "pynvml.py", "exec"), globals())  # noqa: S102


def _obj(pointer: Any) -> Any:
    """The object a ``byref(...)`` argument points at."""
    return getattr(pointer, "_obj", pointer)


class SimLib:
    """The C functions of libnvidia-ml the bindings call, answered from the simulated host."""

    def __init__(self) -> None:
        self._initialised = 0

    # -- the library ---------------------------------------------------------------------

    def nvmlInitWithFlags(self, flags: int) -> int:
        try:
            _state.read_host()
        except RuntimeError:
            return NVML_ERROR_DRIVER_NOT_LOADED  # type: ignore[name-defined]  # noqa: F821
        self._initialised += 1
        return NVML_SUCCESS  # type: ignore[name-defined]  # noqa: F821

    def nvmlInit_v2(self) -> int:
        return self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> int:
        if self._initialised == 0:
            return NVML_ERROR_UNINITIALIZED  # type: ignore[name-defined]  # noqa: F821
        self._initialised -= 1
        return NVML_SUCCESS  # type: ignore[name-defined]  # noqa: F821

    def nvmlErrorString(self, result: int) -> bytes:
        return NVMLError._errcode_to_string.get(result, "Unknown Error").encode()  # type: ignore[name-defined]  # noqa: F821

    def __getattr__(self, name: str) -> Any:
        # A function the simulated driver does not have: the bindings raise FunctionNotFound,
        # as they do against an older libnvidia-ml.
        raise AttributeError(name)

    # -- helpers -------------------------------------------------------------------------

    def _reading(self) -> Any:
        if self._initialised == 0:
            raise _Fail(NVML_ERROR_UNINITIALIZED)  # type: ignore[name-defined]  # noqa: F821
        return _state.read()

    def _gpu(self, handle: Any) -> tuple[Any, Any]:
        reading = self._reading()
        index = (ctypes.cast(handle, ctypes.c_void_p).value or 0) - 1
        if not 0 <= index < len(reading.host.gpus):
            raise _Fail(NVML_ERROR_INVALID_ARGUMENT)  # type: ignore[name-defined]  # noqa: F821
        return reading, reading.host.gpus[index]


class _Fail(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def _c_function(method: Any) -> Any:
    """A SimLib method as a C function: an NVML return code, whatever goes wrong inside."""
    def call(self: SimLib, *args: Any) -> int:
        try:
            method(self, *args)
        except _Fail as failure:
            return failure.code
        return NVML_SUCCESS  # type: ignore[name-defined]  # noqa: F821
    call.__name__ = method.__name__
    return call


def _put(pointer: Any, value: Any) -> None:
    _obj(pointer).value = value


def _fill(buffer: Any, size: Any, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > int(getattr(size, "value", size)):
        raise _Fail(NVML_ERROR_INSUFFICIENT_SIZE)  # type: ignore[name-defined]  # noqa: F821
    buffer.value = data


def _define(name: str):
    def register(method: Any) -> Any:
        setattr(SimLib, name, _c_function(method))
        return method
    return register


@_define("nvmlSystemGetDriverVersion")
def _driver(self: SimLib, buffer: Any, size: Any) -> None:
    _fill(buffer, size, self._reading().host.driver_version)


@_define("nvmlSystemGetCudaDriverVersion")
def _cuda(self: SimLib, version: Any) -> None:
    major, _, minor = self._reading().host.cuda_version.partition(".")
    _put(version, int(major) * 1000 + int(minor or 0) * 10)  # nvml.h: 1000 * major + 10 * minor


@_define("nvmlSystemGetCudaDriverVersion_v2")
def _cuda_v2(self: SimLib, version: Any) -> None:
    _cuda(self, version)


@_define("nvmlDeviceGetCount_v2")
def _count(self: SimLib, count: Any) -> None:
    _put(count, len(self._reading().host.gpus))


@_define("nvmlDeviceGetHandleByIndex_v2")
def _handle(self: SimLib, index: Any, device: Any) -> None:
    value = int(getattr(index, "value", index))
    if not 0 <= value < len(self._reading().host.gpus):
        raise _Fail(NVML_ERROR_INVALID_ARGUMENT)  # type: ignore[name-defined]  # noqa: F821
    handle = ctypes.c_void_p(value + 1)  # an opaque pointer: never dereferenced
    ctypes.memmove(ctypes.addressof(_obj(device)), ctypes.addressof(handle), ctypes.sizeof(ctypes.c_void_p))


@_define("nvmlDeviceGetName")
def _name(self: SimLib, handle: Any, buffer: Any, size: Any) -> None:
    _fill(buffer, size, self._gpu(handle)[1].name)


@_define("nvmlDeviceGetUUID")
def _uuid(self: SimLib, handle: Any, buffer: Any, size: Any) -> None:
    _fill(buffer, size, self._gpu(handle)[1].uuid)


@_define("nvmlDeviceGetSerial")
def _serial(self: SimLib, handle: Any, buffer: Any, size: Any) -> None:
    serial = self._gpu(handle)[1].serial
    if serial == "[N/A]":
        raise _Fail(NVML_ERROR_NOT_SUPPORTED)  # type: ignore[name-defined]  # noqa: F821
    _fill(buffer, size, serial)


def _memory(reading: Any, gpu: Any) -> tuple[int, int, int]:
    mib = 1024 * 1024
    used = min(reading.used_mib(gpu), gpu.memory_total_mib)
    return gpu.memory_total_mib * mib, (gpu.memory_total_mib - used) * mib, used * mib


@_define("nvmlDeviceGetMemoryInfo")
def _memory_info(self: SimLib, handle: Any, memory: Any) -> None:
    total, free, used = _memory(*self._gpu(handle))
    info = _obj(memory)
    info.total, info.free, info.used = total, free, used


@_define("nvmlDeviceGetMemoryInfo_v2")
def _memory_info_v2(self: SimLib, handle: Any, memory: Any) -> None:
    total, free, used = _memory(*self._gpu(handle))
    info = _obj(memory)
    info.total, info.reserved, info.free, info.used = total, 0, free, used


@_define("nvmlDeviceGetMaxPcieLinkGeneration")
def _max_gen(self: SimLib, handle: Any, gen: Any) -> None:
    _put(gen, self._gpu(handle)[1].pcie_max_gen)


@_define("nvmlDeviceGetMaxPcieLinkWidth")
def _max_width(self: SimLib, handle: Any, width: Any) -> None:
    _put(width, self._gpu(handle)[1].pcie_max_width)


@_define("nvmlDeviceGetCurrPcieLinkGeneration")
def _curr_gen(self: SimLib, handle: Any, gen: Any) -> None:
    reading, gpu = self._gpu(handle)
    _put(gen, reading.link(gpu, time.time())[0])


@_define("nvmlDeviceGetCurrPcieLinkWidth")
def _curr_width(self: SimLib, handle: Any, width: Any) -> None:
    reading, gpu = self._gpu(handle)
    _put(width, reading.link(gpu, time.time())[1])


@_define("nvmlDeviceGetMigMode")
def _mig(self: SimLib, handle: Any, current: Any, pending: Any) -> None:
    mode = self._gpu(handle)[1].mig_mode
    if mode not in ("Enabled", "Disabled"):
        raise _Fail(NVML_ERROR_NOT_SUPPORTED)  # type: ignore[name-defined]  # noqa: F821
    _put(current, int(mode == "Enabled"))
    _put(pending, int(mode == "Enabled"))


@_define("nvmlDeviceGetComputeRunningProcesses_v3")
def _processes(self: SimLib, handle: Any, count: Any, infos: Any) -> None:
    reading, gpu = self._gpu(handle)
    listed = reading.processes(gpu)
    room = _obj(count).value
    _put(count, len(listed))
    if infos is None or room < len(listed):
        if listed:
            raise _Fail(NVML_ERROR_INSUFFICIENT_SIZE)  # type: ignore[name-defined]  # noqa: F821
        return
    unreported = reading.host.process_memory == "not-available"
    for slot, holding in zip(infos, listed, strict=False):
        # NVML_VALUE_NOT_AVAILABLE is the unsigned long long -1 (nvml.h); the bindings map it to None.
        slot.pid, slot.usedGpuMemory = holding.pid, 2**64 - 1 if unreported else holding.mib * 1024 * 1024
        slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF  # no MIG


@_define("nvmlDeviceGetCurrentClocksEventReasons")
def _reasons(self: SimLib, handle: Any, mask: Any) -> None:
    reading, gpu = self._gpu(handle)
    _put(mask, reading.reason_mask(gpu))


@_define("nvmlDeviceGetCurrentClocksThrottleReasons")
def _reasons_old(self: SimLib, handle: Any, mask: Any) -> None:
    _reasons(self, handle, mask)


@_define("nvmlDeviceGetPowerUsage")
def _power(self: SimLib, handle: Any, milliwatts: Any) -> None:
    reading, gpu = self._gpu(handle)
    _put(milliwatts, int(reading.power_w(gpu) * 1000))


@_define("nvmlDeviceGetPowerManagementLimit")
def _power_limit(self: SimLib, handle: Any, milliwatts: Any) -> None:
    _put(milliwatts, int(self._gpu(handle)[1].power_limit_w * 1000))


@_define("nvmlDeviceGetEnforcedPowerLimit")
def _enforced_limit(self: SimLib, handle: Any, milliwatts: Any) -> None:
    _power_limit(self, handle, milliwatts)


@_define("nvmlDeviceGetClockInfo")
def _clock(self: SimLib, handle: Any, kind: Any, mhz: Any) -> None:
    reading, gpu = self._gpu(handle)
    if int(getattr(kind, "value", kind)) not in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):  # type: ignore[name-defined]  # noqa: F821
        raise _Fail(NVML_ERROR_NOT_SUPPORTED)  # type: ignore[name-defined]  # noqa: F821
    _put(mhz, reading.sm_clock_mhz(gpu))


@_define("nvmlDeviceGetTemperatureV")
def _temperature_v(self: SimLib, handle: Any, reading_struct: Any) -> None:
    reading, gpu = self._gpu(handle)
    if _obj(reading_struct).sensorType != NVML_TEMPERATURE_GPU:  # type: ignore[name-defined]  # noqa: F821
        raise _Fail(NVML_ERROR_NOT_SUPPORTED)  # type: ignore[name-defined]  # noqa: F821
    _obj(reading_struct).temperature = reading.temperature_c(gpu)


@_define("nvmlDeviceGetTemperature")
def _temperature(self: SimLib, handle: Any, sensor: Any, celsius: Any) -> None:
    reading, gpu = self._gpu(handle)
    _put(celsius, reading.temperature_c(gpu))


@_define("nvmlDeviceGetTotalEnergyConsumption")
def _energy(self: SimLib, handle: Any, millijoules: Any) -> None:
    reading, gpu = self._gpu(handle)
    _put(millijoules, reading.energy_mj(gpu, time.time()))


def _violation_ns(reading: Any, gpu: Any, policy: int) -> int:
    if policy == NVML_PERF_POLICY_POWER:  # type: ignore[name-defined]  # noqa: F821
        return int(reading.power_violation_ns(gpu))
    if policy == NVML_PERF_POLICY_THERMAL:  # type: ignore[name-defined]  # noqa: F821
        return int(reading.thermal_violation_ns(gpu))
    raise _Fail(NVML_ERROR_NOT_SUPPORTED)  # type: ignore[name-defined]  # noqa: F821


@_define("nvmlDeviceGetViolationStatus")
def _violation(self: SimLib, handle: Any, policy: Any, status: Any) -> None:
    reading, gpu = self._gpu(handle)
    ns = _violation_ns(reading, gpu, int(getattr(policy, "value", policy)))
    _obj(status).referenceTime = int(time.time() * 1e6)
    _obj(status).violationTime = ns


# nvml.h's field ids for the perf-policy counters (NVML_FI_DEV_PERF_POLICY_POWER = 74, _THERMAL = 75).
_FIELD_POLICIES = {74: "NVML_PERF_POLICY_POWER", 75: "NVML_PERF_POLICY_THERMAL"}


@_define("nvmlDeviceGetFieldValues")
def _fields(self: SimLib, handle: Any, count: Any, values: Any) -> None:
    reading, gpu = self._gpu(handle)
    for slot in list(_obj(values))[: int(getattr(count, "value", count))]:
        policy = _FIELD_POLICIES.get(int(slot.fieldId))
        slot.timestamp = int(time.time() * 1e6)
        if policy is None:
            slot.nvmlReturn = NVML_ERROR_NOT_SUPPORTED  # type: ignore[name-defined]  # noqa: F821
            continue
        slot.nvmlReturn = NVML_SUCCESS  # type: ignore[name-defined]  # noqa: F821
        slot.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG  # type: ignore[name-defined]  # noqa: F821
        slot.value.ullVal = _violation_ns(reading, gpu, globals()[policy])


@_define("nvmlDeviceGetSamples")
def _samples(self: SimLib, handle: Any, kind: Any, since_us: Any, value_type: Any, count: Any,
             samples: Any) -> None:
    reading, gpu = self._gpu(handle)
    if int(getattr(kind, "value", kind)) != NVML_PROCESSOR_CLK_SAMPLES:  # type: ignore[name-defined]  # noqa: F821
        raise _Fail(NVML_ERROR_NOT_SUPPORTED)  # type: ignore[name-defined]  # noqa: F821
    found = reading.clock_samples(gpu, int(getattr(since_us, "value", since_us)), time.time())
    _put(value_type, NVML_VALUE_TYPE_UNSIGNED_INT)  # type: ignore[name-defined]  # noqa: F821
    if samples is None:
        _put(count, len(found))
        return
    room = _obj(count).value
    for slot, (stamp_us, mhz) in zip(samples, found[-room:], strict=False):
        slot.timeStamp, slot.sampleValue.uiVal = stamp_us, mhz
    _put(count, min(room, len(found)))


@_define("nvmlDeviceGetCudaComputeCapability")
def _capability(self: SimLib, handle: Any, major: Any, minor: Any) -> None:
    gpu = self._gpu(handle)[1]
    _put(major, gpu.compute_capability[0])
    _put(minor, gpu.compute_capability[1])


@_define("nvmlDeviceGetPersistenceMode")
def _persistence(self: SimLib, handle: Any, mode: Any) -> None:
    _put(mode, int(self._gpu(handle)[1].persistence_mode))


nvmlLib = SimLib()  # noqa: F811 - the library the bindings would have loaded with CDLL
