"""int2_hadamard in the CPU kernels (sgl-kernel/csrc/cpu/kv_quant_int2.h): the code conversions of
extend_attention_quant checked exactly, and kv_quant_write against kv_quant_codec.quantize. (Attention over int2 pools
against an fp64 reference, extend / decode / fresh rows: test_cpu_quant_attention.py; the recent window:
test/registered/mem_cache/test_recent_window.py.)

A request of one token attends to that token alone (softmax weight exactly 1), so with the keys' scale code 0 and no
turn (out_turn None) the kernel's fp32 output is its value row as converted: (trit - 1) x scale, exact in fp32.
"""

import unittest

import torch
from test_cpu_quant_attention import wide_range  # the K/V rows of the attention tests (fp8 subnormals, outliers)

from sglang.jit_kernel.cpu_ops import get_kv_quant_ops, kv_quant_kernels_expected
from sglang.srt.mem_cache import kv_quant_codec as codec
from sglang.srt.mem_cache.quantized_kv_pool import QuantizedKVPool
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

FMT = "int2_hadamard"
HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)  # decode_attention_head_dims(): every phase of 16 values in 5-trit bytes


@unittest.skipUnless(kv_quant_kernels_expected(), "the quantized-KV CPU kernels do not run at this CPU level")
class TestInt2Kernels(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_kv_quant_ops()
        assert cls.ops is not None and hasattr(cls.ops, "extend_attention_quant"), "the kernels did not load"

    def one_token_values(self, pool, n, heads):
        """Request i = slot i + 1 alone, its key scale 0: the fp32 output rows [n, heads, D] are the values."""
        d = pool.head_dim
        q = torch.randn(n, heads, d)
        rows, table = torch.arange(n), torch.arange(1, n + 1).view(n, 1)
        out = self.ops.extend_attention_quant(
            q, pool.fields["k"][0], pool.fields["v"][0], pool.fields["k_scale"][0], pool.fields["v_scale"][0], FMT,
            table, rows, torch.zeros(n, dtype=torch.int64), torch.ones(n, dtype=torch.int64), d**-0.5)
        return out.view(n, heads, d)

    def test_every_value_byte_at_every_position(self):
        """The trit conversion (VPMULHUW's (b x M) >> 16 = floor(b / 3^t), then floor(b / 3^t) - 3 floor(b /
        3^(t+1))) for every byte value 0..242 at every byte position of a row, every compiled head dim (all five
        phases of a 16-value block in the 5-trit bytes), two KV heads of a group of two: exactly the codec's trits."""
        for d in HEAD_DIMS:
            with self.subTest(d=d):
                n, width = 243, -(-d // 5)
                pool = QuantizedKVPool(n + 1, 1, FMT, torch.bfloat16, 2, d, layer_num=1)
                for buf in pool.fields.values():
                    buf.zero_()
                r, j = torch.arange(n)[:, None], torch.arange(width)[None, :]
                pool.fields["v"][0][1 : n + 1, 0] = ((r + 37 * j) % 243).to(torch.uint8)  # row r, byte j: every value at j
                pool.fields["v"][0][1 : n + 1, 1] = ((r + 101 * j + 5) % 243).to(torch.uint8)
                pool.fields["v_scale"][0][1 : n + 1] = torch.tensor([176, 200], dtype=torch.uint8)[:, None]  # 1.0, 4.0
                out = self.one_token_values(pool, n, 4)
                v = pool.gather_kv(0, torch.arange(1, n + 1), torch.float32, rotated=True)[1]  # [n, 2, d] as stored
                want = v.repeat_interleave(2, 1)
                self.assertTrue(torch.equal(out, want), f"d {d}: {int((out != want).sum())} values differ")

    def test_every_scale_code(self):
        """Every log-scale byte 0..255 (values all +1, trit 2): the kernel's scale table is the codec's
        2^((code - 176) / 12) (code 0: 0) to within an ulp (torch's exp2 and the table's correctly rounded one)."""
        n, d = 256, 64
        pool = QuantizedKVPool(n + 1, 1, FMT, torch.bfloat16, 1, d, layer_num=1)
        for buf in pool.fields.values():
            buf.zero_()
        pool.fields["v"][0][1 : n + 1] = 242  # 2 + 2 x 3 + ... + 2 x 81
        codes = torch.arange(n).to(torch.uint8)
        pool.fields["v_scale"][0][1 : n + 1, 0, 0] = codes
        out = self.one_token_values(pool, n, 1)
        want = codec._log_scale_value(codes)[:, None, None].expand(n, 1, d)
        torch.testing.assert_close(out, want, rtol=1.2e-7, atol=0)
        self.assertEqual(int(out[0].abs().sum()), 0)

    def test_write_is_the_codec_rule(self):
        """kv_quant_write (int2_hadamard, the part told by the codes' width: D / 4 keys, ceil(D / 5) values) against
        kv_quant_codec.quantize on the same rows (bf16 and fp32, head dims 32-256, an all-zero row, values over ~6
        octaves): plain rows give exactly the codec's code bytes, and its scale bytes but where log2(s) x 12 lies within
        1e-4 of a half, where the other order of the sums may round it the other way (measured: 2 rows in 960k, both
        keys); turned rows (R given, as both parts are stored) differ only where the turn's other order of sums moves
        r / RMS across a threshold: a level one step away in under 0.5% of the elements, scale bytes within one step."""
        g = torch.Generator().manual_seed(12)
        for dtype in (torch.bfloat16, torch.float32):
            for d in HEAD_DIMS:
                n, kv, slots = 37, 3, 64
                x = wide_range((n, kv, d), g).to(dtype)
                x[5] = 0
                loc = torch.randperm(slots - 1, generator=g)[:n] + 1
                for part in ("k", "v"):
                    for turn in (None, codec.rotation(d)):
                        with self.subTest(dtype=dtype, d=d, part=part, turned=turn is not None):
                            self.check_write(part, x, loc, slots, turn)

    def check_write(self, part, x, loc, slots, turn):
        n, kv, d = x.shape
        codes = torch.zeros(slots, kv, d // 4 if part == "k" else -(-d // 5), dtype=torch.uint8)
        scales = torch.zeros(slots, kv, 1, dtype=torch.uint8)
        self.ops.kv_quant_write(x, codes, scales, loc, FMT, turn)
        want = codec.quantize(FMT, x, part, turned=turn is not None)
        untouched = torch.ones(slots, dtype=torch.bool)
        untouched[loc] = False
        self.assertEqual(int(codes[untouched].int().sum() + scales[untouched].int().sum()), 0)
        got, got_s, want_s = codes[loc], scales[loc].int(), want[part + "_scale"].int()
        self.assertEqual(int(got_s[5].sum()), 0)  # the all-zero row: scale code 0
        if turn is None:
            self.assertTrue(torch.equal(got, want[part]), int((got != want[part]).sum()))
            levels = codec._constant(codec.LEVELS_2BIT, "cpu")[codec._unpack_crumbs(got).long()] if part == "k" \
                else codec._unpack_trits(got, d).double() - 1
            s = (x.double() * levels).sum(-1) / (levels.double() ** 2).sum(-1).clamp_min(1e-30)  # [n, kv]
            t = torch.log2(s.clamp_min(1e-30)) * codec.LOG_SCALE_STEPS
            tie = (t - t.floor() - 0.5).abs() < 1e-4
            bad = (got_s[..., 0] != want_s[..., 0]) & ~tie
            self.assertEqual(int(bad.sum()), 0)
            self.assertLessEqual(int((got_s - want_s).abs().max()), 1)
            return
        unpack = codec._unpack_crumbs if part == "k" else lambda c: codec._unpack_trits(c, d)
        diff = (unpack(got).int() - unpack(want[part]).int()).abs()
        self.assertLessEqual(int(diff.max()), 1)
        self.assertLess(float((diff > 0).float().mean()), 0.005)
        self.assertLessEqual(int((got_s - want_s).abs().max()), 1)

    def test_refusals(self):
        x = torch.randn(2, 1, 64)
        with self.assertRaisesRegex(RuntimeError, "int2_hadamard scales must be a contiguous uint8"):
            self.ops.kv_quant_write(x, torch.zeros(4, 1, 16, dtype=torch.uint8), torch.zeros(4, 1, 1, dtype=torch.float16),
                                    torch.tensor([1, 2]), FMT, None)
        with self.assertRaisesRegex(RuntimeError, "codes must be"):  # neither D / 4 nor ceil(D / 5) bytes
            self.ops.kv_quant_write(x, torch.zeros(4, 1, 32, dtype=torch.uint8), torch.zeros(4, 1, 1, dtype=torch.uint8),
                                    torch.tensor([1, 2]), FMT, None)


if __name__ == "__main__":
    unittest.main()
