"""decode_attention / extend_attention (sgl-kernel/csrc/cpu) with issue 41's windowed-layer arguments: sliding_window,
sinks, logit_cap and loc_map (window_keys.h), bf16 and fp32, at every ISA level that runs them.

Reference: fp64 brute force per query row from the same stored values: the query at position p sees positions
max(0, p - W + 1) .. p, each read as buffer[loc_map[req_to_token[row, j]]]; scores scale * q.k, soft-capped
cap * tanh(s / cap), softmax whose denominator also holds e^{sink} of the head. The batches are built the way the
windowed pool leaves them: loc_map is a random permutation into a smaller buffer (not the identity), and every position
below a request's window is garbage the kernel must not touch: mapped to a buffer row of NaN (any read poisons the
output), or a token-pool slot outside the map altogether (any check of it refuses the call).
"""

import unittest

import torch

from sglang.jit_kernel.cpu_isa import LEVELS
from sglang.jit_kernel.cpu_ops import (cpu_kernels_expected, get_cpu_ops, get_fp32_ops, quant_kernels_expected,
                                       set_fp32_kernels)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="cpu")

TOKEN_SLOTS, BUFFER_SLOTS = 1500, 700
POISON = BUFFER_SLOTS - 1  # the buffer row of NaN that the positions below a window map to (half of them)
# (prefix lens, extend lens, heads, kv heads, head dim, window): a chunk cutting the window edge, a window wider than
# the sequence, a window of one key, a request whose prefix lies wholly outside its window, groups of 5 (two passes
# over the keys, so the sinks' offset per pass matters), 1 and 4
CASES = [
    ([40, 0], [33, 20], 10, 2, 64, 16),
    ([5, 0, 90], [9, 31, 4], 8, 2, 128, 1000),
    ([7], [12], 4, 4, 96, 1),
    ([200, 3], [6, 40], 8, 1, 64, 32),
    ([60], [25], 10, 2, 256, 48),
]


def make_batch(prefix, extend, heads, kv, d, window, dtype, mapped=True, seed=0):
    """q, k_cache, v_cache, req_to_token, rows, prefix_lens, extend_lens, loc_map (None: the cache is the token pool)."""
    g = torch.Generator().manual_seed(seed + 7 * d + len(prefix))
    slots = BUFFER_SLOTS if mapped else TOKEN_SLOTS
    k_cache = torch.randn(slots, kv, d, generator=g)
    v_cache = torch.randn(slots, kv, d, generator=g)
    k_cache[POISON], v_cache[POISON] = float("nan"), float("nan")
    bs, width = len(prefix), max(p + e for p, e in zip(prefix, extend)) + 3
    table = torch.zeros(bs + 2, width, dtype=torch.int64)
    rows = torch.randperm(bs + 2, generator=g)[:bs]
    token_perm = torch.randperm(TOKEN_SLOTS, generator=g)
    buffer_perm = torch.randperm(BUFFER_SLOTS - 2, generator=g) + 1  # 0: the dummy page; POISON: NaN
    loc_map = torch.zeros(TOKEN_SLOTS, dtype=torch.int32)
    used_t = used_b = 0
    for r, p, e in zip(rows.tolist(), prefix, extend):
        n, lo = p + e, max(0, p + 1 - window)  # the request's first new row reads from position lo
        t = token_perm[used_t : used_t + n].clone()
        used_t += n
        if mapped:
            loc_map[t[lo:]] = buffer_perm[used_b : used_b + n - lo].int()
            used_b += n - lo
            loc_map[t[:lo]] = POISON
            t[:lo:2] = TOKEN_SLOTS + 5  # freed and stale: outside the map
        else:
            k_cache[t[:lo]], v_cache[t[:lo]] = float("nan"), float("nan")
            t[:lo:2] = -3  # stale entries of a windowed-only model's table
        table[r, :n] = t
    q = torch.randn(sum(extend), heads, d, generator=g) * 2  # scores of a few units: the soft cap bends them
    cast = lambda x: x.to(dtype)
    return (cast(q), cast(k_cache), cast(v_cache), table, rows, torch.tensor(prefix), torch.tensor(extend),
            loc_map if mapped else None)


