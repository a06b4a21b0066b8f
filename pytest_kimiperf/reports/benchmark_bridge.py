"""pytest-benchmark bridge: each measured scenario also lands in pytest-benchmark's results.

When pytest-benchmark is active, ``perf.measure`` runs the scenario through its ``benchmark``
fixture as ``benchmark.pedantic(target, rounds=1, iterations=1)``: one round, one call. The
round's time is therefore the scenario's wall time as ``perf.measure`` spends it (prompt
preparation through ``/tokenize``, warm-up requests and every measured round), not a per-request
figure; the LLM figures pytest-benchmark cannot time go into ``benchmark.extra_info`` under vLLM
``bench serve``'s names (vllm/benchmarks/serve.py): the median of each per-request metric of
the metric table (``median_ttft_ms``, ``median_decode_tok_s``, ...), each per-round one
(``output_throughput``, ...), ``completed`` and ``failed``, plus ``scenario``,
``profile`` and ``deployment``. ``--benchmark-json``, ``--benchmark-autosave`` and
``--benchmark-compare`` then carry them, and ``machine_info["kimiperf"]`` carries the hardware
fingerprint that decides which baselines compare.

**Its table leaves these rows out.** One round per test gives "StdDev 0.0000", "Outliers 0;0"
and the whole scenario's wall time as "time": a pytest-benchmark user reads that table as the
distribution of one operation, and it is none. It could not be made one honestly: a round per
request (or per closed-loop round) would hand pytest-benchmark the within-boot distribution, and
its table and ``--benchmark-compare-fail`` would judge that across runs request by request, the
test stats.py rejects (the boot, not the request, is the unit that varies: 20 requests of one
boot varied by 4% while five boots of the same server spread 18%). So :func:`without_scenario_rows`
drops them from the groups the table prints (``pytest_benchmark_group_stats``, after its JSON
and storage were written), and the summary says where they went.

Inactive means: pytest-benchmark not installed or ``-p no:benchmark``; an xdist worker (where
pytest-benchmark disables itself, since parallel timings are not trustworthy);
``--benchmark-disable``; and ``--benchmark-skip``, where asking for the fixture would skip the
perf test itself. Only the first ``perf.measure`` of a test goes through the fixture, which
pytest-benchmark allows to be used once per test. The regression gate never depends on any of
this: it judges the samples, with or without pytest-benchmark.

Nothing here imports pytest or pytest-benchmark; the plugin passes in what they provide.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

from pytest_kimiperf.config.metric_specs import SampleKind, metrics_of
from pytest_kimiperf.measure.results import RunResult
from pytest_kimiperf.numbers import json_safe

# The name pytest-benchmark's entry point registers its plugin under.
_BENCHMARK_PLUGIN = "benchmark"
# The extra_info key that marks a round as a kimiperf scenario (what the table leaves out).
_TIMED_KEY = "kimiperf_timed"
_TIMED = "one round: the scenario's wall time (prompt preparation, warm-up and measured rounds)"

T = TypeVar("T")


def _bench_serve_keys() -> tuple[str, ...]:
    """The figures extra_info carries, in bench serve's names: each per-request metric's median
    and each per-round throughput of the metric table (config/metric_specs.py)."""
    return (*(f"median_{name}" for name in metrics_of(SampleKind.REQUEST)), *metrics_of(SampleKind.ROUND))


def active_benchmark(config: Any, getfixturevalue: Callable[[str], Any], *, is_worker: bool) -> Any | None:
    """pytest-benchmark's ``benchmark`` fixture of the current test when it times anything, else None.

    ``config`` is pytest's config and ``getfixturevalue`` the test's ``request.getfixturevalue``.
    """
    if is_worker:
        return None  # pytest-benchmark disables itself on xdist workers
    if not config.pluginmanager.hasplugin(_BENCHMARK_PLUGIN):
        return None
    if config.getoption("benchmark_skip", False):
        # The fixture calls pytest.skip under --benchmark-skip: the perf test must still run.
        return None
    fixture = getfixturevalue("benchmark")
    return fixture if getattr(fixture, "enabled", False) else None


def run_timed(benchmark: Any, target: Callable[[], T]) -> T:
    """Call ``target`` once as pytest-benchmark's single timed round and return its result."""
    result: T = benchmark.pedantic(target, rounds=1, iterations=1, warmup_rounds=0)
    return result


def extra_info(run: RunResult, *, profile: str, deployment: str) -> dict[str, Any]:
    """The LLM figures of a RunResult for ``benchmark.extra_info`` (bench serve names, JSON-safe):
    the median of each per-request metric and each per-round one, from the metric table."""
    summary = run.summary()
    figures = summary.to_json()
    info: dict[str, Any] = {key: json_safe(figures.get(key)) for key in _bench_serve_keys()}
    info.update({
        "completed": summary.completed,
        "failed": summary.failed,
        "scenario": run.scenario_name,
        "valid": summary.valid,
        "invalid_reason": summary.invalid_reason or None,
        "profile": profile,
        "deployment": deployment,
        _TIMED_KEY: _TIMED,
    })
    return info


def without_scenario_rows(groups: list[tuple[Any, list[dict[str, Any]]]]) -> tuple[list[tuple[Any, list[dict[str, Any]]]], int]:
    """pytest-benchmark's table groups without the kimiperf scenarios' rows (their JSON and
    storage keep them), and how many rows were left out."""
    kept: list[tuple[Any, list[dict[str, Any]]]] = []
    hidden = 0
    for name, benches in groups:
        rows = [b for b in benches if _TIMED_KEY not in (b.get("extra_info") or {})]
        hidden += len(benches) - len(rows)
        if rows:
            kept.append((name, rows))
    return kept, hidden


def add_fingerprint(machine_info: MutableMapping[str, Any], fingerprint: Any) -> None:
    """Put the kimiperf fingerprint into pytest-benchmark's ``machine_info`` (when one was taken)."""
    if fingerprint is not None:
        machine_info["kimiperf"] = fingerprint.to_json()

