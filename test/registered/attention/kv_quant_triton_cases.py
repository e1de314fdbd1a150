"""Shared by the quantized-KV Triton kernel tests: a one-layer quantized pool (the real QuantizedKVPool: its codec
writes the codes and scales) with shuffled pages, and runners that return the max abs error of the Triton decode /
extend kernels, reading the pool's codes in place, against a float64 attention over the cached tokens' dequantized K/V
(gather_kv, unrotated: the host's rotation of q, k, v and of the output is checked too; a format with fixed channel
means gets non-zero ones) and the new tokens' K/V exactly as written (the forward's own, attended as computed though the
pool holds their codes too). codes_reference=True compares against the old rule instead (the new tokens through their
codes): the kernels must be far from it. ring_counts: the formats with a recent window (int4, int2_hadamard, fp8) read
request b's last ring_counts[b] cached tokens from a ring (kv_formats.RingOperands: bf16, in the pool's stored basis,
noise in every other entry), the reference those rows turned back; ring_codes_reference=True reads them through their
codes instead (a kernel ignoring the ring). sink_counts: the ring also has S = kv_quant.SINK_TOKENS sink entries per
row (without it none: the kernels' SINKS=0 path) and request b's first sink_counts[b] cached tokens are read from them,
the reference substituting their bf16 rows for positions [0, s_b) (computed from the written K/V, not read from the
ring); sink_codes_reference=True reads those through their codes (a kernel ignoring the sinks). Not a test file."""

import torch
from triton_attention_cases import reference

from sglang.srt.mem_plan.kv_quant import RECENT_WINDOW_TOKENS, SINK_TOKENS, recent_window

# max abs error of the kernels against the float64 attention over the dequantized rows (outputs are O(1))
QUANT_TOL = {torch.float32: 4e-5, torch.float16: 1e-2}  # fp16: the query, p and the turned q in fp16
FORMATS = ("fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2_hadamard")
DECODE_CASE = dict(seq_lens=[1, 5, 40, 17], num_q_heads=4, num_kv_heads=2, head_dim=32, num_splits=2)
# no prefix (attends to the fresh K/V), a prefix ending mid-page, a one-token extend after a prefix
EXTEND_CASE = dict(prefix_lens=[0, 20, 9], extend_lens=[6, 11, 1], num_q_heads=6, num_kv_heads=2, head_dim=32)
WINDOW_FORMATS = tuple(RECENT_WINDOW_TOKENS)  # int4, int2_hadamard (W = 16), fp8 (W = 48, e5m2 56)


def ring_decode_case(fmt):
    """Ring counts (cached = seq_len - 1): none, every cached token (no codes read), as many as the window or every
    cached one, a partial ring, a full ring that wraps; the last request has code tokens in two splits with the GPU
    tiles."""
    w = recent_window(fmt)
    return dict(DECODE_CASE, seq_lens=[1, 5, 40, 17, 90], ring_counts=[0, 4, min(39, w), 9, w])


def ring_extend_case(fmt):
    return dict(EXTEND_CASE, ring_counts=[0, min(20, recent_window(fmt)), 9])


def sink_decode_case(fmt):
    """Sinks (s_b of S = 4) and ring counts w_b over cached = seq_len - 1 = [0, 3, 39, 16, 89, 29, 12, 49, 59]: nothing
    cached; fewer cached than S (every one a sink); all sinks with a full ring and codes between; two sinks (some
    evicted) with a partial ring; all sinks with a full wrapping ring (its codes in two splits with the GPU tiles);
    sinks and codes, no ring; sinks and ring meeting (no codes); 30 codes after the sinks (with the GPU tiles one
    split, 34 if a kernel counted the sinks as codes: two); no sinks (s_b = 0) with a ring and two splits of codes."""
    w = recent_window(fmt)
    assert SINK_TOKENS == 4, SINK_TOKENS  # the counts below are written for S = 4
    return dict(DECODE_CASE, seq_lens=[1, 4, 40, 17, 90, 30, 13, 50, 60], sink_counts=[0, 3, 4, 2, 4, 4, 4, 4, 0],
                ring_counts=[0, 0, min(35, w), 9, w, 0, 8, 15, 5])


def sink_extend_case(fmt):
    """prefix [0, 20, 9, 3, 30, 12]: none; all sinks, a ring meeting them; two sinks, ring, codes; fewer cached than
    S (all sinks); no sinks with a ring; sinks and ring meeting (no codes)."""
    assert SINK_TOKENS == 4, SINK_TOKENS
    return dict(EXTEND_CASE, prefix_lens=[0, 20, 9, 3, 30, 12], extend_lens=[6, 11, 1, 4, 5, 2],
                sink_counts=[0, 4, 2, 3, 0, 4], ring_counts=[0, min(16, recent_window(fmt)), 5, 0, 10, 8])


