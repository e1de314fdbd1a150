"""Gemma's two CPU kernels against torch.

RMSNorm (x / rms(x) * (1 + w), in fp32, rounded once; HF Gemma3RMSNorm): the rmsnorm op
given bf16 rows and the fp32 scale 1 + w (sgl-kernel/csrc/cpu/norm.h rmsnorm_row_f32_scale), with and without the
residual add before it, equals HF's formula written out in torch here: bit for bit, as both compute the same fp32
products and round once (the residual sum rounded to bf16 first, as HF adds in the model dtype). Widths 640 (Gemma 3
270M), a multiple of 16, and one with a tail. The model's GemmaRMSNorm takes this kernel on contiguous 2-D rows.

gelu_tanh_and_mul (bf16 [rows, gate | up] -> gelu_tanh(gate) * up; activation.h): torch's F.gelu(approximate="tanh")
rounded to bf16 then times up, rounded. The kernel's tanh is not torch's (Sleef's), so the gelu may differ where
1 + tanh(u) cancels to a few fp32 ulps: only for |gelu| < 1e-3, by at most 2 fp32 ulps of 1 (2.4e-7). Everywhere else
the bf16 values are equal, and the product is exactly the rounded product of that gelu and up.

rmsnorm_pair (Gemma's post-norm, then the next pre-norm with its residual add, in one call; the model's norm_pair)
equals HF's formula applied twice, and the two rmsnorm calls, bit for bit.

The attention prologue (qk_norm_rope_ with the fp32 scales, in place on the fused qkv rows) gives the q and k of the
module path (two GemmaRMSNorm calls, two rotations) bit for bit, local and global layers (their own rope tables).
"""

import unittest

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import cpu_ops_status, get_cpu_ops
from sglang.srt.models.gemma3 import GemmaRMSNorm
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")


