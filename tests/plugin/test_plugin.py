"""The plugin's surface through pytester: options, usage errors, hardware check, the handle."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.helpers import counted_boots, stub_deployment_toml
from tests import helpers

pytestmark = pytest.mark.usefixtures("isolated_state")

SERVER_TEST = """
import httpx

def test_handle(kimiperf_server):
    h = kimiperf_server
    assert h.model == "stub-model"
    assert httpx.get(h.base_url + "/health").status_code == 200
    assert h.log_path.is_file()
    print("PROFILE", h.profile, "ENV", dict(h.env))
"""


def test_options_and_ini_twins_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines([
        "*LLM-serving performance tests (pytest-kimiperf)*",
        "*--kimiperf-server-url=SERVER_URL*",
        "*--deployment=DEPLOYMENT*",
        "*--nccl-profile=PROFILE*",
        "*--update-baselines*",
        "*kimiperf_deployment (string)*",
        "*kimiperf_profile (string)*",
    ])


def test_unknown_deployment_is_a_usage_error_listing_known_ones(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--deployment", "kimi-typo")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*unknown deployment 'kimi-typo' (from command line --deployment)*kimi-k25-int4-tp8*tiny-cpu*"
    ])


def test_unknown_profile_is_a_usage_error_listing_profiles(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--nccl-profile", "ring-lll")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ring-lll*ring-ll*"])


def test_ini_twin_sets_the_deployment_and_cli_wins(pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml(), ini='kimiperf_deployment = "stub"')
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["kimiperf: deployment stub *"])
    result = pytester.runpytest("--deployment", "tiny-cpu")
    result.stdout.fnmatch_lines(["kimiperf: deployment tiny-cpu *"])


def test_the_header_names_every_node_and_the_fingerprint_counts_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest("--deployment", "tiny-cpu-2node", "--co")
    result.stdout.fnmatch_lines([
        "kimiperf: nodes (vLLM --nnodes, head first): node0 (127.0.0.1, this machine), node1 (127.0.0.1, this machine)",
        "kimiperf fingerprint: 2n-cpu-*",
    ])


def test_a_profile_whose_args_undo_the_node_layout_is_a_usage_error(pytester: pytest.Pytester, stub_project) -> None:
    stub_project('[tool.kimiperf.profiles.wide]\nargs = ["--data-parallel-size", "2"]\n')
    result = pytester.runpytest("--deployment", "tiny-cpu-2node", "--kimiperf-profile", "wide")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*profile 'wide' (from *) args on deployment tiny-cpu-2node: --data-parallel-size 2 "
                                 "with nodes*"])


def test_a_ray_deployment_with_nodes_is_a_usage_error_saying_why(pytester: pytest.Pytester, stub_project) -> None:
    stub_project('[tool.kimiperf.deployments.mine]\nextends = "tiny-cpu-2node"\n'
                 'command = ["{python}", "-m", "vllm", "serve", "{model}", "--distributed-executor-backend", "ray"]\n')
    result = pytester.runpytest("--deployment", "mine")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distributed-executor-backend ray with nodes*cannot watch, sweep or stop them*"])


def test_bad_user_deployment_table_is_a_usage_error(pytester: pytest.Pytester, stub_project) -> None:
    stub_project('[tool.kimiperf.deployments.mine]\nextends = "tiny-cpu"\ntensor_parallel_size = "two"\n')
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*tensor_parallel_size = 'two' has the wrong type; expected an integer*"])


def _fake_nvidia_smi(tmp_path: Path) -> tuple[Path, Path]:
    """A PATH dir whose nvidia-smi only records that it was called and finds nothing."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    marker = tmp_path / "nvidia-smi-called"
    tool = bindir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho called >> {marker}\nexit 9\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bindir, marker


def test_missing_gpus_error_each_selected_perf_test_before_any_boot(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir, _ = _fake_nvidia_smi(tmp_path)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    pytester.makepyfile(SERVER_TEST)
    result = pytester.runpytest_subprocess(timeout=60)  # default deployment: Kimi at TP=8
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*deployment 'kimi-k25-int4-tp8' needs 8x NVIDIA GPU whose name contains 'RTX PRO 6000'"
        "*found no NVIDIA GPU*--kimiperf-deployment tiny-cpu*"
    ])
    assert "starting" not in result.stdout.str()
    assert not list(pytester.path.rglob("server-*.log"))


