#!/bin/bash
# Decode throughput per --kv-cache-dtype against bf16 KV at concurrency 32 (issue 23's speed gate: quantized KV must
# not make decode more than 10% slower than bf16; on a CPU the int8 / int4 / fp8 pools are read by the attention kernel over
# their codes, sgl-kernel/csrc/cpu/decode_attention_quant.h). For each dtype a server with the default model and
# torch_native is started, warmed up once at the measured shape, then measured with `python -m sglang.bench_serving`
# (streaming /v1/chat/completions, N=64 requests at concurrency C=32, prompts of WORDS=100 fresh random words,
# OUT_LEN=64 output tokens, ignore_eos). Prints output tok/s, ITL p50 per dtype and the ratio to bf16.
#
# Quiet machine: the measurement (warm-up + run, well under a minute per dtype) holds LOCK (default
# /tmp/i20/BENCH_LOCK, the file other jobs on a shared machine wait on) and starts only when the 1-minute load average
# is below LOAD_MAX (default 3; after WAIT_MAX_S, default 300 s, it goes ahead and says so). Server start-up is outside
# the lock. Run from the project checkout with the project importable (installed, or PYTHONPATH=python):
#   bash benchmark/bench_kv_decode_speed.sh [dtype ...]     (default: bfloat16 int8 int4 fp8_e4m3 fp8_e5m2)
# The ratios are to the first dtype listed: bfloat16 by default; at a level without BF16 (SGLANG_CPU_ISA=avx512_vnni,
# or such a CPU: --dtype auto serves fp32 there) list float32 first, the KV cache a start gives by default.
# ROUNDS (default 1) measures every dtype that many times, the order turned by one each round (a dtype is not always
# the one measured after a given other), and prints each round's ratio to that round's first dtype and the median:
# on a shared 2-core machine one round's bf16 figure alone moves by ~10% between runs.
# Environment: N, C, WORDS, OUT_LEN, ROUNDS, OURS_FLAGS, LOCK, LOAD_MAX, WAIT_MAX_S, RESULTS (default a fresh
# /tmp/kv-decode-speed.*), PY (python3).
set -u
PY=${PY:-$(command -v python3)}
N=${N:-64} C=${C:-32} WORDS=${WORDS:-100} OUT_LEN=${OUT_LEN:-64} ROUNDS=${ROUNDS:-1}
LOCK=${LOCK:-/tmp/i20/BENCH_LOCK} LOAD_MAX=${LOAD_MAX:-3} WAIT_MAX_S=${WAIT_MAX_S:-300}
RESULTS=${RESULTS:-$(mktemp -d /tmp/kv-decode-speed.XXXXXX)}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-600}
PORT=31961
SEED=$(( $(date +%s) % 1000000 * 10 ))
mkdir -p "$RESULTS" "$(dirname "$LOCK")"
$PY -c 'import sglang.bench_serving' 2>/dev/null || { echo "python3 cannot import sglang: install the project or set PYTHONPATH=python"; exit 1; }

server_pid="" locked=0
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM -- -$server_pid 2>/dev/null; sleep 3; kill -KILL -- -$server_pid 2>/dev/null; sleep 1
  server_pid=""
}
unlock() { (( locked )) && rm -f "$LOCK"; locked=0; }
trap 'unlock; stop_server' EXIT
trap 'unlock; stop_server; exit 130' INT TERM

lock_when_quiet() {  # waits for no lock held by another job and a low load, then takes the lock
  local t0=$SECONDS
  while [[ -e $LOCK ]] || awk -v m="$LOAD_MAX" '{exit !($1 >= m)}' /proc/loadavg; do
    if (( SECONDS - t0 >= WAIT_MAX_S )) && [[ ! -e $LOCK ]]; then
      echo "  load still $(cut -d' ' -f1 /proc/loadavg) after ${WAIT_MAX_S}s: measuring anyway" >&2; break
    fi
    sleep 5
  done
  touch "$LOCK"; locked=1
  sleep 20  # jobs that honour the lock poll it every 20 s
  echo "  lock taken at $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
}

