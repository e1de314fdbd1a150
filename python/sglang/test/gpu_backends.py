"""What the GPU test suites need to know about this machine: which GPU (CUDA or ROCm) and which attention backends
run on it.

    CUDA   triton, flashinfer (each compared with torch_native)
    ROCm   triton, aiter
flashinfer and aiter run fp16/bf16 only: their fp32 tests assert the startup refusal instead of tokens.

A GPU suite cannot pass by skipping: test/run_suite.py checks the device and the libraries before it runs one
(preflight), and sets SUITE_GPU_ENV for the suite's tests, under which `requires_gpu` fails where it would skip.
Outside a GPU suite (a CPU machine collecting every test) a GPU test class skips with the reason. A backend whose
library does not import fails its test (`require_library`) either way: on a GPU machine that is a broken install.
"""

from __future__ import annotations

import importlib
import os
import unittest
from typing import List, Optional

import torch

SUITE_GPU_ENV = "RUN_SUITE_GPU"  # 'cuda' or 'rocm': set by test/run_suite.py for a GPU suite's test processes
HALF_ONLY_BACKENDS = ("flashinfer", "aiter")
# backend -> (module, where it comes from)
LIBRARIES = {
    "triton": ("triton", "the CUDA torch wheel's triton, or the ROCm image's pytorch-triton-rocm"),
    "flashinfer": ("flashinfer", 'pip install -e "python[cuda]"'),
    "aiter": ("aiter", "bash scripts/install.sh --rocm"),
}


def gpu_kind() -> Optional[str]:
    """'cuda', 'rocm' or None."""
    if not torch.cuda.is_available():
        return None
    return "rocm" if torch.version.hip else "cuda"


def no_gpu_reason(kind: Optional[str] = None) -> Optional[str]:
    """Why this machine cannot run tests that need a `kind` GPU ('cuda', 'rocm'; None: either), or None."""
    want = {"cuda": "a CUDA", "rocm": "a ROCm"}.get(kind, "a CUDA or ROCm")
    have = gpu_kind()
    if have is None:
        return f"needs {want} GPU (torch {torch.__version__} sees none)"
    if kind in ("cuda", "rocm") and have != kind:
        return f"needs {want} GPU (this one is {have})"
    return None


def _in_suite(reason: str) -> str:
    suite = os.environ.get(SUITE_GPU_ENV)
    return f"{reason}; inside a GPU suite ({SUITE_GPU_ENV}={suite}) that is a failure, not a skip"


def requires_gpu(kind: Optional[str] = None):
    """Class decorator for GPU tests. Without the GPU: skipped, with the reason, outside a GPU suite; inside one
    (SUITE_GPU_ENV set) every test of the class fails, with the reason, so the suite cannot go green unrun."""

    def decorate(cls):
        suite = os.environ.get(SUITE_GPU_ENV) or None
        reason = no_gpu_reason(kind or suite)  # inside a GPU suite, its own platform
        if reason is None:
            return cls
        if not suite:
            return unittest.skip(reason)(cls)

        def fail(_cls):
            raise AssertionError(_in_suite(reason))

        cls.setUpClass = classmethod(fail)
        return cls

    return decorate


def skip_or_fail(test: unittest.TestCase, reason: str) -> None:
    """test.skipTest(reason) outside a GPU suite, test.fail(reason) inside one."""
    if os.environ.get(SUITE_GPU_ENV):
        test.fail(_in_suite(reason))
    test.skipTest(reason)


def platform_backends() -> List[str]:
    """The GPU attention backends this machine's platform offers, whether installed or not."""
    return {"cuda": ["triton", "flashinfer"], "rocm": ["triton", "aiter"]}.get(gpu_kind(), [])


def require_library(backend: str) -> None:
    """AssertionError naming the package and where it comes from when the backend's library does not import."""
    module, source = LIBRARIES[backend]
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 -- a broken install raises more than ImportError (OSError, RuntimeError)
        raise AssertionError(f"{backend}: the {module!r} package does not import ({type(e).__name__}: {e}); "
                             f"it comes from {source}") from e


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
