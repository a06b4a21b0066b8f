"""The GPU copy canary runs in a child, so no CUDA context or buffer stays on a GPU the server needs."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT

# In a fresh interpreter: take the canary, then say whether torch (and with it any CUDA context)
# was ever loaded into this process.
PROBE = """
import json, sys
from pytest_kimiperf.measure.canary import gpu_canary
canary = gpu_canary(3)
print(json.dumps({"canary": None if canary is None else canary.to_json(), "torch_here": "torch" in sys.modules}))
"""


def test_the_gpu_canary_never_loads_torch_into_the_session() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=180,
                          check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["torch_here"] is False
    # On a host with CUDA torch the child's score comes back; on this CPU host there is none.
    assert seen["canary"] is None or seen["canary"]["scores"]["gpu_copy_gbs"] > 0
