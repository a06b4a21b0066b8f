"""A simulated GPU host for the plugin's tests: NVML and nvidia-smi answering from one state.

``state.py`` holds the state (the GPUs, and the real processes holding their memory);
``nvml/pynvml.py`` is nvidia-ml-py's own bindings over a stand-in libnvidia-ml that answers from
it; ``bin/nvidia-smi`` prints it in the real tool's recorded layouts. :class:`SimulatedGpus` is
what a test uses: it writes the host, and gives the environment under which every process of
the test (pytest under pytester, the stub server and its children, a stranger) sees the same
GPUs: ``PATH`` with the fake nvidia-smi first, ``PYTHONPATH`` with the fake pynvml first, and
``SIMGPU_STATE``.

What the simulation can show, and what only a real GPU can (docs/explanation/reliability.md):
the plugin's reading of the driver's answers, the order of its checks, sweeping, waiting and
reporting are real here; the numbers are the test's, and CUDA itself (a context's memory, the
driver's teardown, clocks under a real load) is not simulated.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from . import state

HERE = Path(__file__).resolve().parent
NVML_DIR = HERE / "nvml"
BIN_DIR = HERE / "bin"
FAKES = HERE.parent

# A process that is no part of any kimiperf launch and holds GPU memory until killed (another
# user's notebook, a stray training job): ``python -c STRANGER '{"0": 90000}' linger_s``.
STRANGER = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from simgpu import state
state.hold({int(k): v for k, v in json.loads(sys.argv[1]).items()}, linger_s=float(sys.argv[2]))
print("HOLDING", flush=True)
while True:
    time.sleep(1)
"""


class SimulatedGpus:
    """One simulated host in ``directory``: its state, its environment, its strangers."""

    def __init__(self, directory: Path, host: state.Host | None = None) -> None:
        self.directory = directory
        self.host = host or state.rtx_pro_6000_host()
        state.write_host(self.host, directory)
        self._strangers: list[subprocess.Popen[bytes]] = []

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (os.environ) with the simulated GPU's tools first."""
        base = dict(os.environ if base is None else base)
        python_path = base.get("PYTHONPATH")
        return {**base, state.STATE_ENV: str(self.directory),
                "PATH": f"{BIN_DIR}{os.pathsep}{base.get('PATH', '')}",
                "PYTHONPATH": f"{NVML_DIR}{os.pathsep}{python_path}" if python_path else str(NVML_DIR)}

    def update(self, **changes: object) -> None:
        """Change the host (e.g. ``pid_mode="foreign"``) for every process from now on."""
        for key, value in changes.items():
            setattr(self.host, key, value)
        state.write_host(self.host, self.directory)

    def update_gpu(self, index: int, **changes: object) -> None:
        """Change one GPU (e.g. ``reasons_under_load=("hw_thermal_slowdown",)``)."""
        for key, value in changes.items():
            setattr(self.host.gpus[index], key, value)
        state.write_host(self.host, self.directory)

    def stranger(self, mib_by_gpu: Mapping[int, int], *, linger_s: float = 0.0) -> subprocess.Popen[bytes]:
        """Start a process of no kimiperf launch holding ``mib_by_gpu``; returns once it holds it."""
        import json

        proc = subprocess.Popen([sys.executable, "-c", STRANGER, json.dumps(mib_by_gpu), str(linger_s), str(FAKES)],
                                stdout=subprocess.PIPE, env=self.env())
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert b"HOLDING" in line, f"the stranger did not start: {line!r}"
        self._strangers.append(proc)
        return proc

    def read(self) -> state.Reading:
        """The host now."""
        return state.read(self.directory)

    def used_mib(self) -> dict[int, int]:
        """Memory used on each GPU now (MiB, by index)."""
        reading = self.read()
        return {gpu.index: reading.used_mib(gpu) for gpu in reading.host.gpus}

    def wait_released(self, timeout_s: float = 10.0) -> None:
        """Until no GPU holds memory (every holder ended, nothing lingers)."""
        deadline = time.monotonic() + timeout_s
        while any(self.used_mib().values()):
            assert time.monotonic() < deadline, f"GPU memory still held: {self.used_mib()}"
            time.sleep(0.05)

    def close(self) -> None:
        """End the strangers this host started."""
        for proc in self._strangers:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
