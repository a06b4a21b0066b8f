"""Attach over HTTPS: the httpx client through a TLS gateway (self-signed) in front of the paced server."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_kimiperf.measure.client import RequestSpec, StreamingClient
from pytest_kimiperf.measure.connection import EVENT_LOOP_TIMING
from pytest_kimiperf.measure.runner import run_scenario
from pytest_kimiperf.measure.workload import Concurrency
from pytest_kimiperf.measure.target import Target
from tests.unit.test_client import ITL_MS, MODEL, TTFT_MS, start_server, stop_server

from tests.fakes.tls_gateway import make_self_signed
from tests import helpers

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command line")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(https URL of the gateway, http URL of the paced server behind it, the certificate)."""
    cert_dir = tmp_path_factory.mktemp("tls")
    cert, _ = make_self_signed(cert_dir)
    proc, base_url = start_server()
    gw = subprocess.Popen([sys.executable, str(helpers.TLS_GATEWAY), "--target-port",
                           base_url.rsplit(":", 1)[1], "--cert-dir", str(cert_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert gw.stdout is not None
        line = gw.stdout.readline()
        assert "port=" in line, f"the TLS gateway did not start: {line!r}"
        yield f"https://localhost:{line.split('port=')[1].strip()}", base_url, cert
    finally:
        gw.terminate()
        gw.wait(timeout=10)
        if gw.stdout is not None:
            gw.stdout.close()
        stop_server(proc)


@pytest.fixture
def trusted(gateway: tuple[str, str, Path], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SSL_CERT_FILE", str(gateway[2]))
    return gateway[0]


def test_an_https_url_gets_a_tls_pool_and_http_keeps_the_kernel_stamped_one() -> None:
    from pytest_kimiperf.measure.connection import Pool
    from pytest_kimiperf.measure.connection import TlsPool

    assert type(StreamingClient("https://gw.example", MODEL)._pool) is TlsPool
    assert type(StreamingClient("http://127.0.0.1:1", MODEL)._pool) is Pool


def test_the_client_streams_through_a_tls_gateway_and_counts_as_over_plain_http(trusted: str) -> None:
    async def go() -> list:
        async with StreamingClient(trusted, MODEL, endpoint="chat", max_connections=2,
                                        first_token_deadline_s=10, idle_deadline_s=10) as client:
            return [await client.stream(RequestSpec("a b c d", 12, request_id=f"tls-{i}")) for i in range(3)]

    records = asyncio.run(go())
    for rec in records:
        assert rec.ok, rec.error
        assert (rec.output_tokens, len(rec.chunk_ns)) == (12, 12)  # the role-only chat chunk is no token
        assert TTFT_MS * 0.8 <= rec.ttft_ms <= TTFT_MS + 50
        # Chunks that reach the loop in one read share a stamp (no kernel stamps through TLS), so
        # single gaps may read 0, and a loaded host may read the first few together; but no chunk
        # arrives before the server sent it: the last comes after the paced TTFT and 11 gaps.
        assert rec.e2el_ms >= (TTFT_MS + 11 * ITL_MS) * 0.8


def test_closing_the_client_closes_its_tls_sockets_before_the_loop_ends(trusted: str) -> None:
    # A TLS transport's close() only starts the shutdown: a loop that ended right after left the
    # socket open until garbage collection, and CI failed on "unclosed transport".
    import psutil

    port = int(trusted.rsplit(":", 1)[1])

    def to_gateway() -> list:
        return [c for c in psutil.Process().net_connections("tcp") if c.raddr and c.raddr.port == port]

    async def go() -> tuple[int, list]:
        async with StreamingClient(trusted, MODEL, max_connections=3) as client:
            records = await asyncio.gather(*(client.stream(RequestSpec("a b", 4)) for _ in range(3)))
            assert all(rec.ok for rec in records), [rec.error for rec in records]
            opened = len(to_gateway())
        return opened, to_gateway()

    opened, left = asyncio.run(go())
    assert opened >= 1 and left == [], f"{opened} sockets to the gateway, {len(left)} still open: {left}"


def test_an_untrusted_certificate_fails_the_request_naming_the_tls_error(gateway: tuple[str, str, Path],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)

    async def go():
        async with StreamingClient(gateway[0], MODEL) as client:
            return await client.stream(RequestSpec("a b", 4))

    rec = asyncio.run(go())
    assert not rec.ok and "CERTIFICATE_VERIFY_FAILED" in rec.error


def test_a_scenario_over_https_is_marked_timed_in_the_event_loop(trusted: str) -> None:
    run = run_scenario(Target(trusted, MODEL, server_metrics=False),
                       Concurrency(concurrency=2, prompt_tokens=4, output_tokens=8, requests=4))
    assert run.invalid_count == 0, run.invalid_reasons
    assert EVENT_LOOP_TIMING in run.notes
    assert run.to_json()["load"]["timing"] == "event-loop"
    assert httpx.get(trusted + "/health").status_code == 200  # the gateway forwards every path


def test_a_plain_http_scenario_stays_kernel_stamped(gateway: tuple[str, str, Path]) -> None:
    run = run_scenario(Target(gateway[1], MODEL, server_metrics=False),
                       Concurrency(concurrency=1, prompt_tokens=4, output_tokens=4, requests=2))
    assert EVENT_LOOP_TIMING not in run.notes and run.to_json()["load"]["timing"] == "kernel"


@pytest.mark.usefixtures("isolated_state")
def test_an_https_server_url_is_accepted_and_the_header_says_how_it_is_timed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain(): pass")
    result = pytester.runpytest("--kimiperf-server-url", "https://gw.example:8443", "--co")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["kimiperf: server attached to https://gw.example:8443 (HTTPS: timed in the "
                                 "event loop, not by the kernel)*"])
