"""GPU: each attention backend's real kernels against torch_native, layer by layer, over the same paged pools:
prefill, extend over a cached prefix, decode; GQA, page sizes 1 and 16, mixed lengths, a request longer than one
AITER partition. Runs the libraries' numerics that the CPU wiring tests (test_*_wiring.py) cannot."""

import unittest

import torch

from sglang.test.attention_harness import BackendHarness, max_abs_diff
from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import HALF_ONLY_BACKENDS, platform_backends, require_library, requires_gpu

register_cuda_ci(est_time=60, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=60, suite="stage-a-test-1-gpu-amd")

TOLERANCE = {torch.float32: 1e-3, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@requires_gpu()
class TestGpuBackendLayers(unittest.TestCase):
    def check(self, backend, dtype, page_size):
        h = BackendHarness(backend, page_size=page_size, dtype=dtype, num_q_heads=8, num_kv_heads=2, head_dim=128,
                           context_len=4096, num_reqs=8, pool_tokens=16384, device="cuda")
        rows = [h.new_request() for _ in range(4)]
        for new_lens in ([7, 300, 33, 1], [5, 1, 64, 9], [1, 1, 1, 1], [1, 1, 1, 1]):
            got, want = h.step(rows, new_lens)
            with self.subTest(backend=backend, dtype=dtype, page_size=page_size, new_lens=new_lens):
                self.assertLess(max_abs_diff(got, want), TOLERANCE[dtype])

    def test_each_backend_against_torch_native(self):
        for backend in platform_backends():
            require_library(backend)
            half_only = backend in HALF_ONLY_BACKENDS
            dtypes = (torch.float16, torch.bfloat16) if half_only else (torch.float32, torch.float16)
            for dtype in dtypes:
                for page_size in (1, 16):
                    self.check(backend, dtype, page_size)


if __name__ == "__main__":
    unittest.main()
