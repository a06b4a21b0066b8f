"""A process holding simulated GPU memory until killed: the stand-in for ci/gpu_bare_load.py's
``hold`` (a CUDA allocation) where ci/'s scripts run on the simulated GPU.

    python tests/fakes/simgpu/hold.py [hold] --mib 1024 [--gpu 0]

It prints ``ready: ...`` once the memory is held, as the real holder does.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/fakes
from simgpu import state  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("verb", nargs="?", default="hold")
    parser.add_argument("--mib", type=int, required=True)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args()
    state.hold({args.gpu: args.mib})
    print(f"ready: holding {args.mib} MiB on GPU {args.gpu} (simulated)", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
