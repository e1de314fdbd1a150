"""The routing kernel (sgl-kernel/csrc/cpu/moe_router.h) against the torch path of layers/moe/router.py.

softmax in fp32, the top k, renormalisation when asked. Where no two probabilities of a row tie, the kernel picks the
same ids in the same order as torch.topk, and its weights are within a few fp32 ulps of torch's (another exp, another
summation order). Ties (frequent with bf16 logits) follow the kernel's stated rule, lower expert id first: the order
torch.sort(stable=True, descending=True) gives, which the reference here uses; torch.topk leaves their order to its
selection algorithm. select_experts sends bf16 CPU logits to the kernel and keeps fp32 on the torch path.
"""

import unittest

import torch

from sglang.jit_kernel.cpu_ops import cpu_kernels_expected, cpu_ops_status, get_cpu_ops
from sglang.srt.layers.moe.router import select_experts, select_experts_torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="cpu")

BF16 = torch.bfloat16
SHAPES = ((64, 8), (8, 2), (128, 1), (60, 6), (16, 16))  # (experts, top k)


def stable_reference(logits: torch.Tensor, top_k: int, renormalize: bool):
    """torch's softmax, then the k largest probabilities with ties taken lower id first (a stable descending sort)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :top_k], ids[:, :top_k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0: the kernels are not used")
class TestMoeRouterKernel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()

    def setUp(self):
        self.assertIsNotNone(self.ops, f"CPU kernels did not load: {cpu_ops_status()}")
        self.gen = torch.Generator().manual_seed(0)

    def logits(self, m: int, e: int, dtype=torch.float32) -> torch.Tensor:
        return (torch.randn(m, e, generator=self.gen) * 2).to(dtype)

    def test_tie_free_rows_equal_torch_topk(self):
        for e, k in SHAPES:
            for renormalize in (True, False):
                for m in (1, 7, 600):  # 600 rows: the kernels' threads share them
                    x = self.logits(m, e)
                    w, ids = self.ops.topk_softmax(x, k, renormalize)
                    rw, rids = select_experts_torch(x, k, renormalize)
                    self.assertEqual((w.dtype, ids.dtype, tuple(ids.shape)), (torch.float32, torch.int32, (m, k)))
                    self.assertTrue(torch.equal(ids, rids), (e, k, renormalize, m))
                    torch.testing.assert_close(w, rw, rtol=1e-6, atol=0)

    def test_bf16_ties_lower_id_first(self):
        ties = 0
        for e, k in SHAPES:
            for renormalize in (True, False):
                x = self.logits(500, e, BF16)
                w, ids = self.ops.topk_softmax(x, k, renormalize)
                rw, rids = stable_reference(x, k, renormalize)
                self.assertTrue(torch.equal(ids, rids), (e, k, renormalize))
                torch.testing.assert_close(w, rw, rtol=1e-6, atol=0)
                _, topk_ids = select_experts_torch(x, k, renormalize)
                ties += (topk_ids != ids).any(dim=1).sum().item()
        self.assertGreater(ties, 0)  # the rule was exercised: torch.topk ordered some tied rows otherwise

    def test_rows_do_not_depend_on_their_batch(self):
        x = self.logits(300, 64, BF16)
        w, ids = self.ops.topk_softmax(x, 8, True)
        for r in (0, 123, 299):
            w1, ids1 = self.ops.topk_softmax(x[r : r + 1], 8, True)
            self.assertTrue(torch.equal(w1, w[r : r + 1]) and torch.equal(ids1, ids[r : r + 1]))

    def test_nan_and_infinite_logits(self):
        x = self.logits(3, 16)
        x[0, 5] = float("nan")  # softmax of the row is NaN: NaN counts as the largest, ids in order
        x[1, :12] = float("-inf")  # the 4 finite logits come first, then the -inf ones (probability 0) by id
        x[2] = float("-inf")  # all -inf: NaN, as in torch
        w, ids = self.ops.topk_softmax(x, 6, False)
        self.assertEqual(ids[0].tolist(), [0, 1, 2, 3, 4, 5])
        self.assertTrue(torch.isnan(w[0]).all() and torch.isnan(w[2]).all())
        self.assertEqual(sorted(ids[1, :4].tolist()), [12, 13, 14, 15])
        self.assertEqual(ids[1, 4:].tolist(), [0, 1])
        self.assertTrue(torch.equal(w[1, 4:], torch.zeros(2)))

    def test_bad_input_is_refused(self):
        with self.assertRaisesRegex(RuntimeError, "top_k"):
            self.ops.topk_softmax(self.logits(2, 8), 9, True)
        with self.assertRaisesRegex(RuntimeError, "bf16 or fp32"):
            self.ops.topk_softmax(self.logits(2, 8).half(), 2, True)

    def test_select_experts_takes_the_kernel_for_bf16_only(self):
        x = self.logits(500, 64, BF16)
        got = select_experts(x, 8, True)
        want = self.ops.topk_softmax(x, 8, True)
        self.assertTrue(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))
        self.assertFalse(torch.equal(got[1], select_experts_torch(x, 8, True)[1]))  # tied rows tell the paths apart
        x32 = self.logits(9, 64)
        got, want = select_experts(x32, 8, True), select_experts_torch(x32, 8, True)
        self.assertTrue(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))


if __name__ == "__main__":
    unittest.main()
