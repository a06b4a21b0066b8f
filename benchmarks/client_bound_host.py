"""The client's self-check on a slower host: its event-loop bounds follow what the host can do.

A bound set on a fast host (the loop answers within 0.5 ms at the median) judges the host, not
the client, on a slow one: CI on a host 5x slower read p50 0.84 ms and called the run
client-bound. Each client process times the same probe on an idle loop in a fresh interpreter
(``measure.loop_probe``; it inherits the client's core), and the bound in force is never below
``results.HOST_LOOP_FACTOR`` times what that reads.

This runs the client against the paced truth server (tests/fakes/paced_server.py) at 1 and 8
streams (``--streams``), on the host as it is and with the client given less CPU: a real-time hog
pinned to the client's core (SCHED_FIFO, above the client's normal priority, so the client waits
for it the way a slower core would make it wait) that runs ``--hog-duty`` of every millisecond
(0: the host as it is only). For each it prints the client's CPU share, the loop's p50/p99, the
idle loop's, the bounds in force and the verdict.

``--batched`` makes the server write every stream's chunk of a step at once, as a server that
decodes all running streams in one step does (tiny-gpu-torch): the client's loop then reads the
streams' chunks back to back, the burst its bounds must allow (config/deployments.py).

    python benchmarks/client_bound_host.py [--hog-duty 0.5] [--requests 20]
    python benchmarks/client_bound_host.py --hog-duty 0.5 --streams 32 --batched --itl-ms 2 --requests 6
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from client_accuracy import MODEL, paced_server  # noqa: E402

from pytest_kimiperf.config.deployments import HealthBounds  # noqa: E402
from pytest_kimiperf.measure.hostwatch import CpuCounters, parse_proc_stat  # noqa: E402
from pytest_kimiperf.measure.loop_probe import host_idle_loop_latency_ms  # noqa: E402
from pytest_kimiperf.measure.results import percentile  # noqa: E402
from pytest_kimiperf.measure.results import loop_latency_bounds  # noqa: E402
from pytest_kimiperf.measure.runner import run_scenario  # noqa: E402
from pytest_kimiperf.measure.workload import Concurrency  # noqa: E402
from pytest_kimiperf.measure.target import Target  # noqa: E402
from pytest_kimiperf.reports.sentences import say_run_invalid  # noqa: E402

CLIENT_CORE = 1
HOG_PRIORITY = 10  # real-time: above the client, which runs at normal priority (measure/placement.py)


def _hog(duty: float, stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    os.sched_setaffinity(0, {CLIENT_CORE})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(HOG_PRIORITY))
    except OSError:
        pass
    busy_ns, period_ns = int(duty * 1e6), 1_000_000
    while not stop.is_set():
        start = time.perf_counter_ns()
        while time.perf_counter_ns() - start < busy_ns:
            pass
        time.sleep((period_ns - busy_ns) / 1e9)


@contextlib.contextmanager
def hog(duty: float) -> Iterator[None]:
    """A real-time process taking ``duty`` of every millisecond of the client's core."""
    if duty <= 0:
        yield
        return
    stop = multiprocessing.Event()
    proc = multiprocessing.Process(target=_hog, args=(duty, stop), daemon=True)
    proc.start()
    try:
        yield
    finally:
        stop.set()
        proc.join(5)


def _cpu_counters() -> CpuCounters:
    return parse_proc_stat(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))


def measure(base_url: str, streams: int, requests: int) -> str:
    """One run of the client at ``streams`` on core CLIENT_CORE: its loop, the host's, the verdict."""
    os.sched_setaffinity(0, {CLIENT_CORE})
    before, started_s = _cpu_counters(), time.monotonic()
    host_idle_loop_latency_ms.cache_clear()  # the host changed: the hog took part of its core
    scenario = Concurrency(concurrency=streams, requests=requests * streams, prompt_tokens=16, output_tokens=64,
                           warmup_requests=streams)
    run = run_scenario(Target(base_url, MODEL, server_metrics=False), scenario)
    after, wall_s = _cpu_counters(), time.monotonic() - started_s
    # The hypervisor's share of the host's CPU time over the run: what the host bound on steal
    # (config/deployments.py HostBounds.max_steal_share) would have read.
    steal_share = (after.steal_s - before.steal_s) / (wall_s * after.cpu_count)
    busy_share = (after.busy_s - before.busy_s) / (wall_s * after.cpu_count)
    health = [h for rnd in run.rounds for h in rnd.health]
    lat = [x for h in health for x in h.loop_latency_ms]
    idle = [x for h in health for x in h.idle_loop_latency_ms]
    b50, b99, _ = loop_latency_bounds(HealthBounds(), health)
    verdict = "valid" if run.invalid is None else f"INVALID: {say_run_invalid(run.invalid)[:140]}"
    cpu = max(h.cpu_fraction for h in health)
    chunks_per_s = sum(len(r.chunk_ns) for r in run.records) / sum(rnd.wall_s for rnd in run.rounds)
    return (f"client CPU share {cpu:.2f} (worst process and round), {chunks_per_s:.0f} chunks/s, "
            f"loop p50/p99 {percentile(lat, 50):.3f}/{percentile(lat, 99):.2f} ms, idle loop "
            f"{percentile(idle, 50):.3f}/{percentile(idle, 99):.2f} ms, bounds in force {b50:.3g}/{b99:.3g} ms "
            f"(declared 0.5/5), host busy {busy_share:.0%} steal {steal_share:.1%}: {verdict}")


def main(argv: list[str] | None = None) -> int:
    """Print one line per host state and stream count."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hog-duty", type=float, default=0.5, help="share of each ms the hog takes (0-0.95)")
    parser.add_argument("--requests", type=int, default=20, help="requests per stream (default 20)")
    parser.add_argument("--streams", default="1,8", help="stream counts, comma-separated (default 1,8)")
    parser.add_argument("--itl-ms", type=float, default=5.0, help="the server's gap between chunks (default 5)")
    parser.add_argument("--batched", action="store_true", help="the server writes every stream's chunk of a step at once")
    args = parser.parse_args(argv)
    if not 0.0 <= args.hog_duty <= 0.95:
        parser.error(f"--hog-duty {args.hog_duty}: use a share from 0 to 0.95")
    if not args.itl_ms > 0:
        parser.error(f"--itl-ms {args.itl_ms}: use a gap above 0 ms")
    if args.requests < 1:
        parser.error(f"--requests {args.requests}: use at least 1 request per stream")
    try:
        stream_counts = [int(part) for part in args.streams.split(",")]
    except ValueError:
        parser.error(f"--streams {args.streams!r}: use stream counts such as 1,8,32")
    if not stream_counts or min(stream_counts) < 1:
        parser.error(f"--streams {args.streams!r}: every stream count must be at least 1")
    with paced_server(ttft_ms=20.0, itl_ms=args.itl_ms, batched=args.batched) as base_url:
        for duty in sorted({0.0, args.hog_duty}):
            for streams in stream_counts:
                with hog(duty):
                    line = measure(base_url, streams, args.requests)
                print(f"client core {'free' if duty == 0 else f'{duty:.0%} taken'}, {streams} stream(s): {line}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
