"""``python -m pytest_kimiperf.history_steps``: a baseline file's steps, printed without running anything."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.history_steps import main
from pytest_kimiperf.judge.baselines import BaselineFile
from pytest_kimiperf.storage.baselines import dumps_baseline
from pytest_kimiperf.judge.baselines import append_history, make_entry
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.noise import BootOrigin
from tests.helpers import ROOT

START = datetime(2026, 11, 1, 3, 0, tzinfo=UTC)
FINGERPRINT = Fingerprint(hard={"cpu.cores": "2", "engine": "vllm-cpu", "model": "tiny", "tp": "1"}, soft={})
DECODE = "perf_tests/test_decode.py::test_single_stream_decode|default|decode_tok_s"


def write_history(path: Path, levels: list[float], deployment: str = "my-gpu-box") -> Path:
    """One nightly session per level (boot medians), commit c<day> each."""
    entry = None
    for day, level in enumerate(levels):
        boot = make_entry(
            test="perf_tests/test_decode.py::test_single_stream_decode", profile="default", metric="decode_tok_s",
            unit="tok/s", direction=Direction.HIGHER_IS_BETTER,
            samples=[level * (1 + 0.002 * ((i % 5) - 2)) for i in range(20)], git_commit=f"c{day:02d}" + "0" * 37,
            profile_env={}, recorded_at=START + timedelta(days=day),
            boot_origins=[BootOrigin(session=f"night-{day}", host="runner-a")])
        entry = boot if entry is None else append_history(entry, boot)
    assert entry is not None
    path.write_text(dumps_baseline(BaselineFile(path=path, deployment=deployment, fingerprint=FINGERPRINT,
                                                entries={entry.key: entry})), encoding="utf-8")
    return path


STEPPED = [81.4, 81.9, 81.2, 81.6, 81.5, 78.1, 78.4, 77.9, 78.3, 78.0]


def test_prints_each_entrys_step_with_its_dates_and_commits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_history(tmp_path / "key.json", STEPPED)
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "deployment my-gpu-box, 1 entries; boot/session/host spreads 1%/1%/2% (a deployment table's defaults" in out
    assert (f"{DECODE}: 10 boots; the history stepped -4.1% between 2026-11-05 03:00 (c040000000) and "
            "2026-11-06 03:00 (c050000000) (5 boots before, 5 after): judged against the 5 boots since the last step") in out


def test_json_lists_the_steps_and_an_unstepped_history_has_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stepped = write_history(tmp_path / "a.json", STEPPED)
    flat = write_history(tmp_path / "b.json", [81.4, 81.9, 81.2, 81.6, 81.5, 81.1])
    assert main([str(stepped), str(flat), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [len(r["steps"]) for r in rows] == [1, 0]
    assert rows[0]["steps"][0]["change"] == pytest.approx(-0.041, abs=0.001)
    assert rows[0]["steps"][0]["before_commit"].startswith("c04")
    assert (rows[0]["judged_boots"], rows[1]["judged_boots"]) == (5, 6)


def test_spreads_are_the_built_in_deployments_or_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-cpu declares a boot spread of 18% and a session spread of 20%: a 4% step is its noise.
    path = write_history(tmp_path / "key.json", STEPPED, deployment="tiny-cpu")
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "declared by the built-in deployment 'tiny-cpu'" in out and "no step" in out
    assert main([str(path), "--spreads", "0.01,0.01,0.02"]) == 0
    assert "stepped -4.1%" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0.01,0.01", "a,b,c", "0.01,1.5,0.02", "-0.1,0,0"])
def test_bad_spreads_are_a_usage_error_naming_the_value(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["x.json", f"--spreads={value}"])
    assert exc.value.code == 2
    assert f"--spreads {value!r}: give three fractions BOOT,SESSION,HOST" in capsys.readouterr().err


def test_a_missing_or_broken_file_is_exit_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "none.json")]) == 2
    assert f"no baseline file at {tmp_path / 'none.json'}" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    assert main([str(broken)]) == 2
    assert str(broken) in capsys.readouterr().err


def test_plot_draws_each_history(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_history(tmp_path / "key.json", STEPPED)
    assert main([str(path), "--plot", str(tmp_path / "plots")]) == 0
    [png] = (tmp_path / "plots").glob("*--history.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_as_a_module(tmp_path: Path) -> None:
    path = write_history(tmp_path / "key.json", STEPPED)
    done = subprocess.run([sys.executable, "-m", "pytest_kimiperf.history_steps", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "stepped -4.1%" in done.stdout
