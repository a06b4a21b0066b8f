"""User deployment tables: what a table without ``extends`` starts from, and what it inherits with one."""

from __future__ import annotations

from pytest_kimiperf.config.deployment_tables import resolve_deployments
from pytest_kimiperf.config.deployments import TINY_CPU
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
