"""The bare check's first step: what this machine offers, in one line, before anything needs a GPU.

Python and the packages the steps import (what the lent machine's image lacks travels in the
carried ``.bare-deps`` folder, ci/gpu-bare-deps.sh), torch with its CUDA and
NCCL versions, the driver and the CUDA version it supports (NVML), each GPU's compute
capability, persistence mode and MIG mode, and the container's ``CUDA_VISIBLE_DEVICES``,
``NVIDIA_VISIBLE_DEVICES`` and ``NVIDIA_DRIVER_CAPABILITIES``. A torch that cannot see a GPU is
this step's one FAIL line, and the steps that need one are then not started
(ci/gpu-bare-check.sh reads ``preflight.blocked``), instead of each failing on its own.

Python itself is checked first: the plugin needs 3.11 or later (pyproject's requires-python),
and ``.bare-deps`` was built for one CPython minor version (its ``BUILT_FOR``, cp312 by default):
another interpreter is a FAIL naming both and the command that rebuilds it.

    python ci/gpu_bare_preflight.py --python    that check alone, one line; exit 1 on a problem
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# What the steps import beyond the standard library, and the distribution each comes from.
PACKAGES = {"torch": "torch", "pynvml": "nvidia-ml-py", "psutil": "psutil", "httpx": "httpx", "pytest": "pytest",
            "numpy": "numpy", "scipy": "scipy", "pytest_benchmark": "pytest-benchmark",
            "prometheus_client": "prometheus_client", "matplotlib": "matplotlib"}
# Without these the steps cannot run at all (numpy: the CPU canary only; scipy: no step).
NEEDED = ("torch", "pynvml", "psutil", "httpx", "pytest")
ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_DEVICE_ORDER")
BLOCKED = "preflight.blocked"
# pyproject.toml's requires-python.
OLDEST_PYTHON = (3, 11)


def python_problem(root: Path = ROOT, version: Sequence[int] = tuple(sys.version_info[:3])) -> str | None:
    """Why this interpreter cannot run the plugin with the carried dependencies; None when it can."""
    here = ".".join(map(str, version[:3]))
    if tuple(version[:2]) < OLDEST_PYTHON:
        return (f"Python {here} is older than pytest-kimiperf allows (requires-python >= "
                f"{'.'.join(map(str, OLDEST_PYTHON))}): run with PYTHON=python3.12")
    built = root / ".bare-deps" / "BUILT_FOR"
    tag = built.read_text().strip() if built.is_file() else None
    if tag is not None and tag != f"cp{version[0]}{version[1]}":
        return (f".bare-deps was built for CPython {tag[2]}.{tag[3:]} ({tag}), this is CPython {here}: rebuild it "
                f"with BARE_PYTHON_VERSION={version[0]}.{version[1]} ci/gpu-bare-deps.sh, or run the Python it was "
                "built for")
    return None


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(PACKAGES[module])
    except importlib.metadata.PackageNotFoundError:
        return "present"  # carried without its metadata


def torch_facts() -> dict[str, Any]:
    """torch, its CUDA and NCCL, and what it sees; ``error`` says why it sees no GPU."""
    try:
        import torch
    except ImportError as error:
        return {"error": f"torch does not import: {error}"}
    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as error:  # noqa: BLE001  (a CPU build has no NCCL: that is the fact)
        facts["nccl"] = f"none ({type(error).__name__})"
    if not torch.cuda.is_available():
        why = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda} build, no device"
        return {**facts, "error": f"torch {torch.__version__} ({why}) sees no GPU"}
    facts["devices"] = [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i))}
                        for i in range(torch.cuda.device_count())]
    return facts


def nvml_facts() -> dict[str, Any]:
    """The driver, the CUDA version it supports, and each GPU's capability, persistence and MIG."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as error:  # noqa: BLE001  (no library, no driver: the fact itself)
        return {"error": f"NVML: {error}"}
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        facts: dict[str, Any] = {"driver": str(pynvml.nvmlSystemGetDriverVersion()),
                                 "driver_cuda": f"{cuda // 1000}.{cuda % 1000 // 10}", "gpus": []}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu: dict[str, Any] = {"name": str(pynvml.nvmlDeviceGetName(handle))}
            for key, getter in (("capability", pynvml.nvmlDeviceGetCudaComputeCapability),
                                ("persistence", pynvml.nvmlDeviceGetPersistenceMode),
                                ("mig", pynvml.nvmlDeviceGetMigMode)):
                try:
                    gpu[key] = getter(handle)
                except Exception as error:  # noqa: BLE001  (NOT_SUPPORTED: no MIG on this GPU)
                    gpu[key] = f"n/a ({error})"
            facts["gpus"].append(gpu)
        return facts
    finally:
        pynvml.nvmlShutdown()


def step_preflight(out: Path) -> tuple[str, str]:
    """The machine in one line; FAIL (and the GPU steps held back) where torch sees no GPU."""
    from ci.gpu_bare_recording import save

    packages = {module: _version(module) for module in PACKAGES}
    facts: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(), "packages": packages,
             "env": {name: os.environ.get(name) for name in ENV}, "torch": torch_facts(), "nvml": nvml_facts()}
    save(out, "preflight.json", facts)
    missing = [module for module in NEEDED if packages[module] is None]
    python = python_problem()
    torch_seen, nvml_seen = facts["torch"], facts["nvml"]
    gpus = "; ".join(f"{g['name']} cc {g.get('capability')} persistence {g.get('persistence')} MIG {g.get('mig')}"
                     for g in nvml_seen.get("gpus", [])) or nvml_seen.get("error", "no GPU")
    env = ", ".join(f"{name}={value}" for name, value in facts["env"].items() if value is not None) or "no GPU env"
    version = f"{facts['python']} ({python})" if python else facts["python"]
    line = (f"python {version}, torch {torch_seen.get('torch')} CUDA {torch_seen.get('cuda')} NCCL "
            f"{torch_seen.get('nccl')}, driver {nvml_seen.get('driver')} (CUDA {nvml_seen.get('driver_cuda')}); "
            f"{gpus}; {env}")
    blocked = torch_seen.get("error")
    if blocked:
        (out.parent / BLOCKED).write_text(blocked + "\n")
        return "FAIL", f"{blocked}: the steps that need a GPU are not run; {line}"
    if python:
        return "FAIL", line
    if missing:
        return "FAIL", (f"missing {', '.join(missing)} (carry them: ci/gpu-bare-deps.sh builds .bare-deps); {line}")
    return "OK", line + ("" if packages["numpy"] else "; no numpy: the canary takes the GPU copy only")


if __name__ == "__main__" and sys.argv[1:] == ["--python"]:
    problem = python_problem()
    print(f"python: {'FAIL ' + problem if problem else f'OK {sys.version.split()[0]} at {sys.executable}'}")
    sys.exit(1 if problem else 0)
