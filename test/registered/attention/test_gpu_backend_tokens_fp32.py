"""GPU: the default model in float32 gives the same greedy tokens with each backend as with torch_native; the
fp16/bf16-only libraries (flashinfer, aiter) refuse float32 at startup, naming the dtype to use."""

import unittest

import sglang
from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import (
    ENGINE_KW,
    HALF_ONLY_BACKENDS,
    NO_GPU_REASON,
    PROMPTS,
    free_gpu_memory,
    gpu_kind,
    missing_library,
    platform_backends,
)

register_cuda_ci(est_time=120, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=120, suite="stage-a-test-1-gpu-amd")

MAX_NEW_TOKENS = 24


def greedy_tokens(backend: str) -> list:
    engine = sglang.Engine(attention_backend=backend, dtype="float32", **ENGINE_KW)
    try:
        outs = engine.generate(PROMPTS, {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        return [o["output_ids"] for o in outs]
    finally:
        engine.shutdown()
        del engine
        free_gpu_memory()


@unittest.skipIf(gpu_kind() is None, NO_GPU_REASON)
class TestGpuBackendTokensFp32(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reference = greedy_tokens("torch_native")

    def test_same_greedy_tokens_as_torch_native(self):
        for backend in platform_backends():
            with self.subTest(backend=backend):
                if missing_library(backend):
                    self.skipTest(missing_library(backend))
                if backend in HALF_ONLY_BACKENDS:
                    with self.assertRaisesRegex(ValueError, "float16/bfloat16.*--dtype bfloat16"):
                        greedy_tokens(backend)
                    continue
                self.assertEqual(greedy_tokens(backend), self.reference)


if __name__ == "__main__":
    unittest.main()
