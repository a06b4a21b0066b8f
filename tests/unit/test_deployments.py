"""User deployment tables: what a table without ``extends`` starts from, and what it inherits with one."""

from __future__ import annotations

from pytest_kimiperf.config.deployment_tables import resolve_deployments
from pytest_kimiperf.config.deployments import TINY_CPU, TINY_CPU_TP2
from pytest_kimiperf.reports.header import declarations_line
from pytest_kimiperf.config.metric_specs import METRICS

COMMAND = ["vllm", "serve", "{model}", "--port", "{port}"]


def test_a_table_without_extends_inherits_nothing_of_another_deployment() -> None:
    mine = resolve_deployments({"my-llama": {"model": "/models/llama", "command": COMMAND}},
                               source="pyproject.toml")["my-llama"]
    assert dict(mine.env) == {}  # not tiny-cpu's HF_HUB_OFFLINE / VLLM_CPU_KVCACHE_SPACE
    assert dict(mine.client_bounds) == {}
    assert all(mine.tolerance(m) == spec.default_tolerance for m, spec in METRICS.items())
    assert (mine.decode_floor_tok_s, mine.decode_target_tok_s) == (0.0, 0.0)
    assert mine.health_deadline_s == 3600.0
    assert mine.served_model_name == "llama"
    assert mine.description.startswith("user deployment from pyproject.toml")


