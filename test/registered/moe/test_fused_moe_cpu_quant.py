"""The fused MoE experts kernel on block-quantized experts (sgl-kernel/csrc/cpu/moe_quant.h) against a float64
per-token reference.

Weights: GGUF Q4_0 / Q4_1 / Q8_0 blocks made and dequantized by the `gguf` package (independent of our packing), and
int8 blocks (quantize_experts_int8) decoded here from their staging bytes. The kernel quantizes its activations to int8
per 32 values as quant_linear does (hidden per token, silu(gate) * up per slot; for 8-bit weights a second pass over
the rounding residual), so the reference emulates that quantization (in float32, as the kernel computes the scales)
and otherwise computes in float64, rounding where the kernel rounds (gate, up, silu, act to bf16). The differences
left are fp32 sums and the final bf16 rounding (see test_fused_moe_cpu.py), and, where an fp32 sum tips an act value
to the neighbouring bf16, the requantization of its 32-value block: tolerance 2U |ref| + 2U mean|ref| (U = 2^-8).
Against the exact product (no activation quantization) the relative error stays below 2^-5: one int8 pass errs by up
to amax / 254 per value (~1% of the output measured for Q4 weights, ~0.4% with the residual pass).
The torch path dequantizes the routed experts to bf16 and runs torch.mm: it is compared with the bf16 reference on
those bf16 weights (test_fused_moe_cpu.py's tolerance for it).
"""

import unittest

import numpy as np
import torch

from sglang.jit_kernel.cpu_ops import cpu_kernels_disabled, cpu_kernels_expected
from sglang.srt.layers.moe import fused_moe_cpu as moe
from sglang.srt.layers.quantization import packing
from sglang.srt.layers.quantization.linear_method import quant_kernels
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

BF16 = torch.bfloat16
U = 2.0**-8
GGUF_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
RESIDUAL_SCALE = 254.0  # quant_gemm.h's kResidualScale