def reference(q, k_cache, v_cache, table, rows, prefix, extend, loc_map, window, scale, sinks=None, cap=0.0):
    """fp64 brute force, a request's rows at once under the explicit mask pos - W < j <= pos: [N, H * D]."""
    N, H, D = q.shape
    KV = k_cache.shape[1]
    outs, n = [], 0
    for r, p, e in zip(rows.tolist(), prefix.tolist(), extend.tolist()):
        lo = max(0, p + 1 - window) if window > 0 else 0  # no row of the request sees a key below lo
        slots = table[r, lo : p + e]
        if loc_map is not None:
            slots = loc_map[slots].long()
        k = k_cache[slots].double().repeat_interleave(H // KV, dim=1)  # [keys, H, D]
        v = v_cache[slots].double().repeat_interleave(H // KV, dim=1)
        s = torch.einsum("ehd,khd->hek", q[n : n + e].double(), k) * scale
        if cap > 0:
            s = cap * torch.tanh(s / cap)
        pos, key = torch.arange(p, p + e)[:, None], torch.arange(lo, p + e)[None, :]
        visible = (key <= pos) & ((pos - key < window) if window > 0 else True)
        s = s.masked_fill(~visible, float("-inf"))
        m = s.max(dim=2, keepdim=True).values
        if sinks is not None:
            m = torch.maximum(m, sinks.double()[:, None, None])
        w = torch.exp(s - m)
        den = w.sum(dim=2, keepdim=True)
        if sinks is not None:
            den = den + torch.exp(sinks.double()[:, None, None] - m)
        outs.append(torch.einsum("hek,khd->ehd", w / den, v).reshape(e, H * D))
        n += e
    return torch.cat(outs)


class WindowChecks:
    dtype = atol = None

    def single_threaded_reference(self):
        """The reference is thousands of small torch ops: one thread runs them ~10x faster than several on a shared
        machine. (The kernels' own thread pool is sized when they load, before this.)"""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.addCleanup(torch.set_num_threads, threads)

    def variants(self, heads, seed):
        g = torch.Generator().manual_seed(seed)
        sinks = torch.randn(heads, generator=g) * 2
        sinks[0] = 30.0  # a sink far above every score: its head's output all but vanishes, and stays finite
        return [dict(), dict(sinks=sinks), dict(logit_cap=2.5), dict(sinks=sinks, logit_cap=2.5)]

    def check_case(self, ops, case, mapped):
        prefix, extend, heads, kv, d, window = case
        q, kc, vc, table, rows, pre, ext, loc_map = make_batch(prefix, extend, heads, kv, d, window, self.dtype, mapped)
        scale = d**-0.5
        for extra in self.variants(heads, d):
            msg = (case, mapped, sorted(extra))
            out = ops.extend_attention(q, kc, vc, table, rows, pre, ext, scale, sliding_window=window,
                                       loc_map=loc_map, **extra)
            ref = reference(q, kc, vc, table, rows, pre, ext, loc_map, window, scale, extra.get("sinks"),
                            extra.get("logit_cap", 0.0))
            self.assertEqual(out.dtype, self.dtype)
            torch.testing.assert_close(out.double(), ref, atol=self.atol, rtol=self.atol, msg=lambda m: f"{msg}: {m}")
            # each row again through decode: its K/V written through the map, the same result bit for bit
            n = 0
            for r, p, e in zip(rows.tolist(), pre.tolist(), ext.tolist()):
                for i in (0, e - 1):
                    loc = table[r, p + i : p + i + 1]
                    dst = loc_map[loc].long() if loc_map is not None else loc
                    k_new, v_new = torch.randn_like(kc[dst].float()).to(self.dtype), kc[dst].clone()
                    k_after, v_after = kc.clone(), vc.clone()
                    k_after[dst], v_after[dst] = k_new, v_new
                    one = ops.decode_attention(q[n + i : n + i + 1], k_new, v_new, kc, vc, table, torch.tensor([r]),
                                               torch.tensor([p + i + 1]), loc, scale, sliding_window=window,
                                               loc_map=loc_map, **extra)
                    self.assertTrue(torch.equal(kc.nan_to_num(7.0), k_after.nan_to_num(7.0)), msg)  # only there
                    self.assertTrue(torch.equal(vc.nan_to_num(7.0), v_after.nan_to_num(7.0)), msg)
                    row_ref = reference(q[n + i : n + i + 1], kc, vc, table, torch.tensor([r]), torch.tensor([p + i]),
                                        torch.tensor([1]), loc_map, window, scale, extra.get("sinks"),
                                        extra.get("logit_cap", 0.0))
                    torch.testing.assert_close(one.double(), row_ref, atol=self.atol, rtol=self.atol,
                                               msg=lambda m: f"{msg} decode row {r} {i}: {m}")
                n += e
            # the decode writes above changed some keys: the batch is rebuilt for the next variant
            q, kc, vc, table, rows, pre, ext, loc_map = make_batch(prefix, extend, heads, kv, d, window, self.dtype,
                                                                   mapped)

    def check_all(self, ops):
        for case in CASES:
            for mapped in (True, False):
                self.check_case(ops, case, mapped)

    def check_defaults_unchanged(self, ops):
        """A window as wide as the sequence and the identity map take other code paths to the same keys: the result
        equals the plain call bit for bit."""
        q, kc, vc, table, rows, pre, ext, _ = make_batch([30, 0], [9, 17], 8, 2, 64, 1000, self.dtype, mapped=False)
        ident = torch.arange(TOKEN_SLOTS, dtype=torch.int32)
        plain = ops.extend_attention(q, kc, vc, table, rows, pre, ext, 0.125)
        wide = ops.extend_attention(q, kc, vc, table, rows, pre, ext, 0.125, sliding_window=39, loc_map=ident)
        self.assertTrue(torch.equal(plain, wide))
        zero_cap = ops.extend_attention(q, kc, vc, table, rows, pre, ext, 0.125, logit_cap=0.0, sinks=None)
        self.assertTrue(torch.equal(plain, zero_cap))

    def check_refusals(self, ops):
        q, kc, vc, table, rows, pre, ext, loc_map = make_batch([20, 4], [6, 3], 4, 2, 64, 8, self.dtype)
        args = (q, kc, vc, table, rows, pre, ext, 0.125)
        for kwargs, pattern in [
            (dict(sliding_window=0, loc_map=loc_map), "sliding_window must be -1"),
            (dict(sliding_window=8, loc_map=loc_map.long()), "loc_map must be a contiguous int32"),
            (dict(sliding_window=8, loc_map=loc_map, sinks=torch.zeros(3)), "one logit per query head"),
            (dict(sliding_window=8, loc_map=loc_map, sinks=torch.zeros(4, dtype=torch.float64)), "sinks must be"),
            (dict(sliding_window=8, loc_map=loc_map, logit_cap=-1.0), "logit_cap must be"),
            (dict(sliding_window=9, loc_map=loc_map), "outside the KV pool"),  # one more key: a freed position
            (dict(sliding_window=8), "outside the KV pool"),  # token-pool slots read as buffer slots
        ]:
            with self.assertRaisesRegex(RuntimeError, pattern, msg=str(kwargs)):
                ops.extend_attention(*args, **kwargs)
        bad_map = loc_map.clone()
        bad_map[table[rows[0], 19]] = BUFFER_SLOTS  # the last prefix position, inside the window
        with self.assertRaisesRegex(RuntimeError, "outside the KV pool"):
            ops.extend_attention(*args, sliding_window=8, loc_map=bad_map)
        # decode: the write goes through the map too, and a slot the map sends outside the buffer is refused
        loc = table[rows[0], 25:26]
        step = (q[:1], kc[:1], vc[:1], kc, vc, table, rows[:1], torch.tensor([26]))
        with self.assertRaisesRegex(RuntimeError, "out_cache_loc through loc_map"):
            ops.decode_attention(*step, torch.tensor([TOKEN_SLOTS]), 0.125, sliding_window=8, loc_map=loc_map)
        bad_map = loc_map.clone()
        bad_map[loc] = -1
        with self.assertRaisesRegex(RuntimeError, "out_cache_loc through loc_map"):
            ops.decode_attention(*step, loc, 0.125, sliding_window=8, loc_map=bad_map)


@unittest.skipUnless(cpu_kernels_expected(), "no AVX-512 BF16 on this CPU, or SGLANG_CPU_KERNELS=0")
class TestWindowAttentionBf16(WindowChecks, unittest.TestCase):
    dtype, atol = torch.bfloat16, 2e-2

    def test_every_level(self):
        ops = get_cpu_ops()
        self.single_threaded_reference()
        level0 = ops.get_cpu_isa()
        self.addCleanup(ops.set_cpu_isa, level0)
        for level in LEVELS[LEVELS.index("avx512_bf16") : LEVELS.index(level0) + 1]:
            with self.subTest(level=level):
                ops.set_cpu_isa(level)
                self.check_all(ops)
                self.check_defaults_unchanged(ops)
        self.check_refusals(ops)


@unittest.skipUnless(quant_kernels_expected(), "no AVX2 on this CPU, or SGLANG_CPU_KERNELS=0: no fp32 kernels")
class TestWindowAttentionF32(WindowChecks, unittest.TestCase):
    dtype, atol = torch.float32, 2e-5

    def test_every_level(self):
        set_fp32_kernels(True)
        self.addCleanup(set_fp32_kernels, False)
        ops = get_fp32_ops()
        self.single_threaded_reference()
        level0 = ops.get_cpu_isa()
        self.addCleanup(ops.set_cpu_isa, level0)
        for level in LEVELS[LEVELS.index("avx2") : LEVELS.index(level0) + 1]:
            with self.subTest(level=level):
                ops.set_cpu_isa(level)
                self.check_all(ops)
                self.check_defaults_unchanged(ops)
        self.check_refusals(ops)


class TestWindowKernelsDeclared(unittest.TestCase):
    def test_flag_matches_the_module(self):
        """cpu_kernel_ops.WINDOW_KERNELS (what torch_native asks) is only true with a module whose kernels take the
        arguments."""
        from sglang.srt.layers.attention import cpu_kernel_ops

        self.assertTrue(cpu_kernel_ops.WINDOW_KERNELS)
        ops = get_cpu_ops()
        if ops is not None:
            for name in ("decode_attention", "extend_attention"):
                for arg in ("sliding_window", "sinks", "logit_cap", "loc_map"):
                    self.assertIn(arg, getattr(ops, name).__doc__)


if __name__ == "__main__":
    unittest.main()
