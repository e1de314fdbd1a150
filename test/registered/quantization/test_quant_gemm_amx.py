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

From 256 rows of bf16 activations quant_linear dequantizes each weight tile into three bf16 terms on AMX-BF16 tiles
(quant_gemm_amx_dense.h): hi + mid + lo is the fp32 weight d * u + c exactly, so a one-hot power-of-two activation
row gives bf16(x_k * w[:, k]) bit for bit (the torch path's fp32 dequantization, packing.unpack_dequantize); random
rows are within half a bf16 ulp of the fp64 product plus fp32 summation, far inside the int8 paths' bound.
"""

import unittest

import numpy as np
import torch

from sglang.jit_kernel.cpu_ops import cpu_ops_status, get_cpu_ops
from sglang.srt.layers.quantization import packing
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="cpu")

RECORD_BYTES = {4: 64 + 256, 8: 64 + 512, 20: 128 + 256, 24: 128 + 512, 36: 256 + 256, 40: 256 + 512, 56: 64 + 512}


def random_packed(fmt: int, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 [tiles, blocks, record bytes]: random level bytes under headers of sane magnitudes for the format."""
    nb, tiles = (k + 31) // 32, (n + 15) // 16
    p = torch.randint(0, 256, (tiles, nb, RECORD_BYTES[fmt]), dtype=torch.uint8, generator=gen)
    head = fmt >> 4

    def put(lo: int, values: torch.Tensor) -> None:
        raw = values.contiguous().view(torch.uint8).view(tiles, nb, -1)
        p[:, :, lo: lo + raw.shape[-1]] = raw

    if head == 0:  # 16 fp16 d, 16 fp16 c
        put(0, (torch.randn(tiles, nb, 32, generator=gen) * 1e-2).half())
    elif head in (1, 2):  # fp32 d, c (halves: two of each)
        put(0, torch.randn(tiles, nb, 32 * head, generator=gen) * 1e-2)
    else:  # Q6_K: 16 fp16 d, then 2 x 16 int8 scales
        put(0, (torch.randn(tiles, nb, 16, generator=gen) * 1e-3).half())
        put(32, torch.randint(-32, 32, (tiles, nb, 32), dtype=torch.int8, generator=gen))
    return p


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
        self.assertEqual([self.ops.quant_path(m) for m in (1, 7, 8, 64)],
                         ["avx512_vnni", "avx512_vnni", "amx_int8", "amx_int8"])
        self.assertEqual([self.ops.quant_path(m) for m in (255, 256, 4096)], ["amx_int8", "amx_bf16_dense", "amx_bf16_dense"])
        self.ops.set_cpu_isa("avx512_bf16")
        self.assertEqual(self.ops.quant_path(64), "avx512_vnni")
        self.assertEqual(self.ops.quant_path(4096), "avx512_vnni")

    def test_same_bits_as_the_vnni_kernel(self):
        gen = torch.Generator().manual_seed(0)
        for fmt in RECORD_BYTES:
            for n, k in ((40, 640), (48, 96)):
                w = random_packed(fmt, n, k, gen)
                for m in (8, 9, 16, 17, 32, 33, 45, 64):
                    for dtype in (torch.bfloat16, torch.float32):
                        x = torch.randn(m, k, generator=gen).to(dtype)
                        self.ops.set_cpu_isa("avx512_bf16")
                        want = self.ops.quant_linear(x, w, n, fmt)
                        self.ops.set_cpu_isa("amx")
                        got = self.ops.quant_linear(x, w, n, fmt)
                        with self.subTest(fmt=fmt, n=n, k=k, m=m, dtype=dtype):
                            self.assertTrue(torch.isfinite(want).all())
                            self.assertTrue(torch.equal(got, want), (got.float() - want.float()).abs().max())


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

    def test_dense_path_is_the_fp32_weights_exactly(self):
        """One-hot rows of +-2^e: every product and partial sum is exact, so each output is bf16(x_k w[n, k]) bit for
        bit; a lost term (mid or lo), a wrong scale or a misplaced k pair changes bits. 260 / 300 rows: the padded last
        input tile; n 40 (a partial output tile, an odd count) and 48; K 640 and 96."""
        self.ops.set_cpu_isa("amx")
        gen = torch.Generator().manual_seed(1)
        for fmt in RECORD_BYTES:
            for n, k in ((40, 640), (48, 96)):
                packed, w32 = self._dense_weights(fmt, n, k, gen)
                for m in (260, 300):
                    cols = torch.arange(m) % k
                    x = torch.zeros(m, k)
                    signs = torch.randint(0, 2, (m,), generator=gen) * 2 - 1
                    x[torch.arange(m), cols] = signs * torch.pow(2.0, torch.randint(-3, 4, (m,), generator=gen)).float()
                    x = x.bfloat16()
                    self.assertEqual(self.ops.quant_path(m), "amx_bf16_dense")
                    got = self.ops.quant_linear(x, packed, n, fmt)
                    want = (x.double() @ w32.double().T).bfloat16()
                    with self.subTest(fmt=fmt, n=n, k=k, m=m):
                        self.assertTrue(torch.isfinite(want.float()).all())
                        self.assertTrue(torch.equal(got, want), (got != want).sum().item())

    def test_dense_path_random_rows_within_fp32_summation(self):
        """Random bf16 rows (1,000: three passes over the output tiles at K 640) against the fp64 product: within half
        a bf16 ulp of it plus fp32 summation's bound (3K terms: 3K * 2^-24 * sum |x w|), and bf16(fp64) on >= 99.9% of outputs
        (the int8 paths miss it on 2% (8-bit weights) to 70% (4-bit) of these)."""
        self.ops.set_cpu_isa("amx")
        gen = torch.Generator().manual_seed(2)
        for fmt in RECORD_BYTES:
            n, k, m = 40, 640, 1000
            packed, w32 = self._dense_weights(fmt, n, k, gen)
            x = torch.randn(m, k, generator=gen).bfloat16()
            got = self.ops.quant_linear(x, packed, n, fmt).double()
            ref = x.double() @ w32.double().T
            mag = x.double().abs() @ w32.double().abs().T
            ulp = torch.pow(2.0, torch.floor(torch.log2(ref.abs().clamp_min(1e-30))) - 7)
            bound = ulp / 2 + 3 * k * 2.0**-24 * mag
            with self.subTest(fmt=fmt):
                self.assertTrue(((got - ref).abs() <= bound).all(), ((got - ref).abs() - bound).max())
                self.assertGreaterEqual((got == ref.bfloat16().double()).double().mean().item(), 0.999)

    def test_dense_path_not_for_fp32_activations(self):
        """fp32 activations keep the int8 path at any row count (the bf16 tiles would round them): the same bits as the
        VNNI kernel."""
        gen = torch.Generator().manual_seed(3)
        packed = random_packed(20, 40, 640, gen)
        x = torch.randn(300, 640, generator=gen)
        self.ops.set_cpu_isa("avx512_bf16")
        want = self.ops.quant_linear(x, packed, 40, 20)
        self.ops.set_cpu_isa("amx")
        self.assertTrue(torch.equal(self.ops.quant_linear(x, packed, 40, 20), want))

    def test_q8_0_decode_rows_against_the_int8_formula(self):
        """The lm_head's decode path (a GGUF Q8_0 table, K 640, outputs past whole 16-row tiles) at the row counts
        decode serves, on both sides of each switch point (7 | 8: VNNI | AMX-INT8 tiles; 16 | 17 | 32: one, one and
        a partial, two 16-row groups; 255: the last int8 row count): against the fp64 GGUF formula (d q per block of
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
        for m in (1, 7, 8, 16, 17, 32, 255):
            x = torch.randn(m, k, generator=gen)
            a = int8_activations(x)
            self.ops.set_cpu_isa("amx")
            got = self.ops.quant_linear(x, packed, n, 8).double()
            want = a @ wq.T
            bound = 2.0**-21 * (a.abs() @ mag.T) + 1e-30
            with self.subTest(m=m, path=self.ops.quant_path(m)):
                self.assertLessEqual(((got - want).abs() / bound).max().item(), 1.0)
            # bf16 activations (the served dtype) take the same path: within the fp32 bound plus the output's rounding
            xb = x.bfloat16()
            got16 = self.ops.quant_linear(xb, packed, n, 8).double()
            want16 = int8_activations(xb.float()) @ wq.T
            ulp = torch.pow(2.0, torch.floor(torch.log2(got16.abs().clamp_min(1e-30))) - 7)  # got16 rounds to nearest
            with self.subTest(m=m, dtype="bf16"):
                self.assertTrue(((got16 - want16).abs() <= ulp / 2 + 2.0**-21 * (int8_activations(xb.float()).abs() @ mag.T)).all())


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
