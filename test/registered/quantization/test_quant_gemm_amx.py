"""quant_linear on AMX-INT8 tiles (sgl-kernel/csrc/cpu/quant_gemm_amx.h: level amx, from 8 input rows) gives the same
bits as the VNNI kernel (quant_gemm.h, level avx512_bf16) for every packed format (the fp16, fp32, halves and Q6_K
headers; 4- and 8-bit records, the 8-bit residual pass), bf16 and fp32 activations, row counts that fill 16-row tiles
and leave tails (from 17 rows the groups go in pairs sharing each B tile: 17, 32, 33, 45, 64 rows take a pair with one
row, a full pair, a pair and a one-row group, a pair and a tail, two pairs), and output columns that end inside a
16-row tile. The two compute the same exact int32 block sums
and the same fp32 operations in the same order; the VNNI kernel is itself checked against an fp64 formula
(test_kquant_kernels.py, test_quant_kernels_isa.py). Below 8 rows, and below level amx, the VNNI path runs.
The decode rows of a GGUF Q8_0 lm_head (1 to 255, across each switch point) are held to the fp64 GGUF formula times
the int8 activations the kernels quantize (reproduced here) within fp32 rounding: a change both paths share (a block's
residual-pass sum, quant_block_sum) cannot hide behind their agreement.

From 32 rows of bf16 activations quant_linear dequantizes each weight tile to bf16, the dense path: on AMX-BF16 tiles
at level amx (quant_gemm_amx_dense.h), by VDPBF16PS at avx512_bf16 (quant_gemm_vec_dense.h; AMD EPYC, Xeons without
AMX; on an AMX CPU at the forced level). At each level there is here: each weight is the fp32 d * u + c rounded to
bf16 (torch's round to nearest even of the torch path's fp32 dequantization, packing.unpack_dequantize), so a one-hot
power-of-two activation row gives bf16(x_k * bf16(w[:, k])) bit for bit; random rows are within half a bf16 ulp of the
fp64 product of those weights plus fp32 summation (fp32 outputs: within the summation alone), in the unit walk and
the blocked walks over output tiles (one block and several).
"""

import unittest

import numpy as np
import torch

from sglang.jit_kernel.cpu_ops import cpu_ops_status, get_cpu_ops
from sglang.srt.layers.quantization import packing
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.quant_fixtures import DENSE_PATHS, RECORD_BYTES, dense_levels, random_packed

register_cpu_ci(est_time=15, suite="cpu")


