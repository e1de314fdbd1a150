"""The Triton fused-MoE kernels (layers/moe/triton_ops) under the Triton interpreter on CPU, against a per-token
float64 reference written from the definition (fused_moe_cases.py): decode (M = 1, k = 8, fewer assignments than
experts), k = 1, one expert taking every token, a shared first expert, experts with no token, several blocks per
expert, K / N not multiples of the tiles, both tile sets, fp32 (relative error <= 1e-5) and fp16 (<= 2e-3); a
workspace planned for more tokens than the batch (also as a dict, and laid out as the model runner's
MoEWorkspace: separate intermediate3, looser index bounds); the alignment against a brute-force construction at
BLOCK_M 16 and 64 (exact, nothing written past the used entries); and a run with gate and up swapped that must be
far off. The interpreter computes bf16 dot products wrongly, so bf16 is checked only on a GPU
(test_fused_moe_triton_gpu.py). The kernels run in a child process with TRITON_INTERPRET=1 (moe_interpreted_run.py
says why); the workspace checks here launch no kernel."""

import unittest

import torch
from fused_moe_cases import ALIGN_CASES, CASES, SENSITIVITY_MIN_ERROR, TOL
from moe_interpreted_run import ALIGN_BLOCK_MS, WORKSPACE_KINDS, run_in_interpreter

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="cpu")

DTYPES = {str(d): d for d in TOL}


class TestFusedMoeTritonInterpreted(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.results = run_in_interpreter()

    def test_every_case_within_tolerance(self):
        fused = {k: v for k, v in self.results.items() if k.startswith("fused|")}
        self.assertEqual(len(fused), 2 * 2 * len(CASES))  # 2 tile sets x 2 dtypes x the cases
        for key, err in fused.items():
            _, tiles, dtype, case = key.split("|")
            with self.subTest(tiles=tiles, dtype=dtype, case=case):
                self.assertLessEqual(err, TOL[DTYPES[dtype]], f"{key}: relative error {err:.3g}")
        print("relative error fp32 %.2e, fp16 %.2e; interpreted %.1f s (fused) + %.1f s (alignment)" % (
            max(v for k, v in fused.items() if "float32" in k), max(v for k, v in fused.items() if "float16" in k),
            self.results["seconds|fused"], self.results["seconds|align"]))

    def test_planned_workspace(self):
        runs = {k: v for k, v in self.results.items() if k.startswith("workspace|")}
        self.assertEqual(len(runs), 3 * len(WORKSPACE_KINDS))
        for key, err in runs.items():
            self.assertLessEqual(err, TOL[torch.float32], key)

    def test_alignment_matches_brute_force(self):
        aligned = {k: v for k, v in self.results.items() if k.startswith("align|")}
        self.assertEqual(len(aligned), 2 * len(ALIGN_BLOCK_MS) * len(ALIGN_CASES))
        for key, problems in aligned.items():
            self.assertEqual(problems, [], key)

    def test_comparison_can_fail(self):
        """w13 with gate and up swapped gives silu(up) * gate: far outside the tolerance."""
        self.assertGreater(self.results["sensitivity|swap_gate_up"], SENSITIVITY_MIN_ERROR)


class TestFusedMoeWorkspace(unittest.TestCase):
    def test_the_plans_row_block_is_the_kernels(self):
        """The runtime's MoEWorkspace on a GPU is sized with moe_sizes.SORT_BLOCK_M["triton"]: the kernel's largest
        row block, so every block the kernel pads fits the planned sorted-ids buffer."""
        from sglang.srt.layers.moe.triton_ops.tiles import MOE_BLOCK_M
        from sglang.srt.mem_plan.moe_sizes import CAPTURABLE, SORT_BLOCK_M, moe_impl_for

        self.assertEqual(SORT_BLOCK_M["triton"], MOE_BLOCK_M)
        self.assertEqual((moe_impl_for("cuda"), moe_impl_for("cpu")), ("triton", "torch"))
        self.assertTrue(CAPTURABLE["triton"])

    def test_bytes_formula_is_what_is_allocated(self):
        from sglang.srt.layers.moe.triton_ops import FusedMoeWorkspace, fused_moe_workspace_bytes

        shapes = [(1, 8, 128, 768, 2048), (4096, 8, 128, 768, 2048), (3, 2, 5, 7, 300), (0, 2, 4, 8, 8)]
        for max_tokens, topk, experts, n, k in shapes:
            for dtype in (torch.float32, torch.bfloat16):
                for block_m in (16, 64):
                    ws = FusedMoeWorkspace.allocate(max_tokens, topk, experts, n, k, dtype, "meta", block_m=block_m)
                    want = fused_moe_workspace_bytes(max_tokens, topk, experts, n, k, dtype.itemsize, block_m)
                    self.assertEqual(ws.nbytes(), want, (max_tokens, topk, experts, n, k, dtype, block_m))

    def test_bytes_formula_by_hand(self):
        from sglang.srt.layers.moe.triton_ops import fused_moe_workspace_bytes

        # T = 8 assignments, 3 experts, BLOCK_M 64: P = 8 + 3 * 63 = 197 slots, B = 197 // 64 = 3 blocks;
        # int32: 197 + 3 + 1 + 3 entries; bf16: 8 rows x (max(2 * 5, 7) + 5)
        self.assertEqual(fused_moe_workspace_bytes(4, 2, 3, 5, 7, 2, 64), 4 * (197 + 3 + 1 + 3) + 2 * 8 * (10 + 5))
        # min(E, T): 1 token x 8 experts of 256 -> at most 8 experts are padded
        self.assertEqual(fused_moe_workspace_bytes(1, 8, 256, 4, 4, 2, 16),
                         4 * ((8 + 8 * 15) + (8 + 8 * 15) // 16 + 1 + 256) + 2 * 8 * (8 + 4))

    def test_batch_beyond_the_workspace_is_refused(self):
        from sglang.srt.layers.moe.triton_ops import FusedMoeWorkspace, fused_experts_triton

        hidden, w13, w2 = torch.zeros(5, 8), torch.zeros(3, 8, 8), torch.zeros(3, 8, 4)
        ids, weights = torch.zeros(5, 2, dtype=torch.int64), torch.ones(5, 2)
        ws = FusedMoeWorkspace.allocate(4, 2, 3, 4, 8, torch.float32, "cpu")
        for given in (ws, dict(vars(ws))):
            with self.assertRaisesRegex(ValueError, "buffer intermediate1 .* does not fit a batch of 10 assignments"):
                fused_experts_triton(hidden, w13, w2, weights, ids, given)
        with self.assertRaisesRegex(ValueError, r"x torch.float32\) does not fit .* x torch.float16"):
            fused_experts_triton(hidden[:4].half(), w13.half(), w2.half(), weights[:4], ids[:4], ws)
        with self.assertRaisesRegex(ValueError, "expert_offsets has 4 entries for 2 experts"):
            fused_experts_triton(hidden[:4], w13[:2], w2[:2], weights[:4], ids[:4], ws)


if __name__ == "__main__":
    unittest.main()
