"""`kimiperf compare` (python -m pytest_kimiperf compare): verdicts and exit statuses on the
result files vLLM's bench serve wrote (tests/data/compare), and on copies of them made here
slower by a known factor. Nothing here reads this host's clock: the figures are the files'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_kimiperf.compare.cli import USAGE_EXIT, main
from pytest_kimiperf.judge.gate import UNRESOLVED_EXIT
from tests.helpers import DATA, ROOT

VLLM = DATA / "compare" / "vllm"
A = [str(VLLM / "boot1-summary.json"), str(VLLM / "boot3-summary.json")]
B = [str(VLLM / "boot2-summary.json"), str(VLLM / "boot4-summary.json")]


def _slower(paths: list[str], factor: float, out: Path) -> list[str]:
    """Copies of bench serve results whose server was ``factor`` times slower: every latency
    times it, every throughput divided by it."""
    out.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in paths:
        data: dict[str, Any] = json.loads(Path(path).read_text())
        for key, value in list(data.items()):
            if not isinstance(value, float):
                continue
            if key.endswith("_ms"):
                data[key] = value * factor
            elif key.endswith("_throughput"):
                data[key] = value / factor
        copy = out / Path(path).name
        copy.write_text(json.dumps(data))
        copies.append(str(copy))
    return copies


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_four_boots_of_one_build_pass_under_the_cpu_deployments_rules(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--a", *A, "--b", *B, "--deployment", "tiny-cpu")
    assert status == 0, out
    assert "b vs a, decode tok/s (one stream): " in out
    assert "(tolerance 25%, 2 vs 2 boots;" in out
    assert "REGRESSION" not in out and "improvement" not in out
    assert out.rstrip().endswith("compare passed: exit status 0")


def test_runs_whose_boots_spread_beyond_the_declared_say_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # The default rules declare a 1% boot spread; these runs' figures spread far wider, a tail
    # most (judge/noise.py). One answer line says so, with the flag to change.
    _, out, _ = _run(capsys, "--a", *A, "--b", *B)
    [line] = [line for line in out.splitlines() if "spreads wider than declared" in line]
    assert line.strip().startswith(
        "spreads wider than declared, at the run's level (1% over 9 checks): boot spread 89% where 1% is declared, "
        "the widest of 8 of 9 boot checks beyond it (p99 inter-token latency ms (one stream) of b vs a: 4 boots, 2 df;")
    assert line.endswith("pass --boot-spread 0.89, or find what spreads the boots (the judge already used the larger)")
    _, out, _ = _run(capsys, "--a", *A, "--b", *B, "--boot-spread", "0.9")
    assert "spreads wider" not in out


def test_a_build_twice_as_slow_is_a_regression_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The default rules (a 1% declared boot spread, no spawn modes); b's boots were themselves
    # 27% slower than a's (the host, not the build), so b slowed twice reads -64%.
    status, out, _ = _run(capsys, "--a", *A, "--b", *_slower(B, 2.0, tmp_path))
    assert status == 1, out
    assert "b vs a, decode tok/s (one stream): -63.7%, " in out
    assert ": REGRESSION (tolerance 3%, 2 vs 2 boots;" in out
    assert "compare FAILED (" in out and "exit status 1" in out


def test_swapping_the_groups_reads_the_same_change_as_an_improvement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--a", *_slower(B, 2.0, tmp_path), "--b", *A)
    assert status == 0, out
    assert "b vs a, decode tok/s (one stream): +175.4%, " in out
    assert ": improvement (tolerance 3%, 2 vs 2 boots;" in out


def test_under_the_cpu_engines_spawn_modes_two_boots_a_side_leave_decodes_halving_unresolved(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-cpu declares a slow mode at half speed in 10% of boots (judge/profiles.py): both
    # boots of a side in it is a reading the rule must weigh, so decode (-64%) gets no direction,
    # only a change (its sign at the level the comparison's 8 rows share); output throughput
    # (-65%, its boots agreeing more closely) is convicted.
    status, out, _ = _run(capsys, "--a", *A, "--b", *_slower(B, 2.0, tmp_path), "--deployment", "tiny-cpu")
    assert "b vs a, decode tok/s (one stream): -63.7%, " in out
    assert ": changed, size unresolved (tolerance 25%, 2 vs 2 boots;" in out
    [throughput] = [line for line in out.splitlines() if "output throughput tok/s" in line]
    assert throughput.split()[-1] == "REGRESSION"
    assert status == 1, out


def test_runs_of_one_live_server_screen_a_change_but_never_convict_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--a", *A, "--b", *_slower(B, 2.0, tmp_path), "--same-server")
    assert status == UNRESOLVED_EXIT, out
    assert "one boot can screen a change, never convict it" in out
    assert "(tolerance 3%, 1 vs 1 boot;" in out
    assert "UNRESOLVED, " in out and "(one live server a side: screened, not convicted)" in out
    assert "REGRESSION" not in out
    assert f"exit status {UNRESOLVED_EXIT}" in out


def test_one_boot_a_side_cannot_convict_either(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "--a", A[0], "--b", _slower(B, 2.0, tmp_path)[0])
    assert status == UNRESOLVED_EXIT, out
    assert "(one boot a side: screened, not convicted)" in out
    assert "REGRESSION" not in out


def test_files_of_two_tools_are_not_compared(capsys: pytest.CaptureFixture[str]) -> None:
    aiperf = str(DATA / "compare" / "aiperf" / "boot1.json")
    status, _, err = _run(capsys, "--a", *A, "--b", aiperf)
    assert status == USAGE_EXIT
    assert "the files come from different tools: vllm bench serve (" in err and f"aiperf ({aiperf})" in err


def test_a_metric_missing_on_one_side_names_the_file_and_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(Path(B[0]).read_text())
    for key in [k for k in data if k.endswith("_e2el_ms")]:
        del data[key]
    lacking = tmp_path / "no-e2el.json"
    lacking.write_text(json.dumps(data))
    status, _, err = _run(capsys, "--a", *A, "--b", str(lacking), B[1])
    assert status == USAGE_EXIT
    assert f"{lacking}: metric 'e2el_ms' is missing at load 'one stream'" in err
    assert "(field 'median_e2el_ms')" in err
    # Judging the metrics both sides have is the way out the message names.
    status, out, _ = _run(capsys, "--a", *A, "--b", str(lacking), B[1], "--metric", "decode_tok_s",
                          "--metric", "ttft_ms")
    assert status in (0, UNRESOLVED_EXIT) and "end-to-end" not in out


def test_labelled_groups_and_the_json_and_markdown_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow = _slower(B, 2.0, tmp_path / "slow")
    status, out, _ = _run(capsys, "--group", f"main={A[0]}", "--group", f"main={A[1]}",
                          "--group", f"pr={tmp_path / 'slow' / '*.json'}",
                          "--json", str(tmp_path / "answer.json"), "--markdown", str(tmp_path / "answer.md"))
    assert status == 1 and len(slow) == 2
    answer = json.loads((tmp_path / "answer.json").read_text())
    assert answer["exit_status"] == 1 and answer["reference_group"] == "main"
    primary = [row for row in answer["rows"] if row["primary"]]
    assert [(r["metric"], r["verdict"], r["group"]) for r in primary] == [("decode_tok_s", "regression", "pr")]
    assert primary[0]["boots_current"] == primary[0]["boots_reference"] == 2
    markdown = (tmp_path / "answer.md").read_text()
    assert "| one stream | decode tok/s | pr | -63.7% |" in markdown
    assert "**compare FAILED (" in markdown


@pytest.mark.parametrize(("args", "words"), [
    (["--a", "nowhere/*.json", "--b", B[0]], "group 'a': 'nowhere/*.json' matches no file"),
    (["--a", *A], "compare needs two groups of result files at least"),
    (["--a", *A, "--b", *B, "--tolerance", "decode=0.1"], "--tolerance 'decode=0.1': unknown metric 'decode'"),
    (["--a", *A, "--b", *B, "--tolerance", "3"], "--tolerance '3': use a fraction above 0 and below 1"),
    (["--a", *A, "--b", *B, "--deployment", "gpu-box"], "gpu-box"),
    (["--group", "x"], "--group 'x': use LABEL=FILE or LABEL=GLOB"),
])
def test_a_bad_option_is_a_usage_error_that_names_it(capsys: pytest.CaptureFixture[str], args: list[str],
                                                     words: str) -> None:
    status, _, err = _run(capsys, *args)
    assert status == USAGE_EXIT
    assert words in err


def test_the_module_runs_the_command_and_exits_with_its_status(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_kimiperf", "compare", "--a", *A,
                           "--b", *_slower(B, 2.0, tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "REGRESSION" in done.stdout
    bare = subprocess.run([sys.executable, "-m", "pytest_kimiperf"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert bare.returncode == USAGE_EXIT and "kimiperf compare --help" in bare.stderr
