"""The load generator against a real local server: tests/fakes/paced_server.py in a subprocess.

The paced server writes each chunk on a schedule and records when it wrote it, so these tests
check the client against what actually happened on the wire, and inject the faults a real
server shows (a chunk carrying several tokens, a stream cut mid-way, a lying usage, an error
event) on request.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pytest_kimiperf.config.server_url import parse_base_url
from pytest_kimiperf.measure import workload
from pytest_kimiperf.measure.client import RequestSpec, StreamingClient
from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.errors import ConfigError, ServerError
from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.measure.results import median
from pytest_kimiperf.measure.results import ClientBound
from pytest_kimiperf.reports.sentences import CLIENT_BOUND
from pytest_kimiperf.measure.coverage import FIGURES
from pytest_kimiperf.measure.loop_probe import IDLE_PROBE_S, PROBE_INTERVAL_S
from pytest_kimiperf.measure.results import HOST_LOOP_FACTOR, loop_latency_bounds
from pytest_kimiperf.measure.runner import run_scenario, run_scenario_async, run_sweep
from pytest_kimiperf.measure.workload import Concurrency, ConcurrencySweep, RequestRate, SingleStream
from pytest_kimiperf.measure.target import Target
from pytest_kimiperf.measure.workload import Workload, build_prompts, build_requests
from tests import helpers

SERVER = helpers.PACED_SERVER
MODEL = "paced-model"
TTFT_MS = 5.0
ITL_MS = 1.0


def start_server(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0", "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), *args],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "port=" not in line:
        proc.kill()
        raise RuntimeError(f"paced server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{line.split('port=')[1].strip()}"


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    proc, base_url = start_server()
    try:
        yield base_url
    finally:
        stop_server(proc)


def truth(base_url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(f"{base_url}/paced/truth").json()
    return data


def stream_truth(base_url: str, request_id: str) -> dict[str, Any]:
    streams: list[dict[str, Any]] = [s for s in truth(base_url)["streams"] if s["request_id"] == request_id]
    assert len(streams) == 1, request_id
    return streams[0]


def send(base_url: str, *specs: RequestSpec, endpoint: str = "completions",
         extra_body: dict[str, Any] | None = None, api_key: str | None = None) -> list[Any]:
    async def go() -> list[Any]:
        async with StreamingClient(base_url, MODEL, endpoint=endpoint, extra_body=extra_body,
                                   api_key=api_key) as client:
            return [await client.stream(spec) for spec in specs]
    return asyncio.run(go())


def spec(request_id: str, output_tokens: int = 6, **kwargs: Any) -> RequestSpec:
    return RequestSpec(prompt="a b c", output_tokens=output_tokens, request_id=request_id, **kwargs)


# --------------------------------------------------------------------------- the client


def test_token_counts_come_from_usage_and_stamps_follow_the_server_writes(server: str) -> None:
    (rec,) = send(server, spec("exact-1", 8, prompt_tokens=4))
    assert rec.ok, rec.error
    assert (rec.prompt_tokens, rec.output_tokens) == (4, 8)
    wrote = stream_truth(server, "exact-1")
    assert len(rec.chunk_ns) == len(wrote["write_ns"]) == 8
    # Causality on one monotonic clock, in user-space stamps on both sides (a kernel stamp carries
    # its realtime conversion's few microseconds): sent before the server wrote its answer, each
    # chunk read after it was written.
    assert rec.t_send_ns <= wrote["write_ns"][0]
    assert 0 < rec.t_send_ns <= rec.send_done_ns  # when send() returned: the bound on the stamp
    assert all(read >= written for read, written in zip(rec.chunk_read_ns, wrote["write_ns"]))
    assert rec.ttft_ms >= TTFT_MS


def test_one_chunk_carrying_several_tokens(server: str) -> None:
    # 20 ms gaps: far apart enough that a busy machine does not merge the chunks into one read.
    (rec,) = send(server, spec("multi-1", 10), extra_body={"paced": {"tokens_per_chunk": 3, "itl_ms": 20}})
    assert rec.ok, rec.error
    assert rec.output_tokens == 10
    assert len(rec.chunk_ns) == 4  # 3 + 3 + 3 + 1
    # The running count in every chunk (continuous_usage_stats): the first chunk's 3 tokens are
    # not decode's, so decode rests on the 7 after it, not bench serve's 9.
    assert rec.chunk_tokens == (3, 6, 9, 10) and rec.tokens_per_chunk_max == 3
    span_ms = (rec.chunk_ns[-1] - rec.chunk_ns[0]) / 1e6
    assert rec.tpot_ms == pytest.approx(span_ms / 7)
    assert rec.decode_tok_s == pytest.approx(7 / (span_ms / 1000))
    # A server that counts nothing leaves bench serve's assumption, said by the report.
    (plain,) = send(server, spec("multi-2", 10), extra_body={
        "paced": {"tokens_per_chunk": 3, "itl_ms": 20}, "stream_options": {"include_usage": True}})
    assert plain.ok and plain.chunk_tokens == ()
    assert plain.tpot_ms == pytest.approx((plain.chunk_ns[-1] - plain.chunk_ns[0]) / 1e6 / 9)


def test_stream_broken_mid_way_is_invalid_with_reason(server: str) -> None:
    (rec,) = send(server, spec("broken-1", 10), extra_body={"paced": {"break_after_chunks": 3}})
    assert not rec.ok
    assert rec.error.startswith("connection closed after 3 token chunks")


def test_wrong_completion_tokens_is_invalid(server: str) -> None:
    (rec,) = send(server, spec("short-1", 10), extra_body={"paced": {"completion_tokens_delta": -1}})
    assert not rec.ok
    assert "usage.completion_tokens=9 but 10 were asked" in rec.error


def test_wrong_prompt_tokens_is_invalid(server: str) -> None:
    (rec,) = send(server, spec("prompt-1", 3, prompt_tokens=99))
    assert not rec.ok
    assert "usage.prompt_tokens=4 but the prompt was built to 99" in rec.error


def test_error_event_mid_stream_is_invalid(server: str) -> None:
    (rec,) = send(server, spec("error-1", 10), extra_body={"paced": {"error_after_chunks": 2}})
    assert not rec.ok
    assert rec.error == "server error event: paced server: injected error"
    assert len(rec.chunk_ns) == 2


def test_http_error_status_is_invalid(server: str) -> None:
    (rec,) = send(server, spec("status-1"), extra_body={"paced": {"status": 503}})
    assert not rec.ok
    assert rec.error.startswith("HTTP 503:")


def test_stream_without_usage_is_invalid(server: str) -> None:
    (rec,) = send(server, spec("nousage-1"), extra_body={"stream_options": {"include_usage": False}})
    assert not rec.ok
    assert "no usage" in rec.error


def test_chat_role_only_delta_is_not_a_token_chunk(server: str) -> None:
    (rec,) = send(server, spec("chat-1", 5), endpoint="chat")
    assert rec.ok, rec.error
    assert len(rec.chunk_ns) == 5
    assert rec.chunk_read_ns[0] >= stream_truth(server, "chat-1")["write_ns"][0]


def test_connections_are_reused(server: str) -> None:
    before = truth(server)["connections_accepted"]
    records = send(server, *(spec(f"reuse-{i}", 2) for i in range(5)))
    assert all(r.ok for r in records)
    # One for the five requests, one for this truth() read itself.
    assert truth(server)["connections_accepted"] - before == 2


def test_connection_closed_by_the_server_while_idle_is_retried(server: str) -> None:
    async def go() -> list[Any]:
        async with StreamingClient(server, MODEL, extra_body={"paced": {"close_idle_after_ms": 20}}) as client:
            first = await client.stream(spec("idle-1", 2))
            time.sleep(0.2)  # noqa: ASYNC251 - block the loop so the server's close goes unseen
            return [first, await client.stream(spec("idle-2", 2))]
    first, second = asyncio.run(go())
    assert first.ok and second.ok, (first.error, second.error)


def test_unreachable_server_is_an_invalid_record() -> None:
    (rec,) = send("http://127.0.0.1:9", spec("nobody-1"))
    assert not rec.ok
    assert rec.error.startswith("cannot connect to http://127.0.0.1:9")


def test_api_key_is_sent_and_never_shown() -> None:
    proc, base_url = start_server("--api-key", "sekrit-key")
    try:
        (ok,) = send(base_url, spec("key-1", 2), api_key="sekrit-key")
        (refused,) = send(base_url, spec("key-2", 2), api_key="wrong-key")
    finally:
        stop_server(proc)
    assert ok.ok, ok.error
    assert refused.error.startswith("HTTP 401")
    assert "key" not in repr(StreamingClient(base_url, MODEL, api_key="sekrit-key")).lower()
    assert "wrong-key" not in refused.error


@pytest.mark.parametrize("url", ["ftp://h:1", "http://h:1/v1", "h:1", "http://h:99999", 42])
def test_bad_base_urls_are_config_errors(url: object) -> None:
    with pytest.raises(ConfigError, match="invalid server URL"):
        parse_base_url(url)


# --------------------------------------------------------------------------- HTTP/SSE framing


class CannedServer:
    """Answers each request with the next canned response, written in small pieces."""

    def __init__(self, responses: list[bytes], piece_bytes: int = 7) -> None:
        self._responses = list(responses)
        self._piece = piece_bytes
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with self._listener:
            while self._responses:
                conn, _ = self._listener.accept()
                self.accepted += 1
                with conn:
                    while self._responses and self._read_request(conn):
                        response = self._responses.pop(0)
                        for i in range(0, len(response), self._piece):
                            conn.sendall(response[i:i + self._piece])
                            time.sleep(0.0005)
                        if response.startswith(b"HTTP/1.0"):
                            break  # close-delimited body: closing ends it

    @staticmethod
    def _read_request(conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                return False
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += conn.recv(65536)
        return True


def chunked(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)


# json.dumps with its default spaces (http.server-style servers), CRLF line ends, a comment.
SPACED_EVENTS = (
    b": keep-alive ping\n\n",
    b'data: {"id": "x", "choices": [{"index": 0, "text": "a"}]}\r\n\r\n',
    b'data: {"id": "x", "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}\n\n',
    b'data: {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}\n\n',
    b"data: [DONE]\n\n",
)


def test_chunk_framing_split_anywhere_with_trailers_keeps_the_connection() -> None:
    ok = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(*SPACED_EVENTS)
          + b"0\r\nX-Trailer: yes\r\n\r\n")
    server = CannedServer([ok, ok])
    first, second = send(server.base_url, spec("canned-1", 2), spec("canned-2", 2))
    assert first.ok and second.ok, (first.error, second.error)
    assert len(first.chunk_ns) == 2 and first.output_tokens == 2
    assert server.accepted == 1


def test_close_delimited_http_1_0_body() -> None:
    response = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + b"".join(SPACED_EVENTS)
    (rec,) = send(CannedServer([response]).base_url, spec("canned-3", 2))
    assert rec.ok, rec.error
    assert len(rec.chunk_ns) == 2


def test_error_answer_with_a_length_delimited_body() -> None:
    body = b'{"error": {"message": "max_tokens is too large", "code": 400}}'
    response = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    (rec,) = send(CannedServer([response]).base_url, spec("canned-4", 2))
    assert not rec.ok
    assert rec.error == "HTTP 400: " + body.decode()


def test_garbage_answer_is_a_malformed_response() -> None:
    (rec,) = send(CannedServer([b"SSH-2.0-OpenSSH_9.6\r\n\r\n"]).base_url, spec("canned-5", 2))
    assert not rec.ok
    assert rec.error.startswith("malformed HTTP response: bad status line")


# --------------------------------------------------------------------------- the workload


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_prompts_have_the_exact_token_count_and_are_deterministic(server: str, endpoint: str) -> None:
    prompts = build_prompts(server, MODEL, prompt_tokens=12, count=3, seed=7, endpoint=endpoint)
    body: dict[str, Any]
    for prompt in prompts:
        if endpoint == "chat":
            body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
        else:
            body = {"model": MODEL, "prompt": prompt}
        assert httpx.post(f"{server}/tokenize", json=body).json()["count"] == 12
    assert len(set(prompts)) == 3
    # Same seed, same prompts (past the cache: the seed decides, not the memo).
    again = build_prompts(server, MODEL, prompt_tokens=12, count=3, seed=7, endpoint=endpoint, first_index=1)
    assert again[:2] == prompts[1:]
    other = build_prompts(server, MODEL, prompt_tokens=12, count=3, seed=8, endpoint=endpoint)
    assert set(other).isdisjoint(prompts)


def test_prompts_built_on_one_server_are_counted_once_on_another_and_rebuilt_where_it_counts_otherwise(
    server: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workload, "_CACHE", {})
    monkeypatch.setattr(workload, "_COUNTED_ON", set())
    built = build_prompts(server, MODEL, prompt_tokens=12, count=2, seed=31)
    # A later boot (a server this process has not counted on: the set forgotten stands in for a
    # new address): one count of a cached prompt agrees, and the prompts are the same.
    calls: list[str] = []
    real_post = workload._Tokenizer._post

    def counting(self: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
        calls.append(path)
        return real_post(self, path, body)

    monkeypatch.setattr(workload._Tokenizer, "_post", counting)
    workload._COUNTED_ON.clear()
    assert build_prompts(server, MODEL, prompt_tokens=12, count=2, seed=31) == built
    assert calls == ["/tokenize"]
    assert build_prompts(server, MODEL, prompt_tokens=12, count=2, seed=31) == built
    assert calls == ["/tokenize"]  # counted on once
    # A tokenizer that counts a cached prompt otherwise (a prompt of the wrong length stands in
    # for it): the cache is emptied and the prompt built again, exact on this server.
    workload._CACHE[(MODEL, "completions", 12, 31, 0)] = "far too short"
    workload._COUNTED_ON.clear()
    rebuilt = build_prompts(server, MODEL, prompt_tokens=12, count=1, seed=31)
    assert rebuilt == built[:1]
    assert httpx.post(f"{server}/tokenize", json={"model": MODEL, "prompt": rebuilt[0]}).json()["count"] == 12


def test_prompt_shorter_than_the_template_is_a_config_error(server: str) -> None:
    with pytest.raises(ConfigError, match="prompt_tokens=2 is too small"):
        build_prompts(server, MODEL, prompt_tokens=2, count=1, endpoint="chat")


def test_requests_built_and_sent_come_back_exact(server: str) -> None:
    specs = build_requests(server, MODEL, Workload(prompt_tokens=20, output_tokens=7), 2, id_prefix="wl")
    records = send(server, *specs)
    assert [r.request_id for r in records] == ["wl-0", "wl-1"]
    assert all(r.ok and r.prompt_tokens == 20 and r.output_tokens == 7 for r in records), records


def test_server_without_tokenizer_gets_approximate_prompts() -> None:
    proc, base_url = start_server("--no-tokenizer")
    try:
        with pytest.raises(ServerError, match="no /tokenize endpoint"):
            build_requests(base_url, MODEL, Workload(10, 3), 1, require_exact=True)
        run = run_scenario(Target(base_url, MODEL), SingleStream(prompt_tokens=10, output_tokens=3, requests=2))
    finally:
        stop_server(proc)
    assert all(r.ok for r in run.records)
    assert any("not exact" in note for note in run.notes)


# --------------------------------------------------------------------------- scenarios


def test_single_stream_run_counts_every_measured_request(server: str) -> None:
    # The bounds the CPU deployment runs with: a p50 that catches a client always behind, a
    # p99 that lets this host's scheduler stall the client now and then.
    scenario = SingleStream(prompt_tokens=16, output_tokens=10, requests=4, warmup_requests=2,
                            bounds=HealthBounds(**TINY_CPU.client_bounds))
    run = run_scenario(Target(server, MODEL), scenario)
    # Whether this host held the client off is the host's; that the run says so is the product's.
    assert run.valid or isinstance(run.invalid, ClientBound), run.invalid
    assert run.scenario_name == "single-stream-16in-10out"
    # Every request sent is accounted for, figure by figure: measured, or withheld with a reason.
    for figure in FIGURES:
        count = run.coverage.of(figure)
        assert count.sent == 4 and count.measured + sum(count.withheld.values()) == 4
        assert len(run.samples(figure)) == count.measured
        assert set(count.withheld) <= {"client-held", "one-read"}  # nothing failed, every stream had tokens
    assert run.warmup_requests == 2
    assert len(run.samples("output_throughput")) == 1
    # Single stream: never two requests in flight.
    records = sorted(run.records, key=lambda r: r.t_send_ns)
    assert all(a.t_done_ns <= b.t_send_ns for a, b in itertools.pairwise(records))
    # The server saw exactly the measured requests between the two /metrics reads.
    (server_view,) = run.server_metrics
    assert server_view["ttft_count"] == 4
    assert server_view["generation_tokens"] == 40


def test_concurrency_rounds_give_one_throughput_sample_each(server: str) -> None:
    scenario = Concurrency(concurrency=4, prompt_tokens=8, output_tokens=6, requests=8, rounds=3)
    run = run_scenario(Target(server, MODEL), scenario)
    assert all(r.ok for r in run.records)
    assert len(run.samples("output_throughput")) == 3
    ttft = run.coverage.of("ttft_ms")
    assert ttft.sent == 24 and len(run.samples("ttft_ms")) == ttft.measured == 24 - sum(ttft.withheld.values())
    assert len({r.request_id for r in run.records}) == 24
    in_flight = max(
        sum(1 for r in run.records if r.t_send_ns <= t < r.t_done_ns) for t in (r.t_send_ns for r in run.records)
    )
    assert in_flight == 4


def test_request_rate_sends_on_schedule(server: str) -> None:
    scenario = RequestRate(rate_per_s=200.0, arrivals="constant", prompt_tokens=8, output_tokens=4, requests=10, rounds=1)
    run = run_scenario(Target(server, MODEL), scenario)
    assert all(r.ok for r in run.records)
    offsets = scenario.arrival_offsets_s(0)
    assert offsets == pytest.approx([i / 200.0 for i in range(10)])
    assert all(r.send_lag_ms is not None and r.send_lag_ms >= 0 for r in run.records)  # never early
    # Each request is due on the schedule (5 ms apart) and goes out after it, not before; how
    # late is the host's scheduling, which the client's send-lag bound self-checks in a run
    # (benchmarks/client_accuracy.py measures it), so no wall-clock figure is judged here.
    due = sorted(r.scheduled_send_ns for r in run.records if r.scheduled_send_ns is not None)
    assert len(due) == 10
    assert [(b - a) / 1e9 for a, b in itertools.pairwise(due)] == pytest.approx([0.005] * 9, abs=1e-6)
    assert all(r.t_send_ns >= r.scheduled_send_ns for r in run.records)


def test_poisson_arrivals_are_seeded() -> None:
    def make(seed: int) -> RequestRate:
        return RequestRate(rate_per_s=10.0, prompt_tokens=8, output_tokens=4, requests=50, seed=seed)
    assert make(1).arrival_offsets_s(0) == make(1).arrival_offsets_s(0)
    assert make(1).arrival_offsets_s(0) != make(2).arrival_offsets_s(0)
    assert make(1).arrival_offsets_s(0) != make(1).arrival_offsets_s(1)


def test_seconds_budget_stops_sending(server: str) -> None:
    run = run_scenario(Target(server, MODEL), Concurrency(concurrency=2, prompt_tokens=8, output_tokens=5, seconds=0.3, rounds=1))
    assert run.records and all(r.ok for r in run.records)
    # Every request after a slot's first was due (its predecessor ended) within 0.3 s of the
    # start; the first send is after the start. (The send itself may be stamped a little later
    # when the host pauses the client: that is send lag, not a budget overrun.)
    first_send = min(r.t_send_ns for r in run.records)
    due = [r.scheduled_send_ns for r in run.records if r.scheduled_send_ns is not None]
    assert due and all((d - first_send) / 1e9 < 0.3 for d in due)
    assert max(r.t_done_ns for r in run.records) - first_send > 0.25e9, "stopped well before its budget"


def test_streams_spread_over_client_processes_merge(server: str) -> None:
    scenario = Concurrency(concurrency=4, prompt_tokens=8, output_tokens=5, requests=8, client_processes=2, rounds=1)
    run = run_scenario(Target(server, MODEL), scenario)
    assert all(r.ok for r in run.records)
    assert len(run.records) == 8 and len({r.request_id for r in run.records}) == 8
    assert len(run.rounds[0].health) == 2
    written = {s["request_id"]: s for s in truth(server)["streams"]}
    # Stamps from both processes sit on the server's clock, held by causality alone: the server
    # stamps a chunk before its send, and the client's read returns it after (user-space stamps on
    # both sides; a kernel stamp would carry its realtime conversion's few microseconds).
    for rec in run.records:
        assert rec.chunk_read_ns[0] >= written[rec.request_id]["write_ns"][0]


def test_sweep_runs_each_concurrency(server: str) -> None:
    sweep = ConcurrencySweep(concurrencies=(2, 1), prompt_tokens=8, output_tokens=3, requests=2, name="sw")
    runs = run_sweep(Target(server, MODEL), sweep)
    assert [r.scenario_name for r in runs] == ["sw-c1", "sw-c2"]
    assert all(rec.ok for r in runs for rec in r.records)
    with pytest.raises(ConfigError, match="run_sweep"):
        run_scenario(Target(server, MODEL), sweep)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SingleStream(prompt_tokens=8, output_tokens=4), "give a budget per round"),
        (lambda: SingleStream(prompt_tokens=8, output_tokens=4, requests=0), r"SingleStream.requests=0"),
        (lambda: SingleStream(prompt_tokens=0, output_tokens=4, requests=1), r"Workload.prompt_tokens=0"),
        (lambda: Concurrency(concurrency=2, prompt_tokens=8, output_tokens=4, requests=1, client_processes=3),
         "client_processes=3 exceeds"),
        (lambda: RequestRate(rate_per_s=1.0, arrivals="bursty", prompt_tokens=8, output_tokens=4, requests=1),
         "arrivals='bursty'"),
        (lambda: SingleStream(prompt_tokens=8, output_tokens=4, requests=1, name="../x"), "invalid scenario name"),
        (lambda: SingleStream(prompt_tokens=8, output_tokens=4, seconds=-1),
         r"^SingleStream\.seconds=-1: must be a positive number or None$"),
        (lambda: RequestRate(rate_per_s=float("inf"), prompt_tokens=8, output_tokens=4, requests=1),
         r"^RequestRate\.rate_per_s=inf: must be a positive number$"),
        (lambda: Concurrency(concurrency=True, prompt_tokens=8, output_tokens=4, requests=1),
         r"^Concurrency\.concurrency=True: must be an integer >= 1$"),
    ],
)
def test_bad_scenarios_are_config_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Target("http://127.0.0.1:8000/v1", MODEL), "drop the trailing /v1"),
        (lambda: Target("http://127.0.0.1:8000", ""), r"^model='': must be the served model's name$"),
        (lambda: Target("http://127.0.0.1:8000", MODEL, endpoint="embeddings"), "unknown endpoint 'embeddings'"),
    ],
)
def test_a_bad_target_is_a_config_error_when_built(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_a_target_keeps_its_api_key_out_of_its_repr() -> None:
    assert "s3cret" not in repr(Target("http://127.0.0.1:8000", MODEL, api_key="s3cret"))


# --------------------------------------------------------------------------- the self-check


def test_client_starved_by_a_cpu_hog_thread_is_invalid(server: str) -> None:
    stop = threading.Event()

    def hog() -> None:
        # One C call holds the GIL for its whole length (tens of ms, more on a loaded host), as a
        # client busy in a library would. A Python loop yields it every 5 ms switch interval, a
        # lateness the bound in force can stand above: it is 4x what this host's idle loop reads
        # (HOST_LOOP_FACTOR), and a loaded host's idle loop read 2 ms at the median, so such a
        # client passed its self-check beside a CPU hog (scripts/stress_suite.sh).
        while not stop.is_set():
            sum(range(5_000_000))

    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        run = run_scenario(Target(server, MODEL), Concurrency(concurrency=4, prompt_tokens=8, output_tokens=50, requests=8, rounds=1))
    finally:
        stop.set()
        thread.join()
    assert not run.valid
    assert helpers.said(run).startswith(CLIENT_BOUND)


def test_client_whose_loop_is_kept_busy_is_invalid(server: str) -> None:
    async def go() -> Any:
        done = asyncio.Event()

        async def busy() -> None:
            while not done.is_set():
                # Hog the loop, a tiny budget left for the client: 100 ms a time, far above the
                # bound in force (4x this host's idle loop, which a loaded host read at 6 ms).
                time.sleep(0.1)  # noqa: ASYNC251
                await asyncio.sleep(0)

        task = asyncio.create_task(busy())
        try:
            return await run_scenario_async(
                Target(server, MODEL), SingleStream(prompt_tokens=8, output_tokens=30, requests=3, warmup_requests=0)
            )
        finally:
            done.set()
            await task

    run = asyncio.run(go())
    assert not run.valid
    assert "event-loop latency" in helpers.said(run)


def test_bounds_decide_validity_not_the_data(server: str) -> None:
    scenario = SingleStream(prompt_tokens=8, output_tokens=5, requests=2, warmup_requests=0,
                            bounds=HealthBounds(max_cpu_fraction=1e-6))
    run = run_scenario(Target(server, MODEL), scenario)
    assert all(r.ok for r in run.records)
    assert helpers.said(run).startswith(CLIENT_BOUND)


def test_a_loop_latency_bound_below_what_this_host_can_do_is_raised_to_it(server: str) -> None:
    # A bound set on a fast host judges the host on a slow one: the bound in force is never
    # below HOST_LOOP_FACTOR times what an idle loop reads here, and the reason says so.
    scenario = SingleStream(prompt_tokens=8, output_tokens=5, requests=2, warmup_requests=0,
                            bounds=HealthBounds(max_loop_latency_p50_ms=1e-6, max_loop_latency_p99_ms=1e-6))
    run = run_scenario(Target(server, MODEL), scenario)
    health = [h for rnd in run.rounds for h in rnd.health]
    # The idle loop was read, at most once an interval (no burst to catch up): how many readings
    # fit is the host's (beside a CPU hog, 50 or fewer of the 125 an idle host gives).
    assert health and all(0 < len(h.idle_loop_latency_ms) <= IDLE_PROBE_S / PROBE_INTERVAL_S + 1 for h in health)
    bound50, _, idle = loop_latency_bounds(scenario.bounds, health)
    assert idle is not None
    assert bound50 == pytest.approx(HOST_LOOP_FACTOR * median([x for h in health for x in h.idle_loop_latency_ms]))
