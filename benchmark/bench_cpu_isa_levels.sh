#!/bin/bash
# The default model served at every CPU ISA level this machine can run, forced with SGLANG_CPU_ISA (from the native
# level down to scalar; python/sglang/jit_kernel/cpu_isa.py): one row per level from ../shared/tools/perf-side-by-side.sh
# (ready time, c=32 throughput, streaming chat c=32 with ITL p50, batch-1 decode, RSS), then AVX2's batch-1 as a
# share of the native level's. Run from the project checkout with the project installed:
#   bash benchmark/bench_cpu_isa_levels.sh [level ...]        (default: every level from native down)
# The peers (vLLM CPU, llama.cpp) at the native level: bash ../shared/tools/perf-side-by-side.sh vllm llama
set -u
here=$(dirname "$(readlink -f "$0")")
SIDE=${SIDE:-$here/../../shared/tools/perf-side-by-side.sh}
[[ -f $SIDE ]] || { echo "perf-side-by-side.sh not found at $SIDE (set SIDE=...)"; exit 1; }
native=$(python3 -c 'from sglang.jit_kernel.cpu_isa import native_cpu_isa; print(native_cpu_isa())')
levels=${*:-$(python3 -c "
from sglang.jit_kernel.cpu_isa import LEVELS, level_rank
print(' '.join(reversed(LEVELS[:level_rank('$native') + 1])))")}
echo "CPU flags: $(grep -o -w 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|avx2\|avx_vnni\|fma\|f16c' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "native level: $native; $(nproc) cores"
declare -A bs1
for level in $levels; do
  line=$(SGLANG_CPU_ISA=$level bash "$SIDE" ours | grep '^ours ')
  echo "$level: ${line#ours }"
  bs1[$level]=$(echo "$line" | grep -o 'bs1_tok/s=\[[0-9. ]*\]' | grep -o '[0-9.]*' | sort -g | tail -1)
done
if [[ -n ${bs1[avx2]:-} && -n ${bs1[$native]:-} ]]; then
  python3 -c "print(f'avx2 batch-1 / $native batch-1 (best of 2 each): {${bs1[avx2]} / ${bs1[$native]}:.2f}')"
fi