def test_a_table_with_extends_inherits_its_parent_and_merges_env() -> None:
    mine = resolve_deployments({"cpu-more-kv": {"extends": "tiny-cpu", "env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}},
                               source="pyproject.toml")["cpu-more-kv"]
    assert dict(mine.env) == {**TINY_CPU.env, "VLLM_CPU_KVCACHE_SPACE": "4"}
    assert mine.tolerances == TINY_CPU.tolerances and mine.client_bounds == TINY_CPU.client_bounds


def test_tiny_cpus_floor_and_target_follow_the_hosts_canary() -> None:
    # Hosts of the family decode 146-1285 tok/s: a floor of one host judges another.
    assert TINY_CPU.decode_floor_and_target({"python_mops": 14.2}) == (99.4, 284.0)
    assert TINY_CPU.decode_floor_and_target({"python_mops": 5.0}) == (35.0, 100.0)
    # No canary (an attached server): the absolute figures.
    assert TINY_CPU.decode_floor_and_target(None) == (100.0, 300.0)
    assert TINY_CPU_TP2.decode_floor_and_target({"python_mops": 14.2}) == (100.0, 300.0)


def test_the_header_says_what_the_verdicts_rest_on_and_where_it_was_declared() -> None:
    assert declarations_line(TINY_CPU) == (
        "kimiperf: declared for tiny-cpu: boot spread 18%, p99 inter-token latency 33% (15 df), session 20% (10 df), host 15% (10 df); spawn modes 50% "
        "slower in 10% of boots; decode floor / target 7 / 20 tok/s per Mops of this host's canary; from the "
        "noise corpus (benchmarks/data/noise): 62 quiet boots, 12 sessions, 9 hosts (canary 10.7-28 Mops, decode "
        "241-1285 tok/s per boot)")
    mine = resolve_deployments({"mine": {"model": "/m", "command": COMMAND, "decode_floor_tok_s": 40,
                                         "decode_target_tok_s": 50}}, source="pyproject.toml")["mine"]
    assert declarations_line(mine).endswith("no spawn modes; decode floor / target 40 / 50 tok/s; as pyproject.toml "
                                            "[deployments.mine] declares them (the defaults where it is silent)")


def test_a_floor_alone_sets_the_target_too() -> None:
    # The target warns below it and the floor fails below it: a table that gives only the floor
    # means "fail below 40", not "a target of 0 below the floor" (a usage error before).
    mine = resolve_deployments({"mine": {"model": "/m", "command": COMMAND, "decode_floor_tok_s": 40}},
                               source="pyproject.toml")["mine"]
    assert (mine.decode_floor_tok_s, mine.decode_target_tok_s) == (40.0, 40.0)
    # Extending a deployment whose target is above the new floor keeps that target.
    kimi = resolve_deployments({"k": {"extends": "kimi-k25-int4-tp8", "decode_floor_tok_s": 45}},
                               source="pyproject.toml")["k"]
    assert (kimi.decode_floor_tok_s, kimi.decode_target_tok_s) == (45.0, 50.0)


def test_gpu_count_follows_the_parallel_layout_unless_given() -> None:
    # Left out, gpu_count once defaulted to 0: the hardware check and the NVML watch were off.
    tables = {
        "tp4": {"model": "/m", "command": [*COMMAND, "-tp", "{tp}"], "tensor_parallel_size": 4},
        "tp2-pp2": {"model": "/m", "command": [*COMMAND, "--tensor-parallel-size=2", "--pipeline-parallel-size", "2"]},
        "dp2": {"model": "/m", "command": [*COMMAND, "--data-parallel-size", "2"], "tensor_parallel_size": 2},
        "cpu": {"model": "/m", "command": COMMAND, "gpu_count": 0},
        "kimi-tp4": {"extends": "kimi-k25-int4-tp8", "tensor_parallel_size": 4},
        "tiny-more": {"extends": "tiny-cpu", "tensor_parallel_size": 2},
        "plain": {"model": "/m", "command": COMMAND},
    }
    found = resolve_deployments(tables, source="pyproject.toml")
    assert {name: found[name].gpu_count for name in tables} == {
        "tp4": 4, "tp2-pp2": 4, "dp2": 4, "cpu": 0, "kimi-tp4": 4, "tiny-more": 0, "plain": 1}


def test_a_parallel_size_that_is_no_integer_is_a_usage_error() -> None:
    import pytest
    from pytest_kimiperf.errors import ConfigError

    with pytest.raises(ConfigError, match=r"\[deployments.bad\]: --pipeline-parallel-size 'two' is not an integer"):
        resolve_deployments({"bad": {"model": "/m", "command": [*COMMAND, "-pp", "two"]}}, source="pyproject.toml")


def _boots(*origins: tuple[str, str]) -> list[object]:
    from pytest_kimiperf.judge.baselines import BaselineBoot
    from pytest_kimiperf.judge.noise import BootOrigin

    return [BaselineBoot(median=100.0, n=20, se_log=0.01, recorded_at="2026-12-01T00:00:00Z", git_commit=None,
                         versions={}, origin=BootOrigin(session=session, host=host)) for host, session in origins]


def test_the_header_says_which_spreads_are_declared_and_which_the_history_measured() -> None:
    from pytest_kimiperf.judge.baselines import HistorySpan
    from pytest_kimiperf.reports.header import spreads_line

    mine = resolve_deployments({"mine": {"model": "/m", "command": COMMAND}}, source="pyproject.toml")["mine"]
    assert spreads_line(mine, None) == (
        "kimiperf: spreads in force: boot 1% declared; session 1% declared (the history spans 0 sessions; "
        "measured from 3); host 2% declared (the history spans 0 hosts; measured from 3) (a declared spread is a "
        "floor: declare a smaller one where the history measures less)")
    four = HistorySpan.of(_boots(("h1", "s1"), ("h1", "s2"), ("h1", "s3"), ("h2", "s4"), ("h2", "s4")))  # type: ignore[arg-type]
    assert (four.boots, four.sessions, four.hosts) == (5, 4, 2)
    assert spreads_line(mine, four) == (
        "kimiperf: spreads in force: boot 1% declared, or what the boots measure where larger (5 recorded); "
        "session: the larger of 1% declared and what 4 sessions measure; "
        "host 2% declared (the history spans 2 hosts; measured from 3) (a declared spread is a floor: declare a "
        "smaller one where the history measures less)")
    many = HistorySpan(boots=120, sessions=60, hosts=1)
    assert "session: the larger of 1% declared and what 60 sessions measure" in spreads_line(mine, many)


def test_a_history_of_one_session_warns_that_the_session_spread_is_a_guess() -> None:
    from pytest_kimiperf.judge.baselines import HistorySpan
    from pytest_kimiperf.reports.header import one_session_warning

    mine = resolve_deployments({"mine": {"model": "/m", "command": COMMAND}}, source="pyproject.toml")["mine"]
    one = HistorySpan.of(_boots(("h1", "s1"), ("h1", "s1"), ("h1", "s1")))  # type: ignore[arg-type]
    assert one_session_warning(mine, one) == (
        "the baseline history of mine spans one session (3 boots): the session spread in force (1%) is declared, "
        "not measured, and every later session is judged on that guess; record in 2 more sessions (another day or "
        "runner: --kimiperf-update-baselines appends to the history) to measure it")
    assert one_session_warning(mine, HistorySpan.of(_boots(("h1", "s1"), ("h1", "s2")))) is None  # type: ignore[arg-type]
    assert one_session_warning(mine, None) is None  # no history: the missing baseline says so


def test_a_metric_declares_its_own_boot_spread_and_every_other_keeps_the_deployments() -> None:
    mine = resolve_deployments({"mine": {"extends": "tiny-cpu", "boot_spreads": {"ttft_ms": 0.4}}},
                               source="pyproject.toml")["mine"]
    # Merged over the parent's, as tolerances are.
    assert dict(mine.boot_spreads) == {"p99_itl_ms": 0.33, "ttft_ms": 0.4}
    spreads = mine.spreads
    assert spreads.of("ttft_ms").boot == 0.4 and spreads.of("p99_itl_ms").boot == 0.33
    assert spreads.of("decode_tok_s") == spreads and spreads.of("ttft_ms").session == spreads.session


def test_a_bad_boot_spreads_table_is_a_usage_error_naming_the_value() -> None:
    import pytest
    from pytest_kimiperf.errors import ConfigError

    for value, said in (({"p99_itl": 0.3}, r"boot_spreads names unknown metric 'p99_itl'; known: .*p99_itl_ms"),
                        ({"ttft_ms": 1.5}, r"boot_spreads.ttft_ms = 1.5; must be a fraction between 0 and 1"),
                        ({"ttft_ms": True}, r"boot_spreads.ttft_ms = True; must be a fraction"),
                        (0.3, r"boot_spreads = 0.3 has the wrong type; expected a table")):
        with pytest.raises(ConfigError, match=r"\[deployments.bad\]: " + said):
            resolve_deployments({"bad": {"extends": "tiny-cpu", "boot_spreads": value}}, source="pyproject.toml")
