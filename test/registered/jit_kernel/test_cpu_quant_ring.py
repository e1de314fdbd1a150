"""extend_attention_quant with a recent window whose ring rows are fewer than req_to_token's (quant_attention_op.h).

The window's rows follow running requests (mem_plan/kv_window.py): R_w + 1 ring rows against one req_to_token row a
request slot, request b reading ring row ring_rows[b] (row 0 the scratch row of the requests without one). The kernel
takes the rings as [ring rows, E, KV, D] and must read request b's sinks (positions [0, s_b)) from entries
ring_rows[b] x E + W + p and its newest cached positions [P_b - w_b, P_b) from ring_rows[b] x E + p % W, the rest
through the codes, the new tokens as fresh rows, then write the new rows to the ring entries ring_write / sink_write
name (flat over [ring rows, E]).

Reference: fp64 attention (test_cpu_quant_attention.reference) over rows chosen by this test: the pool's own
dequantization of the codes, replaced at the ring positions by the ring's bf16 entries turned back to the plain basis
(QuantizedKVPool.plain_basis), and the fed new rows. The ring's entries hold other values than the codes (and the
scratch row huge ones), so reading codes where the ring is due, the wrong ring row, or the scratch row fails it. Every
format, page sizes 1 and 16, extend with cached prefixes and decode; test_kv_quant_kernel_levels.py runs this file
at level avx512_vnni too.
"""

import unittest
import zlib

import torch
from test_cpu_quant_attention import BF16, FORMATS, kernel_turns, make_pool, reference, wide_range

from sglang.jit_kernel.cpu_ops import get_kv_quant_ops, kv_quant_kernels_expected
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="cpu")

W, S = 8, 4  # ring entries a row: W recent, then S sinks
# (prefix lens, extend lens, each request's ring row, ring counts w_b, sink counts s_b, heads, kv heads, head dim);
# 3 ring rows against the table's len(prefix) + 2 rows
CASES = [
    ([40, 0, 7, 25], [3, 5, 2, 1], [2, 0, 1, 0], [W, 0, 3, 0], [S, 0, S, 0], 9, 3, 64),  # request 2: all from the ring
    ([30, 9, 50], [1, 1, 1], [1, 2, 0], [W, 5, 0], [S, 2, 0], 4, 1, 128),  # decode
]


def ring_reference(pool, layer, q, table, rows, prefix, extend, heads, kv, d, fresh, ring, req_ring, counts, sinks):
    """reference() with request b's positions [0, s_b) and [P_b - w_b, P_b) read from its ring row instead."""
    r_k = pool.rotation("k")
    ring_k, ring_v = (pool.plain_basis(layer, part, x.view(-1, kv, d)).double().view(x.shape)
                      for part, x in zip("kv", ring))
    if r_k is not None:
        ring_k = ring_k @ r_k.double()
    outs, q0 = [], 0
    for b, (r, p, e) in enumerate(zip(rows.tolist(), prefix, extend)):
        k = pool.gather_kv(layer, table[r, :p], torch.float64, rotated=True)[0]
        v = pool.gather_kv(layer, table[r, :p], torch.float64)[1]
        for pos in [*range(sinks[b]), *range(p - counts[b], p)]:
            entry = W + pos if pos < sinks[b] else pos % W
            k[pos], v[pos] = ring_k[req_ring[b], entry], ring_v[req_ring[b], entry]
        mine = (fresh[0][q0 : q0 + e], fresh[1][q0 : q0 + e])
        outs.append(reference_with_rows(pool, q[q0 : q0 + e], k, v, mine, heads, kv, d))
        q0 += e
    return torch.cat(outs)


