"""Servers that answer with something other than vLLM's JSON, or serve another model.

A proxy's HTML page, an SSE stream on a JSON endpoint, or a server of another model must give a
clear error naming the URL and what came back, never a JSONDecodeError/AttributeError traceback
or a silent measurement of the wrong model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import running_stub, stub_deployment_toml
from pytest_kimiperf.errors import ServerError
from pytest_kimiperf.server.process import check_ready
from pytest_kimiperf.measure.workload import build_prompts

pytestmark = pytest.mark.usefixtures("isolated_state")


def _stub(*args: str) -> Iterator[str]:
    yield from running_stub(*args)


@pytest.fixture
def html_tokenizer_stub() -> Iterator[str]:
    yield from _stub("--mode", "html-tokenize")


@pytest.fixture
def proxy_page() -> Iterator[str]:
    """Every path answers 200 with a proxy's HTML page, or an SSE stream on /v1/models."""

    class Page(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            sse = self.path == "/v1/models"
            body = b"data: {\"ping\": 1}\n\n" if sse else b"<html><body>Sign in to continue</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if sse else "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_tokenize_answer_that_is_html_names_the_url_and_what_came_back(html_tokenizer_stub: str) -> None:
    with pytest.raises(ServerError) as info:
        build_prompts(html_tokenizer_stub, "stub-model", prompt_tokens=16, count=1)
    message = str(info.value)
    assert f"{html_tokenizer_stub}/tokenize answered something that is not JSON" in message
    assert "text/html" in message and "502 Bad Gateway" in message


def test_a_models_answer_that_is_an_sse_stream_says_so_instead_of_not_answering(proxy_page: str) -> None:
    why = check_ready(proxy_page, "stub-model", {}, timeout_s=5.0)
    assert why is not None
    assert f"{proxy_page}/v1/models answered something that is not JSON (text/event-stream" in why


def test_attach_to_a_proxy_page_fails_clearly(pytester: pytest.Pytester, stub_project, proxy_page: str) -> None:
    stub_project(stub_deployment_toml())
    pytester.makepyfile("def test_x(kimiperf_server):\n    pass\n")
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-server-url", proxy_page, timeout=60)
    assert result.parseoutcomes().get("errors") == 1
    result.stdout.fnmatch_lines([f"*--kimiperf-server-url {proxy_page} is not ready*/v1/models answered something "
                                 "that is not JSON (text/event-stream*"])
    result.stdout.no_fnmatch_line("*Traceback*")


@pytest.fixture
def other_model_stub() -> Iterator[str]:
    yield from running_stub(model="some-other-model")


def test_attach_to_a_server_of_another_model_fails_with_both_names(
    pytester: pytest.Pytester, stub_project, other_model_stub: str
) -> None:
    stub_project(stub_deployment_toml())
    pytester.makepyfile("def test_x(kimiperf_server):\n    pass\n")
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-server-url", other_model_stub, timeout=60)
    assert result.parseoutcomes().get("errors") == 1
    result.stdout.fnmatch_lines([f"*--kimiperf-server-url {other_model_stub} serves 'some-other-model', but deployment "
                                 "stub names model 'stub-model'*"])


def test_update_baselines_in_attach_mode_needs_the_stated_server_hardware(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kimiperf-server-url", "http://127.0.0.1:9", "--update-baselines")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--kimiperf-update-baselines with --kimiperf-server-url http://127.0.0.1:9*--kimiperf-server-hardware*"])


@pytest.fixture
def attached_stub() -> Iterator[str]:
    yield from _stub()


@pytest.mark.parametrize("stated", [None, "8x Test GPU, PCIe"], ids=["unstated", "stated"])
def test_attach_mode_fingerprints_the_server_not_the_client(
    pytester: pytest.Pytester, stub_project, attached_stub: str, stated: str | None
) -> None:
    """The fingerprint takes the server's /version and /v1/models and the hardware the user
    states; this host's CPU and GPUs are the client's, reported but not compared."""
    stub_project(stub_deployment_toml())
    pytester.makepyfile("def test_x(kimiperf_server):\n    pass\n")
    args = ["--deployment", "stub", "--kimiperf-server-url", attached_stub]
    args += ["--kimiperf-server-hardware", stated] if stated else []
    result = pytester.runpytest_subprocess(*args, timeout=60)
    assert result.parseoutcomes().get("passed") == 1
    hardware = f"{stated} (as stated)" if stated else "not stated (--kimiperf-server-hardware)"
    result.stdout.fnmatch_lines([
        f"kimiperf fingerprint: attached-{'8x-Test-GPU-PCIe' if stated else 'not-stated-kimiperf-server-hardware'}-*",
        f"  hardware: attached server: {hardware}",
        "  server: vLLM 0.32.0-stub, models stub-model, max_model_len unknown",
        "  client host (not compared): *",
    ])
    result.stdout.no_fnmatch_line("*hardware: CPU*")
