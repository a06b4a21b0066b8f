"""Where the client runs: off the server's CPUs where the host has some to spare, never above it.

The decision on recorded thread samples; the reader and the pinning on real processes of this
host; and a run against the paced server whose process is pinned, end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.measure import placement
from pytest_kimiperf.measure.placement import (
    ISOLATED,
    NO_SPARE,
    NOT_KNOWN,
    TOO_SMALL,
    ThreadCpu,
    cpu_list,
    parse_task_stat,
    place_client,
    placed,
    read_threads,
)
from pytest_kimiperf.measure.runner import run_scenario, server_processes
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.measure.workload import SingleStream
from tests import helpers

# A thread's /proc/<pid>/task/<tid>/stat as this host's kernel (6.18) wrote it: utime 4 and
# stime 3 ticks, last ran on CPU 1. The second has a command name with a space and a ")".
RECORDED_STAT = ("14955 (python) S 14950 14950 2170 0 -1 4194368 4 0 0 0 4 3 0 0 20 0 2 0 86111 90230784 2822 "
                 "18446744073709551615 94862711037952 94862711038293 140722515157664 0 0 0 0 16781312 2 1 0 0 "
                 "-1 1 0 0 0 0 0 94862711049648 94862711050264 94863612547072 140722515159529 "
                 "140722515159758 140722515159758 140722515161052 0\n")
ODD_NAME_STAT = RECORDED_STAT.replace("(python)", "(VLLM::Engine) x)")

EIGHT = frozenset(range(8))


def thread(allowed: frozenset[int] | range, last_cpu: int, cpu_s: float) -> ThreadCpu:
    return ThreadCpu(frozenset(allowed), last_cpu, cpu_s)


def test_the_cpu_a_task_last_ran_on_and_its_time_come_from_its_stat_line() -> None:
    assert parse_task_stat(RECORDED_STAT, ticks_per_s=100.0) == (1, 0.07)
    assert parse_task_stat(ODD_NAME_STAT, ticks_per_s=100.0) == (1, 0.07)


def test_cpu_lists_read_as_the_kernel_writes_them() -> None:
    assert cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert cpu_list({5}) == "5"
    assert cpu_list(()) == "none"


def test_the_client_goes_where_the_server_is_neither_pinned_nor_ran() -> None:
    # vLLM with --numa-bind: two workers pinned to 0-3, its API server and engine core free to
    # run anywhere, seen on 4 and 5 during the warm-up; a tokenizer thread that did not run.
    before = {1: thread(range(4), 0, 10.0), 2: thread(range(4), 2, 10.0), 3: thread(EIGHT, 4, 5.0),
              4: thread(EIGHT, 5, 1.0), 5: thread(EIGHT, 7, 0.2)}
    after = {1: thread(range(4), 1, 10.9), 2: thread(range(4), 3, 10.9), 3: thread(EIGHT, 4, 5.8),
             4: thread(EIGHT, 5, 1.3), 5: thread(EIGHT, 7, 0.2)}
    where = place_client(EIGHT, before, after, window_s=1.0)
    assert where.how == ISOLATED
    assert where.client_cpus == {6, 7} and where.server_cpus == {0, 1, 2, 3, 4, 5}
    assert where.server_busy_cpus == 3  # 2.9 CPU-seconds in one second
    assert where.describe() == ("client on CPU 6-7 at normal priority, off the server's (its processes are pinned "
                                "to or ran on 0-5)")


def test_a_host_too_small_to_spare_a_cpu_shares_them_and_says_so() -> None:
    # The 2-core CPU host: OpenMP pinned to 0, the API server and engine core on 1.
    after = {1: thread({0}, 0, 5.0), 2: thread({0, 1}, 1, 2.0)}
    where = place_client({0, 1}, {}, after, window_s=1.0)
    assert where.how == TOO_SMALL and not where.client_cpus
    assert where.describe() == ("client not isolated: 2 CPUs (0-1) are too few to keep one from the server "
                                "(it takes 4); normal priority, the self-check guards the stamps")


def test_the_cpu_engine_on_two_cores_leaves_the_client_no_cpu_of_its_own() -> None:
    recorded = json.loads((helpers.DATA / "placement" / "tiny_cpu_2core_threads.json").read_text())

    def threads(sample: dict[str, dict[str, object]]) -> dict[int, ThreadCpu]:
        return {int(tid): ThreadCpu(frozenset(t["allowed"]), t["last_cpu"], t["cpu_s"])  # type: ignore[arg-type]
                for tid, t in sample.items()}

    before, after = threads(recorded["before"]), threads(recorded["after"])
    assert place_client({0, 1}, before, after, recorded["window_s"]).how == TOO_SMALL
    # Were two CPUs enough to place a client, none would be left: OpenMP is pinned to CPU 0, and
    # the API server and engine core ran on both.
    where = place_client({0, 1}, before, after, recorded["window_s"], min_cpus=1)
    assert where.how == NO_SPARE and where.server_cpus == {0, 1} and where.server_busy_cpus == 2


def test_a_server_that_used_every_cpu_leaves_none() -> None:
    after = {tid: thread(EIGHT, tid, 1.0) for tid in range(8)}
    where = place_client(EIGHT, {}, after, window_s=1.0)
    assert where.how == NO_SPARE and not where.client_cpus
    assert "pinned to or ran on every CPU it may use (0-7)" in where.describe()


def test_a_server_kept_busier_than_the_cpus_it_was_seen_on_keeps_them_all() -> None:
    # Two threads seen on 0 and 1 burned 3.5 CPU-seconds in a second: they moved between CPUs.
    after = {1: thread(EIGHT, 0, 2.0), 2: thread(EIGHT, 1, 1.5)}
    where = place_client(EIGHT, {1: thread(EIGHT, 0, 0.0), 2: thread(EIGHT, 1, 0.0)}, after, window_s=1.0)
    assert where.how == NO_SPARE and where.server_busy_cpus == 4


def test_without_a_warm_up_a_thread_free_to_run_anywhere_is_taken_to_run_everywhere() -> None:
    after = {1: thread(range(4), 0, 10.0), 2: thread(EIGHT, 4, 5.0)}
    assert place_client(EIGHT, None, after, window_s=0.0).how == NO_SPARE
    pinned_only = {1: thread(range(4), 0, 10.0)}
    assert place_client(EIGHT, None, pinned_only, window_s=0.0).client_cpus == {4, 5, 6, 7}


# --------------------------------------------------------------------------- on this host


@pytest.fixture
def pinned_busy_child() -> Iterator[subprocess.Popen[bytes]]:
    """A busy process pinned to the first CPU this process may use."""
    first = min(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", helpers.BUSY, "1"])
    os.sched_setaffinity(child.pid, {first})
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def test_the_reader_sees_a_pinned_busy_process_where_it_runs(pinned_busy_child: subprocess.Popen[bytes]) -> None:
    first = min(os.sched_getaffinity(0))
    time.sleep(0.3)
    before = read_threads([pinned_busy_child.pid])
    time.sleep(0.3)
    after = read_threads([pinned_busy_child.pid])
    (tid,) = after  # BUSY with one thread: the main thread only
    assert after[tid].allowed == {first} and after[tid].last_cpu == first
    assert after[tid].cpu_s > before[tid].cpu_s
    assert read_threads([2**22 + 12345]) == {}  # no such process: nothing, no error
    # A host of eight CPUs would keep the client off the one the busy process is pinned to.
    assert place_client(EIGHT | {first}, before, after, window_s=0.3).server_cpus == {first}


def test_placed_moves_the_calling_thread_and_the_threads_it_starts_then_puts_it_back() -> None:
    mine = os.sched_getaffinity(0)
    one = frozenset({max(mine)})
    seen: list[set[int]] = []
    with placed(one):
        assert os.sched_getaffinity(0) == one
        started = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        started.start()
        started.join()
    assert seen == [one]
    assert os.sched_getaffinity(0) == mine
    with placed(frozenset()):
        assert os.sched_getaffinity(0) == mine


@pytest.fixture
def pinned_paced_server() -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen([sys.executable, str(helpers.PACED_SERVER), "--port", "0", "--ttft-ms", "5",
                             "--itl-ms", "1"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    os.sched_setaffinity(proc.pid, {min(os.sched_getaffinity(0))})
    try:
        yield proc, f"http://127.0.0.1:{line.split('port=')[1].strip()}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the server, one for the client")
def test_a_run_that_knows_the_server_measures_off_its_cpus(
    pinned_paced_server: tuple[subprocess.Popen[str], str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc, base_url = pinned_paced_server
    mine = os.sched_getaffinity(0)
    server_cpu = min(mine)
    # Where the client runs is what is tested, not how quickly this host ran it: the self-check's
    # bounds are out of reach (a busy host's loop p99 of 5.15 ms against 5 had failed it).
    unbounded = HealthBounds(max_cpu_fraction=1.0, max_loop_latency_p50_ms=1e6, max_loop_latency_p99_ms=1e6,
                             max_send_lag_p99_ms=1e6)
    scenario = SingleStream(prompt_tokens=4, output_tokens=8, requests=3, warmup_requests=1, bounds=unbounded)
    target = Target(base_url, "paced-model", server_metrics=False)
    # On a host of too few CPUs (this one, where it has 2 or 3) the client shares them and says so.
    if len(os.sched_getaffinity(0)) < placement.MIN_CPUS_TO_PLACE:
        with server_processes(lambda: [proc.pid]):
            shared = run_scenario(target, scenario)
        assert shared.client_placement["how"] == TOO_SMALL
        assert all(h.cpus == () for rnd in shared.rounds for h in rnd.health)
    monkeypatch.setattr(placement, "MIN_CPUS_TO_PLACE", 1)
    with server_processes(lambda: [proc.pid]):
        run = run_scenario(target, scenario)
    assert run.valid, run.invalid
    spare = sorted(os.sched_getaffinity(0) - {server_cpu})
    assert run.client_placement["how"] == ISOLATED and run.client_placement["client_cpus"] == spare
    assert [h.cpus for rnd in run.rounds for h in rnd.health] == [tuple(spare)]
    assert run.summary().to_json()["client_placement"]["said"].startswith(f"client on CPU {cpu_list(spare)} ")
    assert os.sched_getaffinity(0) == mine  # the measured rounds' placement was undone
    # A run that does not know the server's processes (attached, a script) is not placed.
    assert run_scenario(target, scenario).client_placement["how"] == NOT_KNOWN
