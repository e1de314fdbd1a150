#!/bin/bash
# The MoE checkpoint served side by side: this runtime vs vLLM CPU vs llama.cpp, one run (issue 21's benchmark).
# The checkpoint is built here (benchmark/make_moe_checkpoint.py: random-weight Qwen3-MoE, hidden 1024, 12 layers,
# 64 experts, top 8, expert intermediate 256) and converted to GGUF with llama.cpp's own converter
# (convert_hf_to_gguf.py from the llama-cpp-python sdist that ../shared/tools/peers-setup.sh unpacks).
# Each server is started, warmed up twice at the measured shape, then measured: c=32 throughput (32 prompts x 64
# tokens, 3 runs), streaming chat at c=32 on fresh 100-word prompts (64 requests, 2 runs, with inter-token latency),
# batch-1 decode (128 tokens, 2 runs), ready time, RSS of its process group.
# Run from the project checkout with the project installed in the active Python environment:
#   bash benchmark/bench_moe_side_by_side.sh [ours-bf16] [ours-q8] [vllm] [llama-bf16] [llama-q8]   (default: all)
set -u
here=$(dirname "$(readlink -f "$0")")
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/peers}
MOE=${MOE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglang-bench/moe-qwen3}
PY=$(command -v python3)
LG="$PY ${SHARED_TOOLS:-$here/../../shared/tools}/loadgen.py"  # the checkout sits beside ../shared
CONVERT=$PEERS/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp

[[ -f $MOE/config.json ]] || $PY "$here/make_moe_checkpoint.py" "$MOE" || exit 1
for q in bf16 q8_0; do
  if [[ ! -f $MOE-$q.gguf && -x $PEERS/vllm/bin/python && -f $CONVERT/convert_hf_to_gguf.py ]]; then
    PYTHONPATH=$CONVERT/gguf-py $PEERS/vllm/bin/python "$CONVERT/convert_hf_to_gguf.py" "$MOE" --outtype $q \
      --outfile "$MOE-$q.gguf" >/tmp/moe-convert-$q.log 2>&1 || { echo "convert $q failed: $(tail -1 /tmp/moe-convert-$q.log)"; }
  fi
done

rss_group() { ps -o rss= -g "$1" 2>/dev/null | awk '{s+=$1} END {printf "%.0f", s/1024}'; }
tp() { grep -o 'throughput=[0-9.]*' | cut -d= -f2; }
run_one() {  # name port cmd...
  local name=$1 port=$2; shift 2
  setsid "$@" >/tmp/moe-perf-$name.log 2>&1 & local pid=$!
  local t0=$(date +%s.%N)
  until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
    sleep 0.5; kill -0 $pid 2>/dev/null || { echo "$name exited: $(tail -1 /tmp/moe-perf-$name.log)"; return 1; }
  done
  local ready=$($PY -c "import time;print(f'{time.time()-$t0:.1f}')")
  local u=http://127.0.0.1:$port X='{"ignore_eos": true}'
  for w in 1 2; do $LG --url $u -n 32 -c 32 --max-tokens 64 --extra "$X" >/dev/null; done
  $LG --url $u -n 2 -c 1 --max-tokens 32 --extra "$X" >/dev/null
  local t="" b="" ch="" itl=""
  for r in 1 2 3; do t="$t $($LG --url $u -n 32 -c 32 --max-tokens 64 --extra "$X" | tp)"; done
  for r in 1 2; do b="$b $($LG --url $u -n 2 -c 1 --max-tokens 128 --extra "$X" | tp)"; done
  for r in 1 2; do
    local out=$($LG --url $u -n 64 -c 32 --max-tokens 64 --stream --chat --random-words 100 --extra "$X")
    ch="$ch $(echo "$out" | tp)"; itl="$itl $(echo "$out" | grep -o 'itl_p50=[0-9.]*' | cut -d= -f2)"
  done
  echo "$name ready=${ready}s c32_tok/s=[${t# }] c32_chat_stream_tok/s=[${ch# }] chat_itl_p50_ms=[${itl# }] bs1_tok/s=[${b# }] rss=$(rss_group $pid)MiB"
  kill -TERM -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null; sleep 1
}
LLAMA=$PEERS/llama/build/bin/llama-server
for x in ${@:-ours-bf16 ours-q8 vllm llama-bf16 llama-q8}; do case $x in
  ours-bf16) run_one $x 31941 sglang serve --model-path "$MOE" --dtype bfloat16 --host 127.0.0.1 --port 31941 ;;
  ours-q8) run_one $x 31942 sglang serve --model-path "$MOE-q8_0.gguf" --tokenizer-path "$MOE" --host 127.0.0.1 --port 31942 ;;
  vllm) [[ -x $PEERS/vllm/bin/python ]] || { echo "vllm: run peers-setup.sh first"; continue; }
        VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CACHE_ROOT=$PEERS/cache TORCHINDUCTOR_CACHE_DIR=$PEERS/cache/inductor \
        run_one vllm 31943 $PEERS/vllm/bin/python -m vllm.entrypoints.openai.api_server --model "$MOE" \
        --served-model-name moe --dtype bfloat16 --max-model-len 2048 --max-num-seqs 32 --host 127.0.0.1 --port 31943 ;;
  llama-bf16|llama-q8) [[ -x $LLAMA ]] || { echo "llama: run peers-setup.sh first"; continue; }
        q=bf16; [[ $x == llama-q8 ]] && q=q8_0
        LD_LIBRARY_PATH=$(dirname $LLAMA) run_one $x 31944 $LLAMA -m "$MOE-$q.gguf" --alias moe --host 127.0.0.1 \
        --port 31944 -t 2 -np 32 -c 16384 ;;
  *) echo "unknown system $x (ours-bf16, ours-q8, vllm, llama-bf16, llama-q8)";;
esac; done
