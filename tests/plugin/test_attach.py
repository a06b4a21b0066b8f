"""An attached server through the plugin: restarts between boots, and UNRESOLVED without them.

The stub server stands in for vLLM here (its speed is set per start, so a slower build is one
flag); tests/real_engine/test_attach_cpu.py restarts a real tiny-cpu server the same way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import STUB_SERVER, RestartableServer, free_port, percent_after

pytestmark = pytest.mark.usefixtures("isolated_state")

PERF_TEST = """
from pytest_kimiperf import SingleStream

DECODE = SingleStream(prompt_tokens=8, output_tokens=32, requests=8, warmup_requests=1)


def test_decode(perf):
    perf.check(perf.measure(DECODE), ["decode_tok_s"])
"""


def _table(restart: list[str] | None) -> str:
    """An attach-only deployment, as a user writes it: no model, no command. The client's
    self-check is off, as in every plumbing run (tests/helpers.stub_deployment_toml): the restart
    and the verdicts are the subject, not this host's scheduling. Beside a CPU hog (load 12 on 2
    cores) the loop bound it had, 200 ms, was passed (p99 221 ms) and the convicting run ended
    INVALID (exit 75)."""
    lines = ["[tool.kimiperf.deployments.remote]", "tolerances = { decode_tok_s = 0.10 }",
             "boot_spread = 0.02", "host_bounds = { max_foreign_cpu_share = \"none\", max_steal_share = \"none\" }",
             "client_bounds = { max_cpu_fraction = inf, max_loop_latency_p50_ms = inf, max_loop_latency_p99_ms = inf, "
             "max_send_lag_p99_ms = inf, max_unmeasured_fraction = 1 }"]
    if restart:
        lines.append(f"restart_command = {json.dumps(restart)}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RestartableServer]:
    port = free_port()
    argv = [sys.executable, str(STUB_SERVER), "--model", "served-here", "--port", str(port), "--load-seconds", "0.3",
            "--tok-per-s", "200"]
    running = RestartableServer(argv, port, tmp_path, model="served-here")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_a_restart_command_gives_an_attached_run_its_boots_and_one_boot_without_it_is_unresolved(
        pytester: pytest.Pytester, server: RestartableServer) -> None:
    pytester.makepyprojecttoml(_table(server.restart_command))
    pytester.makepyfile(test_perf=PERF_TEST)
    first_pid = server.pid()
    attach = ["--deployment", "remote", "--kimiperf-server-url", server.url, "--kimiperf-server-hardware", "stub on this host",
              "-p", "no:cacheprovider"]
    recorded = pytester.runpytest_subprocess(*attach, "--kimiperf-boots", "2", "--update-baselines", timeout=120)
    recorded.assert_outcomes(passed=2)
    recorded.stdout.fnmatch_lines(["*kimiperf: restarting the attached server for another boot: *restart_server.py*",
                                   f"*kimiperf: {server.url} serves 'served-here' again, * s after the restart command*"])
    assert server.pid() != first_pid, "a real restart: another server process"
    (baseline,) = (pytester.path / "baselines" / "remote").glob("*.json")
    [entry] = json.loads(baseline.read_text())["entries"].values()
    assert len(entry["boots"]) == 2

    # The server gets 5x slower (far beyond any host's jitter: the stub paces its tokens on a
    # set schedule); attached without a restart_command, one boot cannot convict.
    server.restart_command[server.restart_command.index("200")] = "40"
    server.start()
    pytester.makepyprojecttoml(_table(None))
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(*attach, f"--junitxml={junit}", timeout=120)
    result.assert_outcomes(failed=1)
    assert result.ret == 76
    result.stdout.fnmatch_lines([
        "*UNRESOLVED: decode looks -*% on 1 boot(s), beyond the 10% tolerance (one boot can screen, never "
        "convict); this run cannot boot the attached server again: give deployment remote a restart_command*",
        "kimiperf: every failure was UNRESOLVED (1 test: *): exit status 76; give the deployment a restart_command*"])
    assert -83 <= percent_after(result.stdout.str(), "UNRESOLVED: decode looks") <= -77  # 40 against 200 tok/s
    assert '<property name="kimiperf_outcome" value="unresolved" />' in junit.read_text()

    # With it, the plugin restarts the server for the second boot the verdict needs: REGRESSION.
    pytester.makepyprojecttoml(_table(server.restart_command))
    convicted = pytester.runpytest_subprocess(*attach, timeout=120)
    assert convicted.ret == 1
    convicted.stdout.fnmatch_lines(["*kimiperf: restarting the attached server for another boot*",
                                    "*decode tok/s: REGRESSION -*"])
    assert -83 <= percent_after(convicted.stdout.str(), "decode tok/s: REGRESSION") <= -77
