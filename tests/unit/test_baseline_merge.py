"""The three-way merge of baseline files, as a function and as git's merge driver on real clones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.storage.baseline_merge import BaselineConflict, main, merge_baseline_texts, merge_baselines
from pytest_kimiperf.__main__ import main as kimiperf
from pytest_kimiperf.judge.baselines import BaselineEntry, BaselineFile
from pytest_kimiperf.storage.baselines import dumps_baseline, parse_baseline
from pytest_kimiperf.judge.baselines import HISTORY_BOOTS, append_history, make_entry
from pytest_kimiperf.storage.baselines import baseline_path, load_baseline, update_baseline
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.judge.noise import BootOrigin
from tests.helpers import DATA, ROOT

DEPLOYMENT = "tiny-llama-cpu"
HARD_FACTS = {"cpu.cores": "2", "cpu.model": "x86-64", "engine": "vllm-cpu", "model": "tiny-llama", "tp": "1"}
FINGERPRINT = Fingerprint(hard=HARD_FACTS, soft={"host.name": "runner-a"})
PATH = Path("baselines") / DEPLOYMENT / f"{FINGERPRINT.key}.json"
START = datetime(2025, 2, 3, 4, 5, 6, tzinfo=UTC)
DECODE = "perf_tests/test_decode.py::test_single_stream|default|decode_tok_s"


def _entry(minute: int, median: float, *, host: str = "runner-a", test: str = "perf_tests/test_decode.py::test_single_stream",
           env: dict[str, str] | None = None) -> BaselineEntry:
    """One session's one boot of decode_tok_s, recorded ``minute`` minutes after START on ``host``."""
    return make_entry(
        test=test, profile="default", metric="decode_tok_s", unit="tok/s",
        direction=Direction.HIGHER_IS_BETTER, samples=[median, median * 1.01, median * 0.99],
        git_commit=f"{minute % 10}" * 40, profile_env=env or {}, recorded_at=START + timedelta(minutes=minute),
        boot_origins=[BootOrigin(session=f"s{minute}", host=host)],
    )


def _file(*entries: BaselineEntry, fingerprint: Fingerprint = FINGERPRINT, deployment: str = DEPLOYMENT) -> BaselineFile:
    return BaselineFile(path=PATH, deployment=deployment, fingerprint=fingerprint,
                        entries={e.key: e for e in entries})


def _history(entry: BaselineEntry | None) -> list[str]:
    assert entry is not None
    return [boot.origin.session for boot in entry.boots if boot.origin is not None]


def _texts(base: BaselineFile, ours: BaselineFile, theirs: BaselineFile) -> tuple[str, str, str]:
    return dumps_baseline(base), dumps_baseline(ours), dumps_baseline(theirs)


def test_boots_appended_on_both_sides_are_kept_oldest_first_either_way_round() -> None:
    base = append_history(_entry(0, 40.0), _entry(1, 41.0))
    ours = append_history(base, _entry(3, 42.0, host="runner-b"))
    theirs = append_history(base, _entry(2, 43.0))
    merged = merge_baselines(_file(base), _file(ours), _file(theirs))
    assert _history(merged.entries[DECODE]) == ["s0", "s1", "s2", "s3"]
    # A merge and a rebase (the sides swapped) write the same bytes.
    assert (merge_baseline_texts(*_texts(_file(base), _file(ours), _file(theirs)), path=PATH)
            == merge_baseline_texts(*_texts(_file(base), _file(theirs), _file(ours)), path=PATH))


def test_a_boot_on_both_sides_is_kept_once() -> None:
    base = _entry(0, 40.0)
    shared = append_history(base, _entry(1, 41.0))  # e.g. one commit cherry-picked onto both
    merged = merge_baselines(_file(base), _file(shared), _file(append_history(shared, _entry(2, 42.0))))
    assert _history(merged.entries[DECODE]) == ["s0", "s1", "s2"]