def reference_with_rows(pool, q, k, v, fresh, heads, kv, d):
    """One request: its cached rows k / v (reference basis, fp64) and its new tokens' fed rows, causal in fp64."""
    r_k = pool.rotation("k")
    k_new = fresh[0].double() if r_k is None else fresh[0].double() @ r_k.double()
    k, v = torch.cat([k, k_new]), torch.cat([v, fresh[1].double()])
    p, e = k.shape[0] - q.shape[0], q.shape[0]
    qq = (q.double() if r_k is None else q.double() @ r_k.double()).view(e, kv, heads // kv, d)
    s = torch.einsum("ekgd,jkd->ekgj", qq, k) * d**-0.5
    mask = torch.arange(p + e)[None, :] <= (p + torch.arange(e))[:, None]
    s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    return torch.einsum("ekgj,jkd->ekgd", torch.softmax(s, -1), v).reshape(e, heads * d)


@unittest.skipUnless(kv_quant_kernels_expected(), "the quantized-KV CPU kernels do not run at this CPU level")
class TestQuantRingRows(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ops = get_kv_quant_ops()
        assert cls.ops is not None and hasattr(cls.ops, "extend_attention_quant"), "the kernels did not load"

    def check(self, fmt, page, prefix, extend, req_ring, counts, sinks, heads, kv, d):
        g = torch.Generator().manual_seed(zlib.crc32(repr((fmt, page, d)).encode()))
        pool, table, rows = make_pool(fmt, page, kv, d, g, [p + e for p, e in zip(prefix, extend)])
        n, ring_rows = sum(extend), 3
        self.assertLess(ring_rows, table.shape[0])
        q = (torch.randn(n, heads, d, generator=g) * 2).to(BF16)
        fresh = (wide_range((n, kv, d), g).to(BF16), wide_range((n, kv, d), g).to(BF16))
        # the new tokens' ring and sink entries (flat over [ring rows, W + S]), -1 where a token enters none
        starts = torch.tensor(prefix)
        pos = torch.cat([p + torch.arange(e) for p, e in zip(prefix, extend)])
        req = torch.repeat_interleave(torch.arange(len(prefix)), torch.tensor(extend))
        ring_row = torch.tensor(req_ring)[req]
        has_row = ring_row > 0
        ring_write = torch.where(has_row, ring_row * (W + S) + pos % W, -1)
        sink_write = torch.where(has_row & (pos < S), ring_row * (W + S) + W + pos.clamp(max=S - 1), -1)
        scales = pool.fixed if pool.is_fp8 else pool.fields
        for layer in (0, 1):
            q_turn, q_smooth, out_turn = kernel_turns(pool, layer)
            plain = [wide_range((ring_rows, W + S, kv, d), g) for _ in range(2)]
            ring = [pool.stored_basis(layer, part, x.view(-1, kv, d)).view(x.shape).to(BF16).contiguous()
                    for part, x in zip("kv", plain)]
            for x in ring:  # the scratch row: what no request may read
                x[0] = 1e4
            before = [x.clone() for x in ring]
            fk, fv = pool.stored_basis(layer, "k", fresh[0]), pool.stored_basis(layer, "v", fresh[1])
            out = self.ops.extend_attention_quant(
                q, pool.fields["k"][layer], pool.fields["v"][layer], scales["k_scale"][layer], scales["v_scale"][layer],
                pool.kv_format, table, rows, starts, torch.tensor(extend), d**-0.5, q_turn, q_smooth, out_turn, fk, fv,
                ring[0], ring[1], torch.tensor(req_ring), torch.tensor(counts), ring_write, torch.tensor(sinks),
                sink_write, W)
            what = f"{fmt} page {page} {prefix}/{extend} layer {layer}"
            ref = ring_reference(pool, layer, q, table, rows, prefix, extend, heads, kv, d, fresh, before, req_ring,
                                 counts, sinks)
            torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2, msg=lambda m: f"{what}: {m}")
            codes_only = reference(pool, layer, q, table, rows, prefix, extend, heads, kv, d, fresh)
            self.assertGreater(float((codes_only - ref).abs().max()), 0.1, f"{what}: the ring changes nothing")
            # after the reads: the new rows in their ring and sink entries (bf16 of the stored basis), nothing else
            for x, old, new in zip(ring, before, (fk, fv)):
                want = old.view(-1, kv, d).clone()
                for t in range(n):
                    for entry in (int(ring_write[t]), int(sink_write[t])):
                        if entry >= 0:
                            want[entry] = new[t].to(BF16)
                self.assertTrue(torch.equal(x.view(-1, kv, d), want), f"{what}: ring after the write")

    def test_ring_rows_fewer_than_requests_rows(self):
        for fmt in FORMATS:
            for page in (1, 16):
                for case in CASES:
                    with self.subTest(fmt=fmt, page=page, case=case[:2]):
                        self.check(fmt, page, *case)

    def test_refusals(self):
        """The ring's own shape is checked: 4-D [ring rows, E, KV, D], request rows inside it, W <= E."""
        g = torch.Generator().manual_seed(3)
        pool, table, rows = make_pool("int8", 1, 2, 64, g, [9])
        q, f = torch.randn(1, 4, 64).to(BF16), torch.randn(1, 2, 64)
        ring = torch.zeros(2, W + S, 2, 64, dtype=BF16)

        def call(ring_k, ring_rows, window=W):
            return self.ops.extend_attention_quant(
                q, pool.fields["k"][0], pool.fields["v"][0], pool.fields["k_scale"][0], pool.fields["v_scale"][0],
                "int8", table, rows, torch.tensor([8]), torch.tensor([1]), 0.125, None, None, None, f, f, ring_k,
                ring_k, torch.tensor([ring_rows]), torch.tensor([2]), None, None, None, window)

        self.assertEqual(call(ring, 1).shape, (1, 4 * 64))
        with self.assertRaisesRegex(RuntimeError, "ring rows, entries"):
            call(ring.view(-1, 2, 64), 1)
        with self.assertRaisesRegex(RuntimeError, "ring row or counts are out of range"):
            call(ring, 2)
        with self.assertRaisesRegex(RuntimeError, "exceeds the ring's"):
            call(ring, 1, W + S + 1)


if __name__ == "__main__":
    unittest.main()
