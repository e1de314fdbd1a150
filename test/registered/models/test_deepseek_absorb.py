"""The absorbed MLA products (models/deepseek_mla.KVBProjection) against einsums over the checkpoint's own
kv_b_proj layout: after arrange() rewrites each head's block as [W_UK^T | W_UV] in place, q_nope_h @ W_UK_h and
o_h @ W_UV_h^T still give the checkpoint's products, on the CPU kernels' per-head path (few bf16 rows: GEMV at one
row, AMX / GEMV up to layers/linear.SMALL_M_ROWS) and on the bmm path (fp32, or more rows); the bytes held are the
checkpoint's (no copy)."""

import unittest

import torch

from sglang.srt.layers.linear import SMALL_M_ROWS
from sglang.srt.models.deepseek_mla import KVBProjection
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

HEADS, NOPE, V, KV_LORA = 4, 64, 96, 256


def projection(dtype):
    gen = torch.Generator().manual_seed(0)
    checkpoint = torch.randn(HEADS * (NOPE + V), KV_LORA, generator=gen, dtype=torch.float64) / KV_LORA ** 0.5
    proj = KVBProjection(HEADS, NOPE, V, KV_LORA)
    proj.weight.data = proj.weight.data.to(dtype)
    proj.weight.data.copy_(checkpoint)
    proj.arrange()
    per_head = checkpoint.to(dtype).double().view(HEADS, NOPE + V, KV_LORA)  # the values the model holds
    return proj, per_head[:, :NOPE], per_head[:, NOPE:]


class TestAbsorbedProducts(unittest.TestCase):
    def check(self, dtype, rows, tol):
        proj, w_uk, w_uv = projection(dtype)
        storage = proj.weight.data_ptr()
        gen = torch.Generator().manual_seed(rows)
        q = torch.randn(rows, HEADS, NOPE, generator=gen, dtype=torch.float64).to(dtype)
        o = torch.randn(rows, HEADS, KV_LORA, generator=gen, dtype=torch.float64).to(dtype)
        got_q = proj.per_head(q.transpose(0, 1).contiguous(), proj.w_uk_t())  # [H, N, kv_lora]
        got_o = proj.per_head(o.transpose(0, 1).contiguous(), proj.w_uv())  # [H, N, v]
        want_q = torch.einsum("nhp,hpc->hnc", q.double(), w_uk)
        want_o = torch.einsum("nhc,hvc->hnv", o.double(), w_uv)
        for got, want in ((got_q, want_q), (got_o, want_o)):
            self.assertEqual(got.dtype, dtype)
            err = ((got.double() - want).abs().max() / want.abs().max()).item()
            self.assertLess(err, tol, (dtype, rows))
        self.assertEqual(proj.weight.data_ptr(), storage)
        self.assertEqual(proj.weight.numel(), HEADS * (NOPE + V) * KV_LORA)

    def test_bf16_kernel_rows(self):
        for rows in (1, 3, 16, SMALL_M_ROWS):
            self.check(torch.bfloat16, rows, 2e-2)

    def test_bf16_bmm_rows(self):
        self.check(torch.bfloat16, SMALL_M_ROWS + 5, 2e-2)

    def test_fp32(self):
        for rows in (1, 7):
            self.check(torch.float32, rows, 1e-5)


if __name__ == "__main__":
    unittest.main()