class QuantPagedKV:
    """A one-layer pool of `fmt` holding random K/V (per-head magnitudes differ) for each request, at shuffled pages."""

    def __init__(self, fmt, seq_lens, num_kv_heads, head_dim, page_size, max_ctx=128, seed=0):
        from sglang.srt.mem_cache.quantized_kv_pool import create_kv_pool

        g = torch.Generator().manual_seed(seed)
        pages_per_req = [-(-n // page_size) for n in seq_lens]
        num_pages = sum(pages_per_req) + 2
        self.pool = create_kv_pool(fmt, num_pages * page_size, page_size, torch.float32, num_kv_heads, head_dim, 1)
        if self.pool.is_fp8:  # non-unit per-head scales, as calibration sets them
            self.pool.load_scales(torch.linspace(0.01, 0.05, num_kv_heads).view(1, -1),
                                  torch.linspace(0.03, 0.02, num_kv_heads).view(1, -1), "test")
        if "k_smooth" in getattr(self.pool, "fixed", {}):  # int4's key multipliers, not 1 (mean 1 per head)
            w = torch.exp(torch.randn(self.pool.fixed["k_smooth"].shape, generator=g) * 0.25)  # calibrated: ^(1/8)
            self.pool.fixed["k_smooth"].copy_(w / w.mean(-1, keepdim=True))
        for name in ("k_mean", "v_mean"):  # a format storing K/V less a fixed channel mean: a non-zero one
            if name in getattr(self.pool, "fixed", {}):
                self.pool.fixed[name].copy_(torch.randn(self.pool.fixed[name].shape, generator=g) * 2)
        order = torch.randperm(num_pages, generator=g) + 1  # page 0 is the dummy page
        self.req_to_token = torch.zeros(len(seq_lens) + 3, max_ctx, dtype=torch.int64)
        self.rows = torch.arange(len(seq_lens), 0, -1, dtype=torch.int64) + 1  # row != batch index
        head_gain = torch.linspace(0.5, 3.0, num_kv_heads).view(1, -1, 1)
        self.k_written, self.v_written = [], []
        used = 0
        for b, n in enumerate(seq_lens):
            pages = order[used : used + pages_per_req[b]]
            used += pages_per_req[b]
            slots = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:n]
            self.req_to_token[self.rows[b], :n] = slots
            k = torch.randn(n, num_kv_heads, head_dim, generator=g) * head_gain
            v = torch.randn(n, num_kv_heads, head_dim, generator=g) * head_gain
            self.pool.set_kv_buffer(0, slots, k, v)
            self.k_written.append(k)
            self.v_written.append(v)

    def seq_kv(self, b, n):
        """The pool's own dequantized K/V of request b's first n tokens (fp32, unrotated)."""
        return self.pool.gather_kv(0, self.req_to_token[self.rows[b], :n], torch.float32)

    def attended_kv(self, b, cached, dtype, codes_reference=False, recent=0, sinks=0):
        """Request b's K/V as a forward must attend them (float64): its first `cached` tokens (earlier forwards')
        through their codes, but positions [0, sinks) and [cached - recent, cached) as the ring holds them (bf16 in
        the stored basis, turned back), the rest (this forward's new tokens) exactly as written in `dtype`;
        codes_reference: every token through its codes."""
        n = self.k_written[b].shape[0]
        if codes_reference:
            cached, recent, sinks = n, 0, 0
        k, v = self.seq_kv(b, cached)
        for part, x in (("k", k), ("v", v)):
            for positions in (torch.arange(sinks), torch.arange(cached - recent, cached)):
                x[positions] = self.pool.plain_basis(0, part, self.ring_rows(b, part, positions))
        return (torch.cat([k.double(), self.k_written[b][cached:].to(dtype).double()]),
                torch.cat([v.double(), self.v_written[b][cached:].to(dtype).double()]))

    def ring_rows(self, b, part, positions):
        """What a ring holds of request b's tokens at `positions`: their written K or V in the stored basis, bf16."""
        written = (self.k_written if part == "k" else self.v_written)[b][positions]
        return self.pool.stored_basis(0, part, written).bfloat16()

    def ring(self, cached_lens, counts, sinks=None):
        """A ring as a server's holds it (mem_cache/recent_window.py), E = W + S entries per row (S = SINK_TOKENS with
        `sinks`, else 0): request b's positions [cached - counts[b], cached) at entry row * E + position % W, its
        positions [0, sinks[b]) at entry row * E + W + position, noise (8x the K/V's scale) in every other entry."""
        from sglang.srt.layers.attention.triton_ops.kv_formats import RingOperands
        from sglang.srt.mem_plan.kv_quant import recent_window

        window, g = recent_window(self.pool.kv_format), torch.Generator().manual_seed(3)
        entries = window + (SINK_TOKENS if sinks is not None else 0)
        sinks = [0] * len(counts) if sinks is None else sinks
        shape = (self.req_to_token.shape[0] * entries, self.pool.head_num)
        ring = RingOperands(*(torch.randn(*shape, d, generator=g).mul(8).bfloat16()
                              for d in (self.pool.head_dim, self.pool.v_head_dim)),
                            self.rows.clone(), torch.tensor(counts, dtype=torch.int64),
                            torch.tensor(sinks, dtype=torch.int64), window, entries)
        for b, (p, c, s) in enumerate(zip(cached_lens, counts, sinks)):
            assert s <= entries - window and c <= window and p - c >= s, (b, p, c, s)
            recent, first = torch.arange(p - c, p), torch.arange(s)
            for part, buf in (("k", ring.k), ("v", ring.v)):
                buf[self.rows[b] * entries + recent % window] = self.ring_rows(b, part, recent)
                buf[self.rows[b] * entries + window + first] = self.ring_rows(b, part, first)
        return ring


def _rotations(pool):
    """The stored basis' rotations (int4 keys and int2_hadamard's K and V; the plan's table, kv_quant.rotated_parts)."""
    from sglang.srt.mem_cache import kv_quant_codec
    from sglang.srt.mem_plan.kv_quant import rotated_parts

    parts = rotated_parts(pool.kv_format) if hasattr(pool, "kv_format") else ()
    return tuple(kv_quant_codec.rotation(pool.head_dim) if p in parts else None for p in ("k", "v"))


def run_quant_decode(fmt, page_size, dtype, tiles=None, scale_error=1.0, seq_lens=None, num_q_heads=4,
                     num_kv_heads=2, head_dim=32, num_splits=2, codes_reference=False, ring_counts=None,
                     ring_codes_reference=False, sink_counts=None, sink_codes_reference=False):
    """Max abs error of decode_attention_fwd over a `fmt` pool, the current token (position seq_len - 1, written to
    the pool too) given as fresh k_new / v_new (scale_error multiplies the fp8 per-head scales / the int formats'
    per-token scales in the pool after writing, to show a wrong scale fails)."""
    from sglang.srt.layers.attention.triton_ops import decode_attention_fwd
    from sglang.srt.layers.attention.triton_ops.kv_formats import (into_basis, key_smooth, kv_operands, out_of_basis,
                                                                   value_mean)

    kv = QuantPagedKV(fmt, seq_lens, num_kv_heads, head_dim, page_size)
    cached = [n - 1 for n in seq_lens]
    ring = kv.ring(cached, ring_counts, sink_counts) if ring_counts else None
    refs = [kv.attended_kv(b, p, dtype, codes_reference, *_ref_ring(b, ring_counts, sink_counts, ring_codes_reference,
                                                                   sink_codes_reference))
            for b, p in enumerate(cached)]
    _break_scales(kv.pool, scale_error)
    bs, scale = len(seq_lens), head_dim**-0.5
    q = torch.randn(bs, num_q_heads, head_dim, generator=torch.Generator().manual_seed(1)).to(dtype)
    k_new = torch.stack([kv.k_written[b][n - 1] for b, n in enumerate(seq_lens)]).to(dtype)
    v_new = torch.stack([kv.v_written[b][n - 1] for b, n in enumerate(seq_lens)]).to(dtype)
    r_k, r_v = _rotations(kv.pool)
    v_mean = value_mean(kv.pool, 0)
    o = torch.empty(bs, num_q_heads, head_dim, dtype=dtype)
    partial = torch.full((bs + 2, num_q_heads, num_splits, head_dim), float("nan"))
    lse = torch.full((bs + 2, num_q_heads, num_splits), float("nan"))
    q_b, k_b, v_b = into_basis(q, k_new, v_new, r_k, r_v, v_mean, key_smooth(kv.pool, 0))
    decode_attention_fwd(q_b, None, None, o, kv.req_to_token, kv.rows, torch.tensor(seq_lens), partial, lse, scale,
                         tiles=tiles, kv=kv_operands(kv.pool, 0), k_new=k_b, v_new=v_b, ring=ring)
    o = out_of_basis(o, r_v, v_mean)
    err = 0.0
    for b, n in enumerate(seq_lens):
        ref = reference(q[b : b + 1], *refs[b], [n - 1], scale)[0]
        err = max(err, _abs_err(o[b], ref))
    return err


def run_quant_extend(fmt, page_size, dtype, tiles=None, scale_error=1.0, prefix_lens=None, extend_lens=None,
                     num_q_heads=6, num_kv_heads=2, head_dim=32, codes_reference=False, ring_counts=None,
                     ring_codes_reference=False, sink_counts=None, sink_codes_reference=False):
    """Max abs error of extend_attention_fwd over a `fmt` pool: every request attends to its cached prefix's
    dequantized rows and to its new tokens' fresh K/V as given (their codes are in the pool too)."""
    from sglang.srt.layers.attention.triton_ops import extend_attention_fwd
    from sglang.srt.layers.attention.triton_ops.kv_formats import (into_basis, key_smooth, kv_operands, out_of_basis,
                                                                   value_mean)

    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    kv = QuantPagedKV(fmt, seq_lens, num_kv_heads, head_dim, page_size)
    ring = kv.ring(prefix_lens, ring_counts, sink_counts) if ring_counts else None
    refs = [kv.attended_kv(b, p, dtype, codes_reference, *_ref_ring(b, ring_counts, sink_counts, ring_codes_reference,
                                                                   sink_codes_reference))
            for b, p in enumerate(prefix_lens)]
    _break_scales(kv.pool, scale_error)
    total, scale = sum(extend_lens), head_dim**-0.5
    q = torch.randn(total, num_q_heads, head_dim, generator=torch.Generator().manual_seed(2)).to(dtype)
    k_new = torch.cat([kv.k_written[b][p:] for b, p in enumerate(prefix_lens)]).to(dtype)
    v_new = torch.cat([kv.v_written[b][p:] for b, p in enumerate(prefix_lens)]).to(dtype)
    r_k, r_v = _rotations(kv.pool)
    v_mean = value_mean(kv.pool, 0)
    o = torch.full((total, num_q_heads, head_dim), float("nan"), dtype=dtype)
    qo_start = torch.tensor([0] + extend_lens[:-1]).cumsum(0)
    extend_attention_fwd(*into_basis(q, k_new, v_new, r_k, r_v, v_mean, key_smooth(kv.pool, 0)), o, None, None,
                         kv.req_to_token, kv.rows, qo_start, torch.tensor(extend_lens), torch.tensor(prefix_lens),
                         max(extend_lens), scale, tiles=tiles, kv=kv_operands(kv.pool, 0), ring=ring)
    o = out_of_basis(o, r_v, v_mean)
    err, start = 0.0, 0
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        ref = reference(q[start : start + e], *refs[b], list(range(p, p + e)), scale)
        err = max(err, _abs_err(o[start : start + e], ref))
        start += e
    return err


def _abs_err(o, ref) -> float:
    """max |o - ref|, inf where o has a NaN (Python's max would drop one: the workspace starts as NaN, so a merge
    reading a split the split kernel did not write shows as NaN)."""
    return torch.nan_to_num((o.double() - ref).abs(), nan=float("inf")).max().item()


def _ref_ring(b, ring_counts, sink_counts, ring_codes_reference, sink_codes_reference):
    """(recent, sinks): how many of request b's last / first cached tokens the reference takes as the ring holds them
    (0 where there is no ring, or where a *_codes_reference reads them through their codes)."""
    recent = 0 if ring_codes_reference or not ring_counts else ring_counts[b]
    sinks = 0 if ring_codes_reference or sink_codes_reference or not sink_counts else sink_counts[b]
    return recent, sinks


def _break_scales(pool, factor):
    """Multiply the scales the kernel reads by `factor` (fp8: the per-head V scales; int8 / int4: the per-token
    V scales; int2_hadamard: one log step per factor 2^(1/12) on the V scale bytes)."""
    if factor == 1.0:
        return
    if pool.is_fp8:
        pool.fixed["v_scale"].mul_(factor)
    elif pool.kv_format == "int2_hadamard":
        pool.fields["v_scale"].add_(12)  # x 2
    else:
        s = pool.fields["v_scale"]
        s[..., 0] = s[..., 0] * factor
