"""What the GPU test suites need to know about this machine: which GPU (CUDA or ROCm) and which attention backends
run on it. On a machine without a GPU every GPU test skips with `NO_GPU_REASON`.

    CUDA   triton, flashinfer (each compared with torch_native)
    ROCm   triton, aiter
flashinfer and aiter run fp16/bf16 only: their fp32 tests assert the startup refusal instead of tokens.
"""

from __future__ import annotations

import importlib.util
from typing import List, Optional

import torch

NO_GPU_REASON = "needs a CUDA or ROCm GPU (this machine has none)"
HALF_ONLY_BACKENDS = ("flashinfer", "aiter")


def gpu_kind() -> Optional[str]:
    """'cuda', 'rocm' or None."""
    if not torch.cuda.is_available():
        return None
    return "rocm" if torch.version.hip else "cuda"


def platform_backends() -> List[str]:
    """The GPU attention backends this machine's platform offers, whether installed or not."""
    return {"cuda": ["triton", "flashinfer"], "rocm": ["triton", "aiter"]}.get(gpu_kind(), [])


def missing_library(backend: str) -> Optional[str]:
    """A skip reason when the backend's library is not installed (the CI images install them)."""
    module = {"triton": "triton", "flashinfer": "flashinfer", "aiter": "aiter"}[backend]
    return None if importlib.util.find_spec(module) else f"{backend}: the {module!r} package is not installed"


def free_gpu_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# a few fixed prompts with clear greedy winners on the default model (not the near-tie "capital of France")
PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    ",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
]
# small engine/server shapes shared by the GPU tests
ENGINE_KW = dict(max_total_tokens=65536, max_running_requests=64, log_level="warning")
SERVER_ARGS = ["--max-total-tokens", "65536", "--max-running-requests", "64"]
