"""How the bare GPU check's steps run a child and keep what it read: the one module that
ci/gpu_bare_check.py, ci/gpu_bare_preflight.py and ci/gpu_bare_steps.py share, and it imports
none of them (nor the plugin), so the steps' modules import one way only.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOAD = str(ROOT / "ci" / "gpu_bare_load.py")
# A child's import path: this checkout first, then what the shell set (a carried .bare-deps).
CHILD_PATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run a command; (exit code, stdout+stderr), 124 on timeout, 127 where it cannot start."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired as error:
        # What it printed before the cut, which subprocess hands back as bytes even in text mode.
        return 124, "".join(part.decode("utf-8", "replace") if isinstance(part, bytes) else part or ""
                            for part in (error.stdout, error.stderr))
    except OSError as error:
        return 127, str(error)
    return done.returncode, done.stdout + done.stderr


def save(where: Path, name: str, data: object) -> None:
    """Write one recording: text as is, anything else as JSON."""
    where.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data, indent=1, sort_keys=True, default=str)
    (where / name).write_text(text)


def record_call(record: dict[str, object], name: str, getter: Callable[[], object]) -> object:
    """One driver call: its value (None where it raised), and into ``record`` its repr or its error."""
    try:
        value = getter()
    except Exception as error:  # noqa: BLE001  (every failure is the recording)
        record[name] = f"{type(error).__module__}.{type(error).__name__}: {error}"
        return None
    record[name] = repr(value)
    return value


def nvml_sample(pynvml: Any, index: int, since_us: int | None = None) -> dict[str, object]:
    """One GPU now, in the fake NVML's recording format (tests/unit/test_hostwatch.py FakeNvml)."""
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    raw: dict[str, object] = {}

    def get(name: str, *args: object) -> Any:
        return record_call(raw, name, lambda: getattr(pynvml, name)(h, *args))

    procs = get("nvmlDeviceGetComputeRunningProcesses") or []
    sample: dict[str, object] = {
        "sm_clock_mhz": get("nvmlDeviceGetClockInfo", pynvml.NVML_CLOCK_SM),
        "temperature_c": get("nvmlDeviceGetTemperatureV", pynvml.NVML_TEMPERATURE_GPU),
        "power_mw": get("nvmlDeviceGetPowerUsage"),
        "clocks_event_reasons": get("nvmlDeviceGetCurrentClocksEventReasons"),
        "compute_processes": [{"pid": int(p.pid), "used_gpu_memory_bytes": p.usedGpuMemory} for p in procs],
        "energy_mj": get("nvmlDeviceGetTotalEnergyConsumption"),
    }
    for key, policy, field in (("power_violation_ns", "NVML_PERF_POLICY_POWER", "NVML_FI_DEV_PERF_POLICY_POWER"),
                               ("thermal_violation_ns", "NVML_PERF_POLICY_THERMAL", "NVML_FI_DEV_PERF_POLICY_THERMAL")):
        status = get("nvmlDeviceGetViolationStatus", getattr(pynvml, policy))
        sample[key] = None if status is None else int(status.violationTime)
        values = get("nvmlDeviceGetFieldValues", [getattr(pynvml, field)])
        sample[key + "_field"] = None if not values else [int(values[0].nvmlReturn), int(values[0].value.ullVal)]
    if since_us is not None:
        answer = get("nvmlDeviceGetSamples", pynvml.NVML_PROCESSOR_CLK_SAMPLES, since_us)
        sample["clock_samples"] = [] if not answer else [
            [int(s.timeStamp) - since_us, int(s.sampleValue.uiVal)] for s in answer[1]]
    sample["raw"] = raw
    return sample
