"""The CPU MLA kernels (sgl-kernel/csrc/cpu/mla_attention*.h: mla_decode / mla_extend over the latent pool) against
the EXPANDED form in float64, at every ISA level this CPU runs: bf16 from avx512_bf16, fp32 from avx2.

- through the user's path: the torch_native backend on a real MLATokenToKVPool with allocator pages (page sizes 1
  and 16, scattered), driven by sglang.test.mla_reference.MLAHarness: prefill, a chunk over a cached prefix, ragged
  decode steps; the reference decompresses every head's K and V from the latent with random W_UK / W_UV and runs
  plain softmax attention in float64 (the kernel's output is taken through W_UV). Widths 64 + 16, 80 + 20,
  128 + 32 and DeepSeek's 512 + 64. The backend must really take the kernel here (asserted), so a broken kernel fails these.
- the kernel itself: the new latent rows written at out_cache_loc (and nothing else), an extend row equal bit for bit
  to the decode of that token, a head's result independent of how many heads share the call, and refusals by name.
fp32 agrees within fp32 rounding (1e-5 on outputs of size ~1); bf16 within bf16's (inputs rounded to 8 bits).
"""

import unittest

import torch

from sglang.jit_kernel.cpu_isa import LEVELS
from sglang.jit_kernel.cpu_ops import (cpu_kernels_expected, cpu_ops_status, get_ops_for_dtype, quant_kernels_expected,
                                       set_fp32_kernels)
from sglang.srt.layers.attention.cpu_kernel_ops import mla_cpu_ops, mla_decode, mla_extend
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.mla_reference import MLAHarness, max_abs_diff

register_cpu_ci(est_time=40, suite="cpu")

BF16 = torch.bfloat16
# (kv_lora_rank, qk_rope_head_dim, heads): the small test widths and DeepSeek's 512 + 64 = 576. L = 80 and 100 end in
# a partial step of the score pass (bf16 steps of 32 values, fp32 of 16 or 8), kv_lora 80 in a 16-column block of the
# output pass (512-bit), 5, 3 and 11 heads in partial head tiles
WIDTHS = [(64, 16, 5), (80, 20, 3), (128, 32, 11), (512, 64, 4)]
# new tokens per request per step: prefill (no prefix), a chunk over the cached prefix (one request at 1 token),
# ragged decodes
STEPS = [(37, 5, 20), (11, 1, 29), (1, 1, 1), (1, 1, 1)]


