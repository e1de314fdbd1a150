"""GPU variant of test_fused_moe_triton_interpreted.py: the Triton fused-MoE kernels compiled for the GPU (CUDA or
ROCm), GPU tile set, the same cases against the same float64 reference -- fp32 (relative error <= 1e-5), fp16
(<= 2e-3) and bf16 (<= 2e-2; checked only here, the CPU interpreter's bf16 dot is wrong) -- the alignment against
the brute force, the gate/up-swapped run that must fail, and one decode batch captured in a CUDA graph with a
planned workspace and replayed on new routing (no host sync inside, fixed buffer addresses). Skips without a GPU
(fails instead inside a GPU suite)."""

import unittest

import torch
from fused_moe_cases import (
    ALIGN_CASES,
    CASES,
    SENSITIVITY_MIN_ERROR,
    TOL,
    alignment_mismatches,
    make_inputs,
    reference,
    relative_error,
    run_case,
)
from moe_interpreted_run import WORKSPACE_KINDS

from sglang.test.ci.ci_register import register_amd_ci, register_cuda_ci
from sglang.test.gpu_backends import requires_gpu, skip_or_fail

register_cuda_ci(est_time=60, suite="stage-a-test-1-gpu")
register_amd_ci(est_time=60, suite="stage-a-test-1-gpu-amd")


@requires_gpu()  # the CPU interpreter variant is test_fused_moe_triton_interpreted.py
class TestFusedMoeTritonGpu(unittest.TestCase):
    def setUp(self):
        from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted
        from sglang.srt.layers.moe.triton_ops.tiles import GPU_TILES

        if interpreted():
            skip_or_fail(self, "TRITON_INTERPRET is set: this file checks the compiled kernels")
        self.tiles = GPU_TILES

    def test_every_case_within_tolerance(self):
        for dtype in TOL:
            for c in CASES:
                with self.subTest(dtype=dtype, case=c["name"]):
                    err = run_case(c, dtype, tiles=self.tiles, device="cuda")
                    self.assertLessEqual(err, TOL[dtype], f"relative error {err:.3g}")

    def test_planned_workspace(self):
        for kind in WORKSPACE_KINDS:
            for c in CASES[:2] + CASES[5:6]:
                err = run_case(c, torch.bfloat16, tiles=self.tiles, device="cuda", workspace=kind,
                               workspace_tokens=c["M"] + 13)
                self.assertLessEqual(err, TOL[torch.bfloat16], f"{kind} {c['name']}")

    def test_alignment_matches_brute_force(self):
        for block_m in (16, 64):
            for c in ALIGN_CASES:
                self.assertEqual(alignment_mismatches(c, block_m, self.tiles, device="cuda"), [], c["name"])

    def test_comparison_can_fail(self):
        err = run_case(CASES[5], torch.float32, tiles=self.tiles, device="cuda", swap_gate_up=True)
        self.assertGreater(err, SENSITIVITY_MIN_ERROR)

    def test_cuda_graph_replay_on_new_routing(self):
        from sglang.srt.layers.moe.triton_ops import FusedMoeWorkspace, fused_experts_triton

        case, dtype = CASES[5], torch.bfloat16
        ws = FusedMoeWorkspace.allocate(64, case["topk"], case["E"], case["N"], case["K"], dtype, "cuda")
        hidden, w13, w2, weights, ids = (x.cuda() for x in make_inputs(case, dtype, seed=0))
        fused_experts_triton(hidden, w13, w2, weights, ids, ws, tiles=self.tiles)  # compiles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_experts_triton(hidden, w13, w2, weights, ids, ws, tiles=self.tiles)
        for seed in (1, 2):
            new = make_inputs(case, dtype, seed=seed)
            for static, value in zip((hidden, w13, w2, weights, ids), new):
                static.copy_(value)
            graph.replay()
            torch.cuda.synchronize()
            err = relative_error(out, reference(*new))
            self.assertLessEqual(err, TOL[dtype], f"replay with seed {seed}: relative error {err:.3g}")


if __name__ == "__main__":
    unittest.main()