bench() {  # seed [flags...]
  local seed=$1; shift
  $PY -m sglang.bench_serving --backend sglang-oai-chat --base-url "http://127.0.0.1:$PORT" --num-prompts "$N" \
    --max-concurrency "$C" --random-input-len "$WORDS" --random-output-len "$OUT_LEN" --seed "$seed" \
    --metrics-interval-s 0 "$@"
}

run_dtype() {  # dtype round
  local dt=$1 tag=$1.r$2 log=$RESULTS/server-$1.r$2.log
  setsid $PY -m sglang.cli.main serve --host 127.0.0.1 --port $PORT --kv-cache-dtype "$dt" ${OURS_FLAGS:-} \
    >"$log" 2>&1 & server_pid=$!
  local t0=$SECONDS
  until curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; do
    sleep 0.5
    kill -0 $server_pid 2>/dev/null || { echo "$dt exited before it was ready: $(tail -1 "$log")"; server_pid=""; return 1; }
    (( SECONDS - t0 < READY_TIMEOUT_S )) || { echo "$dt not ready after ${READY_TIMEOUT_S}s ($log)"; stop_server; return 1; }
  done
  echo "$dt ready in $((SECONDS - t0)) s" >&2
  lock_when_quiet
  local t1=$SECONDS
  bench $((SEED + 1)) --num-prompts "$C" >/dev/null 2>&1
  bench $((SEED + 2)) --output-file "$RESULTS/$tag.jsonl" >"$RESULTS/$tag.txt" 2>&1 \
    || echo "$dt: bench_serving failed: $(tail -2 "$RESULTS/$tag.txt")" >&2
  unlock
  echo "  $dt (round $2) measured; lock held $((SECONDS - t1 + 20)) s" >&2
  stop_server
}

echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "CPU level: ${SGLANG_CPU_ISA:-native} (SGLANG_CPU_ISA)"
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -o -w -E 'avx2|f16c|avx512[a-z0-9_]*|amx[a-z0-9_]*' | sort -u | xargs)"
echo "streaming chat: $N requests, concurrency $C, $WORDS-word prompts, $OUT_LEN output tokens; seeds $SEED+; results in $RESULTS"
DTYPES=(${*:-bfloat16 int8 int4 fp8_e4m3 fp8_e5m2})
for ((r = 0; r < ROUNDS; r++)); do
  n=${#DTYPES[@]}
  for ((i = 0; i < n; i++)); do run_dtype "${DTYPES[(i + r) % n]}" "$r"; done
done

$PY - "$RESULTS" "$ROUNDS" "${DTYPES[@]}" <<'EOF'
import json, pathlib, statistics, sys
d, rounds, dtypes = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def load(dt, r):
    f = d / f"{dt}.r{r}.jsonl"
    return json.loads(f.read_text().splitlines()[-1]) if f.exists() else None
runs = {dt: [load(dt, r) for r in range(rounds)] for dt in dtypes}
first = dtypes[0]
print(f"{'kv dtype':<14}{'out tok/s':>10}{'vs first':>9}{'ITL p50 ms':>11}{'TTFT p50 ms':>12}{'failed':>7}"
      + (f"   vs {first} per round" if rounds > 1 else ""))
for dt, rs in runs.items():
    ok = [(r, x) for r, x in enumerate(rs) if x]
    if not ok:
        continue
    base = runs[first]
    ratios = [x["output_throughput"] / base[r]["output_throughput"] for r, x in ok if base[r]]
    med = lambda key: statistics.median(x[key] for _, x in ok)
    ratio = f"{statistics.median(ratios):.3f}" if ratios else "n/a"
    print(f"{dt:<14}{med('output_throughput'):>10.1f}{ratio:>9}{med('median_itl_ms'):>11.1f}{med('median_ttft_ms'):>12.1f}"
          f"{sum(x['failed'] for _, x in ok):>7}" + ("   " + " ".join(f"{q:.3f}" for q in ratios) if rounds > 1 else ""))
if rounds > 1:
    print(f"(medians over {rounds} rounds; vs first: the median of each round's ratio to the same round's {first})")
EOF
