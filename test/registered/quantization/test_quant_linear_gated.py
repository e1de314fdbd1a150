"""quant_linear_gated (sgl-kernel/csrc/cpu/quant_linear_gated.h): a merged [gate | up] quantized projection and the
gated MLP's activation in one call gives the bits of quant_linear followed by silu_and_mul / gelu_tanh_and_mul, for
every packed format, both activations, at levels amx and avx512_bf16 (each level's dense path's gated epilogue
from 32 rows, the int8 paths below), with the prefill row minimum on and off, halves of whole 16-row tiles and halves
that end inside a tile (the unfused sequence), one and two input tiles per unit, padded rows, and calls whose
activations take the blocked walk (more than kQDensePassBytes of rows) over one and several blocks of output tiles.

The walks (quant_gemm_amx_dense.h, quant_gemm_vec_dense.h): a call of many rows gives each row the bits of the same
rows in calls of 32 (at amx their B tiles read once each, from the ring), plain and gated. The models call it through
MergedColumnParallelLinear.forward_gated: LlamaMLP and Gemma3MLP give the same output with and without it.
"""

import unittest
import unittest.mock as mock

import torch

from sglang.jit_kernel.cpu_ops import cpu_ops_status, get_cpu_ops
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.quant_fixtures import RECORD_BYTES, dense_levels, random_packed

register_cpu_ci(est_time=20, suite="cpu")


