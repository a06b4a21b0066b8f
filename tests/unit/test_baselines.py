"""Baseline files: golden load/merge/format, untouched bad files, git commit, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pytest_kimiperf.judge.baselines import BaselineEntry
from pytest_kimiperf.storage.baselines import SCHEMA_VERSION, dumps_baseline
from pytest_kimiperf.judge.baselines import HISTORY_BOOTS, make_entry
from pytest_kimiperf.storage.baselines import baseline_path, load_baseline, update_baseline
from pytest_kimiperf.errors import BaselineError, ConfigError
from pytest_kimiperf.judge.baselines import Fingerprint
from pytest_kimiperf.storage.git_facts import current_git_commit
from pytest_kimiperf.config.metric_specs import Direction
from tests import helpers

DATA = helpers.DATA / "baselines"
DEPLOYMENT = "tiny-llama-cpu"
HARD_FACTS = {"cpu.cores": "2", "cpu.model": "x86-64", "engine": "vllm-cpu", "model": "tiny-llama", "tp": "1"}
FINGERPRINT = Fingerprint(hard=HARD_FACTS, soft={"vllm": "0.32.0"})
RECORDED_AT = datetime(2025, 2, 3, 4, 5, 6, tzinfo=UTC)
DECODE_TEST = "perf_tests/test_decode.py::test_single_stream"


def _install(tmp_path: Path, golden: str) -> Path:
    """Copy a golden file to where baseline_path puts it, and return that path."""
    path = baseline_path(tmp_path, DEPLOYMENT, FINGERPRINT.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DATA / golden, path)
    return path


def _new_entries() -> list[BaselineEntry]:
    """The run that turns merge_before.json into merge_after.json."""
    ring_ll = make_entry(
        test=DECODE_TEST,
        profile="ring-ll",
        metric="decode_tok_s",
        unit="tok/s",
        direction=Direction.HIGHER_IS_BETTER,
        # Unrounded figures and a failed request (NaN): stored at 6 digits, NaN left out.
        samples=[44.123456789, 44.2000004, 43.98765432, float("nan"), 44.31, 44.05],
        git_commit="2" * 40,
        profile_env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
        recorded_at=RECORDED_AT,
    )
    ttft = make_entry(
        test="perf_tests/test_latency.py::test_ttft[prompt-512]",
        profile="default",
        metric="ttft_ms",
        unit="ms",
        direction=Direction.LOWER_IS_BETTER,
        samples=[812.3456789, 1234567.891, 799.0, 805.55555, 0.000123456789],
        git_commit=None,
        profile_env={},
        recorded_at=RECORDED_AT,
    )
    return [ttft, ring_ll]


def test_baseline_path_is_deployment_then_fingerprint(tmp_path: Path) -> None:
    assert baseline_path(tmp_path, "kimi-k2.5-tp8", "rtxpro6000x8-ab12") == (
        tmp_path / "kimi-k2.5-tp8" / "rtxpro6000x8-ab12.json"
    )


@pytest.mark.parametrize("deployment, key", [("../etc", "k"), ("d", "a/b"), ("", "k"), ("d", "..")])
def test_baseline_path_rejects_unsafe_names(tmp_path: Path, deployment: str, key: str) -> None:
    with pytest.raises(ConfigError, match="invalid (deployment|fingerprint key) name"):
        baseline_path(tmp_path, deployment, key)


def test_missing_file_loads_as_none(tmp_path: Path) -> None:
    assert load_baseline(tmp_path / "nope.json") is None


def test_golden_file_loads_and_dumps_back_byte_for_byte() -> None:
    loaded = load_baseline(DATA / "merge_before.json")
    assert loaded is not None
    assert loaded.deployment == DEPLOYMENT
    assert loaded.fingerprint == FINGERPRINT
    entry = loaded.entry(DECODE_TEST, "ring-ll", "decode_tok_s")
    assert entry is not None
    assert entry.samples == (43.0, 43.1, 43.2, 42.9, 43.3)
    assert entry.direction is Direction.HIGHER_IS_BETTER
    assert entry.profile_env == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    assert [(b.median, b.n, b.recorded_at) for b in entry.boots] == [(43.1, 5, "2025-01-02T03:04:05Z")]
    assert loaded.entry(DECODE_TEST, "tree", "decode_tok_s") is None
    assert json.loads((DATA / "merge_before.json").read_text())["schema_version"] == SCHEMA_VERSION == 3
    assert dumps_baseline(loaded) == (DATA / "merge_before.json").read_text()


def test_unsorted_compact_file_is_written_back_sorted_and_indented() -> None:
    # compact_unsorted.json is schema 1: it also comes back as schema 3, one boot per entry.
    compact = load_baseline(DATA / "compact_unsorted.json")
    assert compact is not None
    text = dumps_baseline(compact)
    assert text == (DATA / "merge_before.json").read_text()
    assert text.endswith("}\n") and '\n  "entries": {\n' in text


def test_update_merges_into_golden_result(tmp_path: Path) -> None:
    path = _install(tmp_path, "merge_before.json")
    result = update_baseline(path, DEPLOYMENT, FINGERPRINT, _new_entries())
    # merge_after.json: ring-ll's latest samples replaced and its new boot appended to its
    # history (the 2025-01-02 boot kept first), the ttft entry added with a one-boot history,
    # the default entry kept untouched (its 2025-01-02 recorded_at and commit 111...),
    # everything rounded, sorted and indented.
    assert path.read_text() == (DATA / "merge_after.json").read_text()
    ring_ll = result.entry(DECODE_TEST, "ring-ll", "decode_tok_s")
    assert ring_ll is not None
    assert [(b.recorded_at, b.git_commit) for b in ring_ll.boots] == [
        ("2025-01-02T03:04:05Z", None), ("2025-02-03T04:05:06Z", "2" * 40)]
    assert [b.n for b in ring_ll.boots] == [5, 5]  # the failed request (NaN) is not counted
    assert result == load_baseline(path)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".lock"]


def test_update_creates_a_new_file(tmp_path: Path) -> None:
    path = baseline_path(tmp_path, DEPLOYMENT, FINGERPRINT.key)
    entries = _new_entries()
    update_baseline(path, DEPLOYMENT, FINGERPRINT, entries)
    loaded = load_baseline(path)
    assert loaded is not None
    assert sorted(loaded.entries) == sorted(e.key for e in entries)
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION == 3
    assert all(len(e.boots) == 1 for e in loaded.entries.values())


def test_schema_1_file_loads_as_one_boot_and_is_written_back_as_schema_3(tmp_path: Path) -> None:
    assert json.loads((DATA / "schema1.json").read_text())["schema_version"] == 1
    path = _install(tmp_path, "schema1.json")
    loaded = load_baseline(path)
    assert loaded is not None and json.loads(dumps_baseline(loaded))["schema_version"] == SCHEMA_VERSION
    default = loaded.entry(DECODE_TEST, "default", "decode_tok_s")
    assert default is not None
    (boot,) = default.boots  # one run of schema 1 was one boot
    assert (boot.median, boot.n, boot.recorded_at, boot.git_commit) == (
        41.2, 5, "2025-01-02T03:04:05Z", "1" * 40)
    assert boot.se_log is not None and 0 < boot.se_log < 0.01  # from its own five samples
    assert path.read_text() == (DATA / "schema1.json").read_text()  # loading writes nothing
    # The next update rewrites the whole file as schema 3, untouched entries included.
    update_baseline(path, DEPLOYMENT, FINGERPRINT, _new_entries())
    assert path.read_text() == (DATA / "merge_after.json").read_text()
    assert json.loads(path.read_text())["schema_version"] == SCHEMA_VERSION == 3


def test_update_appends_boots_and_keeps_the_last_history_boots(tmp_path: Path) -> None:
    path = baseline_path(tmp_path, DEPLOYMENT, FINGERPRINT.key)

    def boot_entry(i: int, *, env: dict[str, str] | None = None) -> BaselineEntry:
        return make_entry(
            test=DECODE_TEST, profile="ring-ll", metric="decode_tok_s", unit="tok/s",
            direction=Direction.HIGHER_IS_BETTER, samples=[40.0 + i, 40.1 + i, 39.9 + i],
            git_commit=f"{i % 10}" * 40, profile_env=env if env is not None else {"NCCL_PROTO": "LL"},
            recorded_at=datetime(2025, 1, 1, 0, i % 60, 0, tzinfo=UTC),
        )

    for i in range(3):
        update_baseline(path, DEPLOYMENT, FINGERPRINT, [boot_entry(i)])
    loaded = load_baseline(path)
    assert loaded is not None
    entry = loaded.entry(DECODE_TEST, "ring-ll", "decode_tok_s")
    assert entry is not None
    assert [b.median for b in entry.boots] == [40.0, 41.0, 42.0]  # oldest first
    assert entry.samples == (42.0, 42.1, 41.9)  # the latest boot's samples
    # One session's several boots of a test arrive as several entries of the same key.
    update_baseline(path, DEPLOYMENT, FINGERPRINT, [boot_entry(i) for i in range(3, HISTORY_BOOTS + 5)])
    loaded = load_baseline(path)
    assert loaded is not None
    entry = loaded.entry(DECODE_TEST, "ring-ll", "decode_tok_s")
    assert entry is not None
    assert len(entry.boots) == HISTORY_BOOTS == 20
    assert [b.median for b in entry.boots] == [40.0 + i for i in range(5, HISTORY_BOOTS + 5)]
    assert entry.boots[-1].recorded_at == f"2025-01-01T00:{HISTORY_BOOTS + 4:02d}:00Z"
    # Another profile environment is another thing: its history starts over.
    update_baseline(path, DEPLOYMENT, FINGERPRINT, [boot_entry(99, env={"NCCL_PROTO": "Simple"})])
    loaded = load_baseline(path)
    assert loaded is not None
    entry = loaded.entry(DECODE_TEST, "ring-ll", "decode_tok_s")
    assert entry is not None and [b.median for b in entry.boots] == [139.0]


@pytest.mark.parametrize(
    "golden, expected",
    [
        ("corrupt.json", r"is not valid JSON \(line 2, column \d+.*git checkout -- .*left unchanged"),
        ("future_schema.json", r"schema_version 4, newer than the 3 .* upgrade pytest-kimiperf"),
    ],
)
def test_bad_file_is_a_clear_error_and_stays_untouched(tmp_path: Path, golden: str, expected: str) -> None:
    path = _install(tmp_path, golden)
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=expected) as load_error:
        load_baseline(path)
    assert str(path) in str(load_error.value)
    with pytest.raises(BaselineError, match=expected):
        update_baseline(path, DEPLOYMENT, FINGERPRINT, _new_entries())
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda e: e.update(n=4), "n is 4 but there are 5 samples"),
        (lambda e: e.update(direction="up"), "direction 'up' is not one of"),
        (lambda e: e.update(samples=[]), "samples must be a non-empty list"),
        (lambda e: e.pop("unit"), "missing unit"),
        (lambda e: e.update(metric="itl_ms"), "holds test/profile/metric"),
        (lambda e: e.update(boots=[]), "boots must be a non-empty list"),
        (lambda e: e["boots"][0].update(median=0), r"boots\[0\]\.median must be a number > 0"),
        (lambda e: e["boots"][0].update(n=0), r"boots\[0\]\.n must be an integer >= 1"),
    ],
)
def test_malformed_entry_names_the_entry(tmp_path: Path, edit, expected: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((DATA / "merge_before.json").read_text())
    key = f"{DECODE_TEST}|default|decode_tok_s"
    edit(data["entries"][key])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError, match=expected) as error:
        load_baseline(path)
    assert key in str(error.value)


def test_file_of_another_fingerprint_is_not_merged_into(tmp_path: Path) -> None:
    path = _install(tmp_path, "merge_before.json")
    other = Fingerprint(hard={**HARD_FACTS, "tp": "2"}, soft={})
    data = json.loads(path.read_text())
    data["fingerprint"] = other.to_json()
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=f"belongs to deployment 'tiny-llama-cpu' with fingerprint '{other.key}'"):
        update_baseline(path, DEPLOYMENT, FINGERPRINT, _new_entries())
    assert path.read_bytes() == before


def test_hand_edited_hard_facts_are_refused_and_left_alone(tmp_path: Path) -> None:
    path = _install(tmp_path, "merge_before.json")
    data = json.loads(path.read_text())
    data["fingerprint"]["hard"]["tp"] = "8"  # the key still says tp=1
    path.write_text(json.dumps(data))
    before = path.read_bytes()
    with pytest.raises(BaselineError, match=r"does not match its hard facts.*git checkout -- "):
        update_baseline(path, DEPLOYMENT, FINGERPRINT, _new_entries())
    assert path.read_bytes() == before


def test_path_must_match_deployment_and_fingerprint(tmp_path: Path) -> None:
    with pytest.raises(BaselineError, match="use baseline_path"):
        update_baseline(tmp_path / DEPLOYMENT / "other.json", DEPLOYMENT, FINGERPRINT, _new_entries())


def test_make_entry_rejects_what_cannot_be_stored() -> None:
    common: dict[str, Any] = {
        "profile": "default", "metric": "ttft_ms", "unit": "ms", "direction": Direction.LOWER_IS_BETTER,
        "git_commit": None, "profile_env": {},
    }
    with pytest.raises(BaselineError, match=r"no finite samples .* \(got 2 samples\)"):
        make_entry(test="t", samples=[float("nan"), float("inf")], **common)
    with pytest.raises(BaselineError, match=r"test id 'a\|b' cannot be part of a baseline key"):
        make_entry(test="a|b", samples=[1.0], **common)
    with pytest.raises(BaselineError, match="has no time zone"):
        make_entry(test="t", samples=[1.0], recorded_at=datetime(2025, 1, 1), **common)


def test_recorded_at_defaults_to_now_in_utc() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    entry = make_entry(test="t", profile="p", metric="ttft_ms", unit="ms", direction=Direction.LOWER_IS_BETTER,
                       samples=[1.0], git_commit=None, profile_env={})
    recorded = datetime.strptime(entry.recorded_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before <= recorded <= datetime.now(UTC)


def test_current_git_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert current_git_commit(repo) is None  # a repository without commits has no HEAD yet
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert current_git_commit(repo) == head
    outside = tmp_path / "plain"
    outside.mkdir()
    # GIT_CEILING_DIRECTORIES is not needed: tmp_path is never inside a checkout.
    assert current_git_commit(outside) is None
    assert current_git_commit(tmp_path / "missing") is None


def _writer(path: str, worker: int, updates: int, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    for i in range(updates):
        entry = make_entry(
            test=f"tests/test_w{worker}.py::test_{i}", profile="default", metric="ttft_ms", unit="ms",
            direction=Direction.LOWER_IS_BETTER, samples=[float(i + 1), float(worker + 1)],
            git_commit=None, profile_env={}, recorded_at=RECORDED_AT,
        )
        update_baseline(path, DEPLOYMENT, FINGERPRINT, [entry])


def _reader(path: str, start: multiprocessing.synchronize.Barrier, stop: multiprocessing.synchronize.Event,
            failures: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    start.wait()
    while not stop.is_set():
        try:
            load_baseline(path)
        except BaselineError as exc:  # a half-written file would show up here
            failures.put(str(exc))
            return


def test_two_processes_updating_at_once_lose_no_entry(tmp_path: Path) -> None:
    path = baseline_path(tmp_path, DEPLOYMENT, FINGERPRINT.key)
    updates = 25
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(3)
    stop = ctx.Event()
    failures = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(str(path), w, updates, start)) for w in (0, 1)]
    reader = ctx.Process(target=_reader, args=(str(path), start, stop, failures))
    for proc in (*writers, reader):
        proc.start()
    for proc in writers:
        proc.join(timeout=120)
    stop.set()
    reader.join(timeout=30)
    assert [p.exitcode for p in (*writers, reader)] == [0, 0, 0]
    assert failures.empty()
    loaded = load_baseline(path)
    assert loaded is not None
    expected = {f"tests/test_w{w}.py::test_{i}|default|ttft_ms" for w in (0, 1) for i in range(updates)}
    assert set(loaded.entries) == expected