def quant_experts(kind: str, num_experts: int, rows: int, cols: int, seed: int):
    """(QuantExpertWeights, their float64 values [E, rows, cols]) for kind in Q4_0 / Q4_1 / Q8_0 / int8."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((num_experts, rows, cols)) / cols**0.5).astype(np.float32)
    if kind == "int8":
        q = moe.quantize_experts_int8(torch.from_numpy(w))
        staging = torch.stack([packing.staging_q8_blocks(torch.from_numpy(we)) for we in w])
        raw = staging.numpy().reshape(num_experts, rows, -1, 36)
        d = raw[..., 0:2].copy().view(np.float16).astype(np.float64)
        c = raw[..., 2:4].copy().view(np.float16).astype(np.float64)
        values = (d * raw[..., 4:].astype(np.float64) + c).reshape(num_experts, rows, cols)
        return q, torch.from_numpy(values)
    import gguf.quants as gq

    t = GGUF_TYPES[kind]
    raws = [gq.quantize(we, t) for we in w]
    values = np.stack([gq.dequantize(r, t).reshape(rows, cols) for r in raws]).astype(np.float64)
    staging = torch.stack([packing.staging_from_gguf(torch.from_numpy(r), t) for r in raws])
    return moe.pack_quant_experts(staging, cols), torch.from_numpy(values)


def quantize_acts(v: torch.Tensor, residual: bool) -> torch.Tensor:
    """quantize_row_q8 on rows of v (fp32 values, length a multiple of 32), back as float64 values."""
    b = v.float().reshape(*v.shape[:-1], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    q = torch.round(b * inv).clamp(-128, 127)
    out = q.double() * d.double()
    if residual:
        r = (b.double() - q.double() * d.double()).float()
        inv2 = torch.where(d > 0, RESIDUAL_SCALE / d, torch.zeros_like(d))
        out = out + torch.round(r * inv2).clamp(-128, 127).double() * (d.double() / RESIDUAL_SCALE)
    return out.reshape(v.shape)


def reference(hidden, w13, w2, bits13, bits2, topk_weights, topk_ids, quantized_acts=True, mirror_rounding=True):
    """(out, S) in float64, token by token: out[m] = sum_j w_j * y_j and S[m] = sum_j w_j |y_j|; w13 [E, 2N, K] and
    w2 [E, K, N] are float64 weight values."""
    n = w13.shape[1] // 2
    bf = (lambda t: t.to(BF16).double()) if mirror_rounding else (lambda t: t)
    xq = quantize_acts(hidden.float(), bits13 == 8) if quantized_acts else hidden.double()
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    mag = torch.zeros(hidden.shape, dtype=torch.float64)
    for m in range(hidden.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[m, j])
            gate, up = bf(w13[e, :n] @ xq[m]), bf(w13[e, n:] @ xq[m])
            act = bf(bf(gate * torch.sigmoid(gate)) * up)
            if quantized_acts:
                act = quantize_acts(act.float(), bits2 == 8)
            y = w2[e] @ act
            out[m] += float(topk_weights[m, j]) * y
            mag[m] += float(topk_weights[m, j]) * y.abs()
    return out, mag


def routing(m: int, top_k: int, experts, seed: int):
    g = torch.Generator().manual_seed(seed)
    experts = torch.as_tensor(experts)
    ids = torch.stack([experts[torch.randperm(len(experts), generator=g)[:top_k]] for _ in range(m)])
    return torch.softmax(torch.randn(m, top_k, generator=g), -1), ids


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0: the kernel is not used")
class TestFusedMoeQuantKernel(unittest.TestCase):
    def setUp(self):
        self.assertIsNotNone(quant_kernels(), "the quantized kernels did not load (AVX-512 VNNI expected with BF16)")

    def check(self, kinds, m, top_k, num_experts, n, k, experts=None, seed=0):
        w13q, w13 = quant_experts(kinds[0], num_experts, 2 * n, k, seed)
        w2q, w2 = quant_experts(kinds[1], num_experts, k, n, seed + 1)
        weights, ids = routing(m, top_k, range(num_experts) if experts is None else experts, seed + 2)
        hidden = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + 3)).to(BF16)
        nbytes = moe.fused_moe_cpu_workspace_bytes(m, top_k, num_experts, k, n, w13q.bits, w2q.bits)
        workspace = torch.full((nbytes,), 255, dtype=torch.uint8)
        out = moe.fused_experts_cpu(hidden, w13q, w2q, weights, ids, workspace)
        ref, _ = reference(hidden, w13, w2, w13q.bits, w2q.bits, weights, ids)
        self.assertEqual((out.shape, out.dtype), (hidden.shape, BF16))
        worst = ((out.double() - ref).abs() / (2 * U * ref.abs() + 2 * U * ref.abs().mean())).max().item()
        self.assertLessEqual(worst, 1.0, f"{kinds}: max |out - ref| / tolerance = {worst:.3f}")
        exact, _ = reference(hidden, w13, w2, 0, 0, weights, ids, quantized_acts=False, mirror_rounding=False)
        self.assertLess(((out.double() - exact).norm() / exact.norm()).item(), 2.0**-5, kinds)
        return hidden, (w13q, w2q), weights, ids, out

    def test_formats(self):
        """Every format in w13 and in w2, 4 and 8 bits mixed, with register-tile and row-block tails."""
        self.check(("Q4_0", "Q4_1"), m=70, top_k=8, num_experts=16, n=64, k=128)
        self.check(("Q8_0", "int8"), m=23, top_k=2, num_experts=4, n=96, k=64)
        self.check(("int8", "Q4_0"), m=9, top_k=3, num_experts=8, n=32, k=96)
        self.check(("Q4_1", "Q8_0"), m=130, top_k=1, num_experts=2, n=32, k=64)

    def test_decode_and_routing_edges(self):
        self.check(("Q4_1", "Q4_1"), m=1, top_k=8, num_experts=64, n=64, k=128)  # E = 64, k = 8
        self.check(("Q8_0", "Q8_0"), m=1, top_k=1, num_experts=4, n=32, k=64)  # k = 1
        self.check(("Q4_0", "Q8_0"), m=30, top_k=2, num_experts=16, n=32, k=64, experts=[3, 9])  # 14 experts idle
        self.check(("int8", "int8"), m=17, top_k=1, num_experts=8, n=32, k=64, experts=[0])  # one expert gets all

    def test_decode_reads_only_the_routed_experts(self):
        hidden, (w13q, w2q), weights, ids, out = self.check(("Q4_1", "Q8_0"), m=1, top_k=4, num_experts=32, n=64, k=128)
        unused = torch.ones(32, dtype=torch.bool)
        unused[ids[0]] = False
        for q in (w13q, w2q):
            q.packed[unused] = 0xFF  # fp16 d = c = NaN in every record
        self.assertTrue(torch.equal(moe.fused_experts_cpu(hidden, w13q, w2q, weights, ids), out))

    def test_batch_invariance(self):
        hidden, (w13q, w2q), weights, ids, out = self.check(("Q4_0", "Q8_0"), m=20, top_k=4, num_experts=8, n=32, k=64)
        for rows in (slice(0, 1), slice(5, 6), slice(2, 17)):
            self.assertTrue(torch.equal(moe.fused_experts_cpu(hidden[rows], w13q, w2q, weights[rows], ids[rows]), out[rows]))

    def test_below_avx512_bf16_the_torch_path_serves(self):
        """Forced below avx512_bf16 (isa.h) the kernel refuses and fused_experts_cpu takes the torch path instead."""
        ops = quant_kernels()
        w13q, _ = quant_experts("Q4_0", 4, 64, 64, 0)
        w2q, _ = quant_experts("Q8_0", 4, 64, 32, 1)
        weights, ids = routing(3, 2, range(4), 2)
        hidden = torch.randn(3, 64).to(BF16)
        with cpu_kernels_disabled():
            torch_out = moe.fused_experts_cpu(hidden, w13q, w2q, weights, ids)
        native = ops.get_cpu_isa()
        try:
            for level in ("avx512_vnni", "avx2"):
                ops.set_cpu_isa(level)
                self.assertFalse(ops.moe_quant_supported())
                self.assertTrue(torch.equal(moe.fused_experts_cpu(hidden, w13q, w2q, weights, ids), torch_out), level)
                with self.assertRaisesRegex(RuntimeError, f"needs the ISA level avx512_bf16 .* '{level}'"):
                    ops.fused_experts_quant(hidden, w13q.packed, w2q.packed, 4, 8, weights, ids)
        finally:
            ops.set_cpu_isa(native)
        self.assertFalse(torch.equal(moe.fused_experts_cpu(hidden, w13q, w2q, weights, ids), torch_out))  # the kernel

    def test_workspace_bytes_formula(self):
        ops = quant_kernels()
        for m, top_k, e, k, n in ((1, 8, 64, 1024, 256), (2048, 8, 64, 1024, 256), (5, 3, 7, 96, 64)):
            for b13, b2 in ((4, 4), (4, 8), (8, 4), (8, 8)):
                self.assertEqual(moe.fused_moe_cpu_workspace_bytes(m, top_k, e, k, n, b13, b2),
                                 ops.moe_quant_workspace_bytes(m, top_k, e, n, k, b13, b2))
        with self.assertRaisesRegex(RuntimeError, "workspace must be"):
            hidden, (w13q, w2q), weights, ids, _ = self.check(("Q4_0", "Q4_0"), m=3, top_k=2, num_experts=4, n=32, k=64)
            ops.fused_experts_quant(hidden, w13q.packed, w2q.packed, 4, 4, weights, ids,
                                    torch.empty(moe.fused_moe_cpu_workspace_bytes(3, 2, 4, 64, 32, 4, 4) - 1, dtype=torch.uint8))


class TestFusedMoeQuantTorchPath(unittest.TestCase):
    def test_torch_path_dequantizes_to_bf16(self):
        for kinds, m, top_k, e, n, k in ((("Q4_0", "Q8_0"), 12, 2, 8, 32, 64), (("int8", "Q4_1"), 1, 4, 16, 64, 32)):
            w13q, w13 = quant_experts(kinds[0], e, 2 * n, k, 0)
            w2q, w2 = quant_experts(kinds[1], e, k, n, 1)
            weights, ids = routing(m, top_k, range(e), 2)
            hidden = torch.randn(m, k).to(BF16)
            with cpu_kernels_disabled():
                out = moe.fused_experts_cpu(hidden, w13q, w2q, weights, ids)
            w13b, w2b = w13.to(BF16).double(), w2.to(BF16).double()  # what the torch path multiplies by
            ref, mag = reference(hidden, w13b, w2b, 0, 0, weights, ids, quantized_acts=False)
            tol = 2 * U * ref.abs() + U * ref.abs().mean() + U * mag  # + each y_j rounded to bf16 (a bf16 torch.mm)
            self.assertLessEqual(((out.double() - ref).abs() / tol).max().item(), 1.0, kinds)


if __name__ == "__main__":
    unittest.main()
