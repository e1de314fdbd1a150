#!/bin/bash
# A ~1B random DeepSeek-V3-shaped checkpoint served side by side: this runtime (bf16 safetensors) and llama.cpp on the
# same model converted by its own convert_hf_to_gguf.py (bf16, and q8_0 for llama-q8), on CPU (issue 42).
# The checkpoint is built once by benchmark/make_deepseek_checkpoint.py (hidden 1536, 11 layers, MLA with q_lora 768
# and kv_lora 512 + rope 64, a dense first layer, 64 routed experts of 256 + 1 shared, top 8 by sigmoid noaux_tc over
# 8 groups keeping 4: 1.04 B parameters, 0.38 B active; SmolLM2's tokenizer) under ~/.cache/sglang-bench/. The
# converter (llama-cpp-python's vendored llama.cpp, unpacked by ../shared/tools/peers-setup.sh) runs in the vLLM venv,
# which already holds its dependencies (torch, transformers, numpy, sentencepiece), with its own gguf-py on PYTHONPATH.
# Each server is started, warmed up twice at the measured shape, then measured: c=32 throughput (32 prompts x 64
# tokens, 3 runs), batch-1 decode (128 tokens, 2 runs), ready time (start to /v1/models answering), RSS of its
# process group.
# DEEPSEEK_SIZE=tiny builds a 2-layer, hidden-256 model of the same shape instead and only checks the pipeline: each
# server starts and answers one completion (no timing).
# OURS_ARGS: extra `sglang serve` flags (e.g. --attention-backend). The converter needs the scoring_func / topk_method
# keys the helper writes into config.json (without them llama.cpp routes by softmax); it drops no tensor here (the
# checkpoint has no MTP layer) and warns 'Unknown RoPE type: default' (harmless: plain rope, no YaRN).
#   bash benchmark/bench_deepseek_side_by_side.sh [ours] [llama-bf16] [llama-q8]   (default: all three)
set -u
here=$(dirname "$(readlink -f "$0")")
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/peers}
SIZE=${DEEPSEEK_SIZE:-full}
DS=${DEEPSEEK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglang-bench/deepseek-v3-$SIZE}
PY=$(command -v python3)
LG="$PY ${SHARED_TOOLS:-$here/../../shared/tools}/loadgen.py"  # the checkout sits beside ../shared
CONVERT=${LLAMA_CPP_SRC:-$PEERS/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp}
CONVERT_PY=${CONVERT_PY:-$PEERS/vllm/bin/python}
SYSTEMS=${@:-ours llama-bf16 llama-q8}

[[ -f $DS/config.json ]] || $PY "$here/make_deepseek_checkpoint.py" "$DS" --size "$SIZE" || exit 1
for q in bf16 q8_0; do
  [[ $q == q8_0 && " $SYSTEMS " != *" llama-q8 "* ]] && continue
  if [[ ! -f $DS-$q.gguf && -x $CONVERT_PY && -f $CONVERT/convert_hf_to_gguf.py ]]; then
    PYTHONPATH=$CONVERT/gguf-py $CONVERT_PY "$CONVERT/convert_hf_to_gguf.py" "$DS" --outtype $q \
      --outfile "$DS-$q.gguf" >/tmp/deepseek-convert-$q.log 2>&1 || echo "convert $q failed: $(tail -1 /tmp/deepseek-convert-$q.log)"
  fi
done

rss_group() { ps -o rss= -g "$1" 2>/dev/null | awk '{s+=$1} END {printf "%.0f", s/1024}'; }
tp() { grep -o 'throughput=[0-9.]*' | cut -d= -f2; }
smoke() {  # url: one greedy completion, its text printed (the pipeline check of the tiny size)
  curl -sf "$1/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "deepseek", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}' \
    | $PY -c 'import json,sys; r=json.load(sys.stdin); print(repr(r["choices"][0]["text"]), r["usage"])'
}
run_one() {  # name port cmd...
  local name=$1 port=$2; shift 2
  setsid "$@" >/tmp/deepseek-perf-$name.log 2>&1 & local pid=$!
  local t0=$(date +%s.%N)
  until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
    sleep 0.5; kill -0 $pid 2>/dev/null || { echo "$name exited: $(tail -1 /tmp/deepseek-perf-$name.log)"; return 1; }
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
  kill -TERM -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null; sleep 1
}
# LLAMA_SERVER: another llama-server build. The GGML_NATIVE build of peers-setup.sh dies with "Illegal instruction"
# in its AMX repack on Xeons with AMX in a VM (bench_gemma3_side_by_side.sh says which flags run), so build-noamx is
# preferred where it exists.
LLAMA=${LLAMA_SERVER:-$PEERS/llama/build-noamx/bin/llama-server}
[[ -x $LLAMA ]] || LLAMA=$PEERS/llama/build/bin/llama-server
echo "model: $DS ($SIZE) llama-server: $LLAMA"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc) flags: $(grep -m1 -o -w -E 'amx_bf16|amx_int8|amx_tile|avx512_bf16|avx512_fp16|avx512_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for x in $SYSTEMS; do case $x in
  ours) run_one ours 31961 sglang serve --model-path "$DS" --dtype bfloat16 --host 127.0.0.1 --port 31961 ${OURS_ARGS:-} ;;
  llama-bf16|llama-q8) [[ -x $LLAMA ]] || { echo "llama: run peers-setup.sh first"; continue; }
        q=bf16; [[ $x == llama-q8 ]] && q=q8_0
        [[ -f $DS-$q.gguf ]] || { echo "$x: no $DS-$q.gguf (see /tmp/deepseek-convert-$q.log)"; continue; }
        LD_LIBRARY_PATH=$(dirname $LLAMA) run_one $x 31962 $LLAMA -m "$DS-$q.gguf" --alias deepseek --host 127.0.0.1 \
        --port 31962 -t 2 -np 32 -c 16384 ;;
  *) echo "unknown system $x (ours, llama-bf16, llama-q8)";;
esac; done
