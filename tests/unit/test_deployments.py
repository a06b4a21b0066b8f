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
        "kimiperf: declared for tiny-cpu: boot spread 18% (15 df), session 20%, host 15%; spawn modes 50% "
        "slower in 10% of boots; decode floor / target 7 / 20 tok/s per Mops of this host's canary; from the "
        "noise corpus (benchmarks/data/noise): 26 quiet boots, 6 sessions, 3 hosts (canary 14-28 Mops, decode "
        "431-1285 tok/s per boot)")
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
