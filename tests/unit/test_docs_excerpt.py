"""The docs show what `make perf` prints: the excerpt in docs/quickstart.md has the summary's
current format, and the format check follows the renderer (a change to the first screen fails
here until the excerpt is taken again with scripts/docs_excerpt.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pytest_kimiperf.reports.terminal import render_summary
from tests.unit.test_reports import DECODE_TEST, make_report, measured

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_excerpt", ROOT / "scripts" / "docs_excerpt.py")
assert _spec is not None and _spec.loader is not None
docs_excerpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_excerpt)


def terminal_of(lines: list) -> str:
    """The summary as pytest's terminal writes it: separators padded to 80 columns."""
    out = ["============================= test session starts ==============================", "...",
           "=============================== warnings summary ==============================="]
    for line in lines:
        if line.sep:
            side = max((80 - len(line.text) - 2) // 2, 1)
            out.append(f"{line.sep * side} {line.text} {line.sep * side}")
        else:
            out.append(line.text)
    return "\n".join(out + ["========================= 12 passed in 600.00s =========================="]) + "\n"


def test_the_current_first_screen_passes_the_format_check() -> None:
    results = [measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1),
               measured("ring-ll", decode=81.9, itl=12.2, ttft=44.0, seed=10),
               measured("ring-ll", decode=82.1, itl=12.2, ttft=44.3, seed=30, boot=2),
               measured("default", decode=81.2, itl=12.3, ttft=40.2, seed=20, boot=2)]
    screen = docs_excerpt.first_screen(terminal_of(render_summary(make_report(results), verbosity=0)))
    assert docs_excerpt.problems(screen) == [], screen
    assert screen[-1] != "" and "servers and files" not in " ".join(screen)
    assert any(DECODE_TEST.rpartition("::")[2].removeprefix("test_") in line for line in screen)


def test_the_old_layout_fails_the_format_check() -> None:
    old = ["= kimiperf: profiles vs default", "each boot's median (IQR of its samples);",
           "    profile         median  IQR          change  CI            verdict"]
    assert docs_excerpt.problems(old)


def test_the_excerpt_in_the_docs_has_the_current_format() -> None:
    page = (ROOT / "docs" / "quickstart.md").read_text(encoding="utf-8")
    assert docs_excerpt.problems(docs_excerpt.excerpt_in(page)) == []
    assert (ROOT / "docs" / "images" / "make-perf-throughput.png").is_file()


def test_a_terminal_without_the_answers_is_refused() -> None:
    with pytest.raises(ValueError, match="no 'kimiperf: answers' section"):
        docs_excerpt.first_screen("== 1 passed ==\n")


def _current_screen() -> list[str]:
    results = [measured("default", decode=81.4, itl=12.3, ttft=40.0, seed=1),
               measured("ring-ll", decode=81.9, itl=12.2, ttft=44.0, seed=10),
               measured("ring-ll", decode=82.1, itl=12.2, ttft=44.3, seed=30, boot=2),
               measured("default", decode=81.2, itl=12.3, ttft=40.2, seed=20, boot=2)]
    return docs_excerpt.first_screen(terminal_of(render_summary(make_report(results), verbosity=0)))


def test_an_excerpt_of_older_code_is_stale_though_its_format_is_current() -> None:
    # The excerpt is real output, but a level or verdict word the code no longer prints (68%
    # intervals from before the 5% TOST, issue 60) is older code: the check follows the code's
    # own levels and words (reports/answers.py), so a change to either fails here.
    screen = _current_screen()
    assert docs_excerpt.stale(screen) == []
    levels, words = docs_excerpt.printed()
    shown = next(line for line in screen if line.startswith("  ") and "%)" in line)
    level = shown.split("(")[-1].split(")")[0]
    assert level in levels
    old_level = [line.replace(f"({level})", "(68%)") if line == shown else line for line in screen]
    assert "68%" not in levels
    assert any("an interval at 68%, a level the summary no longer prints" in p for p in docs_excerpt.problems(old_level))
    verdict = next(w for w in words if shown.rstrip().endswith(w))
    old_word = [line.replace(verdict, "equivalent") if line == shown else line for line in screen]
    assert any("the verdict 'equivalent', which the summary no longer prints" in p
               for p in docs_excerpt.problems(old_word))
    # An answer wraps onto indented lines: it is read whole, its level and word checked too.
    start = next(i for i, line in enumerate(screen) if " vs " in line and "%)" in line)
    end = next(i for i, line in enumerate(screen[start + 1:], start + 1) if not line.startswith("    "))
    answer = screen[start:end]
    assert len(answer) > 1 and docs_excerpt.stale(answer) == []
    assert any("an interval at 68%" in p for p in docs_excerpt.stale([answer[0].replace(f"({level})", "(68%)"),
                                                                     *answer[1:]]))
