#!/bin/bash
# A ~1B random Qwen3-Next-shaped checkpoint served side by side on CPU (issue 43): this runtime (bf16 safetensors)
# and llama.cpp (arch qwen3next) on the same model converted by its own convert_hf_to_gguf.py (bf16, and q8_0 for
# llama-q8).
# The checkpoint is built once by benchmark/make_qwen3_next_checkpoint.py (hidden 1024, 16 layers: 12 Gated DeltaNet +
# 4 gated full attention, 64 routed experts of 256 top 8 + a 512-wide shared expert; 1.06 B parameters, 0.36 B active;
# SmolLM2's tokenizer) under ~/.cache/sglang-bench/. The converter (llama-cpp-python's vendored llama.cpp, unpacked by
# ../shared/tools/peers-setup.sh) runs in the vLLM venv with its own gguf-py on PYTHONPATH; it is given --no-mtp (the
# random checkpoint has no multi-token-prediction layer, and Qwen3-Next's converter otherwise asserts one) and warns
# 'Unknown RoPE type: default' (harmless: plain partial rope).
# Each server is started, warmed up twice at the measured shape, then measured: c=32 throughput (32 prompts x 64
# tokens, 3 runs), batch-1 decode (128 tokens, 2 runs), ready time (start to /v1/models answering), RSS of its
# process group. Ports are picked free at start (a fixed port may already answer for another process's server).
# QWEN3_NEXT_SIZE=tiny builds a 4-layer, hidden-256 model of the same shape instead and only checks the pipeline:
# each server starts and answers one completion (no timing).
# OURS_ARGS: extra `sglang serve` flags. Prefix caching is off for this model in this runtime (docs/linear_attention.md);
# llama.cpp keeps its own per-slot prompt cache, which loadgen's distinct prompts do not hit.
#   bash benchmark/bench_qwen3_next_side_by_side.sh [ours] [llama-bf16] [llama-q8]   (default: all three)
set -u
here=$(dirname "$(readlink -f "$0")")
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/peers}
SIZE=${QWEN3_NEXT_SIZE:-full}
QN=${QWEN3_NEXT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglang-bench/qwen3-next-$SIZE}
PY=$(command -v python3)
LG="$PY ${SHARED_TOOLS:-$here/../../shared/tools}/loadgen.py"  # the checkout sits beside ../shared
CONVERT=${LLAMA_CPP_SRC:-$PEERS/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp}
CONVERT_PY=${CONVERT_PY:-$PEERS/vllm/bin/python}
SYSTEMS=${@:-ours llama-bf16 llama-q8}
LOGS=${TMPDIR:-/tmp}/qwen3-next-bench

mkdir -p "$LOGS"
if [[ -f $QN/config.json ]]; then  # the parameter counts, as the build prints them
  $PY "$here/make_qwen3_next_checkpoint.py" "$QN" --size "$SIZE" --count-only 2>/dev/null | tail -1
else
  $PY "$here/make_qwen3_next_checkpoint.py" "$QN" --size "$SIZE" 2>&1 | grep -v 'Writing model shards' || exit 1
fi
for q in bf16 q8_0; do
  [[ $q == q8_0 && " $SYSTEMS " != *" llama-q8 "* ]] && continue
  [[ $q == bf16 && " $SYSTEMS " != *" llama-bf16 "* ]] && continue
  if [[ ! -f $QN-$q.gguf && -x $CONVERT_PY && -f $CONVERT/convert_hf_to_gguf.py ]]; then
    PYTHONPATH=$CONVERT/gguf-py $CONVERT_PY "$CONVERT/convert_hf_to_gguf.py" "$QN" --no-mtp --outtype $q \
      --outfile "$QN-$q.gguf" >"$LOGS/convert-$q.log" 2>&1 || echo "convert $q failed: $(tail -1 "$LOGS/convert-$q.log")"
  fi
done

free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rss_group() { ps -o rss= -g "$1" 2>/dev/null | awk '{s+=$1} END {printf "%.0f", s/1024}'; }
tp() { grep -o 'throughput=[0-9.]*' | cut -d= -f2; }
smoke() {  # url: one greedy completion, its text printed (the pipeline check of the tiny size)
  curl -sf "$1/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "qwen3-next", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}' \
    | $PY -c 'import json,sys; r=json.load(sys.stdin); print(repr(r["choices"][0]["text"]), r["usage"])'
}
run_one() {  # name port cmd...
  local name=$1 port=$2; shift 2
  if curl -s -o /dev/null "http://127.0.0.1:$port/"; then echo "$name: port $port already answers"; return 1; fi
  setsid "$@" >"$LOGS/$name.log" 2>&1 & local pid=$!
  local t0=$(date +%s.%N)
  until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
    sleep 0.5; kill -0 $pid 2>/dev/null || { echo "$name exited: $(tail -1 "$LOGS/$name.log")"; return 1; }
  done
  local ready=$($PY -c "import time;print(f'{time.time()-$t0:.1f}')")
  local u=http://127.0.0.1:$port X='{"ignore_eos": true}'
  if [[ $SIZE == tiny ]]; then
    echo "$name ready=${ready}s completion: $(smoke $u || echo FAILED) rss=$(rss_group $pid)MiB"
  else
    for w in 1 2; do $LG --url $u -n 32 -c 32 --max-tokens 64 --extra "$X" >/dev/null; done
    $LG --url $u -n 2 -c 1 --max-tokens 32 --extra "$X" >/dev/null
    local t="" b=""
    for r in 1 2 3; do t="$t $($LG --url $u -n 32 -c 32 --max-tokens 64 --extra "$X" | tp)"; done
    for r in 1 2; do b="$b $($LG --url $u -n 2 -c 1 --max-tokens 128 --extra "$X" | tp)"; done
    echo "$name ready=${ready}s c32_tok/s=[${t# }] bs1_tok/s=[${b# }] rss=$(rss_group $pid)MiB"
  fi
  kill -TERM -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null; wait $pid 2>/dev/null; sleep 1
}
# LLAMA_SERVER: another llama-server build; build-noamx is preferred where it exists (the GGML_NATIVE build dies
# with "Illegal instruction" in its AMX repack on Xeons with AMX in a VM: bench_gemma3_side_by_side.sh).
LLAMA=${LLAMA_SERVER:-$PEERS/llama/build-noamx/bin/llama-server}
[[ -x $LLAMA ]] || LLAMA=$PEERS/llama/build/bin/llama-server
echo "model: $QN ($SIZE) llama-server: $LLAMA"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc) flags: $(grep -m1 -o -w -E 'amx_bf16|amx_int8|amx_tile|avx512_bf16|avx512_fp16|avx512_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for x in $SYSTEMS; do case $x in
  ours) p=$(free_port)
        run_one ours $p sglang serve --model-path "$QN" --dtype bfloat16 --host 127.0.0.1 --port $p ${OURS_ARGS:-} ;;
  llama-bf16|llama-q8) [[ -x $LLAMA ]] || { echo "llama: run peers-setup.sh first"; continue; }
        q=bf16; [[ $x == llama-q8 ]] && q=q8_0
        [[ -f $QN-$q.gguf ]] || { echo "$x: no $QN-$q.gguf (see $LOGS/convert-$q.log)"; continue; }
        p=$(free_port)
        LD_LIBRARY_PATH=$(dirname $LLAMA) run_one $x $p $LLAMA -m "$QN-$q.gguf" --alias qwen3-next --host 127.0.0.1 \
        --port $p -t 2 -np 32 -c 16384 ;;
  *) echo "unknown system $x (ours, llama-bf16, llama-q8)";;
esac; done
