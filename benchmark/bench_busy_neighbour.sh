#!/bin/bash
# Streaming chat with and without a busy neighbour, this runtime vs vLLM CPU, in one run (issue 20's benchmark).
# Each server is started (ours: the default model with --enable-metrics; vLLM CPU from ../shared/tools/peers-setup.sh,
# started as ../shared/tools/perf-side-by-side.sh starts it), warmed up twice at the measured shape, then measured
# with `python -m sglang.bench_serving` (streaming /v1/chat/completions, N=64 requests at concurrency C=32, prompts
# of WORDS=100 fresh random words, OUT_LEN=64 output tokens, ignore_eos):
#   quiet  nothing else running
#   busy   with `--cpu-burner BURNERS` (default 1): that many pure-Python busy loops from after the warm-up until the
#          last request ends
# One row per (system, condition): output tok/s, ITL p50/p99, TTFT p50, the server's running batch (mean of
# GET /metrics every 0.5 s) and the cores the burners got; then the ratios issue 20 asks about. Both systems get
# the same prompts (same seeds); the seeds change every run, so no run finds an earlier run's prompts cached.
# Run from the project checkout with the project importable by python3 (installed, or PYTHONPATH=python):
#   bash benchmark/bench_busy_neighbour.sh [ours] [vllm]        (default: both)
# Environment: OURS_FLAGS (extra flags for our server), BURNERS, N, C, WORDS, OUT_LEN, PEERS (default
# ~/.cache/peers), RESULTS (a folder for the JSON lines; default a fresh /tmp/busy-neighbour.*), PY (python3).
set -u
PEERS=${PEERS:-${XDG_CACHE_HOME:-$HOME/.cache}/peers}
PY=${PY:-$(command -v python3)}
N=${N:-64} C=${C:-32} WORDS=${WORDS:-100} OUT_LEN=${OUT_LEN:-64} BURNERS=${BURNERS:-1}
RESULTS=${RESULTS:-$(mktemp -d /tmp/busy-neighbour.XXXXXX)}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-900}
SEED=$(( $(date +%s) % 1000000 * 10 ))
mkdir -p "$RESULTS"
$PY -c 'import sglang.bench_serving' 2>/dev/null || { echo "python3 cannot import sglang: install the project or set PYTHONPATH=python"; exit 1; }

server_pid=""
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM -- -$server_pid 2>/dev/null; sleep 3; kill -KILL -- -$server_pid 2>/dev/null; sleep 1
  server_pid=""
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT TERM

bench() {  # url backend seed [flags...]
  local url=$1 backend=$2 seed=$3; shift 3
  $PY -m sglang.bench_serving --backend "$backend" --base-url "$url" --num-prompts "$N" --max-concurrency "$C" \
    --random-input-len "$WORDS" --random-output-len "$OUT_LEN" --seed "$seed" "$@"
}

run_one() {  # name backend port cmd...
  local name=$1 backend=$2 port=$3; shift 3
  local url=http://127.0.0.1:$port log=$RESULTS/server-$name.log
  setsid "$@" >"$log" 2>&1 & server_pid=$!
  local t0=$SECONDS
  until curl -sf "$url/v1/models" >/dev/null; do
    sleep 0.5
    kill -0 $server_pid 2>/dev/null || { echo "$name exited before it was ready: $(tail -1 "$log")"; server_pid=""; return 1; }
    (( SECONDS - t0 < READY_TIMEOUT_S )) || { echo "$name not ready after ${READY_TIMEOUT_S}s (log: $log)"; stop_server; return 1; }
  done
  echo "$name ready in $((SECONDS - t0)) s; warming up" >&2
  for w in 0 1; do bench "$url" "$backend" $((SEED + w)) --num-prompts "$C" --metrics-interval-s 0 >/dev/null; done
  echo "$name: quiet" >&2
  bench "$url" "$backend" $((SEED + 2)) --output-file "$RESULTS/$name-quiet.jsonl" >"$RESULTS/$name-quiet.txt" 2>&1 \
    || echo "$name quiet: bench_serving failed: $(tail -2 "$RESULTS/$name-quiet.txt")" >&2
  echo "$name: busy ($BURNERS burner)" >&2
  bench "$url" "$backend" $((SEED + 3)) --cpu-burner "$BURNERS" --output-file "$RESULTS/$name-busy.jsonl" \
    >"$RESULTS/$name-busy.txt" 2>&1 || echo "$name busy: bench_serving failed: $(tail -2 "$RESULTS/$name-busy.txt")" >&2
  stop_server
}

echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores available, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|avx512[a-z0-9_]*|amx[a-z0-9_]*' | sort -u | xargs)"
echo "streaming chat: $N requests, concurrency $C, $WORDS-word prompts, $OUT_LEN output tokens; busy = $BURNERS burner(s); seeds $SEED+; results in $RESULTS"
for x in ${@:-ours vllm}; do case $x in
  ours) run_one ours sglang-oai-chat 31951 $PY -m sglang.cli.main serve --host 127.0.0.1 --port 31951 --enable-metrics ${OURS_FLAGS:-} ;;
  vllm) [[ -x $PEERS/vllm/bin/python && -d $PEERS/smollm2 ]] || {
          echo "vllm: no vLLM CPU in $PEERS (expected $PEERS/vllm/bin/python and $PEERS/smollm2): run ../shared/tools/peers-setup.sh first, or set PEERS"; continue; }
        VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CACHE_ROOT=$PEERS/cache TORCHINDUCTOR_CACHE_DIR=$PEERS/cache/inductor \
        run_one vllm vllm-chat 31952 $PEERS/vllm/bin/python -m vllm.entrypoints.openai.api_server --model $PEERS/smollm2 \
        --served-model-name smollm2 --dtype bfloat16 --max-model-len 2048 --max-num-seqs 32 --host 127.0.0.1 --port 31952 ;;
  *) echo "unknown system $x (ours, vllm)";;
esac; done

$PY - "$RESULTS" <<'EOF'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
rows = {}
for f in sorted(d.glob("*-*.jsonl")):
    system, cond = f.stem.rsplit("-", 1)
    rows[system, cond] = json.loads(f.read_text().splitlines()[-1])
print(f"{'system':<7}{'condition':<10}{'out tok/s':>10}{'ITL p50 ms':>11}{'ITL p99 ms':>11}{'TTFT p50 ms':>12}"
      f"{'run batch':>10}{'burner cores':>13}{'failed':>7}")
for (system, cond), r in sorted(rows.items(), key=lambda kv: (kv[0][0] != "ours", kv[0][1] != "quiet", kv[0])):
    batch = r["running_batch_mean"]
    print(f"{system:<7}{cond:<10}{r['output_throughput']:>10.1f}{r['median_itl_ms']:>11.1f}{r['p99_itl_ms']:>11.1f}"
          f"{r['median_ttft_ms']:>12.1f}{'n/a' if batch is None else f'{batch:.1f}':>10}"
          f"{r['cpu_burner_cores_busy']:>13.2f}{r['failed']:>7}")
tps = {k: r["output_throughput"] for k, r in rows.items()}
for cond in ("quiet", "busy"):
    if ("ours", cond) in tps and ("vllm", cond) in tps:
        print(f"ours / vllm, {cond}: {tps['ours', cond] / tps['vllm', cond]:.2f}x")
for system in ("ours", "vllm"):
    if (system, "quiet") in tps and (system, "busy") in tps:
        print(f"{system} busy / quiet: {100 * tps[system, 'busy'] / tps[system, 'quiet']:.0f}%")
EOF
