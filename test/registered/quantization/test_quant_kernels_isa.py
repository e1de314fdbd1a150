"""quant_linear at every ISA level this machine has (sgl-kernel/csrc/cpu/isa.h, quant_gemm.h, quant_gemm_avx2.h).

Each level from the native one down to avx2 is forced with set_cpu_isa and checked against an fp64 reference: the
weights decoded here from the GGUF block formula (Q4_0: d (q - 8); Q4_1: d q + m; Q8_0: d q, read from the `gguf`
package's bytes) or from the int8 blocks' bytes (d u + c), times fp64 x. The bound is derived per output element
from the kernel's int8 activations: |x - da qa| <= da / 2 per value (da = max|x| / 127 per block of 32), da / 508
with the residual pass of 8-bit weights, plus fp32 summation and, for bf16 outputs, the final rounding. Levels are
also checked against each other: Q4 is the same integer sum and the same FMAs on every level (bit-identical), 8-bit
weights differ by fp32 rounding only. bf16 outputs are torch's `.to(torch.bfloat16)` of the fp32 result, bit for bit.
At level amx a bf16 batch of 32 rows or more (K whole blocks) takes the dense path (quant_gemm_amx_dense.h): no
activation rounding, each weight rounded to bf16 (2^-9 of it at most); its bound says so, and it is held to the
bound alone (not to the int8 levels' bits).
"""

import re
import unittest

import numpy as np
import torch

from sglang.jit_kernel.cpu_ops import cpu_kernels_expected, cpu_ops_status, get_cpu_ops
from sglang.srt.layers.quantization import packing
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

LEVELS = ("scalar", "avx2", "avx512_vnni", "avx512_bf16", "amx")
ROWS = (1, 2, 7, 8, 9, 17, 32)
SHAPES = ((100, 59), (64, 40), (576, 27))  # (K, N): K tails, N past 16-row tiles and 8-row halves
KINDS = ("Q4_0", "Q4_1", "Q8_0", "int8")
GGUF = {"Q4_0": packing.GGUF_Q4_0, "Q4_1": packing.GGUF_Q4_1, "Q8_0": packing.GGUF_Q8_0}


def native_from_cpuinfo() -> str:
    """The level /proc/cpuinfo's flags allow (the kernel asks cpuid and the OS; both should agree here)."""
    flags = set(re.search(r"^flags\s*:(.*)$", open("/proc/cpuinfo").read(), re.M).group(1).split())
    level = "scalar"
    for name, need in (("avx2", "avx2 fma f16c"), ("avx512_vnni", "avx512f avx512bw avx512vl avx512dq avx512_vnni"),
                       ("avx512_bf16", "avx512_bf16"), ("amx", "amx_tile amx_bf16 amx_int8")):
        if not set(need.split()) <= flags:
            break
        level = name
    return level


def decode_gguf(raw: np.ndarray, kind: str) -> np.ndarray:
    """GGUF blocks uint8 [n, blocks * block bytes] -> fp64 weights [n, blocks * 32], from the block formula."""
    n = raw.shape[0]
    b = raw.reshape(n, -1, {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}[kind])
    d = b[:, :, 0:2].copy().view(np.float16).astype(np.float64)
    if kind == "Q8_0":
        return (d * b[:, :, 2:].copy().view(np.int8).astype(np.float64)).reshape(n, -1)
    qs = b[:, :, 4:] if kind == "Q4_1" else b[:, :, 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.float64)  # byte j: weights j and j + 16
    w = d * q + b[:, :, 2:4].copy().view(np.float16).astype(np.float64) if kind == "Q4_1" else d * (q - 8)
    return w.reshape(n, -1)


def decode_staging(staging: torch.Tensor) -> tuple:
    """(weights d u + c, magnitudes |d| u + |c|) in fp64 [n, blocks * 32] from the staging bytes."""
    raw = staging.numpy().reshape(staging.shape[0], -1, 36)
    d = raw[:, :, 0:2].copy().view(np.float16).astype(np.float64)
    c = raw[:, :, 2:4].copy().view(np.float16).astype(np.float64)
    u = raw[:, :, 4:].astype(np.float64)
    return (d * u + c).reshape(len(raw), -1), (np.abs(d) * u + np.abs(c)).reshape(len(raw), -1)