def test_a_run_without_perf_fixtures_boots_nothing_and_queries_no_gpu(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir, marker = _fake_nvidia_smi(tmp_path)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("VLLM_API_KEY", "common-in-vllm-environments")
    pytester.makepyfile("""
        import sys

        def test_plain():
            # heavy imports stay lazy: numpy and scipy load only for perf tests
            assert "scipy" not in sys.modules and "numpy" not in sys.modules
    """)
    result = pytester.runpytest_subprocess(timeout=60)
    result.assert_outcomes(passed=1)
    assert not marker.exists(), "a run that uses no perf fixture called nvidia-smi"
    assert "kimiperf: starting" not in result.stdout.str()
    assert "kimiperf fingerprint" not in result.stdout.str()


def test_a_run_with_perf_tests_shows_the_fingerprint_after_collection(
    pytester: pytest.Pytester, stub_project
) -> None:
    # `pytest perf_tests` with no option at all: the default deployment (here a stub under the
    # default's name) gives the header nothing to go on, so the lines come once collection
    # has found perf tests.
    stub_project(stub_deployment_toml(name="kimi-k25-int4-tp8"))
    pytester.makepyfile(SERVER_TEST)
    result = pytester.runpytest_subprocess("--co", timeout=60)
    # A user deployment allows 6 boots of a profile (the default max_boots): the slots of boots
    # 2 to 6 are collected, and run only when an earlier boot of the test asks for them.
    result.stdout.fnmatch_lines(["kimiperf fingerprint: cpu-*", "kimiperf: baseline file *", "collected 6 items",
                                 "*<Function test_handle[[]default[]]>", "*<Function test_handle[[]default-boot2[]]>",
                                 "*<Function test_handle[[]default-boot6[]]>"])


def test_server_fixture_yields_a_ready_handle_and_stops_the_server(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots.txt"
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile(SERVER_TEST)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "ring-ll", "-s",
                                           timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*PROFILE ring-ll ENV*'NCCL_ALGO': 'Ring'*'NCCL_PROTO': 'LL'*"])
    pid = int(boots.read_text().split()[0])
    assert not _alive(pid), f"server pid {pid} still runs after the session"


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_each_profile_boots_once_one_at_a_time_and_sees_its_own_env(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots.txt"
    stub_project(stub_deployment_toml(boot_count=boots))
    check = f"""
import psutil

def _stub_servers():
    # the launcher between pytest and the server carries the server's command line too
    return [p for p in psutil.process_iter(["cmdline"])
            if {str(boots)!r} in " ".join(p.info["cmdline"] or [])
            and "pytest_kimiperf.server.launcher" not in (p.info["cmdline"] or [])]

def test_one(kimiperf_server):
    assert len(_stub_servers()) == 1, "two servers at once"

def test_two(kimiperf_server):
    assert len(_stub_servers()) == 1
"""
    pytester.makepyfile(test_a=check, test_b=check)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1",
                                           "-v", timeout=120)
    # The boots on demand (default-boot2, ...) are collected; nothing asked for them (these
    # tests measure nothing), so they neither run nor report.
    result.stdout.fnmatch_lines(["collecting ... collected 48 items"])  # 4 tests x 2 profiles x 6 boots
    result.assert_outcomes(passed=8)
    assert "boot2" not in result.stdout.str().split("collected 48 items")[1]
    result.stdout.fnmatch_lines([
        "*test_a.py::test_one[[]default[]] PASSED*",
        "*test_b.py::test_two[[]default[]] PASSED*",
        "*test_a.py::test_one[[]ring-ll[]] PASSED*",
        "*test_b.py::test_two[[]ring-ll[]] PASSED*",
    ])
    lines = boots.read_text().splitlines()
    assert len(lines) == 2, f"expected one boot per profile, got {lines}"
    # the stub records NCCL_PROTO and NCCL_ALGO as its own process saw them
    assert lines[0].split()[1:] == ["-", "-"]
    assert lines[1].split()[1:] == ["LL", "Ring"]


def test_profile_env_overrides_the_shell_for_that_server_only(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boots = tmp_path / "boots.txt"
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile("""
        import os
        def test_env(kimiperf_server):
            assert os.environ["NCCL_PROTO"] == "Simple"  # pytest's own environment untouched
            assert kimiperf_server.overridden_shell_env["NCCL_PROTO"] == ("Simple", "LL")
    """)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "ring-ll", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*profile ring-ll overrides NCCL_PROTO='Simple' from the shell with 'LL'*"])
    assert boots.read_text().split()[1] == "LL"


def test_environment_every_server_gets_is_shown_and_recorded(
    pytester: pytest.Pytester, stub_project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "4")  # from the shell: reaches every profile's server
    stub_project(stub_deployment_toml() + 'env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }\n')
    pytester.makepyfile("""
        def test_env(kimiperf_server):
            assert kimiperf_server.env["NCCL_MAX_NCHANNELS"] == "4"
            assert kimiperf_server.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
            assert kimiperf_server.env["NCCL_PROTO"] == "LL"
    """)
    result = pytester.runpytest_subprocess("--deployment", "stub", "--nccl-profile", "ring-ll", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "kimiperf: profile ring-ll: NCCL_ALGO=Ring NCCL_PROTO=LL; from the shell and deployment: "
        "NCCL_MAX_NCHANNELS=4"])


def test_api_key_reaches_server_and_client_but_no_log_report_or_json(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-kimiperf-test-7f3a9c"
    monkeypatch.setenv("VLLM_API_KEY", secret)
    stub_project(stub_deployment_toml())
    pytester.makepyfile("""
        import os, psutil
        from pytest_kimiperf.measure.workload import SingleStream

        def test_key(perf, kimiperf_server):
            assert psutil.Process(kimiperf_server.pid).environ()["VLLM_API_KEY"] == os.environ["VLLM_API_KEY"]
            assert os.environ["VLLM_API_KEY"] not in " ".join(psutil.Process(kimiperf_server.pid).cmdline())
            assert kimiperf_server.auth_headers() == {"Authorization": "Bearer " + os.environ["VLLM_API_KEY"]}
            assert os.environ["VLLM_API_KEY"] not in repr(kimiperf_server)
            run = perf.measure(SingleStream(prompt_tokens=4, output_tokens=8, requests=5))
            perf.check(run, ["decode_tok_s"])
    """)
    report = tmp_path / "report.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-json", str(report),
                                           "--kimiperf-markdown", str(tmp_path / "s.md"), timeout=120)
    result.assert_outcomes(passed=1)
    assert secret not in result.stdout.str() + result.stderr.str()
    assert secret not in report.read_text()
    assert secret not in (tmp_path / "s.md").read_text()
    logs = list(pytester.path.rglob("server-*.log"))
    assert logs and all(secret not in log.read_text() for log in logs)


def _recorded_8x_rtx_pro_6000_smi(bindir: Path) -> None:
    """nvidia-smi answering as the recorded 8x RTX PRO 6000 PCIe-only host did, its MIG mode
    turned off (the recording was taken with MIG on, which the hardware check refuses)."""
    data = helpers.DATA / "gpu"
    rows = [line.split(", ") for line in (data / "query_gpu_8x_rtx_pro_6000.csv").read_text().splitlines()[1:]]
    (bindir / "query.csv").write_text("".join(
        f"{i}, {name}, {uuid}, {mib.removesuffix(' MiB')}, {drv}, 5, 16, Disabled\n"
        for i, name, uuid, drv, mib, _ in rows
    ))
    tool = bindir / "nvidia-smi"
    tool.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) cat {bindir}/query.csv ;;\n"
        f"  topo) cat {data}/topo_8x_rtx_pro_6000_sys.txt ;;\n"
        f'  "") cat {data}/smi_header_535.txt ;;\n'
        "  *) exit 2 ;;\n"
        "esac\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def test_explicit_ll128_on_a_pcie_only_host_warns_before_the_boot(
    pytester: pytest.Pytester, stub_project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if helpers.nvml_loads():
        pytest.skip("NVML answers on this host before the recorded nvidia-smi would")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _recorded_8x_rtx_pro_6000_smi(bindir)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    stub_project('[tool.kimiperf.profiles.ll128]\nenv = { NCCL_PROTO = "LL128" }\n')
    pytester.makepyfile(SERVER_TEST)
    result = pytester.runpytest_subprocess("--nccl-profile", "ll128,ring-ll", "--co", timeout=60)
    assert result.ret == pytest.ExitCode.OK  # the recorded host has the 8 GPUs Kimi needs
    result.stdout.fnmatch_lines(["*PytestConfigWarning: kimiperf:*ll128*LL128*PCIe-only*"])
    assert "ring-ll" not in "".join(line for line in result.stdout.lines if "LL128" in line and "PCIe" in line)


def test_precedence_cli_over_env_over_ini_over_default() -> None:
    from pytest_kimiperf.config.options import read_raw_options

    ini = {"kimiperf_deployment": "from-ini", "kimiperf_nccl_debug": False, "kimiperf_strict": True}
    cli = {"kimiperf_deployment": None}  # every dest carries the plugin's prefix

    def getoption(dest: str) -> object:
        return cli.get(dest)

    raw = read_raw_options(getoption, lambda name: ini.get(name), {"KIMIPERF_DEPLOYMENT": "from-env"})
    assert (raw["deployment"].value, raw["deployment"].source) == ("from-env", "environment variable KIMIPERF_DEPLOYMENT")
    raw = read_raw_options(getoption, lambda name: ini.get(name), {})
    assert (raw["deployment"].value, raw["deployment"].source) == ("from-ini", "ini option kimiperf_deployment")
    assert raw["nccl_debug"].source == "default"  # an unset bool ini reads False: not "set"
    assert (raw["perf_strict"].value, raw["perf_strict"].source) == (True, "ini option kimiperf_strict")
    cli["kimiperf_deployment"] = "from-cli"
    raw = read_raw_options(getoption, lambda name: ini.get(name), {"KIMIPERF_DEPLOYMENT": "from-env"})
    assert (raw["deployment"].value, raw["deployment"].source) == ("from-cli", "command line --kimiperf-deployment")
    # Every spelling stores into the one dest (the last given wins); the source names the spelling.
    cli.update(kimiperf_deployment="short", kimiperf_perf_json="old.json",
               kimiperf__spellings={"kimiperf_deployment": ["--kimiperf-deployment", "--deployment"],
                                    "kimiperf_perf_json": ["--perf-json"]})
    raw = read_raw_options(getoption, lambda name: ini.get(name), {})
    assert (raw["deployment"].value, raw["deployment"].source) == ("short", "command line --deployment")
    assert (raw["perf_json"].value, raw["perf_json"].source) == ("old.json", "command line --perf-json")


MARKED = """
import pytest
from pytest_kimiperf.measure.workload import SingleStream

SCENARIO = SingleStream(prompt_tokens=8, output_tokens=16, requests=5, warmup_requests=1)

@pytest.mark.kimiperf(tolerances={TOLERANCES})
def test_decode(perf):
    perf.check(perf.measure(SCENARIO), ["decode_tok_s", "ttft_ms"])
"""


def test_marker_tolerance_overrides_the_deployments_for_that_metric(
    pytester: pytest.Pytester, stub_project
) -> None:
    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_marked=MARKED.replace("{TOLERANCES}", '{"decode_tok_s": 0.4}'))
    pytester.runpytest_subprocess("--deployment", "stub", "--update-baselines", timeout=120).assert_outcomes(passed=1)
    out = pytester.path / "perf.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-json", str(out), timeout=120)
    result.assert_outcomes(passed=1)
    # A history recorded in one session: the header and a warning say the session level is a guess.
    result.stdout.fnmatch_lines([
        "kimiperf: spreads in force: boot 6% declared, or what the boots measure where larger (1 recorded); "
        "session 1% declared (the history spans 1 session; measured from 3); host 2% declared (*",
        "*OneSessionHistoryWarning: kimiperf: the baseline history of stub spans one session (1 boot)*"])
    metrics = json.loads(out.read_text())["tests"][0]["metrics"]
    assert metrics["decode_tok_s"]["tolerance"] == 0.4
    assert metrics["decode_tok_s"]["baseline"]["tolerance"] == 0.4
    assert metrics["ttft_ms"]["tolerance"] == 0.25  # not marked: the deployment's


