"""extend_attention_quant (sgl-kernel/csrc/cpu/decode_attention_quant.h, quant_attention_op.h): attention that reads a
quantized KV pool's codes in place (int8, int4, int2_hadamard, fp8_e4m3, fp8_e5m2), for extend (cached prefixes) and
decode (an extend of one token per request), and with fresh_k / fresh_v the new tokens' own K/V instead of their
codes.

Reference: the real pool (mem_cache/quantized_kv_pool.py) quantizes the K/V on write; its own gather_kv dequantizes
each request's rows, and attention over them is computed in fp64 with the causal mask (query i at position prefix + i
sees keys j <= prefix + i). Page sizes 1 and 16 (slots scattered page by page), GQA groups of 1, 3, 4, 5 and 8, ragged
lengths, K/V with a wide dynamic range (fp8 subnormal codes occur) and non-unit fp8 scales per KV head. The model-level
check (greedy tokens through sglang.Engine, kernel vs torch gather path) is test/registered/engine/
test_kv_quant_kernel_engine.py; int2_hadamard's code conversions, every byte at every position, and its write:
test_cpu_quant_int2.py. The kernels run from level avx512_vnni (no BF16 instruction): test_kv_quant_kernel_levels.py
runs this file there too.
"""

import unittest
import zlib

import torch

from sglang.jit_kernel.cpu_ops import get_kv_quant_ops, kv_quant_kernels_expected
from sglang.srt.mem_cache import kv_quant_codec as codec
from sglang.srt.mem_cache.quantized_kv_pool import QuantizedKVPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="cpu")

BF16 = torch.bfloat16
FORMATS = ("int8", "int4", "int2_hadamard", "fp8_e4m3", "fp8_e5m2")
BYTE_FORMATS = ("int8", "fp8_e4m3", "fp8_e5m2")  # one code a byte
# (prefix lens, extend lens, heads, kv heads, head dim): prefill without prefix, cached prefixes, single-token rows
EXTEND_CASES = [
    ([0, 40, 0, 7], [1, 33, 64, 2], 9, 3, 64),
    ([100, 0, 3], [17, 5, 1], 4, 4, 96),
    ([0, 12], [20, 9], 10, 2, 128),
    ([5], [31], 8, 1, 64),
]
# decode: seq lens (ragged), heads, kv heads, head dim
DECODE_CASES = [([1, 170, 33, 64, 2], 9, 3, 64), ([300, 17], 20, 4, 128), ([9, 50], 5, 1, 32)]


def wide_range(shape, g):
    """Values spread over ~6 octaves (so fp8 codes reach the subnormal range), a few channels larger (outliers)."""
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randn(*shape, generator=g) * 1.5)
    x[..., :3] *= 4
    return x


