"""GPU variant of test_triton_kernels_interpreted.py: the Triton attention kernels compiled for the GPU (CUDA or
ROCm) against the float64 torch reference, with the GPU tile set -- decode + merge and extend with cached prefixes,
GQA and MHA, page sizes 1 and 16, mixed lengths. Max abs error <= 1e-5 fp32, <= 2e-3 fp16, <= 2e-2 bf16 (bf16 is
checked only here: the CPU interpreter's bf16 dot is wrong). Skips without a GPU (fails instead inside a GPU suite)."""

import unittest

import torch
from triton_attention_cases import DECODE_CASES, EXTEND_CASES, TOL, run_decode, run_extend

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import requires_gpu, skip_or_fail

register_cuda_ci(est_time=60, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=60, suite="stage-a-test-1-gpu-amd")


@requires_gpu()  # the CPU interpreter variant is test_triton_kernels_interpreted.py
class TestTritonKernelsGpu(unittest.TestCase):
    def setUp(self):
        from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
        from sglang.srt.layers.attention.triton_ops.tiles import GPU_TILES

        if interpreted():
            skip_or_fail(self, "TRITON_INTERPRET is set: this file checks the compiled kernels")
        self.tiles = GPU_TILES

    def check(self, err, dtype, **case):
        with self.subTest(dtype=dtype, **case):
            self.assertLessEqual(err, TOL[dtype], f"max abs error {err:.3g} for {case}")

    def test_decode(self):
        for dtype in TOL:
            for page_size in (1, 16):
                for c in DECODE_CASES:
                    err = run_decode(page_size=page_size, dtype=dtype, tiles=self.tiles, device="cuda", **c)
                    self.check(err, dtype, page_size=page_size, **c)

    def test_extend(self):
        for dtype in TOL:
            for page_size in (1, 16):
                for c in EXTEND_CASES:
                    err = run_extend(page_size=page_size, dtype=dtype, tiles=self.tiles, device="cuda", **c)
                    self.check(err, dtype, page_size=page_size, **c)

    def test_comparison_can_fail(self):
        err = run_decode(page_size=1, dtype=torch.float32, tiles=self.tiles, device="cuda", scale_error=1.5,
                         **DECODE_CASES[0])
        self.assertGreater(err, 1e-2)


if __name__ == "__main__":
    unittest.main()