class MLAKernelChecks:
    dtype = None
    tol = None  # on the W_UV-projected outputs (~1 in size)

    def levels(self):
        """The ISA levels from this dtype's lowest up to the module's, each set in turn (restored at tearDown)."""
        lowest = "avx512_bf16" if self.dtype == BF16 else "avx2"
        for level in LEVELS[LEVELS.index(lowest) : LEVELS.index(self.level0) + 1]:
            self.ops.set_cpu_isa(level)
            yield level

    def setUp(self):
        if self.dtype == torch.float32:
            set_fp32_kernels(True)  # fp32 stays the torch reference path unless a start asks for the fp32 kernels
            self.addCleanup(set_fp32_kernels, False)
        self.ops = get_ops_for_dtype(self.dtype)
        self.assertIsNotNone(self.ops, f"CPU kernels did not load: {cpu_ops_status()}")
        self.level0 = self.ops.get_cpu_isa()
        self.addCleanup(self.ops.set_cpu_isa, self.level0)

    def test_backend_equals_expanded_fp64(self):
        for level in self.levels():
            for page in (1, 16):
                for kv, rope, heads in WIDTHS:
                    h = MLAHarness("torch_native", page_size=page, dtype=self.dtype, kv_lora_rank=kv,
                                   qk_rope_head_dim=rope, qk_nope_head_dim=32, v_head_dim=24, num_heads=heads,
                                   num_layers=1, seed=page + kv)
                    self.assertIs(h.backend.mla.cpu_ops, self.ops)  # the kernel serves this backend, not the torch path
                    rows = [h.new_request() for _ in STEPS[0]]
                    for new_lens in STEPS:
                        got, want = h.step(rows, new_lens)
                        with self.subTest(level=level, page=page, kv=kv, rope=rope, new_lens=new_lens):
                            self.assertLess(max_abs_diff(got, want), self.tol)

    def test_rows_written_and_extend_equals_decode(self):
        kv, rope, heads, slots = 64, 16, 6, 300
        g = torch.Generator().manual_seed(7)
        L, prefix, extend = kv + rope, [0, 13, 30], [9, 1, 17]
        table = torch.zeros(4, 64, dtype=torch.int64)
        perm = torch.randperm(slots - 1, generator=g) + 1
        rows, start = torch.tensor([2, 0, 3]), 0
        for r, p, e in zip(rows.tolist(), prefix, extend):
            table[r, : p + e] = perm[start : start + p + e]
            start += p + e
        pool = torch.randn(slots, 1, L, generator=g).to(self.dtype)
        q = torch.randn(sum(extend), heads, L, generator=g).to(self.dtype)
        k_new = torch.randn(sum(extend), 1, L + 7, generator=g).to(self.dtype)[..., :L]  # strided rows, as views are
        loc = torch.cat([table[r, p : p + e] for r, p, e in zip(rows.tolist(), prefix, extend)])
        for level in self.levels():
            cache = pool.clone()
            out = mla_extend(self.ops, q, cache, kv, table, rows, torch.tensor(prefix), torch.tensor(extend), 0.1,
                             k_new, loc)
            self.assertEqual((out.shape, out.dtype), ((sum(extend), heads * kv), self.dtype))
            written = torch.zeros(slots, dtype=torch.bool)
            written[loc] = True
            self.assertTrue(torch.equal(cache[loc], k_new))  # the new rows, at out_cache_loc
            self.assertTrue(torch.equal(cache[~written], pool[~written]))  # and nothing else
            q0 = 0
            for r, p, e in zip(rows.tolist(), prefix, extend):
                for i in range(e):  # each row == the decode of that token over the first p + i + 1 rows
                    one = mla_decode(self.ops, q[q0 + i : q0 + i + 1], k_new[q0 + i : q0 + i + 1], cache, kv, table,
                                     torch.tensor([r]), torch.tensor([p + i + 1]), loc[q0 + i : q0 + i + 1], 0.1)
                    self.assertTrue(torch.equal(one[0], out[q0 + i]), (level, r, i))
                q0 += e
            # a head's result does not depend on the heads beside it
            two = mla_extend(self.ops, q[:, 3:5].contiguous(), cache, kv, table, rows, torch.tensor(prefix),
                             torch.tensor(extend), 0.1)
            self.assertTrue(torch.equal(two, out.view(-1, heads, kv)[:, 3:5].reshape(-1, 2 * kv)), level)

    def test_refusals_name_the_argument(self):
        z = lambda *s: torch.zeros(*s, dtype=self.dtype)  # noqa: E731
        table, one = torch.zeros(1, 8, dtype=torch.int64), torch.tensor([0])
        with self.assertRaisesRegex(RuntimeError, "kv_lora_rank 24 must be a multiple of 16"):
            self.ops.mla_decode(z(1, 2, 40), z(1, 1, 40), z(4, 1, 40), 24, table, one, torch.tensor([1]), one, 1.0)
        with self.assertRaisesRegex(RuntimeError, r"out_cache_loc\[0\] = 4 is outside the pool of 4 slots"):
            self.ops.mla_decode(z(1, 2, 48), z(1, 1, 48), z(4, 1, 48), 32, table, one, torch.tensor([1]),
                                torch.tensor([4]), 1.0)
        bad = table.clone()
        bad[0, 1] = 9
        with self.assertRaisesRegex(RuntimeError, "outside the KV pool"):
            self.ops.mla_decode(z(1, 2, 48), z(1, 1, 48), z(4, 1, 48), 32, bad, one, torch.tensor([2]), one, 1.0)
        with self.assertRaisesRegex(RuntimeError, "latent pool"):
            self.ops.mla_extend(z(3, 2, 48), z(4, 2, 48), 32, table, one, one * 0, torch.tensor([3]), 1.0)
        self.assertIsNone(mla_cpu_ops("cpu", self.dtype, self.dtype, self.dtype, 80, 72))  # not a multiple of 16
        self.assertIsNone(mla_cpu_ops("cpu", self.dtype, torch.float8_e4m3fn, torch.uint8, 576, 512))


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0")
class TestMLAKernelBf16(MLAKernelChecks, unittest.TestCase):
    dtype, tol = BF16, 0.05

    def test_bf16_refused_below_avx512_bf16(self):
        z = torch.zeros(1, 2, 48, dtype=BF16)
        for level in LEVELS[LEVELS.index("avx2") : LEVELS.index("avx512_bf16")]:
            self.ops.set_cpu_isa(level)
            with self.assertRaisesRegex(RuntimeError, f"bfloat16 needs CPU level avx512_bf16, this module runs at {level}"):
                self.ops.mla_decode(z, z[:, :1], torch.zeros(4, 1, 48, dtype=BF16), 32, torch.zeros(1, 8, dtype=torch.int64),
                                    torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), 1.0)


@unittest.skipUnless(quant_kernels_expected(), "no AVX2 on this CPU, or SGLANG_CPU_KERNELS=0: no fp32 kernels")
class TestMLAKernelF32(MLAKernelChecks, unittest.TestCase):
    dtype, tol = torch.float32, 1e-5


if __name__ == "__main__":
    unittest.main()
