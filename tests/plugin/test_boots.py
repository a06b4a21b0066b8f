"""The boot schedule: interleaved A B B A, boots on demand only when asked, slots stripped from ids."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.helpers import counted_boots, stub_deployment_toml
from pytest_kimiperf.judge.stats import BootLedger, BootSlot, schedule, strip_slot
from pytest_kimiperf.judge.stats import BootSummary

A, B, C = (SimpleNamespace(name=n) for n in ("default", "ring-ll", "tree-ll"))


def test_interleaved_rounds_reverse_so_a_drift_falls_on_every_profile_alike() -> None:
    ids = [slot.id for slot in schedule([A, B], 3)]
    assert ids == ["default", "ring-ll", "ring-ll-boot2", "default-boot2", "default-boot3", "ring-ll-boot3"]
    three = [slot.id for slot in schedule([A, B, C], 2)]
    assert three == ["default", "ring-ll", "tree-ll", "tree-ll-boot2", "ring-ll-boot2", "default-boot2"]


def test_random_order_shuffles_each_round_the_same_way_for_the_same_seed() -> None:
    first = [slot.id for slot in schedule([A, B, C], 4, order="random", seed=7)]
    assert first == [slot.id for slot in schedule([A, B, C], 4, order="random", seed=7)]
    rounds = [first[i:i + 3] for i in range(0, 12, 3)]
    assert all(sorted(s.split("-boot")[0] for s in r) == ["default", "ring-ll", "tree-ll"] for r in rounds)
    assert first != [slot.id for slot in schedule([A, B, C], 4, order="random", seed=8)]


@pytest.mark.parametrize("nodeid, slot, expected", [
    ("t.py::test_x[default]", "default", "t.py::test_x"),
    ("t.py::test_x[ring-ll-boot2]", "ring-ll-boot2", "t.py::test_x"),
    ("t.py::test_out[ring-ll-boot2-8]", "ring-ll-boot2", "t.py::test_out[8]"),
    ("t.py::test_out[8-ring-ll]", "ring-ll", "t.py::test_out[8]"),
])
def test_the_slot_is_stripped_from_the_node_id_and_other_parameters_kept(nodeid: str, slot: str,
                                                                          expected: str) -> None:
    assert strip_slot(nodeid, slot) == expected


def test_a_boot_on_demand_runs_only_when_the_tests_last_boot_asked_for_it() -> None:
    ledger = BootLedger()
    summary = {"decode_tok_s": BootSummary(median=100.0, n=20, se_log=0.01)}
    ledger.of("t.py::test", "default").add(1, summary)
    assert ledger.needed("t.py::test", BootSlot(A, 1), planned=1)[0]
    needed, why = ledger.needed("t.py::test", BootSlot(A, 2), planned=1)
    assert not needed and why == "boot 2 of default not needed: boot 1 settled this test"
    ledger.of("t.py::test", "default").wants_boot = 2
    assert ledger.needed("t.py::test", BootSlot(A, 2), planned=1)[0]
    assert not ledger.needed("t.py::test", BootSlot(A, 3), planned=1)[0]
    assert ledger.needed("t.py::other", BootSlot(A, 2), planned=2)[0]  # planned boots always run


def test_a_boot_measured_again_replaces_its_summary_instead_of_counting_twice() -> None:
    record = BootLedger().of("t.py::test", "default")
    record.add(1, {"m": BootSummary(median=1.0, n=5, se_log=0.1)})
    record.add(1, {"m": BootSummary(median=2.0, n=5, se_log=0.1)})
    assert record.boots == [1] and [b.median for b in record.summaries["m"]] == [2.0]


def test_the_kimiperf_boot_fixture_says_which_boot_of_the_profile_the_server_is(
        pytester: pytest.Pytester, stub_project) -> None:
    stub_project(stub_deployment_toml())
    pytester.makepyfile(test_boot="""
def test_boot(kimiperf_server, kimiperf_boot, kimiperf_profile):
    print("BOOT", kimiperf_profile.name, kimiperf_boot)
""")
    result = pytester.runpytest_subprocess("--deployment", "stub", "--kimiperf-boots", "2", "-s",
                                           "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*BOOT default 1*", "*BOOT default 2*"])


BOOTS_ON_DEMAND = """
import pytest
from pytest_kimiperf.measure.workload import SingleStream

@pytest.fixture(scope="module")
def module_state():
    yield
    print("TEARDOWN test_perf module")

