"""A run says when its boots show spreads beyond the declared ones (judge/noise.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_kimiperf.config.deployments import Spreads
from pytest_kimiperf.config.metric_specs import Direction
from pytest_kimiperf.judge.stats import BootSummary
from pytest_kimiperf.judge.history import compare_with_history
from pytest_kimiperf.judge.notes import SpreadSeen
from pytest_kimiperf.judge.profiles import InSessionRules, SpawnModes, compare_in_session
from pytest_kimiperf.judge.noise import SpreadBeyond, SpreadsMisdeclared, beyond_p, misdeclared
from pytest_kimiperf.judge.stats import Comparison
from pytest_kimiperf.reports.sentences import note_text

HIGHER = Direction.HIGHER_IS_BETTER
KIMI = InSessionRules(boot_spread=0.01, boot_spread_df=3.0)


def boots(*figures: float, session: str = "now", host: str = "h") -> list[BootSummary]:
    return [BootSummary(median=f, n=20, se_log=0.003, session=session, host=host) for f in figures]


def test_a_profile_comparison_carries_what_its_sides_measure_of_the_boot_level() -> None:
    c = compare_in_session(boots(100.0, 102.0, 101.0), boots(99.0, 100.0), direction=HIGHER, tolerance=0.03,
                           rules=KIMI)
    (seen,) = c.spreads_seen
    logs = [[math.log(x) for x in side] for side in ((100.0, 102.0, 101.0), (99.0, 100.0))]
    sum_sq = sum(sum((x - sum(side) / len(side)) ** 2 for x in side) for side in logs)
    assert (seen.level, seen.df, seen.units, seen.declared) == ("boot", 3, 5, 0.01)
    assert seen.sum_sq == pytest.approx(sum_sq)
    # The declaration allows its spread and the boots' own error of the median on top.
    assert seen.allowed_var == pytest.approx(math.log1p(0.01) ** 2 + 0.003 ** 2)
    assert Comparison.from_dict(c.to_dict()).spreads_seen == c.spreads_seen
    # One boot a side measures nothing; declared spawn modes are part of the sides' spread.
    assert compare_in_session(boots(100.0), boots(99.0), direction=HIGHER, tolerance=0.03, rules=KIMI).spreads_seen == ()
    modes = InSessionRules(boot_spread=0.01, modes=SpawnModes(0.5, 0.1))
    assert compare_in_session(boots(100.0, 50.0), boots(99.0, 98.0), direction=HIGHER, tolerance=0.03,
                              rules=modes).spreads_seen == ()


def test_the_gate_carries_the_boots_within_their_sessions_and_the_historys_sessions() -> None:
    history = [b for s, level in enumerate((100.0, 103.0, 97.0, 101.0, 99.0))
               for b in boots(level, level * 1.002, session=f"s{s}")]
    c = compare_with_history(boots(100.0, 100.5), history, direction=HIGHER, tolerance=0.03,
                             spreads=Spreads(0.01, 0.01, 0.02))
    by_level = {seen.level: seen for seen in c.spreads_seen}
    assert set(by_level) == {"boot", "session"}
    assert (by_level["boot"].df, by_level["boot"].units) == (6, 12)  # 5 history sessions and this one, 2 boots each
    assert (by_level["session"].df, by_level["session"].units) == (4, 5)
    assert by_level["session"].measured == pytest.approx(0.024, abs=0.003)  # the session means' spread, less the boots'


def seen(level: str, spread: float, df: int, declared: float = 0.01) -> SpreadSeen:
    """A check whose units measured ``spread`` exactly on ``df`` degrees of freedom."""
    return SpreadSeen(level, math.log1p(spread) ** 2 * df, df, math.log1p(declared) ** 2, declared, df + 1)


def judged(*checks: SpreadSeen) -> Comparison:
    c = compare_in_session(boots(100.0), boots(100.0), direction=HIGHER, tolerance=0.03, rules=KIMI)
    return Comparison.from_dict({**c.to_dict(), "spreads_seen": [s.to_dict() for s in checks]})


def test_a_spread_beyond_the_declared_at_the_runs_level_is_said_with_the_declaration_to_change() -> None:
    wide = [("decode tok/s of single_stream_decode [default]", judged(seen("boot", 0.03, 10))),
            ("ITL ms of single_stream_decode [default]", judged(seen("boot", 0.025, 10))),
            ("decode tok/s of single_stream_decode [ring-ll]", judged(seen("session", 0.022, 9))),
            ("TTFT ms of single_stream_decode [default]", judged(seen("boot", 0.011, 10)))]
    note = misdeclared(wide, deployment="kimi-k25-int4-tp8")
    assert note is not None and note.checks == 4 and note.alpha == 0.01
    boot, session = note.beyond
    assert (boot.level, boot.where, boot.flagged, boot.checked) == (
        "boot", "decode tok/s of single_stream_decode [default]", 2, 3)
    assert boot.measured == pytest.approx(0.03) and session.measured == pytest.approx(0.022)
    assert note_text(note) == (
        "spreads wider than declared, at the run's level (1% over 4 checks): boot spread 3% where 1% is declared, "
        "the widest of 2 of 3 boot checks beyond it (decode tok/s of single_stream_decode [default]: 11 boots, 10 df; "
        f"chance {boot.p:.1g} at the declared); session spread 2.2% where 1% is declared, the widest of 1 of 1 session "
        "checks beyond it (decode tok/s of single_stream_decode [ring-ll]: 10 sessions, 9 df; chance "
        f"{session.p:.1g} at the declared): declare boot_spread = 0.03 and session_spread = 0.022 in deployment "
        "'kimi-k25-int4-tp8', or find what spreads the boots (the judge already used the larger)")
    # Without a deployment (kimiperf compare's rules), the command line's flag.
    assert note_text(SpreadsMisdeclared((SpreadBeyond("boot", 0.03, 0.01, 10, 11, "x", 1e-9),), 1, 0.01)).endswith(
        ": pass --boot-spread 0.03, or find what spreads the boots (the judge already used the larger)")


def test_the_runs_level_is_split_over_its_checks() -> None:
    # 1.6x the declared spread on 10 df: beyond it at 1% for one check, not among 100.
    one = seen("boot", 0.016, 10)
    assert beyond_p(one) < 0.01
    assert misdeclared([("a", judged(one))]) is not None
    assert misdeclared([("a", judged(one)), *((f"q{i}", judged(seen("boot", 0.01, 10))) for i in range(99))]) is None
    # Spreads as declared or narrower say nothing; a comparison that measured nothing is no check.
    assert misdeclared([("a", judged(seen("boot", 0.009, 4))), ("b", judged())]) is None
    assert misdeclared([]) is None


def test_at_the_declared_spreads_the_line_is_rare_and_at_five_times_them_it_is_said() -> None:
    # Simulated sessions of 10 metrics, 3 boots a profile, the boots' spread as declared (1%) or
    # five times it: the line is a claim on the run's budget, like a sign.
    rng = np.random.default_rng(59)

    def said(truth: float) -> int:
        hits = 0
        for _ in range(60):
            rows = []
            for m in range(10):
                figures = 100.0 * np.exp(rng.normal(0.0, math.log1p(truth), (2, 3)))
                rows.append((f"m{m}", compare_in_session(boots(*figures[0]), boots(*figures[1]), direction=HIGHER,
                                                         tolerance=0.03, rules=KIMI)))
            hits += misdeclared(rows) is not None
        return hits

    assert said(0.01) <= 2 and said(0.05) >= 57