def make_pool(fmt, page, kv, d, g, seqs):
    """A two-layer pool holding the K/V of `seqs` requests (their lengths), written through set_kv_buffer into slots
    allocated page by page in a scattered order; returns (pool, req_to_token, rows)."""
    pages = [(n + page - 1) // page for n in seqs]
    size = (sum(pages) + 3) * page
    pool = QuantizedKVPool(size, page, fmt, BF16, kv, d, layer_num=2)
    if "k_smooth" in pool.fixed:  # int4's key multipliers, as calibration leaves them (mean 1 per head, not 1)
        w = torch.exp(torch.randn(pool.fixed["k_smooth"].shape, generator=g) * 0.3)
        pool.fixed["k_smooth"].copy_(w / w.mean(-1, keepdim=True))
    if pool.is_fp8:  # per-head scales: amax x 2 / fp8 max, as calibration picks them, different per head
        fmax = torch.finfo(pool.dtype).max
        for name in ("k_scale", "v_scale"):
            pool.fixed[name].copy_((torch.rand(2, kv, generator=g) * 20 + 4) * 2 / fmax)
    page_order = torch.randperm(size // page - 1, generator=g) + 1  # page 0 is the dummy page
    bs = len(seqs)
    req_to_token = torch.zeros(bs + 2, max(seqs) + 5, dtype=torch.int64)
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    used = 0
    for r, n, p in zip(rows.tolist(), seqs, pages):
        slots = (page_order[used : used + p, None] * page + torch.arange(page)[None, :]).reshape(-1)[:n]
        req_to_token[r, :n] = slots
        used += p
        for layer in range(2):
            pool.set_kv_buffer(layer, slots, wide_range((n, kv, d), g).to(BF16), wide_range((n, kv, d), g).to(BF16))
    return pool, req_to_token, rows


def turned_query(pool, q):
    """The query as the kernel attends it: turned by R where the pool stores its keys turned (k @ R; the kernel turns
    each row in its scratch, given R as q_turn), here in fp64."""
    r_k = pool.rotation("k")
    return q if r_k is None else q.double() @ r_k.double()


def reference(pool, layer, q, req_to_token, rows, prefix, extend, heads, kv, d, fresh=None):
    """fp64 causal attention over the pool's own dequantization of each request's rows, in the basis they are stored
    in (turned keys: the query as turned_query gives it to the kernel). fresh = (k, v) [N, KV, D]: the new tokens'
    rows are those (plain, turned here as the keys are), only the prefix is dequantized."""
    outs, q0 = [], 0
    q = turned_query(pool, q)
    r_k = pool.rotation("k")
    for r, p, e in zip(rows.tolist(), prefix, extend):
        k = pool.gather_kv(layer, req_to_token[r, : p + e], torch.float64, rotated=True)[0]  # [p + e, KV, D]
        v = pool.gather_kv(layer, req_to_token[r, : p + e], torch.float64)[1]  # plain values
        if fresh is not None:
            k_new, v_new = fresh[0][q0 : q0 + e].double(), fresh[1][q0 : q0 + e].double()
            k = torch.cat([k[:p], k_new if r_k is None else k_new @ r_k.double()])
            v = torch.cat([v[:p], v_new])
        qq = q[q0 : q0 + e].double().view(e, kv, heads // kv, d)
        s = torch.einsum("ekgd,jkd->ekgj", qq, k) * d**-0.5
        mask = torch.arange(p + e)[None, :] <= (p + torch.arange(e))[:, None]  # [e, p + e]
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        outs.append(torch.einsum("ekgj,jkd->ekgd", torch.softmax(s, -1), v).reshape(e, heads * d))
        q0 += e
    return torch.cat(outs)


def run_kernel(ops, pool, layer, q, req_to_token, rows, prefix, extend, d, fresh=None):
    """The kernel as torch_native calls it: the pool's key rotation (or None) as q_turn; fresh (k, v) plain rows
    passed in the pool's stored basis (QuantizedKVPool.stored_basis)."""
    scales = pool.fixed if pool.is_fp8 else pool.fields
    q_turn, q_smooth, out_turn = kernel_turns(pool, layer)
    fk = fv = None
    if fresh is not None:
        fk, fv = pool.stored_basis(layer, "k", fresh[0]), pool.stored_basis(layer, "v", fresh[1])
    return ops.extend_attention_quant(
        q, pool.fields["k"][layer], pool.fields["v"][layer], scales["k_scale"][layer], scales["v_scale"][layer],
        pool.kv_format, req_to_token, rows, torch.tensor(prefix), torch.tensor(extend), d**-0.5, q_turn, q_smooth,
        out_turn, fk, fv)


def kernel_turns(pool, layer):
    """What the kernel is told about the stored basis (the format's rule, kv_quant_codec): int8 / fp8 keys turned by
    R; int4 keys turned as (k * w) @ R (q_smooth w of the layer) and its values by R (out_turn R^T); int2_hadamard
    keys and values by R."""
    if pool.kv_format == "int4":
        r = codec.rotation(pool.head_dim)
        return r, pool.fixed["k_smooth"][layer], r.T.contiguous()
    return pool.rotation("k"), None, codec.rotation_t(pool.v_head_dim) if "v" in pool.turned_parts else None


@unittest.skipUnless(kv_quant_kernels_expected(), "the quantized-KV CPU kernels do not run at this CPU level")
class TestQuantAttentionKernel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_kv_quant_ops()
        assert cls.ops is not None and hasattr(cls.ops, "extend_attention_quant"), "the kernels did not load"

    def check(self, fmt, page, prefix, extend, heads, kv, d, q_dtype=BF16, tol=1e-2, fresh=False):
        g = torch.Generator().manual_seed(zlib.crc32(repr((fmt, page, d, len(prefix))).encode()))
        pool, table, rows = make_pool(fmt, page, kv, d, g, [p + e for p, e in zip(prefix, extend)])
        q = (torch.randn(sum(extend), heads, d, generator=g) * 2).to(q_dtype)
        # fresh: the new tokens' own K/V, other values than the codes the pool holds for them (so reading those
        # codes instead fails the comparison)
        new_kv = (wide_range((sum(extend), kv, d), g).to(q_dtype), wide_range((sum(extend), kv, d), g).to(q_dtype))
        new_kv = new_kv if fresh else None
        for layer in (0, 1):
            out = run_kernel(self.ops, pool, layer, q, table, rows, prefix, extend, d, new_kv)
            self.assertEqual(out.dtype, q_dtype)
            ref = reference(pool, layer, q, table, rows, prefix, extend, heads, kv, d, new_kv)
            torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol,
                                       msg=lambda m: f"{fmt} page {page} {prefix}/{extend} layer {layer}: {m}")

    def test_extend_with_cached_prefixes(self):
        for fmt in FORMATS:
            for page in (1, 16):
                for case in EXTEND_CASES:
                    with self.subTest(fmt=fmt, page=page, case=case):
                        self.check(fmt, page, *case)

    def test_decode_ragged(self):
        for fmt in FORMATS:
            for page in (1, 16):
                for seqs, heads, kv, d in DECODE_CASES:
                    with self.subTest(fmt=fmt, page=page, seqs=seqs):
                        self.check(fmt, page, [n - 1 for n in seqs], [1] * len(seqs), heads, kv, d)

    def test_fresh_new_tokens(self):
        """fresh_k / fresh_v (as torch_native passes them): each request's new tokens are attended as those rows, in
        the pool's stored basis (int4 keys (k * w) @ R, values @ R), and only the cached prefix as codes -- extend
        with and without prefixes, and decode."""
        for fmt in FORMATS:
            for page in (1, 16):
                for case in EXTEND_CASES[:2]:
                    with self.subTest(fmt=fmt, page=page, case=case):
                        self.check(fmt, page, *case, fresh=True)
                seqs, heads, kv, d = DECODE_CASES[0]
                with self.subTest(fmt=fmt, page=page, seqs=seqs):
                    self.check(fmt, page, [n - 1 for n in seqs], [1] * len(seqs), heads, kv, d, fresh=True)
            with self.subTest(fmt=fmt, q="fp32"):
                self.check(fmt, 16, [30, 0], [4, 9], 9, 3, 64, q_dtype=torch.float32, tol=2e-5, fresh=True)

    def test_fp32_query(self):
        for fmt in FORMATS:
            with self.subTest(fmt=fmt):
                self.check(fmt, 16, [30, 0], [4, 9], 9, 3, 64, q_dtype=torch.float32, tol=2e-5)

    def test_every_code_converts_exactly(self):
        """Every byte value (fp8: all finite codes, subnormals and -0 included; int8: -127..127) as a value row: a
        request of one token attends to it alone, so the fp32 output is that row dequantized, which must equal the
        pool's own dequantization exactly (fp8 scales per head are powers of two here, int8 scales fp16). (int4's 16
        codes, its min and the turn back of its values: test_extend_with_cached_prefixes and test_fp32_query.)"""
        for fmt in BYTE_FORMATS:
            with self.subTest(fmt=fmt):
                pool = QuantizedKVPool(64, 1, fmt, BF16, 2, 64, layer_num=1)
                for buf in pool.fields.values():  # zero keys: the single score is finite whatever q
                    buf.zero_()
                codes = torch.arange(256, dtype=torch.uint8)
                if pool.is_fp8:
                    finite = torch.isfinite(codes.view(pool.dtype).float())
                    codes = torch.cat([codes[finite], torch.zeros(-int(finite.sum()) % 64, dtype=torch.uint8)])
                    pool.fixed["v_scale"][0] = torch.tensor([0.5, 4.0])
                else:
                    codes = torch.arange(-127, 128, dtype=torch.int16).to(torch.int8).view(torch.uint8)
                    codes = torch.cat([codes, torch.zeros(1, dtype=torch.uint8)])
                rows = codes.view(-1, 64)  # [n, 64]
                n = rows.shape[0]
                slots = torch.arange(1, n + 1)
                field = pool.fields["v"][0]
                field[slots] = rows.view(field.dtype)[:, None, :].expand(n, 2, 64)
                if not pool.is_fp8:
                    pool.fields["v_scale"][0][slots] = torch.tensor([0.0078125, 3.5], dtype=torch.float16)[None, :, None]
                table = slots.view(n, 1)
                q = torch.randn(n, 2, 64)
                out = run_kernel(self.ops, pool, 0, q, table, torch.arange(n), [0] * n, [1] * n, 64)
                _, v = pool.gather_kv(0, slots, torch.float32)
                self.assertTrue(torch.equal(out, v.reshape(n, 128)), f"{fmt}: {(out - v.reshape(n, 128)).abs().max()}")

    def test_write_is_the_codec_rule(self):
        """kv_quant_write against kv_quant_codec.quantize on the same rows (bf16 and fp32, head dims 32-256, an
        all-zero row, values over ~6 octaves so fp8 subnormals occur, fp8 per-head scales): plain rows (V) give exactly
        the codec's codes (and int8's fp16 scales); turned rows (K, R given) differ from it only where the two orders
        of the turn's sums round r / s to the other side of a half: a code one step away, in under 0.5% of the
        elements, int8 scales within one fp16 step. (int2_hadamard: test_cpu_quant_int2.py.)"""
        from sglang.srt.mem_cache import kv_quant_codec as codec

        g = torch.Generator().manual_seed(11)
        for fmt in FORMATS:
            if fmt == "int2_hadamard":
                continue
            for dtype in (BF16, torch.float32):
                for d in (32, 64, 128, 256):
                    with self.subTest(fmt=fmt, dtype=dtype, d=d):
                        n, kv, slots = 37, 3, 64
                        x = wide_range((n, kv, d), g).to(dtype)
                        x[5] = 0
                        loc = torch.randperm(slots - 1, generator=g)[:n] + 1
                        head_scale = torch.rand(kv, generator=g) * 0.05 + 0.001  # fp8: some values saturate
                        w = torch.exp(torch.randn(kv, d, generator=g) * 0.3)  # int4's key multipliers
                        for part, turn in (("v", None), ("k", codec.rotation(d))):
                            smooth = w if fmt == "int4" and part == "k" else None
                            self.check_write(codec, fmt, part, x, loc, slots, head_scale, turn, smooth)

    def check_write(self, codec, fmt, part, x, loc, slots, head_scale, turn, smooth=None):
        n, kv, d = x.shape
        int8, int4 = fmt == "int8", fmt == "int4"
        codes = torch.zeros(slots, kv, d // 2 if int4 else d, dtype=torch.int8 if int8 else torch.uint8)
        per_token = int8 or int4
        scales = torch.zeros(slots, kv, 2 if int4 else 1, dtype=torch.float16) if per_token else head_scale
        self.ops.kv_quant_write(x, codes, scales, loc, fmt, turn, smooth)
        want = codec.quantize(fmt, x, part, None if per_token else head_scale, smooth, turned=turn is not None)
        untouched = torch.ones(slots, dtype=torch.bool)
        untouched[loc] = False
        self.assertEqual(int(codes[untouched].int().abs().sum()), 0)
        got = codes[loc]
        if int4:  # the codes as 0..15, step and min: exact for plain rows, one step / one fp16 step for turned ones
            got_c, want_c = codec._unpack_nibbles(got).int(), codec._unpack_nibbles(want[part]).int()
            if turn is None:
                self.assertTrue(torch.equal(got_c, want_c) and torch.equal(scales[loc], want[part + "_scale"]))
                return
            diff = (got_c - want_c).abs()
            self.assertLessEqual(int(diff.max()), 1)
            self.assertLess(float((diff > 0).float().mean()), 0.005)
            self.assertTrue(torch.allclose(scales[loc].float(), want[part + "_scale"].float(), rtol=1e-3, atol=1e-6))
            return
        if not int8:  # compare fp8 codes as values: one step = the next representable magnitude
            dt = codec.FP8_TORCH[fmt]
            got_v, want_v = got.view(dt).float(), want[part].view(dt).float()
        if turn is None:
            self.assertTrue(torch.equal(got.view(torch.uint8), want[part].view(torch.uint8)),
                            (got.view(torch.uint8) != want[part].view(torch.uint8)).sum())
            if int8:
                self.assertTrue(torch.equal(scales[loc], want["v_scale"]))
            return
        if int8:
            diff = (got.int() - want[part].int()).abs()
            self.assertTrue(torch.allclose(scales[loc].float(), want["k_scale"].float(), rtol=1e-3, atol=0))
        else:  # neighbouring fp8 codes of one sign are adjacent integers
            diff = (got.view(torch.int8).int() - want[part].view(torch.int8).int()).abs()
            diff = torch.where(got_v == want_v, torch.zeros_like(diff), diff)
        self.assertLessEqual(int(diff.max()), 1)
        self.assertLess(float((diff > 0).float().mean()), 0.005)

    def test_fp8_write_rounds_every_tie_as_torch(self):
        """Every fp8 code's value and the midpoints between neighbouring codes (ties: round to even), just above and
        below them, zeros of both signs, and values past the largest finite code (saturated): kv_quant_write's fp8
        bytes equal torch's float -> float8 conversion of the same values, bit for bit."""
        for fmt in ("fp8_e4m3", "fp8_e5m2"):
            with self.subTest(fmt=fmt):
                dt = torch.float8_e4m3fn if fmt == "fp8_e4m3" else torch.float8_e5m2
                vals = torch.arange(256, dtype=torch.uint8).view(dt).float()
                vals = torch.sort(vals[torch.isfinite(vals)]).values.unique()
                mids = (vals[1:] + vals[:-1]) / 2
                fmax = float(vals.max())
                x = torch.cat([vals, mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                               torch.nextafter(mids, torch.full_like(mids, -1e9)), torch.tensor([0.0, -0.0]),
                               torch.tensor([fmax * 1.01, -fmax * 3, 1e30, -1e30])])
                x = torch.cat([x, torch.zeros(-x.numel() % 64)]).view(-1, 1, 64)
                codes = torch.zeros(x.shape[0] + 1, 1, 64, dtype=torch.uint8)
                loc = torch.arange(1, x.shape[0] + 1)
                self.ops.kv_quant_write(x, codes, torch.ones(1), loc, fmt, None)
                want = x.clamp(-fmax, fmax).to(dt).view(torch.uint8)
                bad = codes[loc] != want
                self.assertEqual(int(bad.sum()), 0, (x[bad][:8], codes[loc][bad][:8], want[bad][:8]))

    def test_refusals(self):
        g = torch.Generator().manual_seed(0)
        pool, table, rows = make_pool("int8", 1, 3, 64, g, [5])
        q = torch.randn(1, 9, 64).to(BF16)
        with self.assertRaisesRegex(RuntimeError, "kv format"):
            self.ops.extend_attention_quant(q, pool.fields["k"][0], pool.fields["v"][0], pool.fields["k_scale"][0],
                                            pool.fields["v_scale"][0], "int3", table, rows, torch.tensor([4]),
                                            torch.tensor([1]), 0.125)
        with self.assertRaisesRegex(RuntimeError, "does not match the codes"):  # int8's rows read as int2_hadamard's
            self.ops.extend_attention_quant(q, pool.fields["k"][0], pool.fields["v"][0], pool.fields["k_scale"][0],
                                            pool.fields["v_scale"][0], "int2_hadamard", table, rows, torch.tensor([4]),
                                            torch.tensor([1]), 0.125)
        with self.assertRaisesRegex(RuntimeError, "int8 scales must be float16"):
            self.ops.extend_attention_quant(q, pool.fields["k"][0], pool.fields["v"][0], torch.ones(3),
                                            torch.ones(3), "int8", table, rows, torch.tensor([4]),
                                            torch.tensor([1]), 0.125)
        bad = table.clone()
        bad[rows[0], 2] = 10**6
        with self.assertRaisesRegex(RuntimeError, "outside the KV pool"):
            run_kernel(self.ops, pool, 0, q, bad, rows, [4], [1], 64)


if __name__ == "__main__":
    unittest.main()