def test_a_full_history_merges_as_if_the_two_updates_had_run_one_after_the_other() -> None:
    base: BaselineEntry | None = None
    for minute in range(HISTORY_BOOTS):
        base = append_history(base, _entry(minute, 40.0 + minute))
    assert base is not None
    ours, theirs = _entry(100, 50.0, host="runner-b"), _entry(101, 51.0)
    merged = merge_baselines(_file(base), _file(append_history(base, ours)), _file(append_history(base, theirs)))
    assert merged.entries[DECODE] == append_history(append_history(base, ours), theirs)
    assert len(merged.entries[DECODE].boots) == HISTORY_BOOTS


def test_an_entry_deleted_on_one_side_stays_deleted_and_keeps_only_boots_recorded_since() -> None:
    other = _entry(0, 7.0, test="perf_tests/test_decode.py::test_other")
    base = append_history(_entry(0, 40.0), _entry(1, 41.0))
    reset = _file(other)  # someone deleted the decode history to record it anew
    untouched = merge_baselines(_file(base, other), reset, _file(base, other))
    assert DECODE not in untouched.entries
    appended = merge_baselines(_file(base, other), reset, _file(append_history(base, _entry(2, 42.0)), other))
    assert _history(appended.entries[DECODE]) == ["s2"]


def test_entries_present_on_one_side_only_are_kept() -> None:
    base = _entry(0, 40.0)
    ours = _entry(1, 5.0, test="perf_tests/test_decode.py::test_ours")
    theirs = _entry(2, 6.0, test="perf_tests/test_decode.py::test_theirs")
    merged = merge_baselines(_file(base), _file(base, ours), _file(base, theirs))
    assert sorted(merged.entries) == sorted([DECODE, ours.key, theirs.key])
    assert list(merged.entries) == sorted(merged.entries)


def test_the_latest_samples_and_soft_facts_come_from_the_side_that_recorded_last() -> None:
    base = _entry(0, 40.0)
    later = append_history(base, _entry(9, 60.0, host="runner-b"))
    earlier = append_history(base, _entry(5, 50.0))
    fp_b = Fingerprint(hard=HARD_FACTS, soft={"host.name": "runner-b"})
    fp_c = Fingerprint(hard=HARD_FACTS, soft={"host.name": "runner-c"})
    merged = merge_baselines(_file(base), _file(earlier, fingerprint=fp_c), _file(later, fingerprint=fp_b))
    assert merged.entries[DECODE].samples == later.samples
    assert merged.entries[DECODE].recorded_at == later.recorded_at
    assert merged.fingerprint == fp_b


def test_a_file_both_runners_added_merges_as_a_union() -> None:
    # Two runners of new hardware record its first baseline at once: git's add/add, an empty base.
    ours, theirs = _file(_entry(1, 41.0)), _file(_entry(2, 42.0, host="runner-b"))
    text = merge_baseline_texts("", dumps_baseline(ours), dumps_baseline(theirs), path=PATH)
    assert _history(parse_baseline(PATH, text).entries[DECODE]) == ["s1", "s2"]


def test_a_side_left_as_it_was_gives_the_other_side_byte_for_byte() -> None:
    base = dumps_baseline(_file(_entry(0, 40.0)))
    changed = dumps_baseline(_file(append_history(_entry(0, 40.0), _entry(1, 41.0))))
    assert merge_baseline_texts(base, base, changed, path=PATH) == changed
    assert merge_baseline_texts(base, changed, base, path=PATH) == changed


@pytest.mark.parametrize("theirs, field", [
    (_file(_entry(2, 42.0), fingerprint=Fingerprint(hard={**HARD_FACTS, "tp": "2"}, soft={})), "fingerprint"),
    (_file(_entry(2, 42.0), deployment="other-deployment"), "deployment"),
    (_file(append_history(_entry(0, 40.0), _entry(2, 42.0, env={"NCCL_PROTO": "LL"}))), "profile_env"),
])
def test_sides_that_disagree_on_what_is_not_history_are_a_conflict(theirs: BaselineFile, field: str) -> None:
    base = _entry(0, 40.0)
    with pytest.raises(BaselineConflict, match=rf"baseline {PATH}.*{field} differs between the two sides"):
        merge_baselines(_file(base), _file(append_history(base, _entry(1, 41.0))), theirs)


