"""An attached tiny-cpu server restarted for real between boots (a deployment's restart_command).

The test starts a real vLLM server (tiny-cpu) as a service manager would, through
tests/fakes/restart_server.py and a pidfile; the plugin attaches to it with ``--kimiperf-server-url`` and,
for the second boot a verdict needs, runs the same script as the deployment's restart_command:
SIGTERM to the old server, a new process, a new load. Two boots of tiny-cpu; then a second
session on the running server is judged against the two recorded boots (the baseline's plumbing
on a real engine: what is stored, the session level a verdict rests on).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kimiperf.config.deployments import TINY_CPU
from pytest_kimiperf.paths import compile_cache_env
from pytest_kimiperf.server.tiny_model import ensure_tiny_model
from tests.helpers import RestartableServer, counted_boots, free_port, measured_count
from tests.real_engine.conftest import plumbing_deployment

PERF_TEST = """
from pytest_kimiperf import SingleStream

DECODE = SingleStream(prompt_tokens=8, output_tokens=32, requests=10, warmup_requests=2)


def test_decode(perf):
    perf.check(perf.measure(DECODE), ["decode_tok_s"])
"""


@pytest.fixture(scope="module")
def tiny_model() -> str:
    """The tiny model's path, found before pytester's sys.modules snapshot: finding it imports
    torch and transformers, and pytester drops what a test imported at its end, which leaves a
    later ``import torch`` in this process half-initialized (a segfault in the next e2e test)."""
    return str(ensure_tiny_model())


def entry_key(baseline: Path) -> str:
    """The one entry's key in a baseline file."""
    [key] = json.loads(baseline.read_text())["entries"]
    return key


def test_an_attached_tiny_cpu_server_is_restarted_for_its_second_boot_and_the_next_session_is_judged_on_them(pytester: pytest.Pytester,
                                                                       tmp_path: Path, tiny_model: str) -> None:
    port = free_port()
    server_argv = TINY_CPU.argv(model_path=tiny_model, host="127.0.0.1", port=port)
    # As the plugin starts tiny-cpu (server/manager.py): its compile cache, the deployment's environment.
    env = [f"{k}={v}" for k, v in {**compile_cache_env(), **TINY_CPU.env, "SPT_NOENV": "1"}.items()]
    server = RestartableServer(["env", *env, *server_argv], port, tmp_path, model=TINY_CPU.served_model_name)
    server.start(deadline_s=TINY_CPU.health_deadline_s)
    try:
        first_pid = server.pid()
        pytester.makepyprojecttoml(plumbing_deployment(
            "remote", extra=f"restart_command = {json.dumps(server.restart_command)}\n"))
        pytester.makepyfile(test_perf=PERF_TEST)
        result = pytester.runpytest_subprocess(
            "--deployment", "remote", "--kimiperf-server-url", server.url, "--kimiperf-server-hardware", "tiny-cpu on this host",
            "--kimiperf-boots", "2", "--update-baselines", "--kimiperf-json", "recorded.json", "-p", "no:cacheprovider",
            timeout=900)
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines([
            "*kimiperf: restarting the attached server for another boot: *restart_server.py*",
            f"*kimiperf: {server.url} serves '{TINY_CPU.served_model_name}' again, * s after the restart command started*"])
        assert server.pid() != first_pid, "the second boot is another vLLM process"
        # The history keeps every valid boot that measured a decode figure, and a comparison rests
        # on those that measured a boot's minimum, as the run reports them: a client this 2-core
        # host held off the CPU through most of a window leaves fewer (which boots is the host's;
        # that the file and the comparison take exactly those is the product's).
        report = json.loads((pytester.path / "recorded.json").read_text())
        kept = sum(1 for t in report["tests"] if not t["invalid"] and measured_count(t["run"], "decode_tok_s") >= 1)
        recorded = counted_boots(report, "default")
        assert recorded >= 1, "no boot of the two measured 3 decode figures of 10 requests"
        (baseline,) = (pytester.path / "baselines" / "remote").glob("*.json")
        [entry] = json.loads(baseline.read_text())["entries"].values()

        assert len(entry["boots"]) == kept
        medians = [boot["median"] for boot in entry["boots"]]
        assert all(m > 0 for m in medians), medians
        assert {boot["origin"]["session"] for boot in entry["boots"]} == {entry["boots"][0]["origin"]["session"]}

        # Another session, on the server as it runs now: judged against the two recorded boots,
        # with the session level it rests on. One boot (--kimiperf-max-boots 1) screens, never
        # convicts, so no figure of this host can fail it; whether its verdict is right is
        # statistics (benchmarks/real_engine_verdicts.py).
        judged_run = pytester.runpytest_subprocess(
            "--deployment", "remote", "--kimiperf-server-url", server.url, "--kimiperf-server-hardware",
            "tiny-cpu on this host", "--kimiperf-max-boots", "1", "--kimiperf-json", "judged.json",
            "-p", "no:cacheprovider", timeout=900)
        outcomes = judged_run.parseoutcomes()
        assert outcomes.get("passed") == 1 and not outcomes.get("failed"), judged_run.stdout.str()[-4000:]
        assert "restarting the attached server" not in judged_run.stdout.str()
        judged_report = json.loads((pytester.path / "judged.json").read_text())
        [test] = judged_report["tests"]
        judged = test["metrics"]["decode_tok_s"]["baseline"]
        current = counted_boots(judged_report, "default")
        assert (judged["boots_current"], judged["boots_reference"]) == (current, recorded), judged
        if current:  # a boot that measured its minimum is compared, with the session level it rests on
            assert f"vs {recorded} reference boot{'s' * (recorded != 1)} of 1 session" in judged["message"], judged
            assert judged["levels"][0]["name"] == "session", judged
        # A second session's run leaves the history as it was (nothing appends without asking).
        assert len(json.loads(baseline.read_text())["entries"][entry_key(baseline)]["boots"]) == kept
    finally:
        server.stop()
