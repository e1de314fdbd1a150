"""GPU variant of test_triton_mamba2_interpreted.py: the Triton Mamba-2 SSD kernels compiled for the GPU (CUDA or
ROCm), reached through mamba2_ssd's dispatch (ssd_extend / ssd_decode on a GPU tensor) as a model reaches them,
against the float64 token-by-token recurrence (mamba2_ssd_cases.py): the interpreter's varlen cases with the default
tiles, and Nemotron-H-8B's own widths (128 heads of 64, 8 groups, state 128, chunk 128) over several chunks, fp32
and bf16. Skips without a GPU (fails instead inside a GPU suite). Written without a GPU at hand: not yet run on one."""

import os
import sys
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mamba2_ssd_cases import make_case, max_rel_error, reference_scan  # noqa: E402
from triton_mamba2_cases import LENS, extend_errors, on  # noqa: E402

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci  # noqa: E402
from sglang.test.gpu_backends import requires_gpu, skip_or_fail  # noqa: E402

register_cuda_ci(est_time=60, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=60, suite="stage-a-test-1-gpu-amd")

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}  # relative to the output's scale


@requires_gpu()  # the CPU interpreter variant is test_triton_mamba2_interpreted.py
class TestTritonMamba2Gpu(unittest.TestCase):
    def setUp(self):
        from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted

        if interpreted():
            skip_or_fail(self, "TRITON_INTERPRET is set: this file checks the compiled kernels")

    def test_extend_through_the_dispatch(self):
        from sglang.srt.layers.attention.linear.mamba2_ssd import ssd_extend

        cases = [(make_case(LENS, nh=4, hd=8, ng=2, ns=16, dtype=dtype), chunk) for dtype in TOL
                 for chunk in (8, 12, 64)]
        nemotron = make_case([300, 77, 1], nh=128, hd=64, ng=8, ns=128, has_initial=[True, False, True], seed=5)
        nemotron["A"] = -torch.arange(1, 129, dtype=torch.float32) / 8
        cases.append((nemotron, 128))
        for case, chunk in cases:
            err = extend_errors(ssd_extend, case, chunk, None, device="cuda")
            with self.subTest(dtype=case["x"].dtype, chunk=chunk, heads=case["x"].shape[1]):
                self.assertLessEqual(err, TOL[case["x"].dtype])

    def test_decode_through_the_dispatch(self):
        from sglang.srt.layers.attention.linear.mamba2_ssd import ssd_decode

        for dtype in TOL:
            case = make_case([1] * 32, nh=128, hd=64, ng=8, ns=128, has_initial=[True] * 32, seed=6, dtype=dtype)
            ref_y, ref_state = reference_scan(case)
            c = on(case, "cuda")
            y, state = ssd_decode(c["x"], c["dt"], c["A"], c["B"], c["C"], c["D"], c["initial_state"],
                                  dt_bias=c["dt_bias"])
            self.assertEqual(y.device.type, "cuda")
            with self.subTest(dtype=dtype):
                self.assertLessEqual(max_rel_error(y.cpu(), ref_y), TOL[dtype])
                self.assertLessEqual(max_rel_error(state.cpu(), ref_state), TOL[torch.float32])


if __name__ == "__main__":
    unittest.main()
