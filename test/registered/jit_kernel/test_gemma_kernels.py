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


if __name__ == "__main__":
    unittest.main()
