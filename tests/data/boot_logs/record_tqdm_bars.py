"""Writes tqdm_bars.log: the progress bars a vLLM 0.32 boot draws, as the installed tqdm draws them.

Two bars, each at 23 of 51 and then done: the CUDA-graph capture (v1/worker/gpu_model_runner.py
line 6654: tqdm's default format, '{l_bar}{bar}{r_bar}', tqdm/std.py lines 585-589 and 628, so a
bar sits between '%|' and the counts) and the checkpoint-shard load (model_loader/weight_utils.py
line 837, _BAR_FORMAT: '% Completed | n/total', no bar). The capture bar twice: to a UTF-8 file
(unicode blocks, what a server log gets) and in ASCII ('#'), what tqdm draws where it cannot
write unicode. Redraws are joined by '\\r' as in a server log.

    .venv/bin/python tests/data/boot_logs/record_tqdm_bars.py
"""

from __future__ import annotations

import io
from pathlib import Path

import tqdm

_SHARDS_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n"


def _bar(desc: str, **kwargs: object) -> str:
    out = io.StringIO()
    with tqdm.tqdm(total=51, desc=desc, file=out, mininterval=0, **kwargs) as bar:  # type: ignore[call-overload]
        for _ in range(51):
            bar.update(1)
    return out.getvalue()


def main() -> None:
    capture = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    parts = [_bar(capture, ascii=False), _bar(capture, ascii=True),
             _bar("Loading safetensors checkpoint shards", bar_format=_SHARDS_FORMAT)]
    text = "\n".join(p.strip("\n") for p in parts) + "\n"
    # Rates and times differ run to run; keep the shapes, not the clock.
    Path(__file__).with_name("tqdm_bars.log").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
