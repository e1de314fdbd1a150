"""quant_linear on AMX-INT8 tiles (sgl-kernel/csrc/cpu/quant_gemm_amx.h: level amx, from 8 input rows) gives the same
bits as the VNNI kernel (quant_gemm.h, level avx512_bf16) for every packed format (the fp16, fp32, halves and Q6_K
headers; 4- and 8-bit records, the 8-bit residual pass), bf16 and fp32 activations, row counts that fill 16-row tiles
and leave tails, and output columns that end inside a 16-row tile. The two compute the same exact int32 block sums
and the same fp32 operations in the same order; the VNNI kernel is itself checked against an fp64 formula
(test_kquant_kernels.py, test_quant_kernels_isa.py). Below 8 rows, and below level amx, the VNNI path runs.

From 256 rows of bf16 activations quant_linear dequantizes each weight tile into three bf16 terms on AMX-BF16 tiles
(quant_gemm_amx_dense.h): hi + mid + lo is the fp32 weight d * u + c exactly, so a one-hot power-of-two activation
row gives bf16(x_k * w[:, k]) bit for bit (the torch path's fp32 dequantization, packing.unpack_dequantize); random
rows are within half a bf16 ulp of the fp64 product plus fp32 summation, far inside the int8 paths' bound.
"""

import unittest

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
                for m in (8, 9, 16, 17, 45):
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


if __name__ == "__main__":
    unittest.main()
