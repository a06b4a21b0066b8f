"""Levels above the boot: sessions and hosts in the uncertainty, the host canary, the corpus."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.judge.history import compare_with_history
from pytest_kimiperf.judge.noise import canary_shift
from pytest_kimiperf.judge.noise import BootOrigin, history_level, level_terms, nested_levels
from pytest_kimiperf.judge.stats import VerdictKind, compare_boots
from pytest_kimiperf.measure.canary import Canary, cpu_canary
from pytest_kimiperf.judge.notes import SpreadSource
from pytest_kimiperf.reports.sentences import canary_text, comparison_line, level_spread_text, note_text
from benchmarks.noise_corpus import level_text, load_corpus


def boot(median: float, session: str = "", host: str = "h") -> BootSummary:
    return BootSummary(median=median, n=20, se_log=0.001, session=session, host=host)


def test_nested_levels_recover_known_boot_session_and_host_spreads() -> None:
    rng = np.random.default_rng(3)
    groups: dict[str, dict[str, list[float]]] = {}
    for h in range(8):
        host = rng.normal(0, 0.05)
        for s in range(6):
            session = rng.normal(0, 0.02)
            groups.setdefault(f"h{h}", {})[f"s{h}-{s}"] = list(host + session + rng.normal(0, 0.01, 5))
    levels = nested_levels(groups)
    assert levels.boot.sd_log == pytest.approx(0.01, rel=0.15)
    assert levels.session.sd_log == pytest.approx(0.02, rel=0.25)
    assert levels.host.sd_log == pytest.approx(0.05, rel=0.5)
    assert levels.boot.low < levels.boot.sd_log < levels.boot.high
    assert (levels.boots, levels.sessions, levels.hosts) == (240, 48, 8)


def test_one_session_measures_no_session_level() -> None:
    levels = nested_levels({"h": {"s": [0.0, 0.01, -0.01]}})
    assert math.isnan(levels.session.sd_log) and level_text(levels.session) == "n/a (one session per host)"
    assert math.isnan(levels.host.sd_log)


def test_a_history_of_one_session_adds_the_declared_session_spread_twice() -> None:
    current = [boot(100, "now"), boot(101, "now")]
    history = [boot(100 + i % 3, "then") for i in range(10)]
    terms = level_terms(current, history, spreads=Spreads(0.01, 0.02, 0.05))
    assert [t.name for t in terms] == ["session"]  # one host on both sides
    assert terms[0].var_log == pytest.approx(2 * math.log1p(0.02) ** 2)
    assert level_spread_text(terms[0].level) == "session spread 2% (declared 2%)"


def test_two_profiles_interleaved_in_one_session_share_it_and_add_nothing() -> None:
    a = [boot(100, "run"), boot(99, "run")]
    b = [boot(98, "run"), boot(101, "run")]
    assert level_terms(a, b, spreads=Spreads(0.01, 0.02, 0.05)) == []


def test_another_host_adds_the_host_level() -> None:
    current = [boot(100, "now", host="new")]
    history = [boot(100, f"s{i}", host="old") for i in range(3)]
    names = [t.name for t in level_terms(current, history, spreads=Spreads(0.01, 0.01, 0.03))]
    assert names == ["session", "host"]


def test_a_few_sessions_that_happen_to_agree_never_undercut_the_declared_spread() -> None:
    history = [boot(100.0 + 0.01 * i, f"s{i % 3}") for i in range(9)]
    level = history_level(history, "session", 0.02, boot_var=0.0001)
    assert level.sd_log == pytest.approx(math.log1p(0.02))
    # the declared floor, at its 10 df and the 2 the three sessions measured
    assert level.df == 10 + 2 and level.source.how == SpreadSource.FLOOR
    # and however many sessions agree: the declaration is a floor, lowered only by declaring less
    many = [boot(100.0 + 0.01 * i, f"s{i % 40}") for i in range(80)]
    level = history_level(many, "session", 0.02, boot_var=0.0001)
    assert level.sd_log == pytest.approx(math.log1p(0.02)) and level.source.how == SpreadSource.FLOOR


def test_a_session_level_measured_larger_than_declared_widens_the_comparison() -> None:
    rng = np.random.default_rng(1)
    history = [boot(100 * math.exp(e + rng.normal(0, 0.005)), f"s{i // 3}")
               for i, e in enumerate(np.repeat(rng.normal(0, 0.08, 4), 3))]
    level = history_level(history, "session", 0.01, boot_var=0.005 ** 2)
    assert level.sd_log > math.log1p(0.03) and "measured over 4 sessions" == note_text(level.source)


def test_the_verdict_says_what_it_rests_on_at_every_level() -> None:
    current = [boot(95, "now"), boot(96, "now")]
    history = [boot(100 + (i % 2), f"s{i % 4}") for i in range(12)]
    c = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                             spreads=Spreads(0.01, 0.008, 0.02), metric="decode tok/s")
    assert "2 boots of 1 session (40 samples) vs 12 reference boots of 4 sessions" in comparison_line(c)
    assert "session spread 0.8% (declared 0.8%" in comparison_line(c)


def test_a_session_effect_alone_does_not_convict_what_boots_would() -> None:
    current = [boot(95.5, "now"), boot(95.4, "now")]
    history = [boot(100 + 0.1 * (i % 2), "then") for i in range(10)]
    plain = compare_boots(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                          prior_spread=0.005)
    assert plain.verdict is VerdictKind.REGRESSION
    leveled = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                   spreads=Spreads(0.005, 0.02, 0.02))
    assert leveled.verdict is not VerdictKind.REGRESSION
    assert leveled.se_log > plain.se_log


def test_a_moved_canary_makes_the_host_not_comparable_and_a_steady_one_does_not() -> None:
    history = [{"python_mops": 23.0, "copy_gbs": 40.0}, {"python_mops": 22.5, "copy_gbs": 41.0}]
    slow = canary_shift({"python_mops": 11.6, "copy_gbs": 21.0}, history)
    assert slow is not None and slow.moved and "python_mops -49%" in canary_text(slow)
    steady = canary_shift({"python_mops": 22.0, "copy_gbs": 42.0}, history)
    assert steady is not None and not steady.moved
    # The copy probe alone moves 30% beside another process's memory traffic (corpus): not a host.
    noisy_copy = canary_shift({"python_mops": 22.8, "copy_gbs": 28.0}, history)
    assert noisy_copy is not None and not noisy_copy.moved
    assert canary_shift(None, history) is None and canary_shift({"python_mops": 1.0}, []) is None


def test_boot_origin_and_canary_round_trip_through_json() -> None:
    origin = BootOrigin("abc", "host1", {"python_mops": 22.0})
    assert BootOrigin.from_json(json.loads(json.dumps(origin.to_json()))) == origin
    canary = Canary({"copy_gbs": 40.12345}, {"copy_gbs": 0.01})
    back = Canary.from_json(json.loads(json.dumps(canary.to_json())))
    assert back is not None and back.scores == {"copy_gbs": 40.12}
    with pytest.raises(ValueError, match="copy_gbs=-1.0"):
        Canary.from_json({"scores": {"copy_gbs": -1.0}})


def test_the_cpu_canary_measures_both_probes_and_its_own_noise() -> None:
    canary = cpu_canary(rounds=3)
    assert set(canary.scores) == {"python_mops", "copy_gbs"}
    assert all(v > 0 for v in canary.scores.values())
    assert all(math.isfinite(v) and v >= 0 for v in canary.noise.values())
    with pytest.raises(ValueError, match="rounds=1"):
        cpu_canary(rounds=1)


def test_the_corpus_loader_keeps_valid_boots_of_the_variant(tmp_path) -> None:  # type: ignore[no-untyped-def]
    line = {"session": "s", "host": "h", "variant": "default", "foreign_cpu": [0.02], "invalid": [],
            "metrics": {"decode|decode_tok_s": {"median": 500.0, "n": 20, "se_log": 0.01, "cv": 0.05}},
            "canary": {"scores": {"python_mops": 22.0}}}
    busy = {**line, "foreign_cpu": [0.4]}
    invalid = {**line, "invalid": ["decode: host busy"]}
    other = {**line, "variant": "tcmalloc"}
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (line, busy, invalid, other, {"canary_end": {}})) + "\n")
    boots = load_corpus([path], variant="default", max_foreign_cpu=0.1)
    assert len(boots) == 1 and boots[0].canary == {"python_mops": 22.0}
    assert boots[0].metrics["decode|decode_tok_s"].median == 500.0
    assert len(load_corpus([path], variant="default", max_foreign_cpu=0.5)) == 2
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="c.jsonl:1"):
        load_corpus([path])


def test_the_planner_answers_in_sessions_when_the_session_level_stands_in_the_way() -> None:
    from pytest_kimiperf.judge.noise import plan

    current = [boot(97, "now"), boot(97.2, "now")]
    history = [boot(100 + 0.1 * (i % 2), "then") for i in range(10)]
    wide = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                spreads=Spreads(0.005, 0.04, 0.02))
    line = note_text(plan(wide))
    assert "no number of boots in this run is enough (session spread 4% (declared 4%)" in line
    assert "it takes about" in line and "sessions of this profile" in line
    narrow = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                  spreads=Spreads(0.005, 0.002, 0.02))
    assert "boots of this profile against the baseline's 10" in note_text(plan(narrow))


def test_the_gpu_power_limit_probe_reads_nvidia_smi_as_recorded() -> None:
    from pytest_kimiperf.measure.canary import parse_power_limits
    from tests.helpers import ROOT

    recorded = (ROOT / "tests/data/gpu/query_gpu_rtx2080_noheader_nounits.csv").read_text()
    assert parse_power_limits(recorded) == 200.0
    assert parse_power_limits("600.00\n450.00\n") == 450.0
    assert parse_power_limits("[N/A]\n") is None


def test_the_planner_command_answers_in_sessions_across_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_kimiperf.__main__ import boots_answer as answer

    out, status = answer(["--change", "6%", "--spread", "1%", "--tolerance", "3%", "--reference-boots", "10",
                          "--session-spread", "2%"])
    assert status == 1
    assert "no number of boots in one session will do" in out and "about 10 sessions of each side" in out
    out, status = answer(["--change", "6%", "--spread", "1%", "--tolerance", "3%", "--reference-boots", "10",
                          "--session-spread", "0.5%", "--reference-sessions", "5"])
    assert status == 0
    assert "you need 2 boots" in out
    with pytest.raises(SystemExit):
        answer(["--change", "6%", "--spread", "1%", "--session-spread", "1%", "--reference-sessions", "0"])
    assert "--reference-sessions 0: use a count of at least 1" in capsys.readouterr().err


def test_the_planner_says_when_no_number_of_sessions_helps() -> None:
    from pytest_kimiperf.judge.noise import plan

    current = [boot(97, "now"), boot(97.2, "now")]
    history = [boot(100 + 0.1 * (i % 2), "then") for i in range(10)]
    hopeless = compare_with_history(current, history, direction=Direction.HIGHER_IS_BETTER, tolerance=0.03,
                                    spreads=Spreads(0.005, 0.5, 0.02))
    assert note_text(plan(hopeless)).endswith(
        "neither boots in this run nor up to 100 sessions of this profile are enough "
        "(session spread 50% (declared 50%)): it takes a wider tolerance")
