"""GPU variant of test_triton_mla_interpreted.py: the Triton MLA kernels (triton_ops/mla_decode.py, mla_extend.py)
compiled for the GPU (CUDA or ROCm) against the EXPANDED multi-head form in float64 (triton_mla_cases.py) -- the
interpreter's cases with the GPU tiles, and DeepSeek's own widths (kv_lora 512 + rope 64) at 128 and 16 heads with
the kernels' default heads / rows per program; fp32, fp16 and bf16 (bf16 only here: the CPU interpreter's bf16 dot
is wrong). Skips without a GPU (fails instead inside a GPU suite). Written without a GPU at hand: not yet run on one."""

import unittest

import torch
from triton_mla_cases import (DECODE_CASES, DEEPSEEK_DECODE_CASES, DEEPSEEK_EXTEND_CASES, EXTEND_CASES, run_decode,
                              run_extend)

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import requires_gpu, skip_or_fail

register_cuda_ci(est_time=60, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=60, suite="stage-a-test-1-gpu-amd")

# max abs error of the per-head output (|out| ~ 1) against the float64 expanded form
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@requires_gpu()  # the CPU interpreter variant is test_triton_mla_interpreted.py
class TestTritonMLAGpu(unittest.TestCase):
    def setUp(self):
        from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
        from sglang.srt.layers.attention.triton_ops.tiles import GPU_TILES

        if interpreted():
            skip_or_fail(self, "TRITON_INTERPRET is set: this file checks the compiled kernels")
        self.tiles = GPU_TILES

    def check(self, run, cases):
        for dtype in TOL:
            for page_size in (1, 16):
                for c in cases:
                    err = run(page_size=page_size, dtype=dtype, tiles=self.tiles, device="cuda", **c)
                    with self.subTest(dtype=dtype, page_size=page_size, **c):
                        self.assertLessEqual(err, TOL[dtype], f"max abs error {err:.3g}")

    def test_decode(self):
        self.check(run_decode, DECODE_CASES + DEEPSEEK_DECODE_CASES)

    def test_extend(self):
        self.check(run_extend, EXTEND_CASES + DEEPSEEK_EXTEND_CASES)

    def test_comparison_can_fail(self):
        for run, case in ((run_decode, DEEPSEEK_DECODE_CASES[0]), (run_extend, DEEPSEEK_EXTEND_CASES[0])):
            err = run(page_size=16, dtype=torch.float32, tiles=self.tiles, device="cuda", scale_error=1.5, **case)
            self.assertGreater(err, 1e-2)


if __name__ == "__main__":
    unittest.main()
