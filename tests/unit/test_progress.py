"""Boot progress: the bars of vLLM's log read as phase and percentage, and the xdist progress relay
(worker lines appended to a file, passed on by a controller thread)."""

from __future__ import annotations

import time
from pathlib import Path

from pytest_kimiperf.server.progress import RelayOutput, RelayTail
from pytest_kimiperf.server.progress import BootProgress, parse_progress, split_log_records
from tests import helpers


def _wait_for(seen: list[str], n: int) -> None:
    deadline = time.monotonic() + 5
    while len(seen) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_relay_passes_on_whole_lines_in_order_and_drains_on_close(tmp_path: Path) -> None:
    path = tmp_path / "progress.log"
    seen: list[str] = []
    tail = RelayTail(path, seen.append, poll_s=0.01)
    gw0, gw1 = RelayOutput(path, "[gw0] "), RelayOutput(path, "[gw1] ")
    gw0.write_line("kimiperf [default] loading weights 50% (4/8) — 3s elapsed")
    gw0.write_line("")  # ends an in-place line on a tty; means nothing in a relay
    gw1.rewrite("kimiperf [ring-ll] ready — 9s elapsed")
    _wait_for(seen, 2)
    assert seen == ["[gw0] kimiperf [default] loading weights 50% (4/8) — 3s elapsed",
                    "[gw1] kimiperf [ring-ll] ready — 9s elapsed"]
    with open(path, "ab") as raw:  # half a line: held back until its end arrives
        raw.write(b"[gw0] half")
    time.sleep(0.05)
    assert len(seen) == 2
    with open(path, "ab") as raw:
        raw.write(b" and the rest\n")
    gw0.write_line("last words")
    tail.close()  # no wait: close passes on what the thread has not seen yet
    assert seen[2:] == ["[gw0] half and the rest", "[gw0] last words"]
    tail.close()


def test_relay_output_without_its_folder_drops_lines(tmp_path: Path) -> None:
    RelayOutput(tmp_path / "gone" / "progress.log", "[gw0] ").write_line("nobody listens")
    assert not (tmp_path / "gone").exists()


def test_both_bar_shapes_of_a_vllm_boot_show_their_percentage_and_counts() -> None:
    # tqdm_bars.log: drawn by the installed tqdm in vLLM 0.32's two formats (record_tqdm_bars.py).
    text = (helpers.DATA / "boot_logs" / "tqdm_bars.log").read_text(encoding="utf-8")
    records, rest = split_log_records(text)
    assert rest == ""
    seen: dict[str, list[BootProgress]] = {}
    for record in records:
        progress = parse_progress(record)
        assert progress is not None and progress.percent is not None, record
        assert progress.total == 51 and progress.percent == round(100 * (progress.done or 0) / 51), record
        seen.setdefault(progress.phase, []).append(progress)
    for phase in ("capturing CUDA graphs", "loading weights"):
        assert {p.done for p in seen[phase]} == set(range(52)), phase  # every redraw, 0/51 to 51/51
    assert BootProgress("capturing CUDA graphs", 45, 23, 51) in seen["capturing CUDA graphs"]
    assert BootProgress("capturing CUDA graphs", 45, 23, 51).describe() == "capturing CUDA graphs 45% (23/51)"