class TestQuantLinearGated(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()
        if cls.ops is None or not hasattr(cls.ops, "quant_linear_gated"):
            raise unittest.SkipTest(f"no bf16 CPU kernels here ({cpu_ops_status()})")
        cls.level0, cls.threads0 = cls.ops.get_cpu_isa(), cls.ops.get_num_threads()
        cls.amx = cls.ops.cpu_isa_native() == "amx"

    def tearDown(self):
        self.ops.set_cpu_isa(self.level0)
        self.ops.set_num_threads(self.threads0)
        self.ops.set_quant_dense_prefill(False)

    def unfused(self, x, w, n, fmt, act):
        y = self.ops.quant_linear(x, w, n, fmt)
        return self.ops.silu_and_mul(y) if act == "silu" else self.ops.gelu_tanh_and_mul(y)

    def test_same_bits_as_linear_then_activation(self):
        gen = torch.Generator().manual_seed(0)
        levels = ["amx", "avx512_bf16"] if self.amx else [self.level0]
        dense_seen = 0
        for fmt in RECORD_BYTES:
            # halves of 2 and 3 whole tiles (the gated epilogue), and of 20 rows (not whole tiles: the two steps)
            for n, k in ((64, 640), (96, 96), (40, 96)):
                w = random_packed(fmt, n, k, gen)
                for m in (1, 8, 31, 32, 33, 44, 300, 900):
                    x = torch.randn(m, k, generator=gen).bfloat16()
                    for level in levels:
                        self.ops.set_cpu_isa(level)
                        for prefill in (False, True):
                            self.ops.set_quant_dense_prefill(prefill)
                            dense_seen += self.ops.quant_path(m).endswith("_dense") and (n // 2) % 16 == 0
                            for act in ("silu", "gelu_tanh"):
                                got = self.ops.quant_linear_gated(x, w, n, fmt, act)
                                want = self.unfused(x, w, n, fmt, act)
                                with self.subTest(fmt=fmt, n=n, k=k, m=m, level=level, prefill=prefill, act=act):
                                    self.assertEqual(got.shape, (m, n // 2))
                                    self.assertTrue(torch.isfinite(want).all())
                                    self.assertGreater((want != 0).float().mean().item(), 0.3)
                                    self.assertTrue(torch.equal(got, want), (got != want).sum().item())
        if dense_levels(self.ops):
            self.assertGreater(dense_seen, 50)  # the gated epilogue ran, not only the unfused sequence

    def test_walks_give_each_row_the_bits_of_32_row_calls(self):
        """A call of M rows against the same rows in calls of 32 (each B tile read once, from the ring): one thread,
        so that a thread's range holds several blocks of output tiles (K 4,096: 4 tile pairs a block, 16 a range)."""
        levels = dense_levels(self.ops)
        if not levels:
            self.skipTest("the dense path needs avx512_bf16 or amx")
        self.ops.set_num_threads(1)
        gen = torch.Generator().manual_seed(1)
        for level, fmt in ((level, fmt) for level in levels for fmt in (8, 36, 56)):
            self.ops.set_cpu_isa(level)
            for n, k, m in ((256, 4096, 96), (2048, 640, 860), (96, 640, 1000)):
                w = random_packed(fmt, n, k, gen)
                x = torch.randn(m, k, generator=gen).bfloat16()
                for gated in (False, True):
                    call = (lambda t: self.ops.quant_linear_gated(t, w, n, fmt, "silu")) if gated else \
                        (lambda t: self.ops.quant_linear(t, w, n, fmt))
                    whole = call(x)
                    parts = torch.cat([call(x[i: i + 32]) for i in range(0, m - m % 32, 32)] +
                                      ([call(torch.cat([x[m - m % 32:], x[:32 - m % 32]]))[: m % 32]]
                                       if m % 32 else []))
                    with self.subTest(level=level, fmt=fmt, n=n, k=k, m=m, gated=gated):
                        self.assertTrue(torch.equal(whole, parts), (whole != parts).sum().item())

    def test_refuses_what_it_cannot_pair(self):
        w = random_packed(8, 48, 64, torch.Generator().manual_seed(2))
        x = torch.randn(4, 64).bfloat16()
        with self.assertRaisesRegex(RuntimeError, "act must be 'silu' or 'gelu_tanh'"):
            self.ops.quant_linear_gated(x, w, 48, 8, "relu")
        with self.assertRaisesRegex(RuntimeError, "cannot be a \\[gate \\| up\\] pair"):
            self.ops.quant_linear_gated(x, random_packed(8, 47, 64, torch.Generator()), 47, 8, "silu")
        with self.assertRaisesRegex(RuntimeError, "x must be bf16"):
            self.ops.quant_linear_gated(x.float(), w, 48, 8, "silu")


class TestGatedMlpModules(unittest.TestCase):
    """LlamaMLP (silu) and Gemma3MLP (gelu_tanh) on a quantized gate_up take the one call, with the bits of the two."""

    def test_mlp_forward_with_and_without_the_gated_call(self):
        ops = get_cpu_ops()
        if ops is None or not hasattr(ops, "quant_linear_gated"):
            self.skipTest(f"no bf16 CPU kernels here ({cpu_ops_status()})")
        from sglang.srt.layers.linear import MergedColumnParallelLinear
        from sglang.srt.layers.quantization.linear_method import QuantLinearMethod
        from sglang.srt.models.gemma3 import Gemma3MLP
        from sglang.srt.models.llama import LlamaMLP

        gen = torch.Generator().manual_seed(3)
        for mlp in (LlamaMLP(128, 96), Gemma3MLP(128, 96, "gelu_pytorch_tanh")):
            for lin in (mlp.gate_up_proj, mlp.down_proj):  # a packed Q8_0 weight in place of the checkpoint's
                lin.quant_method = QuantLinearMethod("gguf")
                lin.qweight = random_packed(8, lin.output_size, lin.input_size, gen)
                lin.quant_format, lin.quant_bits = 8, 8
            calls, real = [], MergedColumnParallelLinear.forward_gated
            x = torch.randn(40, 128, generator=gen).bfloat16()
            with torch.inference_mode():
                def counted(self, t, act):
                    out = real(self, t, act)
                    calls.append((act, out is not None))  # the one call was made, not the two-step fallback
                    return out

                with mock.patch.object(MergedColumnParallelLinear, "forward_gated", counted):
                    fused = mlp(x)
                with mock.patch.object(MergedColumnParallelLinear, "forward_gated", lambda self, t, act: None):
                    plain = mlp(x)
            with self.subTest(mlp=type(mlp).__name__):
                self.assertEqual(calls, [("silu" if isinstance(mlp, LlamaMLP) else "gelu_tanh", True)])
                self.assertEqual(fused.shape, (40, 128))
                self.assertTrue(torch.equal(fused, plain))
                self.assertGreater((plain != 0).float().mean().item(), 0.9)


if __name__ == "__main__":
    unittest.main()