class TestQuantGemmAmx(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()
        if cls.ops is None or not hasattr(cls.ops, "quant_path") or cls.ops.cpu_isa_native() != "amx":
            raise unittest.SkipTest(f"no AMX here (kernels: {cpu_ops_status()})")
        cls.level0 = cls.ops.get_cpu_isa()

    def tearDown(self):
        self.ops.set_cpu_isa(self.level0)

    def test_amx_path_is_taken_from_8_rows(self):
        self.ops.set_cpu_isa("amx")
        self.assertEqual([self.ops.quant_path(m) for m in (1, 7, 8, 31)],
                         ["avx512_vnni", "avx512_vnni", "amx_int8", "amx_int8"])
        self.assertEqual([self.ops.quant_path(m) for m in (32, 256, 4096)], ["amx_bf16_dense"] * 3)
        self.ops.set_cpu_isa("avx512_bf16")
        self.assertEqual([self.ops.quant_path(m) for m in (1, 31, 32, 4096)],
                         ["avx512_vnni", "avx512_vnni", "avx512_bf16_dense", "avx512_bf16_dense"])
        self.ops.set_cpu_isa("avx512_vnni")
        self.assertEqual(self.ops.quant_path(4096), "avx512_vnni")

    def test_same_bits_as_the_vnni_kernel(self):
        gen = torch.Generator().manual_seed(0)
        for fmt in RECORD_BYTES:
            for n, k in ((40, 640), (48, 96)):
                w = random_packed(fmt, n, k, gen)
                for m in (8, 9, 16, 17, 31, 32, 33, 45, 64):
                    # bf16 from 32 rows takes the dense path (below); fp32 keeps the int8 tiles at every row count
                    for dtype in (torch.bfloat16, torch.float32) if m < 32 else (torch.float32,):
                        x = torch.randn(m, k, generator=gen).to(dtype)
                        self.ops.set_cpu_isa("avx512_bf16")
                        want = self.ops.quant_linear(x, w, n, fmt)
                        self.ops.set_cpu_isa("amx")
                        got = self.ops.quant_linear(x, w, n, fmt)
                        with self.subTest(fmt=fmt, n=n, k=k, m=m, dtype=dtype):
                            self.assertTrue(torch.isfinite(want).all())
                            self.assertTrue(torch.equal(got, want), (got.float() - want.float()).abs().max())


    def test_q8_0_decode_rows_against_the_int8_formula(self):
        """The lm_head's decode path (a GGUF Q8_0 table, K 640, outputs past whole 16-row tiles) at the row counts
        decode serves, on both sides of each switch point (7 | 8: VNNI | AMX-INT8 tiles; 16 | 17 | 31: one, one and
        a partial, two 16-row groups; 32 and 255: fp32 on the int8 tiles, bf16 on the dense path): against the fp64 GGUF formula (d q per block of
        32, read from the gguf package's bytes) times the activations the kernel quantizes (int8 + the residual
        pass, reproduced here), within 2^-21 of the u-form magnitudes: what fp32 rounding alone can leave. A wrong
        block scale, a dropped or mis-scaled residual pass, or a lost c * sa term misses by orders more."""
        import gguf.quants as gq

        gen = torch.Generator().manual_seed(4)
        n, k = 200, 640
        w = (torch.randn(n, k, generator=gen) * 0.05).numpy()
        raw = gq.quantize(w, packing.GGUF_Q8_0)
        packed = packing.pack(packing.staging_from_gguf(torch.from_numpy(raw), packing.GGUF_Q8_0), 8)
        blocks = raw.reshape(n, -1, 34)  # fp16 d, 32 x int8 q
        d = torch.from_numpy(blocks[:, :, :2].copy().view(np.float16).astype(np.float64))  # [n, nb, 1]
        q = torch.from_numpy(blocks[:, :, 2:].copy().view(np.int8).astype(np.float64))
        wq = (d * q).reshape(n, k)  # the GGUF formula
        mag = (d.abs() * (q + 128) + 128 * d.abs()).reshape(n, k)  # the kernel's u-form |d| u + |c|
        for m in (1, 7, 8, 16, 17, 31, 32, 255):
            x = torch.randn(m, k, generator=gen)
            a = int8_activations(x)
            self.ops.set_cpu_isa("amx")
            got = self.ops.quant_linear(x, packed, n, 8).double()
            want = a @ wq.T
            bound = 2.0**-21 * (a.abs() @ mag.T) + 1e-30
            with self.subTest(m=m, path=self.ops.quant_path(m)):
                self.assertLessEqual(((got - want).abs() / bound).max().item(), 1.0)
            # bf16 activations (the served dtype): below 32 rows the same path, within the fp32 bound plus the output's
            # rounding; from 32 rows the dense one: the bf16 rows times bf16(d q), within fp32 summation and rounding
            xb = x.bfloat16()
            got16 = self.ops.quant_linear(xb, packed, n, 8).double()
            ulp = torch.pow(2.0, torch.floor(torch.log2(got16.abs().clamp_min(1e-30))) - 7)  # got16 rounds to nearest
            if self.ops.quant_path(m).endswith("_dense"):
                wqb = wq.float().bfloat16().double()  # d q is exact in fp32 (11 + 8 bits)
                want16, slack = xb.double() @ wqb.T, k * 2.0**-24 * (xb.double().abs() @ wqb.abs().T)
            else:
                a16 = int8_activations(xb.float())
                want16, slack = a16 @ wq.T, 2.0**-21 * (a16.abs() @ mag.T)
            with self.subTest(m=m, dtype="bf16", path=self.ops.quant_path(m)):
                self.assertTrue(((got16 - want16).abs() <= ulp / 2 + slack).all())



class TestQuantDensePaths(unittest.TestCase):
    """The dense path at each level this CPU has: amx and avx512_bf16 on an AMX CPU, avx512_bf16 alone without."""

    @classmethod
    def setUpClass(cls):
        cls.ops = get_cpu_ops()
        if cls.ops is None or not hasattr(cls.ops, "quant_path"):
            raise unittest.SkipTest(f"no CPU kernels here ({cpu_ops_status()})")
        cls.levels = dense_levels(cls.ops)
        if not cls.levels:
            raise unittest.SkipTest(f"no dense path at the native level {cls.ops.cpu_isa_native()} (needs avx512_bf16)")
        cls.level0 = cls.ops.get_cpu_isa()

    def tearDown(self):
        self.ops.set_cpu_isa(self.level0)

    def _dense_weights(self, fmt: int, n: int, k: int, gen: torch.Generator):
        """Packed weights whose fp32 scales have at most 11 significant bits (as GGUF's fp16 ones, and d_super * sc),
        so d * u is exact in fp32 and d * u + c rounds once whether fused or not; and their fp32 dequantization."""
        w = random_packed(fmt, n, k, gen)
        head = fmt >> 4
        if head == 3:  # Q6_K's levels are 6-bit (d * sc * u: 11 + 6 + 6 bits)
            w[:, :, 64:] &= 63
        if head in (1, 2):
            hb = 64 * head * 2
            f = w[:, :, :hb].contiguous().view(torch.float32)
            w[:, :, :hb] = f.half().float().contiguous().view(torch.uint8)
        return w, packing.unpack_dequantize(w, fmt, n, k, torch.float32)

    def test_dense_path_is_the_bf16_rounded_weights(self):
        """One-hot rows of +-2^e: every product and partial sum is exact, so each output is bf16(x_k bf16(w[n, k])) bit
        for bit; a wrong scale, an unrounded or misplaced k pair changes bits. 44 rows: a padded last input tile; 300:
        several; 500: the blocked walk (more than kQDensePassBytes of rows at K 640); n 40 (a partial output tile, an
        odd count) and 48; K 640 and 96; n 432 at 300 rows: at avx512_bf16 a blocked walk over two blocks of units
        (kQVecBlockBytes holds 12 units of K 640, n 432 has 14)."""
        gen = torch.Generator().manual_seed(1)
        for level, fmt in ((level, fmt) for level in self.levels for fmt in RECORD_BYTES):
            self.ops.set_cpu_isa(level)
            for n, k in ((40, 640), (48, 96), (432, 640)):
                packed, w32 = self._dense_weights(fmt, n, k, gen)
                wb = w32.bfloat16().double()
                self.assertFalse(torch.equal(wb, w32.double()))  # the rounding is seen
                for m in (44, 300, 500) if n != 432 else (300,):
                    cols = torch.arange(m) % k
                    x = torch.zeros(m, k)
                    signs = torch.randint(0, 2, (m,), generator=gen) * 2 - 1
                    x[torch.arange(m), cols] = signs * torch.pow(2.0, torch.randint(-3, 4, (m,), generator=gen)).float()
                    x = x.bfloat16()
                    self.assertEqual(self.ops.quant_path(m), DENSE_PATHS[level])
                    got = self.ops.quant_linear(x, packed, n, fmt)
                    want = x.double() @ wb.T
                    with self.subTest(level=level, fmt=fmt, n=n, k=k, m=m):
                        self.assertTrue(torch.isfinite(want).all())
                        self.assertTrue(torch.equal(got, want.bfloat16()), (got != want.bfloat16()).sum().item())
                        self.assertTrue(torch.equal(self.ops.quant_linear(x, packed, n, fmt, True), want.float()))

    def test_dense_path_random_rows_within_fp32_summation(self):
        """Random bf16 rows (32: the first dense row count; 1,000: the blocked walk at K 640) against
        the fp64 product of the bf16-rounded weights: fp32 outputs within fp32 summation's bound (K terms:
        K * 2^-24 * sum |x w|), bf16 outputs those rounded, bf16(fp64) on >= 99.9% of them. Against the unrounded
        weights the error is larger than that bound (the weights' rounding is what the dense path adds)."""
        gen = torch.Generator().manual_seed(2)
        for level, fmt in ((level, fmt) for level in self.levels for fmt in RECORD_BYTES):
            self.ops.set_cpu_isa(level)
            for m in (32, 1000):
                n, k = 40, 640
                packed, w32 = self._dense_weights(fmt, n, k, gen)
                wb = w32.bfloat16().double()
                x = torch.randn(m, k, generator=gen).bfloat16()
                got32 = self.ops.quant_linear(x, packed, n, fmt, True).double()
                got = self.ops.quant_linear(x, packed, n, fmt)
                ref = x.double() @ wb.T
                bound = k * 2.0**-24 * (x.double().abs() @ wb.abs().T)
                with self.subTest(level=level, fmt=fmt, m=m):
                    self.assertTrue(((got32 - ref).abs() <= bound).all(), ((got32 - ref).abs() - bound).max())
                    self.assertTrue(torch.equal(got, got32.bfloat16()))
                    self.assertGreaterEqual((got.double() == ref.bfloat16().double()).double().mean().item(), 0.999)
                    self.assertGreater(((got32 - x.double() @ w32.double().T).abs() - bound).max().item(), 0)

    def test_dense_path_not_for_fp32_activations(self):
        """fp32 activations keep the int8 paths at any row count (the bf16 weights would round them): the same bits as
        the VNNI kernel."""
        gen = torch.Generator().manual_seed(3)
        packed = random_packed(20, 40, 640, gen)
        x = torch.randn(300, 640, generator=gen)
        self.ops.set_cpu_isa("avx512_vnni")
        want = self.ops.quant_linear(x, packed, 40, 20)
        for level in self.levels:
            self.ops.set_cpu_isa(level)
            self.assertTrue(torch.equal(self.ops.quant_linear(x, packed, 40, 20), want), level)


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """fp64 [m, k] of what quant_linear's int8 activations for 8-bit weights stand for (quant_layout.h, K a multiple
    of 32): per block of 32, da = fp32(max|x| / 127), q = round-half-even(fp32(x * fp32(1 / da))), the residual
    r = fp32(x - q da) (one rounding, the kernel's FMA) quantized again with fp32(254 / da): da (q + q2 / 254)."""
    m, k = x.shape
    xb = x.float().reshape(m, k // 32, 32)
    da = xb.abs().amax(-1, keepdim=True) / 127.0
    safe = torch.where(da > 0, da, torch.ones_like(da))
    inv = torch.where(da > 0, 1.0 / safe, torch.zeros_like(da))
    q = torch.round(xb * inv)
    r = (xb.double() - q.double() * da.double()).float()
    inv2 = torch.where(da > 0, 254.0 / safe, torch.zeros_like(da))
    q2 = torch.round(r * inv2).clamp(-128, 127)
    return (da.double() * (q.double() + q2.double() / 254.0)).reshape(m, k)


if __name__ == "__main__":
    unittest.main()
