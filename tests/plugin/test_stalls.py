"""A stalled server must not stall the suite: per-request deadlines, an aborted scenario, and
bounded buffers, against the stub server's stall modes (tests/fakes/stub_vllm.py)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import pytest

from tests.helpers import running_stub, stub_deployment_toml
from pytest_kimiperf.measure.client import RequestSpec, StreamingClient
from pytest_kimiperf.measure.sse import MAX_SSE_EVENT_BYTES
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.measure.runner import run_scenario
from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.measure.workload import Concurrency, SingleStream
from pytest_kimiperf.measure.target import Target


def _stub(mode: str) -> Iterator[str]:
    yield from running_stub("--mode", mode)


@pytest.fixture
def stalls_before_the_first_token() -> Iterator[str]:
    yield from _stub("stall-first")


@pytest.fixture
def stalls_mid_stream() -> Iterator[str]:
    yield from _stub("stall-mid")


@pytest.fixture
def endless_line() -> Iterator[str]:
    yield from _stub("endless-line")


def _one(url: str, **deadlines: float) -> tuple[RequestRecord, float]:
    async def go() -> RequestRecord:
        async with StreamingClient(url, "stub-model", **deadlines) as client:
            return await client.stream(RequestSpec(prompt="a b c", output_tokens=16))

    start = time.monotonic()
    record = asyncio.run(go())
    return record, time.monotonic() - start


def test_no_first_token_within_the_deadline_fails_the_request_in_time(stalls_before_the_first_token: str) -> None:
    record, took = _one(stalls_before_the_first_token, first_token_deadline_s=0.5, idle_deadline_s=0.5)
    assert record.stalled and not record.ok
    assert record.error.startswith("stalled: no token within the 0.5 s first-token deadline (")
    assert "status 200" in record.error
    assert took >= 0.5  # the deadline, not an early give-up (the stub never sends a token)


def test_a_stream_that_goes_quiet_fails_naming_the_last_chunk_and_how_long_ago(stalls_mid_stream: str) -> None:
    record, took = _one(stalls_mid_stream, first_token_deadline_s=5, idle_deadline_s=0.5)
    assert record.stalled
    said = re.fullmatch(r"stalled: no token for (\d+\.\d) s \(inter-chunk deadline 0\.5 s\) after 3 token "
                        r"chunks; the last came \d+\.\d s after the send", record.error)
    assert said, record.error
    assert float(said.group(1)) >= 0.5  # how late the stall was seen depends on the host; never early
    assert RequestRecord.from_json(record.to_json()) == record  # the fact travels with the record
    assert took >= 0.5


def test_an_sse_line_that_never_ends_fails_at_the_cap_instead_of_growing(endless_line: str) -> None:
    record, took = _one(endless_line, first_token_deadline_s=30, idle_deadline_s=30)
    assert record.error == (f"malformed HTTP response: an SSE event grew past {MAX_SSE_EVENT_BYTES // 1024} KiB "
                            "without ending (an endless line)")
    assert not record.stalled  # failed, but not for want of a token: no stall counts toward an abort


def test_three_stalls_in_a_row_abort_the_scenario_and_say_the_server_still_answers_health(
    stalls_before_the_first_token: str,
) -> None:
    scenario = SingleStream(prompt_tokens=8, output_tokens=8, requests=20, warmup_requests=0,
                            bounds=HealthBounds(first_token_deadline_s=0.3, idle_deadline_s=0.3))
    with pytest.raises(ServerError) as info:  # raised at the third stall, not after 20 requests
        run_scenario(Target(stalls_before_the_first_token, "stub-model", server_metrics=False), scenario)
    assert str(info.value).startswith("the scenario was aborted: 3 requests in a row stalled; the last: "
                                      "stalled: no token within the 0.3 s first-token deadline")
    assert str(info.value).endswith("; the server still answers /health 200 but stopped streaming")


def test_stalls_in_a_client_worker_process_abort_the_scenario_with_the_same_words(
    stalls_before_the_first_token: str,
) -> None:
    # The worker sends the stall as such (engine.WorkerPool), not as a traceback to search.
    scenario = Concurrency(concurrency=2, client_processes=2, prompt_tokens=8, output_tokens=8, requests=20,
                           warmup_requests=0, bounds=HealthBounds(first_token_deadline_s=0.3, idle_deadline_s=0.3))
    with pytest.raises(ServerError) as info:
        run_scenario(Target(stalls_before_the_first_token, "stub-model", server_metrics=False), scenario)
    assert str(info.value).startswith("the scenario was aborted: 3 requests in a row stalled; the last: "
                                      "stalled: no token within the 0.3 s first-token deadline")
    assert "Traceback" not in str(info.value)


STALLING_PERF_TEST = """
from pytest_kimiperf.measure.workload import SingleStream

def test_decode(perf):
    perf.measure(SingleStream(prompt_tokens=8, output_tokens=8, requests=10, warmup_requests=0),
                 server_metrics=False)
"""


def test_a_perf_test_against_a_wedged_server_fails_with_the_stall_and_the_log_tail(
    pytester: pytest.Pytester, stub_project, isolated_state
) -> None:
    """The deadlines come from the deployment's client_bounds; the failure names the stall and
    carries the server log's tail."""
    table = stub_deployment_toml(mode="stall-mid").replace(
        "client_bounds = {", "client_bounds = { first_token_deadline_s = 2, idle_deadline_s = 0.5,")
    stub_project(table)
    pytester.makepyfile(STALLING_PERF_TEST)
    result = pytester.runpytest_subprocess("--deployment", "stub", "-p", "no:randomly", timeout=120)
    assert result.parseoutcomes().get("failed") == 1
    result.stdout.fnmatch_lines([
        "*the scenario was aborted: 3 requests in a row stalled; the last: stalled: no token for *"
        "(inter-chunk deadline 0.5 s) after 3 token chunks*",
        "*kimiperf server log, last 10 lines*",
    ])
