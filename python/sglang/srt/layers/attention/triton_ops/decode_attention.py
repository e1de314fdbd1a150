"""Split-KV paged decode attention: one query token per request against its whole sequence in the KV pool.

With the current token's fresh K/V given (k_new / v_new: a quantized pool, whose codes of that token would only add
quantization error to the key the query weighs most), the pool is read for the n = seq_len - 1 cached tokens and the
merge folds the fresh token in as one more softmax term; without them n = seq_len, every token from the pool. With a
recent window (ring: kv_formats.RingOperands) the last w_b = ring.counts[b] of them are read from the ring's recent
bf16 rows (stored basis) and the first s_b = ring.sinks[b] from its sink rows (attention sinks; S = 0 sink entries:
s_b = 0) instead of the codes; without a ring w_b = s_b = 0. The splits share out the c = n - s_b - w_b code tokens,
positions [s_b, n - w_b).

Two kernels per layer:
  1. `_decode_split_kernel`, grid (B, KV heads, num_kv_splits): the program for (b, kv head g, split s) takes the
     G = H_q / KV query heads that share KV head g as the rows of one tile (so GQA reads each K/V token once per
     group) and attends over the token range of split s. Request b uses
     k_b = max(1, min(num_kv_splits, ceil(c / tiles.decode_min_split_tokens))) splits of L = ceil(c / k_b) tokens
     each: split s covers positions [s_b + s * L, s_b + min((s + 1) * L, c)); split 0 also attends the w_b ring rows
     (one block of RING_N >= W keys) and the s_b sink rows (one block of SINK_N >= S keys), so the workspace keeps its
     planned shape; split 0 runs even when c = 0. Programs of splits s >= k_b (short sequences) and of empty splits
     return at once. Token t of request b lives in pool slot req_to_token[req_pool_indices[b], t] (any page size: the
     table holds one slot per token). A split writes its normalised partial output to partial_out[b, h, s, :] and its
     log-sum-exp to lse[b, h, s].
  2. `_decode_merge_kernel`, grid (B,): merges the k_b splits of every head of request b by their log-sum-exp
     weights (recomputing the same split ranges, c from seq_lens and the ring and sink counts), then the fresh token
     (score sm_scale * q . k_new, value v_new) when given, and writes o[b, :, :] in the output dtype. Both read only
     device tensors: the same launch under CUDA graphs.

The pool is read in its stored format (kv_formats.KVOperands; kv_dequant.py folds the scales into q.k and p.v), so a
quantized pool is never dequantized into a copy.

partial_out fp32 [R, H_q, num_kv_splits, Dv] and lse fp32 [R, H_q, num_kv_splits] (R >= B) are the backend's planned
workspace (mem_plan/backends.py, "attn_logits"/"attn_lse"): passed in, never allocated here.

Windowed layers: with sliding_window W > 0 both kernels take the code positions from max(s_b, seq_len - W) instead of
s_b (the positions below may be freed; every position read is inside the query's window, so nothing is masked);
loc_map maps req_to_token's slots to the windowed pool's rows; the merge folds the sink logits (one per query head,
no value) in after the splits; a logit cap applies cap * tanh(s / cap) to every score, the fresh token's included.

The online-softmax step over a block of keys is online_softmax.attend_key_block, shared with the extend kernel; other
@triton.jit helpers (tl.cdiv included) are avoided: under the CPU interpreter every such call costs ~0.2 ms.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit
from sglang.srt.layers.attention.triton_ops.kv_formats import (KVOperands, RingOperands, plain_operands, ring_args,
                                                               ring_constexprs)
from sglang.srt.layers.attention.triton_ops.online_softmax import (attend_key_block, attend_ring_block,
                                                                   attend_sink_block)
from sglang.srt.layers.attention.triton_ops.tiles import MIN_DOT_TILE, AttentionTiles, default_tiles, dot_tile


@lazy_jit
def _decode_split_kernel(
    Q, K_pool, V_pool, K_scale, V_scale, K_head_scale, V_head_scale, Req_to_token, Req_pool_indices, Seq_lens,
    Partial_out, Lse, sm_scale, Ring_k, Ring_v, Ring_rows, Ring_counts, Ring_sinks, Loc_map, window, logit_cap,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_kst, stride_ksh, stride_vst, stride_vsh,
    stride_r2t, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_rkt, stride_rkh, stride_rvt, stride_rvh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    MIN_SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr, HEAD_SCALES: tl.constexpr, FRESH: tl.constexpr,
    RING: tl.constexpr, WINDOW: tl.constexpr, ENTRIES: tl.constexpr, SINKS: tl.constexpr, RING_N: tl.constexpr,
    SINK_N: tl.constexpr, LOC_MAP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)

    cached = tl.load(Seq_lens + b).to(tl.int64) - FRESH  # the tokens read from the pool (sinks, codes, ring)
    count = cached * 0  # w_b: positions [cached - count, cached) from the ring's recent entries
    sinks = cached * 0  # s_b: positions [0, sinks) from its sink entries
    if RING:
        count = tl.load(Ring_counts + b).to(tl.int64)
        if SINKS:
            sinks = tl.load(Ring_sinks + b).to(tl.int64)
    # a window W: the query at position cached + FRESH - 1 sees positions >= cached + FRESH - W only
    first = tl.maximum(sinks, tl.where(window > 0, cached + FRESH - window, 0))
    seq_len = cached - count - first  # the tokens read through the codes: positions [first, cached - count)
    num_splits = tl.maximum(tl.minimum((seq_len + MIN_SPLIT - 1) // MIN_SPLIT, NUM_SPLITS), 1)
    split_len = (seq_len + num_splits - 1) // num_splits
    start = first + split * split_len  # this split's code positions [start, end)
    end = tl.minimum(start + split_len, first + seq_len)
    ring_here = (split == 0) & (count + sinks > 0)  # split 0 attends the ring (recent and sink entries)
    if (split < num_splits) & ((end > start) | ring_here):
        row = tl.load(Req_pool_indices + b).to(tl.int64)
        offs_g = tl.arange(0, BLOCK_H)
        mask_g = offs_g < GROUP
        heads = kv_head * GROUP + offs_g  # the query heads of this KV head (rows past GROUP are padding)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < HEAD_DIM
        mask_dv = offs_dv < V_DIM
        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_g[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
        q_sum = tl.sum(q.to(tl.float32), 1)  # int4 keys: q . (c s + m) = (q . c) s + m sum(q)
        qk_scale = sm_scale
        v_scale = 1.0
        if HEAD_SCALES:  # fp8: the per-(layer, KV head) scales
            qk_scale = sm_scale * tl.load(K_head_scale + kv_head)
            v_scale = tl.load(V_head_scale + kv_head)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            slots = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=mask_n, other=0).to(tl.int64)
            if LOC_MAP:  # token-pool slot -> the windowed pool's
                slots = tl.load(Loc_map + slots, mask=mask_n, other=0).to(tl.int64)
            acc, m_i, l_i = attend_key_block(
                q, q_sum, m_i, l_i, acc, K_pool + kv_head * stride_kh, V_pool + kv_head * stride_vh,
                K_scale + kv_head * stride_ksh, V_scale + kv_head * stride_vsh, slots, stride_kt, stride_vt,
                stride_kst, stride_vst, offs_d, mask_d, offs_dv, mask_dv, mask_n, mask_n[None, :], qk_scale, v_scale,
                logit_cap, KV_FORMAT)
        if RING:
            ring_row = tl.load(Ring_rows + b).to(tl.int64)
            if (split == 0) & (count > 0):  # positions [cached - count, cached): entries row * E + position % W
                acc, m_i, l_i = attend_ring_block(
                    q, q_sum, m_i, l_i, acc, Ring_k + kv_head * stride_rkh, Ring_v + kv_head * stride_rvh, ring_row,
                    cached - count, count, stride_rkt, stride_rvt, offs_d, mask_d, offs_dv, mask_dv, sm_scale, WINDOW,
                    ENTRIES, RING_N)
            if SINKS:
                if (split == 0) & (sinks > 0):  # positions [0, sinks): entries row * E + W + position
                    acc, m_i, l_i = attend_sink_block(
                        q, q_sum, m_i, l_i, acc, Ring_k + kv_head * stride_rkh, Ring_v + kv_head * stride_rvh,
                        ring_row, sinks, stride_rkt, stride_rvt, offs_d, mask_d, offs_dv, mask_dv, sm_scale, WINDOW,
                        ENTRIES, SINK_N)
        out_ptrs = Partial_out + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_dv[None, :]
        tl.store(out_ptrs, acc / l_i[:, None], mask=mask_g[:, None] & mask_dv[None, :])
        tl.store(Lse + b * stride_lb + heads * stride_lh + split, m_i + tl.log(l_i), mask=mask_g)


@lazy_jit
def _decode_merge_kernel(
    Partial_out, Lse, Seq_lens, O, Q, K_new, V_new, Ring_counts, Ring_sinks, sm_scale, Sink_logits, window, logit_cap,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    stride_qb, stride_qh, stride_knb, stride_knh, stride_vnb, stride_vnh,
    NUM_HEADS: tl.constexpr, V_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_DV: tl.constexpr, FRESH: tl.constexpr, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, RING: tl.constexpr, SINKS: tl.constexpr,
    SINK_LOGITS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    seq_len = tl.load(Seq_lens + b).to(tl.int64) - FRESH  # the tokens the splits read from the pool
    count = seq_len * 0  # as the split kernel: w_b recent ring entries, s_b sink entries
    sinks = seq_len * 0
    if RING:
        count = tl.load(Ring_counts + b).to(tl.int64)
        if SINKS:
            sinks = tl.load(Ring_sinks + b).to(tl.int64)
    first = tl.maximum(sinks, tl.where(window > 0, seq_len + FRESH - window, 0))  # as the split kernel
    seq_len = seq_len - count - first  # ... through the codes (split 0 read the ring and the sinks too)
    num_splits = tl.maximum(tl.minimum((seq_len + MIN_SPLIT - 1) // MIN_SPLIT, NUM_SPLITS), 1)
    split_len = (seq_len + num_splits - 1) // num_splits
    offs_h = tl.arange(0, BLOCK_HQ)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_h = offs_h < NUM_HEADS
    mask = mask_h[:, None] & (offs_dv < V_DIM)[None, :]

    m_run = tl.full([BLOCK_HQ], float("-inf"), tl.float32)
    weight_sum = tl.zeros([BLOCK_HQ], tl.float32)
    acc = tl.zeros([BLOCK_HQ, BLOCK_DV], tl.float32)
    for split in range(0, num_splits):
        if (split * split_len < seq_len) | ((split == 0) & (count + sinks > 0)):
            lse = tl.load(Lse + b * stride_lb + offs_h * stride_lh + split, mask=mask_h, other=0.0)
            part = tl.load(Partial_out + b * stride_pb + offs_h[:, None] * stride_ph + split * stride_ps
                           + offs_dv[None, :], mask=mask, other=0.0)
            m_new = tl.maximum(m_run, lse)
            rescale = tl.exp(m_run - m_new)
            w = tl.exp(lse - m_new)
            acc = acc * rescale[:, None] + w[:, None] * part
            weight_sum = weight_sum * rescale + w
            m_run = m_new
    if FRESH:  # the current token as computed: one more term, in fp32 (its KV head: h // GROUP)
        offs_d = tl.arange(0, BLOCK_D)
        mask_qd = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
        kv_heads = offs_h // GROUP
        q = tl.load(Q + b * stride_qb + offs_h[:, None] * stride_qh + offs_d[None, :], mask=mask_qd, other=0.0)
        k = tl.load(K_new + b * stride_knb + kv_heads[:, None] * stride_knh + offs_d[None, :], mask=mask_qd, other=0.0)
        v = tl.load(V_new + b * stride_vnb + kv_heads[:, None] * stride_vnh + offs_dv[None, :], mask=mask, other=0.0)
        score = tl.sum(q.to(tl.float32) * k.to(tl.float32), 1) * sm_scale
        if logit_cap > 0:
            score = logit_cap * (2.0 * tl.sigmoid(2.0 * score / logit_cap) - 1.0)
        m_new = tl.maximum(m_run, score)
        rescale = tl.exp(m_run - m_new)
        w = tl.exp(score - m_new)
        acc = acc * rescale[:, None] + w[:, None] * v.to(tl.float32)
        weight_sum = weight_sum * rescale + w
        m_run = m_new
    if SINK_LOGITS:  # one more term of score sinks[h] and value 0: only the denominator grows
        sink = tl.load(Sink_logits + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        m_new = tl.maximum(m_run, sink)
        rescale = tl.exp(m_run - m_new)
        acc = acc * rescale[:, None]
        weight_sum = weight_sum * rescale + tl.exp(sink - m_new)
    tl.store(O + b * stride_ob + offs_h[:, None] * stride_oh + offs_dv[None, :],
             (acc / weight_sum[:, None]).to(O.dtype.element_ty), mask=mask)


def decode_attention_fwd(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, o: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, partial_out: torch.Tensor, lse: torch.Tensor,
    sm_scale: float, tiles: AttentionTiles | None = None, max_seq_len: int | None = None,
    kv: KVOperands | None = None, k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
    ring: RingOperands | None = None, sliding_window: int = -1, sinks: torch.Tensor | None = None,
    logit_cap: float = 0.0, loc_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """o[b, h] = softmax(q[b, h] . K_b^T * sm_scale) V_b over the first seq_lens[b] tokens of request b.

    q [B, H_q, D]; k_pool [S, KV, D], v_pool [S, KV, Dv] (one layer of a plain pool; ignored when `kv` is given);
    kv: one layer of a quantized pool (kv_formats.kv_operands: codes, scales, format), read in place;
    o [B, H_q, Dv] (written); req_to_token [rows, max_ctx]; req_pool_indices, seq_lens [B] (every seq_len >= 1);
    partial_out fp32 [>= B, H_q, splits, Dv], lse fp32 [>= B, H_q, splits] (splits = partial_out.shape[2]).
    max_seq_len: max(seq_lens) when the host knows it (eager decode): the grid then has only the splits the longest
    request uses. None (CUDA graphs: a fixed grid) launches all splits; the unused ones return at once.
    k_new [B, KV, D], v_new [B, KV, Dv]: this forward's K/V of each request's current token (position seq_len - 1),
    attended as given instead of the pool's row there (a quantized pool: the backend passes them); None: every token
    is read from the pool. A rotated format (kv.rotated) expects q (and k_new / v_new) in its stored basis and gives o
    in the V part's (the backend turns them). ring: the pool's recent window (kv_formats.ring_operands): the last
    ring.counts[b] cached tokens of request b, and its first ring.sinks[b], are read from it (in the stored basis),
    not from the codes.
    sliding_window W > 0: only positions >= seq_len - W are read (the positions below may be freed); sinks fp32 [H_q]:
    one logit per query head in the softmax's denominator (no value), folded in by the merge; logit_cap > 0: scores
    become cap * tanh(score / cap); loc_map int32: req_to_token's slots -> rows of the pool (a windowed pool).
    """
    assert ring is None or sliding_window <= 0, "decode_attention_fwd: a sliding window over a recent-window ring"
    kv = kv or plain_operands(k_pool, v_pool)
    bs, num_q_heads, head_dim = q.shape
    num_kv_heads, v_dim = kv.num_kv_heads, kv.v_dim
    num_splits = partial_out.shape[2]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    assert head_dim == kv.head_dim, (head_dim, kv.head_dim)
    assert partial_out.shape[0] >= bs and partial_out.shape[1] == num_q_heads and partial_out.shape[3] == v_dim, (
        f"split-KV workspace {tuple(partial_out.shape)} does not fit batch {bs} x {num_q_heads} heads x {v_dim}")
    assert q.stride(2) == 1 and o.stride(2) == 1
    fresh = k_new is not None
    assert fresh == (v_new is not None), "k_new and v_new go together"
    if fresh:
        assert k_new.shape == (bs, num_kv_heads, head_dim) and v_new.shape == (bs, num_kv_heads, v_dim), (
            tuple(k_new.shape), tuple(v_new.shape))
        assert k_new.stride(2) == 1 and v_new.stride(2) == 1
    else:
        k_new, v_new = q, o  # stand-ins, never read (FRESH=0)
    tiles = tiles or default_tiles()
    group = num_q_heads // num_kv_heads
    block_dv = dot_tile(v_dim)
    grid_splits = num_splits
    if max_seq_len is not None:  # the pool tokens of the longest request
        grid_splits = max(1, min(num_splits, triton.cdiv(max_seq_len - fresh, tiles.decode_min_split_tokens)))
    rings, ring_shape = ring_args(ring, q, seq_lens), ring_constexprs(ring)
    _decode_split_kernel[(bs, num_kv_heads, grid_splits)](
        q, kv.k, kv.v, kv.k_scale, kv.v_scale, kv.k_head_scale, kv.v_head_scale, req_to_token, req_pool_indices,
        seq_lens, partial_out, lse, sm_scale, *rings[:5], loc_map if loc_map is not None else seq_lens,
        max(sliding_window, 0), float(logit_cap),
        q.stride(0), q.stride(1), *kv.strides(), req_to_token.stride(0),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2), lse.stride(0), lse.stride(1), *rings[5:],
        GROUP=group, HEAD_DIM=head_dim, V_DIM=v_dim, NUM_SPLITS=num_splits, MIN_SPLIT=tiles.decode_min_split_tokens,
        BLOCK_H=max(MIN_DOT_TILE, triton.next_power_of_2(group)), BLOCK_D=dot_tile(head_dim), BLOCK_DV=block_dv,
        BLOCK_N=tiles.decode_block_n, KV_FORMAT=kv.format_id, HEAD_SCALES=kv.head_scales, FRESH=int(fresh),
        **ring_shape, LOC_MAP=int(loc_map is not None),
    )
    _decode_merge_kernel[(bs,)](
        partial_out, lse, seq_lens, o, q, k_new, v_new, rings[3], rings[4], sm_scale,
        sinks if sinks is not None else q, max(sliding_window, 0), float(logit_cap),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2), lse.stride(0), lse.stride(1),
        o.stride(0), o.stride(1), q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0),
        v_new.stride(1),
        NUM_HEADS=num_q_heads, V_DIM=v_dim, NUM_SPLITS=num_splits, MIN_SPLIT=tiles.decode_min_split_tokens,
        BLOCK_HQ=triton.next_power_of_2(num_q_heads), BLOCK_DV=block_dv, FRESH=int(fresh), GROUP=group,
        HEAD_DIM=head_dim, BLOCK_D=dot_tile(head_dim), RING=ring_shape["RING"], SINKS=ring_shape["SINKS"],
        SINK_LOGITS=int(sinks is not None),
    )
    return o
