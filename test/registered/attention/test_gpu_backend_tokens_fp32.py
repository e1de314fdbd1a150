"""GPU: the default model in float32 gives the same greedy tokens with each backend as with torch_native; the
fp16/bf16-only libraries (flashinfer, aiter) refuse float32 at startup, naming the dtype to use."""

import unittest

from backend_fixtures import engine_generate, for_each_platform_backend

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import HALF_ONLY_BACKENDS, requires_gpu

register_cuda_ci(est_time=120, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=120, suite="stage-a-test-1-gpu-amd")

MAX_NEW_TOKENS = 24


def greedy_tokens(backend: str) -> list:
    sampling = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    outs = engine_generate(backend, "float32", sampling)
    return [o["output_ids"] for o in outs]


@requires_gpu()
class TestGpuBackendTokensFp32(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reference = greedy_tokens("torch_native")

    def test_same_greedy_tokens_as_torch_native(self):
        for_each_platform_backend(self, self.check_tokens)

    def check_tokens(self, backend: str):
        if backend in HALF_ONLY_BACKENDS:
            with self.assertRaisesRegex(ValueError, "float16/bfloat16.*--dtype bfloat16"):
                greedy_tokens(backend)
            return
        self.assertEqual(greedy_tokens(backend), self.reference)


if __name__ == "__main__":
    unittest.main()