def make_weight(kind: str, n: int, k: int, rng) -> tuple:
    """(packed, bits, fp64 reference weights [n, k], u-form magnitudes [n, k])."""
    kp = -(-k // 32) * 32
    w = (rng.standard_normal((n, kp)) * 0.05).astype(np.float32)
    if kind == "int8":
        staging = packing.staging_q8_blocks(torch.from_numpy(w[:, :k]))
        ref, _ = decode_staging(staging)
    else:
        import gguf.quants as gq

        raw = gq.quantize(w, GGUF[kind])
        staging = packing.staging_from_gguf(torch.from_numpy(raw), GGUF[kind])
        ref = decode_gguf(raw, kind)
    _, mag = decode_staging(staging)
    bits = 4 if kind.startswith("Q4") else 8
    assert packing.staging_bits(staging) == bits
    return packing.pack(staging, bits), bits, torch.from_numpy(ref[:, :k]), torch.from_numpy(mag[:, :k])


def error_bound(x: torch.Tensor, w: torch.Tensor, mag: torch.Tensor, bits: int, dense: bool = False) -> torch.Tensor:
    """Per output element: what the int8 activations (and fp32 arithmetic) may move x @ w^T by; dense: what the bf16
    weights (and fp32 arithmetic) may."""
    m, k = x.shape
    if dense:
        return x.double().abs() @ (w.abs() * 2.0**-9 + mag * 2.0**-20).t()
    xb = torch.nn.functional.pad(x.double(), (0, -(-k // 32) * 32 - k)).reshape(m, -1, 32)
    da = (xb.abs().amax(-1, keepdim=True) / 127).expand_as(xb).reshape(m, -1)[:, :k]
    act = da / (2 if bits == 4 else 2 * 254) + x.double().abs() * 2.0**-22
    fp32 = ((x.double().abs() + da) @ mag.t()) * 2.0**-20
    return act @ w.abs().t() + fp32


@unittest.skipUnless(cpu_kernels_expected(), "the CPU kernels are not expected on this machine")
class TestQuantLinearLevels(unittest.TestCase):
    def setUp(self):
        self.ops = get_cpu_ops()
        self.assertIsNotNone(self.ops, cpu_ops_status())
        self.native = self.ops.cpu_isa_native()
        self.levels = [lv for lv in LEVELS[1 : LEVELS.index(self.native) + 1]]
        self.assertIn("avx2", self.levels)
        self.rng = np.random.default_rng(0)
        torch.manual_seed(0)

    def tearDown(self):
        self.ops.set_cpu_isa(self.native)

    def run_at(self, level, x, packed, n, bits):
        self.ops.set_cpu_isa(level)
        self.assertEqual(self.ops.get_cpu_isa(), level)
        return self.ops.quant_linear(x, packed, n, bits)

    def test_isa_levels(self):
        self.assertEqual(self.native, native_from_cpuinfo())
        self.assertEqual(self.ops.get_cpu_isa(), self.native)  # the default
        with self.assertRaisesRegex(ValueError, "unknown ISA level 'avx512'.*scalar, avx2, avx512_vnni"):
            self.ops.set_cpu_isa("avx512")
        for above in LEVELS[LEVELS.index(self.native) + 1 :]:
            with self.assertRaisesRegex(ValueError, f"'{above}' is above this CPU's native level '{self.native}'"):
                self.ops.set_cpu_isa(above)
            self.assertEqual(self.ops.get_cpu_isa(), self.native)  # unchanged
        packed, bits, _, _ = make_weight("Q4_0", 16, 64, self.rng)
        self.ops.set_cpu_isa("scalar")
        self.assertFalse(self.ops.quant_supported())
        self.assertFalse(self.ops.moe_quant_supported())
        with self.assertRaisesRegex(RuntimeError, "no kernel at the ISA level 'scalar'"):
            self.ops.quant_linear(torch.randn(1, 64), packed, 16, bits)
        for level in self.levels:
            self.ops.set_cpu_isa(level)
            self.assertTrue(self.ops.quant_supported())
            self.assertEqual(self.ops.moe_quant_supported(), LEVELS.index(level) >= LEVELS.index("avx512_bf16"))
        self.ops.set_cpu_isa("avx2")  # the MoE kernel refuses before reading its arguments
        empty = torch.empty(0)
        with self.assertRaisesRegex(RuntimeError, "fused_experts_quant: needs the ISA level avx512_bf16 .* 'avx2'"):
            self.ops.fused_experts_quant(empty, empty, empty, 4, 4, empty, empty)

    def test_every_level_against_fp64_reference(self):
        for kind in KINDS:
            for k, n in SHAPES:
                packed, bits, w, mag = make_weight(kind, n, k, self.rng)
                for dtype in (torch.float32, torch.bfloat16):
                    x = torch.randn(max(ROWS), k).to(dtype)
                    x[3] *= 100  # rows of other scales: each row has its own da
                    x[5, : min(k, 40)] = 0  # an all-zero block (da = 0)
                    exact = x.double() @ w.t()
                    outs = {}
                    for level in self.levels:
                        out = self.run_at(level, x, packed, n, bits)
                        dense = (dtype == torch.bfloat16 and k % 32 == 0
                                 and self.ops.quant_path(max(ROWS)).endswith("_dense"))
                        bound = error_bound(x, w, mag, bits, dense)
                        if dtype == torch.bfloat16:
                            bound = bound + (exact.abs() + bound) * 2.0**-8
                        # the bound is the int8 activations' (or bf16 weights') size, not a blanket tolerance
                        self.assertLess((bound / exact.abs().amax(1, keepdim=True)).max().item(),
                                        0.2 if bits == 4 else 4e-2 if dense else 1e-2)
                        self.assertEqual((out.shape, out.dtype), ((max(ROWS), n), dtype))
                        excess = ((out.double() - exact).abs() - bound).max().item()
                        self.assertLessEqual(excess, 0, (level, kind, k, n, dtype, dense))
                        few = self.run_at(level, x[:31], packed, n, bits)  # the int8 paths at every level
                        for m in ROWS:  # a row's result does not depend on its batch mates (within a path)
                            same = out if not dense or m >= 32 else few
                            self.assertTrue(torch.equal(self.run_at(level, x[:m], packed, n, bits), same[:m]), (level, m))
                        if dense:  # the int8 paths' rows, for the level comparison below
                            out = torch.cat([few, self.run_at(level, x[31:], packed, n, bits)])
                            self.ops.set_cpu_isa(level)
                            self.assertFalse(self.ops.quant_path(2).endswith("_dense"))
                        outs[level] = out
                    self.compare_levels(outs, x, mag, bits, dtype, (kind, k, n, dtype))

    def compare_levels(self, outs, x, mag, bits, dtype, what):
        """Q4: every level the same bits; 8-bit: within fp32 rounding (and one bf16 step) of the native level's."""
        ref = outs[self.native].double()
        slack = error_bound(x, torch.zeros_like(mag), mag, bits)  # the fp32 part of the bound only
        if dtype == torch.bfloat16:
            slack = slack + ref.abs() * 2.0**-7
        for level, out in outs.items():
            if bits == 4:
                self.assertTrue(torch.equal(out, outs[self.native]), (level, what))
            else:
                self.assertLessEqual(((out.double() - ref).abs() - slack).max().item(), 0, (level, what))

    def test_bf16_outputs_are_torch_rounding(self):
        """bf16 results == the fp32 results of the same inputs rounded by torch (round to nearest even), on random data
        and on exact integers with ties: int8 blocks with d = 1, c = 0 or -128 and x = +-127 at one k make each output
        the integer +-127 (u or u - 128)."""
        packed, bits, _, _ = make_weight("Q8_0", 59, 100, self.rng)
        x = torch.randn(17, 100).to(torch.bfloat16)
        u = torch.arange(256, dtype=torch.uint8).reshape(256, 1, 1).expand(256, 2, 32).contiguous()
        d = torch.ones(256, 2, dtype=torch.float16)
        c = torch.zeros(256, 2, dtype=torch.float16)
        c[128:] = -128
        exact_packed = packing.pack(packing.staging_from_parts(u, d, c), 8)
        xi = torch.zeros(2, 64, dtype=torch.bfloat16)
        xi[0, 5], xi[1, 40] = 127, -127
        sign = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
        values = sign * 127 * (torch.arange(256, dtype=torch.float64) - torch.where(torch.arange(256) >= 128, 128, 0))
        expect = values.to(torch.bfloat16)
        low_bits = values.float().view(torch.int32) & 0xFFFF
        self.assertGreater(int((low_bits == 0x8000).sum()), 4)  # exact ties, to even below and above
        for level in self.levels:
            out16 = self.run_at(level, x, packed, 59, bits)
            out32 = self.run_at(level, x.float(), packed, 59, bits)
            self.assertTrue(torch.equal(out16, out32.to(torch.bfloat16)), level)
            self.assertTrue(torch.equal(self.run_at(level, xi, exact_packed, 256, 8), expect), level)
            self.assertTrue(torch.equal(self.run_at(level, xi.float(), exact_packed, 256, 8), values.float()), level)


if __name__ == "__main__":
    unittest.main()
