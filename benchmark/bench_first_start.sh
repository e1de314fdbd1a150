#!/bin/bash
# First start (an empty SGLANG_CACHE_DIR: the GGUF's one-time conversion, packing and activation measurement) and
# second start of `sglang serve` on the default model, per CPU level forced with SGLANG_CPU_ISA (issue 27: <= 10 s
# first, <= 5 s second). Ready = launch until GET /v1/models answers. Usage:
#   bash benchmark/bench_first_start.sh            # every level this CPU has
#   LEVELS="avx2 scalar" bash benchmark/bench_first_start.sh
set -u
PORT=${PORT:-31941}
if [ -z "${LEVELS:-}" ]; then
  LEVELS=$(python3 -c "from sglang.jit_kernel.cpu_isa import LEVELS, native_cpu_isa as n; print(' '.join(LEVELS[:LEVELS.index(n()) + 1][::-1]))")
fi
echo "CPU flags: $(grep -o -w 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|avx2\|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
for level in $LEVELS; do
  export SGLANG_CACHE_DIR=$(mktemp -d /tmp/sgl-first-start-XXXX)
  for i in 1 2; do
    log=$SGLANG_CACHE_DIR/start-$i.log
    t0=$(date +%s.%N)
    SGLANG_CPU_ISA=$level setsid sglang serve --host 127.0.0.1 --port $PORT >"$log" 2>&1 & pid=$!
    until curl -sf http://127.0.0.1:$PORT/v1/models >/dev/null; do sleep 0.1; kill -0 $pid 2>/dev/null || break; done
    t1=$(date +%s.%N)
    what=$([ $i = 1 ] && echo first || echo second)
    echo "$level $what start: ready $(python3 -c "print(f'{$t1 - $t0:.1f}')") s; $(grep -o 'Scheduler ready.*' "$log" | cut -c1-260)"
    kill -TERM -- -$pid; sleep 2; kill -KILL -- -$pid 2>/dev/null; sleep 1
  done
  rm -rf "$SGLANG_CACHE_DIR"
done
