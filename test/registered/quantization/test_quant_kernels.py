"""The quantized GEMM (sgl-kernel/csrc/cpu/quant_gemm.h) and its packing against an independent reference.

The reference weights come from the `gguf` package's own quantize/dequantize (written from the GGUF block format,
independent of our packing code); int8 weight-only from a per-row formula computed here. The kernel quantizes
activations to int8 per 32 values (as llama.cpp does), so it is compared twice: with that quantization emulated in
float64 (tight: only fp32 summation and the bf16 output rounding differ) and with the exact float product (loose).
On an AMX CPU a bf16 batch of 32 rows or more (K whole blocks) takes the dense path instead (quant_gemm_amx_dense.h:
the weights rounded to bf16, the activations as they are), emulated here as the fp64 product of bf16(weights).
"""

import unittest

import numpy as np
import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import cpu_kernels_disabled, cpu_kernels_expected, cpu_ops_status
from sglang.srt.layers.quantization import packing
from sglang.srt.layers.quantization.linear_method import quant_kernels
from sglang.srt.mem_plan.quantization_sizes import cpu_packed_bytes
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

ROWS = (1, 2, 7, 8, 9, 16, 33, 64)
GGUF_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}


def gguf_weight(kind: str, n: int, k: int, rng):
    """(staging form, fp32 reference [n, k]) of a random weight quantized by the gguf package."""
    import gguf.quants as gq

    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = gq.quantize(w, GGUF_TYPES[kind])
    ref = torch.from_numpy(gq.dequantize(raw, GGUF_TYPES[kind]).reshape(n, k).astype(np.float32))
    return packing.staging_from_gguf(torch.from_numpy(raw), GGUF_TYPES[kind]), ref


def staging_values(staging: torch.Tensor, k: int) -> torch.Tensor:
    """The weights a staging form stands for, decoded here from its bytes (per block: fp16 d, fp16 c, 32 u)."""
    raw = staging.numpy().reshape(staging.shape[0], -1, 36)
    d = raw[:, :, 0:2].copy().view(np.float16).astype(np.float64)
    c = raw[:, :, 2:4].copy().view(np.float16).astype(np.float64)
    w = d * raw[:, :, 4:].astype(np.float64) + c
    return torch.from_numpy(w.reshape(staging.shape[0], -1)[:, :k].astype(np.float32))


def range_fit_sq_error(w: torch.Tensor) -> tuple:
    """Squared error per 32-block of 8-bit levels spanning the block's range: c = min, d = (max - min) / 255 (the
    start of packing's fit, without the fp16 rounding of d and c), and of the symmetric max|w| / 127 scale."""
    blocks = w.double().reshape(w.shape[0], -1, 32)
    lo, hi = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = (hi - lo) / 255
    ranged = torch.round((blocks - lo) / d) * d + lo
    s = blocks.abs().amax(-1, keepdim=True) / 127
    symmetric = torch.round(blocks / s) * s
    return (ranged - blocks).square().sum(-1), (symmetric - blocks).square().sum(-1)


