"""The engine's clock against the client's, window by window, on real tiny-cpu boots (issue 65).

For each measured window of benchmarks/data/compare_same_boots (3 boots of tiny-cpu, 3 rounds a
boot, 1, 4 and 32 streams, the plugin and vLLM's bench serve interleaved on the same boots;
scripts/compare_data.sh read the server's /metrics before and after each tool's window): the
client's mean time per output token over the engine's (the engine core's decode seconds over the
tokens after each request's first, the figure measure/server_view.py reads). Their ratio is what
lies between the engine and the client's stamps (API server, network, client); its spread over
windows says how much of a client's change that part alone can move.

The window of server.tsv spans each tool's whole call, warm-up requests included, where the
client's mean covers its measured requests: the ratio is over nearly, not exactly, the same
requests.

    python benchmarks/engine_fidelity.py [benchmarks/data/compare_same_boots]
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_tools import PLUGIN, REFERENCE, load_interleaved, load_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    """Print, per load and client, the client/engine ratio's mean and spread over windows."""
    root = Path(argv[0]) if argv else ROOT / "benchmarks" / "data" / "compare_same_boots"
    clients, engine = load_interleaved(root), load_server(root)
    print(f"data: {root.relative_to(ROOT) if root.is_relative_to(ROOT) else root}")
    print("streams | client | windows | client TPOT / engine TPOT: mean | CV over windows | min..max | per boot (geomean)")
    print("--- | --- | --- | --- | --- | --- | ---")
    for streams in sorted(engine):
        for tool in (PLUGIN, REFERENCE):
            client = clients.get(streams, {}).get(tool, {}).get("tpot_ms", {})
            server = engine[streams].get(tool, {})
            ratios = {key: client[key] / server[key] for key in sorted(client) if key in server and server[key] > 0}
            if not ratios:
                continue
            values = list(ratios.values())
            cv = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")
            boots = sorted({boot for boot, _ in ratios})
            per_boot = ", ".join(
                f"{math.exp(statistics.fmean(math.log(v) for (b, _), v in ratios.items() if b == boot)):.3f}"
                for boot in boots)
            print(f"{streams} | {tool} | {len(values)} | {statistics.fmean(values):.3f} | {cv:.1%} | "
                  f"{min(values):.3f}..{max(values):.3f} | {per_boot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
