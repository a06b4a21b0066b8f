"""The clock check's idle reading: what the host charges a loop, not what this process does to it."""

from __future__ import annotations

import statistics
import sys
import threading
from collections.abc import Iterator

import pytest

from pytest_kimiperf.measure import loop_probe
from pytest_kimiperf.measure.loop_probe import host_idle_loop_latency_ms, idle_loop_latency_ms


# The hog's switch interval: 50 ms, ten times Python's default, so what this process's own GIL
# adds to a wake (a whole interval) stands far above anything a loaded host adds to a child's
# (a few ms at a load average of 9 on 2 cores): the test reads which process the reading came
# from, not how quiet the host is.
HOG_SWITCH_S = 0.05


@pytest.fixture
def gil_hog() -> Iterator[None]:
    """A thread of this process that holds the GIL for whole switch intervals, as a busy client would."""
    stop = threading.Event()
    before = sys.getswitchinterval()
    sys.setswitchinterval(HOG_SWITCH_S)

    def hog() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(before)


@pytest.fixture(autouse=True)
def fresh_reading() -> Iterator[None]:
    host_idle_loop_latency_ms.cache_clear()
    yield
    host_idle_loop_latency_ms.cache_clear()


def test_the_idle_reading_is_taken_outside_a_process_whose_thread_holds_the_gil(gil_hog: None) -> None:
    host = host_idle_loop_latency_ms()
    assert host  # the child answered with its readings
    # The same probe in this process waits for the hog's GIL on every wake (a whole switch
    # interval); the child's reading does not, so a bound raised to a few idle wakes still
    # convicts a client starved by its own threads (test_client's CPU-hog test is the end-to-end case).
    switch_ms = sys.getswitchinterval() * 1000
    in_process = idle_loop_latency_ms()
    assert statistics.median(in_process) > switch_ms / 3
    assert statistics.median(host) < switch_ms / 3


def test_the_idle_reading_is_taken_once_per_process() -> None:
    first = host_idle_loop_latency_ms()
    assert first and host_idle_loop_latency_ms() is first


def test_a_child_that_cannot_answer_leaves_the_absolute_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop_probe.sys, "executable", "/nonexistent/python")
    assert host_idle_loop_latency_ms() == ()