def test_sides_of_different_schema_versions_are_a_conflict() -> None:
    schema_1 = (DATA / "baselines" / "schema1.json").read_text()
    schema_2 = dumps_baseline(parse_baseline(PATH, schema_1))
    edited = schema_1.replace('"recorded_at": "', '"recorded_at": "1', 1)
    with pytest.raises(BaselineConflict, match=r"schema_version differs between the two sides \(ours 3, theirs 1\)"):
        merge_baseline_texts(schema_1, schema_2, edited, path=PATH)


def test_driver_writes_the_merge_into_ours(tmp_path: Path) -> None:
    base = _entry(0, 40.0)
    files = [tmp_path / name for name in ("O", "A", "B")]
    for file, side in zip(files, (base, append_history(base, _entry(1, 41.0)), append_history(base, _entry(2, 42.0)))):
        file.write_text(dumps_baseline(_file(side)))
    assert main([*map(str, files), str(PATH)]) == 0
    assert _history(parse_baseline(PATH, files[1].read_text()).entries[DECODE]) == ["s0", "s1", "s2"]


def test_the_drivers_old_commands_leave_the_merge_conflicted_and_say_what_to_configure(tmp_path: Path) -> None:
    # A clone configured before the driver became `python -m pytest_kimiperf merge-driver`: git
    # must not take "ours" as merged (exit 0 with %A untouched would drop the other runner's boots).
    ours = tmp_path / "A"
    ours.write_text("ours\n")
    old = subprocess.run([sys.executable, "-m", "pytest_kimiperf.merge_driver", "a", str(ours), "c", "d"],
                         capture_output=True, text=True, cwd=ROOT)
    assert old.returncode == 1 and ours.read_text() == "ours\n"
    assert "make merge-driver" in old.stderr
    assert f'merge.kimiperf-baselines.driver "{sys.executable} -m pytest_kimiperf merge-driver %O %A %B %P"' in old.stderr
    # The oldest path is gone: Python's own error, a non-zero exit all the same.
    oldest = subprocess.run([sys.executable, "-m", "pytest_kimiperf.judge.baseline_merge", "a", "b", "c", "d"],
                            capture_output=True, text=True, cwd=ROOT)
    assert oldest.returncode == 1 and "No module named" in oldest.stderr


def test_the_driver_is_a_command_of_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert kimiperf(["merge-driver", "only-one"]) == 2
    assert "usage: python -m pytest_kimiperf merge-driver BASE OURS THEIRS PATH" in capsys.readouterr().err
    assert kimiperf(["no-such-command"]) == 4
    assert "merge-driver" in capsys.readouterr().err


def test_driver_refusing_leaves_conflict_markers_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _entry(0, 40.0)
    other = Fingerprint(hard={**HARD_FACTS, "tp": "2"}, soft={})
    files = [tmp_path / name for name in ("O", "A", "B")]
    for file, side in zip(files, (_file(base), _file(append_history(base, _entry(1, 41.0))),
                                  _file(append_history(base, _entry(2, 42.0)), fingerprint=other))):
        file.write_text(dumps_baseline(side))
    assert main([*map(str, files), str(PATH)]) == 1
    assert "<<<<<<< ours:" in files[1].read_text()
    assert f"baseline {PATH}: fingerprint differs" in capsys.readouterr().err
    assert main(["only-one"]) == 2


# Real git: an origin, and runners that each record on their own clone and push.

def _git_env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return {**env, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
            "PYTHONPATH": str(ROOT)}


def _runner(tmp_path: Path, origin: Path, name: str) -> tuple[Path, list[str]]:
    """A clone of ``origin`` with the driver configured by the Makefile's target (this python)."""
    env = _git_env(tmp_path)
    clone = tmp_path / name
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, env=env)
    git = ["git", "-C", str(clone)]
    for key, value in (("user.name", name), ("user.email", f"{name}@example.com")):
        subprocess.run([*git, "config", key, value], check=True, env=env)
    subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "merge-driver", f"PY={sys.executable}"],
                   cwd=clone, check=True, env=env)
    return clone, git