@pytest.mark.parametrize("tolerances, message", [
    ('{"decode_tok": 0.4}', "*@pytest.mark.kimiperf on test_marked.py::test_decode[[]default[]]: tolerances names "
                            "unknown metric 'decode_tok'; known: *decode_tok_s*"),
    ('{"decode_tok_s": 3}', "*tolerances.decode_tok_s = 3; must be a fraction between 0 and 1 (0.03 = 3%)*"),
    ('0.05', "*tolerances = 0.05; must be a table of metric = fraction*"),
])
def test_bad_marker_fails_the_test_before_any_boot(pytester: pytest.Pytester, stub_project, tmp_path: Path,
                                                   tolerances: str, message: str) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile(test_marked=MARKED.replace("{TOLERANCES}", tolerances))
    result = pytester.runpytest_subprocess("--deployment", "stub", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([message])
    assert not boots.exists(), "the server was booted for a test whose marker was bad"


def test_failed_first_still_boots_each_profile_once(pytester: pytest.Pytester, stub_project, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile("""
        import os

        def test_a(kimiperf_server):
            pass

        def test_b(kimiperf_server):
            assert not (kimiperf_server.profile == "ring-ll" and os.environ.get("FAIL_RING_LL"))

        def test_c(kimiperf_server):
            pass
    """)
    args = ("--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "1", "--kimiperf-max-boots", "1", "-p", "no:randomly")
    monkeypatch.setenv("FAIL_RING_LL", "1")
    pytester.runpytest_subprocess(*args, timeout=120).assert_outcomes(passed=5, failed=1)
    monkeypatch.delenv("FAIL_RING_LL")
    # --ff puts test_b[ring-ll] first; pytest would then boot ring-ll, default, ring-ll again.
    # The boots keep the schedule's order (boots.schedule: drift must fall on every profile
    # alike), so --ff moves the failed test to the front of its own boot only.
    result = pytester.runpytest_subprocess(*args, "--ff", "-v", timeout=120)
    result.assert_outcomes(passed=6)
    second_run = boots.read_text().splitlines()[2:]
    assert len(second_run) == 2, f"a profile booted twice: {second_run}"
    result.stdout.fnmatch_lines(["*test_a[[]default[]] PASSED*", "*test_c[[]default[]] PASSED*",
                                 "*test_b[[]ring-ll[]] PASSED*", "*test_a[[]ring-ll[]] PASSED*",
                                 "*test_c[[]ring-ll[]] PASSED*"])


def test_planned_boots_run_interleaved_and_each_comparison_rests_on_them(
    pytester: pytest.Pytester, stub_project, tmp_path: Path
) -> None:
    boots = tmp_path / "boots"
    stub_project(stub_deployment_toml(boot_count=boots))
    pytester.makepyfile(test_marked=MARKED.replace("{TOLERANCES}", "{}"))
    # --kimiperf-max-boots 2: no boot on demand, so the order is the plan's alone.
    args = ("--deployment", "stub", "--nccl-profile", "default,ring-ll", "--kimiperf-boots", "2",
            "--kimiperf-max-boots", "2", "-v")
    recording = pytester.path / "recorded.json"
    pytester.runpytest_subprocess(*args, "--update-baselines", "--kimiperf-json", str(recording),
                                  timeout=180).assert_outcomes(passed=4)
    recorded = json.loads(recording.read_text())
    report = pytester.path / "perf.json"
    result = pytester.runpytest_subprocess(*args, "--kimiperf-json", str(report), timeout=180)
    result.assert_outcomes(passed=4)
    started = [line.split("for profile ")[1].split()[0] for line in result.stdout.lines
               if line.startswith("kimiperf: starting stub server for profile ")]
    assert started == ["default", "ring-ll", "ring-ll", "default"], "boots not interleaved A B B A"
    result.stdout.fnmatch_lines(["*test_decode[[]default[]] PASSED*", "*test_decode[[]ring-ll[]] PASSED*",
                                 "*test_decode[[]ring-ll-boot2[]] PASSED*", "*test_decode[[]default-boot2[]] PASSED*"])
    assert len(boots.read_text().splitlines()) == 8, "each run boots each profile twice, no more"
    data = json.loads(report.read_text())
    assert sorted((t["profile"], t["boot"]) for t in data["tests"]) == [
        ("default", 1), ("default", 2), ("ring-ll", 1), ("ring-ll", 2)]
    for test in data["tests"]:
        assert test["primary_metric"] == "decode_tok_s"  # a single-stream test's, from the metric table
        for name, metric in test["metrics"].items():
            # the first boot waits for the plan; the second's verdict rests on both, against the
            # boots the recording run appended to the baseline's history: each boot whose run
            # measured enough of the figure, as its report counts them (a loaded host's stalls can
            # leave a boot of 5 requests short of decode figures)
            so_far = {**data, "tests": [t for t in data["tests"] if t["boot"] <= test["boot"]]}
            assert (metric["baseline"]["boots_current"], metric["baseline"]["boots_reference"]) == (
                counted_boots(so_far, test["profile"], name), counted_boots(recorded, test["profile"], name))
            # The run's family: 2 profiles x 2 metrics stored, one look each (no boot on demand),
            # so a sign needs the run's 1% over 4 comparisons, split over their two sides: each
            # bound is a one-sided 1 - 0.01 / 8 (judge/stats.py family_critical).
            assert metric["baseline"]["confidence"] == pytest.approx(1 - 0.01 / (2 * 4))
        if test["boot"] == 1:
            assert "boot 1 of 2 planned: the verdict comes after boot 2" in test["messages"]
    rows = data["profile_comparisons"]
    assert {(row["profile"], row["metric"]) for row in rows} == {
        ("ring-ll", "decode"), ("ring-ll", "time to first token")}
    metric_of = {"decode": "decode_tok_s", "time to first token": "ttft_ms"}
    assert all((row["boots_current"], row["boots_reference"]) == (
        counted_boots(data, "ring-ll", metric_of[row["metric"]]), counted_boots(data, "default", metric_of[row["metric"]]))
        for row in rows)


@pytest.mark.parametrize("url, message", [
    ("ftp://gpu-box:8000", "*invalid server URL 'ftp://gpu-box:8000' (from command line --kimiperf-server-url)*"
                           "http://HOST:PORT or https://HOST*"),
    ("http://gpu-box:8000?x=1", "*invalid server URL 'http://gpu-box:8000?x=1' (from command line --kimiperf-server-url)*"
                                "use the server root as http://HOST:PORT*"),
    ("gpu-box:8000", "*invalid server URL 'gpu-box:8000'*"),
])
def test_unusable_server_url_is_a_usage_error(pytester: pytest.Pytester, url: str, message: str) -> None:
    result = pytester.runpytest("--kimiperf-server-url", url)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_junit_xml_carries_the_medians_as_properties(pytester: pytest.Pytester, stub_project) -> None:
    import xml.etree.ElementTree as ET

    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_marked=MARKED.replace("{TOLERANCES}", "{}"))
    junit, report = pytester.path / "junit.xml", pytester.path / "perf.json"
    result = pytester.runpytest_subprocess("--deployment", "stub", "--junitxml", str(junit),
                                           "--kimiperf-json", str(report), timeout=120)
    result.assert_outcomes(passed=1)
    (case,) = ET.parse(junit).getroot().iter("testcase")
    properties = {p.get("name"): float(p.get("value")) for p in case.iter("property")}
    metrics = json.loads(report.read_text())["tests"][0]["metrics"]
    assert properties == {f"median_{name}": pytest.approx(m["summary"]["median"], abs=1e-4)
                          for name, m in metrics.items()}
    assert set(properties) == {"median_decode_tok_s", "median_ttft_ms"}
