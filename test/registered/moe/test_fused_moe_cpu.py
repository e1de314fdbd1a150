"""The fused MoE experts kernel (sgl-kernel/csrc/cpu/moe.h) and its torch path against a float64 per-token reference.

The reference (written here, token by token, pair by pair) computes every dot product in float64 from the same bf16
inputs and rounds where the kernel's semantics round: gate and up to bf16 (a matmul's output), silu(gate) to bf16 and
silu(gate) * up to bf16 (activation.h). bf16 keeps 8 significant bits, so rounding moves a value by at most
U = 2^-8 of itself. The kernel then differs from the reference only by
- the final rounding of out to bf16: at most U |ref|;
- fp32 instead of float64 sums (relative ~1e-7 per sum), which now and then tips a gate/up/act value to the
  neighbouring bf16 (at most 2U of that value, in about 1e-4 of them); one tipped act element moves an output by
  2U |act_n * w2[c, n]|, about 2U / sqrt(N) of a typical |out|.
Hence the kernel's tolerance |out - ref| <= 2U |ref| + U mean|ref|: twice the final rounding, and an absolute term for
outputs near zero after cancellation and a few tipped act elements. The torch path also rounds each expert's output
y_j to bf16 (a bf16 torch.mm), adding up to U sum_j w_j |y_j| (its tolerance adds that). A plain float64 check without
the intermediate roundings guards against a mistake the mirrored reference could share: relative error (Frobenius)
<= 2^-6, the bf16 act carrying three roundings of up to U each.
"""

import unittest

import torch

from sglang.jit_kernel.cpu_ops import cpu_kernels_disabled, cpu_kernels_expected, cpu_ops_status, get_cpu_ops
from sglang.srt.layers.moe import fused_moe_cpu as moe
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

BF16 = torch.bfloat16
U = 2.0**-8  # one bf16 ulp relative to the value (8 significant bits)


def make_experts(num_experts: int, n: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(num_experts, 2 * n, k, generator=g) / k**0.5).to(BF16)
    w2 = (torch.randn(num_experts, k, n, generator=g) / n**0.5).to(BF16)
    return w13, w2


def make_routing(m: int, top_k: int, experts, seed: int = 1):
    """top_k distinct experts per token drawn from the list `experts`, softmax weights."""
    g = torch.Generator().manual_seed(seed)
    experts = torch.as_tensor(experts)
    ids = torch.stack([experts[torch.randperm(len(experts), generator=g)[:top_k]] for _ in range(m)])
    weights = torch.softmax(torch.randn(m, top_k, generator=g), -1)
    return weights, ids


def reference(hidden, w13, w2, topk_weights, topk_ids, mirror_rounding=True):
    """(out, S) in float64, token by token: out[m] = sum_j w_j * y_j and S[m] = sum_j w_j |y_j|."""
    num_experts, n = w13.shape[0], w13.shape[1] // 2
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    mag = torch.zeros(hidden.shape, dtype=torch.float64)
    bf = (lambda t: t.to(BF16).double()) if mirror_rounding else (lambda t: t)
    for m in range(hidden.shape[0]):
        x = hidden[m].double()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])
            if not 0 <= e < num_experts:
                continue
            gate = bf(w13[e, :n].double() @ x)
            up = bf(w13[e, n:].double() @ x)
            act = bf(bf(gate * torch.sigmoid(gate)) * up)
            y = w2[e].double() @ act
            out[m] += float(topk_weights[m, j]) * y
            mag[m] += float(topk_weights[m, j]) * y.abs()
    return out, mag