def _record(clone: Path, git: list[str], env: dict[str, str], entry: BaselineEntry,
            fingerprint: Fingerprint = FINGERPRINT) -> None:
    update_baseline(baseline_path(clone / "baselines", DEPLOYMENT, FINGERPRINT.key), DEPLOYMENT, fingerprint, [entry])
    subprocess.run([*git, "add", "baselines"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", f"baselines: {entry.recorded_at}"], check=True, env=env)


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Path, list[str], Path, list[str], dict[str, str]]:
    """Two runners' clones of an origin whose baseline holds one boot, and the git environment."""
    env = _git_env(tmp_path)
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True, env=env)
    seed, git = _runner(tmp_path, origin, "seed")
    subprocess.run([*git, "checkout", "-q", "-b", "main"], check=True, env=env)
    for name in (".gitattributes", ".gitignore"):  # the driver, and the lock files left out
        (seed / name).write_text((ROOT / name).read_text())
    subprocess.run([*git, "add", ".gitattributes", ".gitignore"], check=True, env=env)
    _record(seed, git, env, _entry(0, 40.0))
    subprocess.run([*git, "push", "-q", "origin", "main"], check=True, env=env)
    return (*_runner(tmp_path, origin, "runner-a"), *_runner(tmp_path, origin, "runner-b"), env)


@pytest.mark.parametrize("pull", ["--rebase", "--no-rebase"])
def test_two_runners_recording_the_same_entry_merge_through_git(fleet, pull: str) -> None:  # type: ignore[no-untyped-def]
    a, git_a, b, git_b, env = fleet
    _record(a, git_a, env, _entry(1, 41.0, host="runner-a"))
    subprocess.run([*git_a, "push", "-q", "origin", "main"], check=True, env=env)
    _record(b, git_b, env, _entry(2, 42.0, host="runner-b"))
    rejected = subprocess.run([*git_b, "push", "-q", "origin", "main"], capture_output=True, env=env)
    assert rejected.returncode != 0  # non-fast-forward: b must pull first
    subprocess.run([*git_b, "pull", "-q", pull, "origin", "main"], check=True, env=env, capture_output=True)
    subprocess.run([*git_b, "push", "-q", "origin", "main"], check=True, env=env)
    path = baseline_path(b / "baselines", DEPLOYMENT, FINGERPRINT.key)
    assert "<<<<<<<" not in path.read_text()
    assert _history(load_baseline(path).entries[DECODE]) == ["s0", "s1", "s2"]  # type: ignore[union-attr]


def test_a_fingerprint_mismatch_through_git_is_left_as_a_conflict(fleet) -> None:  # type: ignore[no-untyped-def]
    a, git_a, b, git_b, env = fleet
    _record(a, git_a, env, _entry(1, 41.0))
    subprocess.run([*git_a, "push", "-q", "origin", "main"], check=True, env=env)
    path = baseline_path(b / "baselines", DEPLOYMENT, FINGERPRINT.key)
    moved = load_baseline(path)
    assert moved is not None  # a file of other hardware copied over this one by hand
    other = Fingerprint(hard={**HARD_FACTS, "tp": "2"}, soft={})
    path.write_text(dumps_baseline(BaselineFile(path=path, deployment=DEPLOYMENT, fingerprint=other,
                                                entries={DECODE: append_history(moved.entries[DECODE], _entry(2, 42.0))})))
    subprocess.run([*git_b, "commit", "-q", "-am", "by hand"], check=True, env=env)
    pulled = subprocess.run([*git_b, "pull", "--no-rebase", "origin", "main"], capture_output=True, text=True, env=env)
    assert pulled.returncode != 0
    assert "fingerprint differs" in pulled.stderr
    unmerged = subprocess.run([*git_b, "diff", "--name-only", "--diff-filter=U"], capture_output=True, text=True,
                              check=True, env=env).stdout.split()
    assert unmerged == [str(PATH)]
    assert "<<<<<<<" in path.read_text()
    assert json.loads((a / PATH).read_text())["fingerprint"]["key"] == FINGERPRINT.key
