"""Shared by the tests that compare a GPU attention backend with torch_native. Not a test file (run_suite collects
test_*.py only).

- Engine level (GPU suites, test_gpu_backend_*.py): `engine_generate` runs one engine per backend and frees it,
  `for_each_platform_backend` runs a check per backend of this machine's platform as a subtest; a backend whose
  library does not import fails its subtest (gpu_backends.require_library), naming it.
- Layer level (CPU wiring tests with stand-in libraries, test_*_wiring.py): `check_steps` runs a sequence of steps
  through a BackendHarness on the backend and on torch_native and asserts they agree and that no step allocates
  a large tensor.
"""

from __future__ import annotations

import unittest
from typing import Callable, Sequence

import sglang
from sglang.test.attention_harness import BackendHarness, max_abs_diff
from sglang.test.attention_standins import AllocationRecorder
from sglang.test.gpu_backends import ENGINE_KW, PROMPTS, free_gpu_memory, platform_backends, require_library


def engine_generate(backend: str, dtype: str, sampling: dict, **generate_kw) -> list:
    """PROMPTS through a fresh Engine(attention_backend=backend, dtype=dtype); the engine is shut down and its GPU
    memory released before returning, so the next backend starts on an empty device."""
    engine = sglang.Engine(attention_backend=backend, dtype=dtype, **ENGINE_KW)
    try:
        return engine.generate(PROMPTS, sampling, **generate_kw)
    finally:
        engine.shutdown()
        del engine
        free_gpu_memory()


def for_each_platform_backend(test: unittest.TestCase, check: Callable[[str], None]) -> None:
    """check(backend) in a subtest per attention backend of this GPU platform (a missing library fails that one)."""
    for backend in platform_backends():
        with test.subTest(backend=backend):
            require_library(backend)
            check(backend)


def check_steps(test: unittest.TestCase, h: BackendHarness, rows: Sequence[int], steps: Sequence[Sequence[int]],
                tol: float, step_alloc_limit_bytes: int) -> None:
    """For each step (new tokens per request of `rows`): the backend's outputs are within tol of torch_native's on
    the same q/k/v and pools, and the backend's forward allocates no tensor of step_alloc_limit_bytes or more (the
    planned buffers are used instead)."""
    for new_lens in steps:
        fb = h.batch(rows, new_lens)
        qkv = h.qkv(sum(new_lens))
        with AllocationRecorder() as rec:
            got = h.run(h.backend, fb, qkv)
        want = h.run(h.reference, fb, qkv)
        with test.subTest(page_size=h.pool.page_size, new_lens=list(new_lens)):
            test.assertLess(max_abs_diff(got, want), tol)
            test.assertLess(rec.largest_bytes, step_alloc_limit_bytes)