class _Check:
    def assert_within(self, out, ref, mag, fallback=False):
        self.assertEqual((out.shape, out.dtype), (ref.shape, BF16))
        err = (out.double() - ref).abs()
        tol = 2 * U * ref.abs() + U * ref.abs().mean()
        if fallback:
            tol = tol + U * mag
        worst = (err / tol).max().item()
        self.assertLessEqual(worst, 1.0, f"max |out - ref| / tolerance = {worst:.3f} (max error {err.max().item():.3g})")


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0: the kernel is not used")
class TestFusedMoeKernel(unittest.TestCase, _Check):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()

    def setUp(self):
        self.assertIsNotNone(self.ops, f"CPU kernels did not load: {cpu_ops_status()}")

    def run_case(self, m, top_k, num_experts, n, k, experts=None, ids_dtype=torch.int64, seed=0):
        w13, w2 = make_experts(num_experts, n, k, seed)
        weights, ids = make_routing(m, top_k, range(num_experts) if experts is None else experts, seed + 1)
        hidden = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 2)).to(BF16)
        w13p, w2p = moe.pack_moe_weights(w13, w2)
        out = moe.fused_experts_cpu(hidden, w13p, w2p, weights, ids.to(ids_dtype))
        ref, mag = reference(hidden, w13, w2, weights, ids)
        self.assert_within(out, ref, mag)
        return hidden, (w13, w2), (w13p, w2p), weights, ids, out

    def test_decode_one_token(self):
        self.run_case(m=1, top_k=8, num_experts=64, n=128, k=256)  # E = 64, k = 8
        self.run_case(m=1, top_k=1, num_experts=4, n=64, k=128)  # k = 1

    def test_prefill_batches(self):
        # 70 tokens x 8 of 64 experts: tails of the 8-slot register tile; 300 x 2 of 4: experts with several 64-slot
        # row blocks and a tail block
        self.run_case(m=70, top_k=8, num_experts=64, n=96, k=224, ids_dtype=torch.int32)
        self.run_case(m=300, top_k=2, num_experts=4, n=64, k=96)

    def test_experts_without_tokens_and_one_expert_with_all(self):
        self.run_case(m=37, top_k=3, num_experts=16, n=64, k=128, experts=[2, 5, 11, 12])  # 12 experts idle
        self.run_case(m=45, top_k=1, num_experts=8, n=32, k=64, experts=[6])  # expert 6 gets every token
        self.run_case(m=1, top_k=1, num_experts=8, n=32, k=64, experts=[7])  # the last expert

    def test_invalid_ids_contribute_nothing(self):
        """An id outside [0, E) (-1 marks another rank's expert under expert parallelism) takes no slot."""
        w13, w2 = make_experts(8, 32, 64)
        weights, ids = make_routing(9, 3, range(8))
        ids[0, 1], ids[4, 0], ids[8] = -1, 8, -1
        hidden = torch.randn(9, 64).to(BF16)
        out = moe.fused_experts_cpu(hidden, *moe.pack_moe_weights(w13, w2), weights, ids)
        ref, mag = reference(hidden, w13, w2, weights, ids)
        self.assert_within(out, ref, mag)
        self.assertTrue(torch.equal(out[8], torch.zeros_like(out[8])))

    def test_plain_float64_semantics(self):
        hidden, (w13, w2), _, weights, ids, out = self.run_case(m=16, top_k=4, num_experts=16, n=128, k=256)
        exact, _ = reference(hidden, w13, w2, weights, ids, mirror_rounding=False)
        rel = ((out.double() - exact).norm() / exact.norm()).item()
        self.assertLess(rel, 2.0**-6)

    def test_decode_reads_only_the_routed_experts(self):
        """NaN in every weight of the experts a token does not use leaves its output unchanged, bit for bit."""
        hidden, (w13, w2), _, weights, ids, out = self.run_case(m=1, top_k=8, num_experts=64, n=64, k=128, seed=5)
        unused = torch.ones(64, dtype=torch.bool)
        unused[ids[0]] = False
        w13[unused], w2[unused] = float("nan"), float("nan")
        poisoned = moe.fused_experts_cpu(hidden, *moe.pack_moe_weights(w13, w2), weights, ids)
        self.assertTrue(torch.equal(poisoned, out))

    def test_batch_and_thread_invariance(self):
        """A token's output is the same bits alone, in any batch, and with any thread count."""
        hidden, _, packed, weights, ids, out = self.run_case(m=40, top_k=4, num_experts=16, n=64, k=128)
        for rows in (slice(0, 1), slice(7, 8), slice(3, 20), slice(39, 40)):
            self.assertTrue(torch.equal(moe.fused_experts_cpu(hidden[rows], *packed, weights[rows], ids[rows]), out[rows]))
        ops = get_cpu_ops()  # the kernels' own thread pool (sgl-kernel/csrc/cpu/parallel.h)
        threads = ops.get_num_threads()
        try:
            for t in (1, 3, 8):
                ops.set_num_threads(t)
                self.assertTrue(torch.equal(moe.fused_experts_cpu(hidden, *packed, weights, ids), out), t)
        finally:
            ops.set_num_threads(threads)

    def test_strided_hidden_and_workspace(self):
        hidden, _, packed, weights, ids, out = self.run_case(m=12, top_k=2, num_experts=8, n=32, k=64)
        wide = torch.zeros(12, 96, dtype=BF16)
        wide[:, 16:80] = hidden
        self.assertTrue(torch.equal(moe.fused_experts_cpu(wide[:, 16:80], *packed, weights, ids), out))
        nbytes = moe.fused_moe_cpu_workspace_bytes(12, 2, 8, 64, 32)
        workspace = torch.full((nbytes,), 255, dtype=torch.uint8)  # stale contents must not matter
        self.assertTrue(torch.equal(moe.fused_experts_cpu(hidden, *packed, weights, ids, workspace), out))
        with self.assertRaisesRegex(RuntimeError, "workspace must be"):
            self.ops.fused_experts(hidden, *packed, weights, ids, workspace[:-1])

    def test_workspace_bytes_formula(self):
        """The Python formula the memory plan charges is the kernel's own."""
        for m, top_k, e, k, n in ((1, 8, 64, 1024, 256), (2048, 8, 64, 1024, 256), (3, 1, 1, 32, 32), (0, 2, 4, 64, 32),
                                  (333, 6, 160, 5120, 1536)):
            self.assertEqual(moe.fused_moe_cpu_workspace_bytes(m, top_k, e, k, n), self.ops.moe_workspace_bytes(m, top_k, e, n, k))
        # M = 2048, k = 8, K = 1024, N = 256: act 8 MiB + acc 8 MiB + routing 128 KiB
        self.assertEqual(moe.fused_moe_cpu_workspace_bytes(2048, 8, 64, 1024, 256), 16 * 2**20 + 2**17 + 2 * 320)

    def test_packing_round_trip(self):
        w13, w2 = make_experts(3, 32, 64)
        w13p, w2p = moe.pack_moe_weights(w13, w2)
        self.assertEqual((w13p.shape, w2p.shape, w13p.dtype), (w13.shape, w2.shape, BF16))
        self.assertTrue(torch.equal(moe.unpack_moe_weight(w13p, True), w13))
        self.assertTrue(torch.equal(moe.unpack_moe_weight(w2p, False), w2))
        params = (torch.nn.Parameter(w13.clone(), requires_grad=False), torch.nn.Parameter(w2.clone(), requires_grad=False))
        self.assertTrue(moe.prepack_moe_weights_(*params))
        self.assertTrue(torch.equal(params[0].data, w13p) and params[0].vnni_packed and params[1].vnni_packed)
        self.assertFalse(moe.prepack_moe_weights_(*params))  # already packed

    def test_shapes_outside_the_kernel_are_refused_and_served_by_torch(self):
        w13, w2 = make_experts(4, 40, 48)  # N = 40, K = 48: not multiples of 32
        weights, ids = make_routing(5, 2, range(4))
        hidden = torch.randn(5, 48).to(BF16)
        with self.assertRaisesRegex(ValueError, "multiples of 32"):
            moe.pack_moe_weights(w13, w2)
        with self.assertRaisesRegex(RuntimeError, "must be multiples of 32"):
            self.ops.fused_experts(hidden, w13, w2, weights, ids)
        self.assertFalse(moe.prepack_moe_weights_(w13, w2))
        ref, mag = reference(hidden, w13, w2, weights, ids)
        self.assert_within(moe.fused_experts_cpu(hidden, w13, w2, weights, ids), ref, mag, fallback=True)

    def test_torch_path_of_packed_weights(self):
        """Kernels switched off: packed weights are unpacked per expert and give the torch path's result."""
        hidden, (w13, w2), packed, weights, ids, out = self.run_case(m=20, top_k=4, num_experts=16, n=64, k=128)
        with cpu_kernels_disabled():
            torch_out = moe.fused_experts_cpu(hidden, *packed, weights, ids)
        self.assertTrue(torch.equal(torch_out, moe.grouped_experts_torch(hidden, w13, w2, weights, ids)))
        ref, mag = reference(hidden, w13, w2, weights, ids)
        self.assert_within(torch_out, ref, mag, fallback=True)


class TestFusedMoeTorchPath(unittest.TestCase, _Check):
    """The torch path, on any CPU: the same cases as the kernel against the same reference."""

    def test_cases(self):
        for m, top_k, e, n, k, experts in ((1, 8, 64, 64, 128, None), (1, 1, 4, 32, 64, None), (37, 3, 16, 64, 128, [2, 5, 11]),
                                           (45, 1, 8, 32, 64, [6]), (30, 2, 6, 40, 48, None)):
            w13, w2 = make_experts(e, n, k)
            weights, ids = make_routing(m, top_k, range(e) if experts is None else experts)
            hidden = torch.randn(m, k).to(BF16)
            with cpu_kernels_disabled():
                out = moe.fused_experts_cpu(hidden, w13, w2, weights, ids)
            ref, mag = reference(hidden, w13, w2, weights, ids)
            self.assert_within(out, ref, mag, fallback=True)


if __name__ == "__main__":
    unittest.main()