def int8_weight(n: int, k: int, rng):
    """w8a8_int8's weights (8-bit levels with an fp16 step and offset per 32 weights of a row; their fit is tested
    in test_int8_blocks_fit) and the values they stand for."""
    w = torch.from_numpy((rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    staging = packing.staging_q8_blocks(w)
    return staging, staging_values(staging, k)


def takes_dense(ops, m: int, k: int, dtype) -> bool:
    """Whether quant_linear serves m rows of K k in dtype on the dense AMX-BF16 path (bf16, K whole blocks, the level
    and row count quant_path names)."""
    return dtype == torch.bfloat16 and k % 32 == 0 and ops.quant_path(m).endswith("_dense")


def emulated(x: torch.Tensor, w_ref: torch.Tensor, bits: int) -> torch.Tensor:
    """x @ w_ref^T with x quantized to int8 per block of 32 (scale max|x| / 127, round to nearest), in float64;
    with 8-bit weights the rounding residual is quantized once more (scale d / 254) and added."""
    m, k = x.shape
    blocks = -(-k // 32)
    xb = F.pad(x.float(), (0, blocks * 32 - k)).reshape(m, blocks, 32)
    d = xb.abs().amax(-1, keepdim=True) / 127
    q = torch.round(xb * torch.where(d > 0, 1 / d, torch.zeros_like(d)))
    xq = q.double() * d.double()
    if bits == 8:
        r = torch.round((xb - q * d) * torch.where(d > 0, 254 / d, torch.zeros_like(d)))
        xq = xq + r.double() * (d.double() / 254)
    return xq.reshape(m, -1)[:, :k] @ w_ref.double().t()


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0")
class TestQuantKernels(unittest.TestCase):
    def setUp(self):
        self.ops = quant_kernels()
        self.assertIsNotNone(self.ops, f"quant_linear not available: {cpu_ops_status()}")
        self.rng = np.random.default_rng(0)
        torch.manual_seed(0)

    def check(self, staging, ref, n, k, dtype=torch.bfloat16):
        bits = packing.staging_bits(staging)
        packed = packing.pack(staging, bits)
        self.assertEqual(packed.numel(), cpu_packed_bytes(n, k, bits))  # what the plan charges
        # the packing round-trips to the reference weights exactly (the torch path uses this)
        self.assertTrue(torch.equal(packing.unpack_dequantize(packed, bits, n, k, torch.float32), ref))
        x = torch.randn(max(ROWS), k).to(dtype)
        out = self.ops.quant_linear(x, packed, n, bits)
        self.assertEqual((out.shape, out.dtype), ((max(ROWS), n), dtype))
        exact = x.double() @ ref.double().t()
        scale = exact.abs().max().item()
        few = self.ops.quant_linear(x[:31], packed, n, bits)  # the int8 paths at any level
        dense = takes_dense(self.ops, max(ROWS), k, dtype)
        for got, rows, want in ((out, max(ROWS), x.double() @ ref.bfloat16().double().t() if dense else
                                 emulated(x, ref, bits)), (few, 31, emulated(x[:31], ref, bits))):
            err_emulated = (got.double() - want).abs().max().item() / scale
            err_exact = (got.double() - exact[:rows]).abs().max().item() / scale
            self.assertLess(err_emulated, 4e-3 if dtype == torch.bfloat16 else 1e-4, (n, k, bits, rows))
            self.assertLess(err_exact, 3e-2 if bits == 4 else 5e-3, (n, k, bits, rows))
        for rows in ROWS:  # a row's result does not depend on its batch mates (within a path)
            batch = out if not dense or takes_dense(self.ops, rows, k, dtype) else few
            self.assertTrue(torch.equal(self.ops.quant_linear(x[:rows], packed, n, bits), batch[:rows]), rows)
            one = self.ops.quant_linear(x[rows - 1 : rows], packed, n, bits)  # the int8 paths
            mates = out if not dense else self.ops.quant_linear(x[max(0, rows - 8) : rows], packed, n, bits)
            self.assertTrue(torch.equal(one, mates[rows - 1 : rows] if not dense else mates[-1:]), rows)
        return bits

    def test_gguf_types_with_row_and_column_tails(self):
        for kind in GGUF_TYPES:
            for n, k in ((64, 64), (50, 96), (17, 1536), (960, 576), (1, 32)):
                bits = self.check(*gguf_weight(kind, n, k, self.rng), n, k)
                self.assertEqual(bits, 8 if kind == "Q8_0" else 4)

    def test_int8_weight_only_with_k_tails(self):
        for n, k in ((64, 64), (40, 100), (33, 7), (576, 1536)):
            self.assertEqual(self.check(*int8_weight(n, k, self.rng), n, k), 8)

    def test_int8_blocks_fit(self):
        """The blocks' levels fit better than the plain range fit and far better than the symmetric int8 scale (one
        outlier no longer halves its block's resolution), and weights on a 4-bit block grid (dequantized Q4_1)
        come back almost exactly."""
        import gguf.quants as gq

        w = torch.from_numpy((self.rng.standard_normal((64, 1024)) * 0.05).astype(np.float32))
        w[:, ::97] *= 8  # outliers on one side of their blocks
        fit = (staging_values(packing.staging_q8_blocks(w), 1024).double() - w.double()).reshape(64, -1, 32)
        ranged, symmetric = range_fit_sq_error(w)
        self.assertLess(fit.square().sum().item(), 0.95 * ranged.sum().item())
        self.assertLess(fit.square().sum().item(), 0.5 * symmetric.sum().item())
        raw = gq.quantize(w.numpy(), GGUF_TYPES["Q4_1"])
        on_grid = torch.from_numpy(gq.dequantize(raw, GGUF_TYPES["Q4_1"]).reshape(64, 1024).astype(np.float32))
        back = staging_values(packing.staging_q8_blocks(on_grid), 1024)
        self.assertLess((back - on_grid).norm().item(), 1e-3 * on_grid.norm().item())
        tail = torch.from_numpy((self.rng.standard_normal((3, 40)) * 0.05).astype(np.float32))  # K tail of 8
        back = staging_values(packing.staging_q8_blocks(tail), 40)
        self.assertLess((back - tail).abs().max().item(), (tail.amax(1) - tail.amin(1)).max().item() / 255)

    def test_float32_activations(self):
        self.check(*gguf_weight("Q4_1", 48, 128, self.rng), 48, 128, dtype=torch.float32)

    def test_torch_path_matches_dense_reference(self):
        """Without the kernels the layer dequantizes per call: exactly F.linear on the reference weights."""
        from sglang.srt.layers.quantization.linear_method import QuantLinearMethod
        from sglang.srt.layers.linear import ReplicatedLinear

        staging, ref = gguf_weight("Q4_0", 40, 64, self.rng)
        with __import__("sglang.srt.layers.quantization", fromlist=["x"]).quantization_config("gguf"):
            layer = ReplicatedLinear(64, 40, bias=True)
        self.assertIsInstance(layer.quant_method, QuantLinearMethod)
        layer.bias.data.normal_()
        layer.weight.weight_loader(layer.weight, staging)
        self.assertIsNone(layer.weight)
        x = torch.randn(5, 64)
        with cpu_kernels_disabled():
            torch.testing.assert_close(layer(x), F.linear(x, ref, layer.bias), rtol=0, atol=1e-6)
        out = layer(x)  # the kernel, fp32 in and out
        torch.testing.assert_close(out, F.linear(x, ref, layer.bias), rtol=0, atol=3e-2 * out.abs().max().item())

    def test_bad_arguments_are_refused(self):
        staging, _ = gguf_weight("Q8_0", 32, 64, self.rng)
        packed = packing.pack(staging, 8)
        with self.assertRaisesRegex(RuntimeError, "tiles"):
            self.ops.quant_linear(torch.randn(2, 64, dtype=torch.bfloat16), packed, 100, 8)
        with self.assertRaisesRegex(RuntimeError, "blocks"):
            self.ops.quant_linear(torch.randn(2, 96, dtype=torch.bfloat16), packed, 32, 8)
        with self.assertRaisesRegex(RuntimeError, "packed"):
            self.ops.quant_linear(torch.randn(2, 64, dtype=torch.bfloat16), packed, 32, 4)


if __name__ == "__main__":
    unittest.main()
