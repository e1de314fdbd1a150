"""quant_linear on AMX-INT8 tiles (sgl-kernel/csrc/cpu/quant_gemm_amx.h: level amx, from 8 input rows) gives the same
bits as the VNNI kernel (quant_gemm.h, level avx512_bf16) for every packed format (the fp16, fp32, halves and Q6_K
headers; 4- and 8-bit records, the 8-bit residual pass), bf16 and fp32 activations, row counts that fill 16-row tiles
and leave tails, and output columns that end inside a 16-row tile. The two compute the same exact int32 block sums
and the same fp32 operations in the same order; the VNNI kernel is itself checked against an fp64 formula
(test_kquant_kernels.py, test_quant_kernels_isa.py). Below 8 rows, and below level amx, the VNNI path runs.
"""

import unittest

import torch

from sglang.jit_kernel.cpu_ops import cpu_ops_status, get_cpu_ops
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

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
        self.ops.set_cpu_isa("avx512_bf16")
        self.assertEqual(self.ops.quant_path(64), "avx512_vnni")

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


if __name__ == "__main__":
    unittest.main()