def test_decode(perf, module_state):
    perf.check(perf.measure(SingleStream(prompt_tokens=8, output_tokens=8, requests=3, warmup_requests=0)),
               ["decode_tok_s"])
"""


def test_boots_nobody_asked_for_leave_nothing_set_up_and_the_counts_still_add_up(
        pytester: pytest.Pytester, stub_project) -> None:
    # Boots 2 and 3 of default are on demand and not needed: they do not run. The module of the
    # last test that did run must still be torn down before a test of another module runs.
    stub_project(stub_deployment_toml(), ini='kimiperf_deployment = "stub"')
    pytester.makepyfile(test_perf=BOOTS_ON_DEMAND,
                        test_zz_plain="def test_plain():\n    print('RUN test_plain')\n")
    result = pytester.runpytest_subprocess("--kimiperf-max-boots", "3", "-p", "no:randomly", "-s", timeout=120)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*TEARDOWN test_perf module*", "*RUN test_plain*"])
    # "collected 4 items" then "2 passed": the header says what the other two are, the end how
    # many of them ran (issue 60).
    result.stdout.fnmatch_lines(["collected 4 items",
                                 "kimiperf: 2 of these 4 items are boots on demand (boots 2-3 of each perf test and "
                                 "profile): each runs only when an earlier boot of its test asks for it*"])
    result.stdout.fnmatch_lines(["kimiperf: 2 boots on demand not needed: collected, neither run nor counted below",
                                 "*= 2 passed*"])


PROFILES_ON_DEMAND = """
import pytest
from pytest_kimiperf.measure.workload import SingleStream

@pytest.mark.kimiperf(tolerances={{"decode_tok_s": {tolerance}}})
def test_decode(perf):
    perf.check(perf.measure(SingleStream(prompt_tokens=8, output_tokens=8, requests=10, warmup_requests=0)),
               ["decode_tok_s"])
"""


@pytest.mark.parametrize("tolerance, boots_run", [(0.001, 3), (0.9, 2)])
def test_a_profile_comparison_books_boots_until_it_decides_or_reaches_the_cap(
        pytester: pytest.Pytester, stub_project, tolerance: float, boots_run: int) -> None:
    # Two profiles of the same stub, 2 boots planned, at most 3 (judge/profiles.py). A 0.1%
    # tolerance can never be shown at a 1% declared boot spread: the comparison stays undecided
    # and books the third boot of each. A 90% tolerance is shown "within" at the first look.
    stub_project(stub_deployment_toml(boot_spread=0.01), ini='kimiperf_deployment = "stub"')
    pytester.makepyfile(test_perf=PROFILES_ON_DEMAND.format(tolerance=tolerance))
    result = pytester.runpytest_subprocess("--nccl-profile", "default,ring-ll", "--kimiperf-max-boots", "3",
                                           "--kimiperf-json", "judged.json", "-p", "no:randomly",
                                           "-p", "no:cacheprovider", "-v", timeout=300)
    result.assert_outcomes(passed=2 * boots_run)
    ran = [line for line in result.outlines if "::test_decode[" in line and "PASSED" in line]
    assert sum("-boot3]" in line for line in ran) == (2 if boots_run == 3 else 0), ran
    report = json.loads((pytester.path / "judged.json").read_text())
    *_, c = (r for r in report["profile_comparisons"] if r["profile"] == "ring-ll" and r.get("verdict") is not None)
    # The last look rests on every boot that ran, those whose runs measured enough decode figures
    # (10 requests a boot: a loaded host would have to spoil 8 of a boot's for it to fall short).
    assert (c["boots_current"], c["boots_reference"]) == (counted_boots(report, "ring-ll"),
                                                          counted_boots(report, "default"))
    if boots_run == 3:  # at the cap, undecided: the answer says what more boots would do
        # Which undecided word depends on whether the stub's two profiles measured within 0.1% of
        # each other, a figure of the host's timer wake-ups, not of the plugin: either one must say
        # what more boots would do, and neither is a direction.
        assert c["verdict"] in ("no detectable change", "inconclusive"), c
        said = (("no number of boots up to 8 a side would show it within the tolerance",)
                if c["verdict"] == "no detectable change" else
                ("a side would decide a change this size", "a side decides a change this size",
                 "the boots' own spread is what holds it back"))
        assert any(words in c["note"] for words in said), c
    else:
        assert c["verdict"] == "within tolerance"