def hf_gemma_norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual=None):
    """transformers' Gemma3RMSNorm after the model-dtype residual add."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())
    return out.to(x.dtype), x


class TestGemmaNormKernel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()
        if cls.ops is None:
            raise unittest.SkipTest(f"no bf16 CPU kernels here: {cpu_ops_status()}")

    def test_kernel_equals_hf_formula_bit_for_bit(self):
        torch.manual_seed(0)
        for hidden in (640, 256, 100):
            w = torch.randn(hidden) * 0.5
            x, r = torch.randn(2, 9, hidden).to(torch.bfloat16)
            for residual in (None, r):
                with self.subTest(hidden=hidden, residual=residual is not None):
                    out, res_out = self.ops.rmsnorm(x, residual, 1.0 + w, 1e-6)
                    ref, ref_res = hf_gemma_norm(x, w, 1e-6, residual)
                    self.assertTrue(torch.equal(out, ref), (out.float() - ref.float()).abs().max())
                    if residual is not None:
                        self.assertTrue(torch.equal(res_out, ref_res))

    def test_rounding_once_differs_from_the_llama_order(self):
        """The fp32-scale path is not the bf16-weight one (normalised, rounded, then scaled and rounded again): on
        these rows the two roundings disagree somewhere, so the test above tells them apart."""
        torch.manual_seed(1)
        w = torch.randn(640) * 0.5
        x = torch.randn(16, 640).to(torch.bfloat16)
        once, _ = self.ops.rmsnorm(x, None, 1.0 + w, 1e-6)
        twice, _ = self.ops.rmsnorm(x, None, (1.0 + w).to(torch.bfloat16), 1e-6)
        self.assertFalse(torch.equal(once, twice))

    def test_gelu_tanh_and_mul_matches_torch(self):
        torch.manual_seed(2)
        for scale in (1.0, 4.0, 30.0):
            for inter in (2048, 100):
                with self.subTest(scale=scale, inter=inter):
                    x = (torch.randn(13, 2 * inter) * scale).to(torch.bfloat16)
                    gate, up = x.chunk(2, dim=-1)
                    ref_gelu = F.gelu(gate, approximate="tanh")
                    gelu = self.ops.gelu_tanh_and_mul(torch.cat([gate, torch.ones_like(up)], dim=-1))
                    big = ref_gelu.float().abs() > 1e-3
                    self.assertTrue(torch.equal(gelu[big], ref_gelu[big]))
                    self.assertLessEqual((gelu.float() - ref_gelu.float()).abs().max().item(), 2.4e-7)
                    self.assertTrue(torch.equal(self.ops.gelu_tanh_and_mul(x), gelu * up))

    def test_attention_prologue_equals_module_path(self):
        from transformers import Gemma3TextConfig

        from sglang.srt.models.gemma3 import Gemma3Attention

        cfg = Gemma3TextConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                               intermediate_size=256, num_hidden_layers=2, vocab_size=64, sliding_window=8,
                               max_position_embeddings=512)
        torch.manual_seed(3)
        for window in (8, -1):
            torch.set_default_dtype(torch.bfloat16)  # as the loader builds a bf16 model (the rope table in bf16)
            try:
                attn = Gemma3Attention(cfg, layer_id=0, window=window)
            finally:
                torch.set_default_dtype(torch.float32)
            for norm in (attn.q_norm, attn.k_norm):
                norm.weight.data = torch.randn(64) * 0.5
                norm.refresh()
            qkv = torch.randn(5, (4 + 2) * 64).to(torch.bfloat16)
            positions = torch.tensor([0, 3, 17, 200, 511])
            fused = qkv.clone()
            self.assertTrue(attn._kernel_prologue_(positions, fused))
            q, k, _ = qkv.split([4 * 64, 64, 64], dim=-1)
            q = attn.q_norm(q.reshape(5 * 4, 64))
            k = attn.k_norm(k.reshape(5, 64))
            q, _ = attn.rotary_emb._forward_torch(positions, q.view(5, 4, 64))
            k, _ = attn.rotary_emb._forward_torch(positions, k.view(5, 1, 64))
            with self.subTest(window=window):
                self.assertTrue(torch.equal(fused[:, :256].view(5, 4, 64), q))
                self.assertTrue(torch.equal(fused[:, 256:320].view(5, 1, 64), k))
                self.assertTrue(torch.equal(fused[:, 320:], qkv[:, 320:]))  # v untouched

    def test_model_norm_takes_the_kernel(self):
        norm = GemmaRMSNorm(640)
        norm.weight.data = torch.randn(640) * 0.5
        norm.refresh()
        x, r = torch.randn(2, 5, 640).to(torch.bfloat16)
        calls = []
        real = self.ops.rmsnorm

        class Spy:
            def __getattr__(self, name):
                return getattr(self_ops, name)

            def rmsnorm(self, *a):
                calls.append(a[2].dtype)
                return real(*a)

        self_ops = self.ops
        import sglang.srt.models.gemma3 as gemma3

        orig = gemma3.get_ops_for_dtype
        gemma3.get_ops_for_dtype = lambda dtype: Spy() if dtype == torch.bfloat16 else orig(dtype)
        try:
            out, res = norm(x, r)
        finally:
            gemma3.get_ops_for_dtype = orig
        self.assertEqual(calls, [torch.float32])
        ref, ref_res = hf_gemma_norm(x, norm.weight, 1e-6, r)
        self.assertTrue(torch.equal(out, ref) and torch.equal(res, ref_res))

    def test_norm_pair_equals_two_norms_bit_for_bit(self):
        """rmsnorm_pair (a post-norm, then the next pre-norm with the residual add) against the two rmsnorm calls, and
        HF's formula applied twice; row counts below, at and above a chunk of the region (8 rows); tiny rows, where
        the two eps differ, and unit ones."""
        torch.manual_seed(4)
        for hidden in (640, 256, 100):
            w1, w2 = torch.randn(2, hidden) * 0.5
            for rows, scale in ((1, 3.0), (8, 0.003), (33, 3.0), (33, 0.003)):  # small rows: the eps counts
                x, r = (torch.randn(2, rows, hidden) * scale).to(torch.bfloat16)
                with self.subTest(hidden=hidden, rows=rows, scale=scale):
                    out, res = self.ops.rmsnorm_pair(x, r, 1.0 + w1, 1.0 + w2, 1e-6, 1e-5)
                    mid, _ = hf_gemma_norm(x, w1, 1e-6)
                    ref, ref_res = hf_gemma_norm(mid, w2, 1e-5, r)
                    if scale > 1:  # tiny rows: torch's fp32 mean sums in another order (an ulp here and there)
                        self.assertTrue(torch.equal(out, ref), (out.float() - ref.float()).abs().max())
                        self.assertTrue(torch.equal(res, ref_res))
                    two = self.ops.rmsnorm(self.ops.rmsnorm(x, None, 1.0 + w1, 1e-6)[0], r, 1.0 + w2, 1e-5)
                    self.assertTrue(torch.equal(out, two[0]) and torch.equal(res, two[1]))
        x = torch.randn(3, 64).to(torch.bfloat16)
        with self.assertRaisesRegex(RuntimeError, "rmsnorm_pair: bfloat16 rows and float32 scales"):
            self.ops.rmsnorm_pair(x, x, torch.ones(64).to(torch.bfloat16), torch.ones(64), 1e-6, 1e-6)
        with self.assertRaisesRegex(RuntimeError, "rmsnorm_pair: x and residual"):
            self.ops.rmsnorm_pair(x, x[:2], torch.ones(64), torch.ones(64), 1e-6, 1e-6)

    def test_model_norm_pair_takes_one_call(self):
        """The model's norm_pair: one rmsnorm_pair call for bf16 rows, the modules' two norms otherwise (fp32 rows),
        the same values either way."""
        import sglang.srt.models.gemma3 as gemma3

        a, b = GemmaRMSNorm(640), GemmaRMSNorm(640, eps=1e-5)
        for norm in (a, b):
            norm.weight.data = torch.randn(640) * 0.5
            norm.refresh()
        x, r = torch.randn(2, 7, 640).to(torch.bfloat16)
        calls, self_ops = [], self.ops

        class Spy:
            def __getattr__(self, name):
                return getattr(self_ops, name)

            def rmsnorm_pair(self, *args):
                calls.append(args[4:])
                return self_ops.rmsnorm_pair(*args)

        orig = gemma3.get_cpu_ops
        gemma3.get_cpu_ops = lambda: Spy()
        try:
            out, res = gemma3.norm_pair(a, b, x, r)
            out32, res32 = gemma3.norm_pair(a, b, x.float(), r.float())
        finally:
            gemma3.get_cpu_ops = orig
        self.assertEqual(calls, [(1e-6, 1e-5)])
        ref, ref_res = b(a(x), r)
        self.assertTrue(torch.equal(out, ref) and torch.equal(res, ref_res))
        ref32, ref_res32 = b(a(x.float()), r.float())
        self.assertTrue(torch.equal(out32, ref32) and torch.equal(res32, ref_res32))


if __name__ == "__main__":
    unittest.main()
