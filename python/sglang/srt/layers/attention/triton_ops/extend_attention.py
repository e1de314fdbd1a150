"""Paged extend (prefill) attention: new tokens attend to their request's cached prefix and, causally, to each other.

Grid (B, KV heads, ceil(max_extend_len / BLOCK_M)); the program for (b, kv head g, m) handles new tokens
[m * BLOCK_M, (m + 1) * BLOCK_M) of request b for all G = H_q / KV query heads that share KV head g (GQA): its
BLOCK_M * BLOCK_G query rows are (token i, head) pairs, row r = token r // BLOCK_G, head g * G + r % BLOCK_G (rows
of padding heads, r % BLOCK_G >= G, and of tokens past extend_len are computed on zeros and never stored), so each
K/V block is read once per group. Programs whose first token is past extend_len return at once. One online
softmax runs over:
  1. the cached prefix, no mask: with a recent window (kv_formats.RingOperands; sinks = its sinks[b], count = its
     counts[b], else both 0) tokens [0, sinks) from the ring's bf16 sink rows in one block of SINK_N >= S keys;
     tokens [sinks, prefix_len - count) from the pool through req_to_token[req_pool_indices[b], t] (any page size:
     the table holds one slot per token); tokens [prefix_len - count, prefix_len) from the ring's bf16 recent rows
     in one block of RING_N >= W keys;
  2. the new tokens themselves, read from the contiguous k/v of this forward, rows qo_start[b] + j, with the causal
     mask j <= i (new token i sits at sequence position prefix_len + i).
q/k/v/o rows of request b are [qo_start[b], qo_start[b] + extend_len[b]); qo_start is the exclusive prefix sum of
the extend lengths. Both loops take their softmax steps with online_softmax.attend_key_block (shared with decode).
A quantized pool (kv_formats.KVOperands: codes and scales read in place, kv_dequant.py) only changes how loop 1 reads
the prefix: the new tokens are attended as computed (loop 2 over the fresh k/v, which the backend gives in the pool's
stored basis), never read back from the codes just written -- a token's own key and its chunk's keys weigh most, and
their quantization error is what a forward can avoid. Later forwards read them from the codes as cached prefix, the
newest W and the first S of them from the ring (in the same stored basis as the fresh k/v, so nothing is turned
between the loops).

Windowed layers (layers/radix_attention.py): with sliding_window W > 0, row i (position q = prefix_len + i) masks keys
at positions <= q - W, and both loops start at the window of the block's first row, max(0, prefix_len + m * BLOCK_M
- W + 1): positions below may be freed and are never read (a row that sees no key of a block keeps its state,
online_softmax.attend_key_block). loc_map maps req_to_token's slots to the windowed pool's rows. Sinks (one logit
per query head) start each row's softmax as a key of that score and value 0; a logit cap applies cap * tanh(s / cap)
to every score.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit
from sglang.srt.layers.attention.triton_ops.kv_dequant import FMT_PLAIN
from sglang.srt.layers.attention.triton_ops.kv_formats import (KVOperands, RingOperands, plain_operands, ring_args,
                                                               ring_constexprs)
from sglang.srt.layers.attention.triton_ops.online_softmax import (attend_key_block, attend_ring_block,
                                                                   attend_sink_block)
from sglang.srt.layers.attention.triton_ops.tiles import AttentionTiles, default_tiles, dot_tile


@lazy_jit
def _extend_kernel(
    Q, K_new, V_new, O, K_pool, V_pool, K_scale, V_scale, K_head_scale, V_head_scale, Req_to_token, Req_pool_indices,
    Qo_start, Extend_lens, Prefix_lens, sm_scale, Ring_k, Ring_v, Ring_rows, Ring_counts, Ring_sinks, Loc_map,
    Sink_logits, window, logit_cap,
    stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh, stride_ot, stride_oh,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_kst, stride_ksh, stride_vst, stride_vsh, stride_r2t,
    stride_rkt, stride_rkh, stride_rvt, stride_rvh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, KV_FORMAT: tl.constexpr, HEAD_SCALES: tl.constexpr,
    RING: tl.constexpr, WINDOW: tl.constexpr, ENTRIES: tl.constexpr, SINKS: tl.constexpr, RING_N: tl.constexpr,
    SINK_N: tl.constexpr, LOC_MAP: tl.constexpr, SINK_LOGITS: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    m_block = tl.program_id(2).to(tl.int64)

    extend_len = tl.load(Extend_lens + b).to(tl.int64)
    if m_block * BLOCK_M < extend_len:
        qo_start = tl.load(Qo_start + b).to(tl.int64)
        prefix_len = tl.load(Prefix_lens + b).to(tl.int64)
        row = tl.load(Req_pool_indices + b).to(tl.int64)

        rows = tl.arange(0, BLOCK_M * BLOCK_G)
        tok = m_block * BLOCK_M + rows // BLOCK_G  # new-token index within the request
        g = rows % BLOCK_G
        heads = kv_head * GROUP + g
        mask_r = (tok < extend_len) & (g < GROUP)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        mask_d = offs_d < HEAD_DIM
        mask_dv = offs_dv < V_DIM
        q = tl.load(Q + (qo_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=mask_r[:, None] & mask_d[None, :], other=0.0)  # [ROWS, BLOCK_D]
        m_i = tl.full([BLOCK_M * BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M * BLOCK_G], tl.float32)
        if SINK_LOGITS:  # the sink as a first key of score sinks[h] and value 0: m = sink, l = e^0
            m_i = tl.load(Sink_logits + heads, mask=g < GROUP, other=0.0).to(tl.float32)
            l_i = l_i + 1.0
        acc = tl.zeros([BLOCK_M * BLOCK_G, BLOCK_DV], tl.float32)
        q_pos = prefix_len + tok  # each row's sequence position
        # a window: keys at positions <= q_pos - window are masked; the block's first row reaches back furthest
        lo = tl.where(window > 0, tl.maximum(prefix_len + m_block * BLOCK_M - window + 1, 0), 0)
        far = tl.where(window > 0, q_pos - window, -1)  # the last masked position per row
        q_sum = tl.sum(q.to(tl.float32), 1)  # int4 keys (kv_dequant.py)
        qk_scale = sm_scale
        v_scale = 1.0
        if HEAD_SCALES:  # fp8: the per-(layer, KV head) scales
            qk_scale = sm_scale * tl.load(K_head_scale + kv_head)
            v_scale = tl.load(V_head_scale + kv_head)

        count = prefix_len * 0  # prefix positions [prefix_len - count, prefix_len) from the ring's recent entries
        sinks = prefix_len * 0  # prefix positions [0, sinks) from its sink entries
        if RING:
            count = tl.load(Ring_counts + b).to(tl.int64)
            if SINKS:
                sinks = tl.load(Ring_sinks + b).to(tl.int64)
        codes_end = prefix_len - count  # positions [sinks, codes_end) are read through the codes
        codes_start = tl.maximum(sinks, lo)  # a window reads nothing below lo (those positions may be freed)

        # 1. the cached prefix, every query row sees all of it: the sinks, the codes through req_to_token, the ring
        if SINKS:
            if sinks > 0:  # positions [0, sinks) at entries row * E + W + position (bf16, stored basis)
                acc, m_i, l_i = attend_sink_block(
                    q, q_sum, m_i, l_i, acc, Ring_k + kv_head * stride_rkh, Ring_v + kv_head * stride_rvh,
                    tl.load(Ring_rows + b).to(tl.int64), sinks, stride_rkt, stride_rvt, offs_d, mask_d, offs_dv,
                    mask_dv, sm_scale, WINDOW, ENTRIES, SINK_N)
        for n0 in range(codes_start, codes_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < codes_end
            slots = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=mask_n, other=0).to(tl.int64)
            if LOC_MAP:  # token-pool slot -> the windowed pool's
                slots = tl.load(Loc_map + slots, mask=mask_n, other=0).to(tl.int64)
            acc, m_i, l_i = attend_key_block(
                q, q_sum, m_i, l_i, acc, K_pool + kv_head * stride_kh, V_pool + kv_head * stride_vh,
                K_scale + kv_head * stride_ksh, V_scale + kv_head * stride_vsh, slots, stride_kt, stride_vt,
                stride_kst, stride_vst, offs_d, mask_d, offs_dv, mask_dv, mask_n,
                mask_n[None, :] & (offs_n[None, :] > far[:, None]), qk_scale, v_scale, logit_cap, KV_FORMAT)
        if RING:
            if count > 0:  # positions [codes_end, prefix_len) at entries row * E + position % W (bf16, stored basis)
                acc, m_i, l_i = attend_ring_block(
                    q, q_sum, m_i, l_i, acc, Ring_k + kv_head * stride_rkh, Ring_v + kv_head * stride_rvh,
                    tl.load(Ring_rows + b).to(tl.int64), codes_end, count, stride_rkt, stride_rvt, offs_d, mask_d,
                    offs_dv, mask_dv, sm_scale, WINDOW, ENTRIES, RING_N)

        # 2. the new tokens of this forward (model dtype, as computed), causally up to the last one of this block
        keys_end = tl.minimum(extend_len, (m_block + 1) * BLOCK_M)
        for n0 in range(tl.maximum(lo - prefix_len, 0), keys_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < keys_end
            causal = (tok[:, None] >= offs_n[None, :]) & mask_n[None, :] & (prefix_len + offs_n[None, :] > far[:, None])
            acc, m_i, l_i = attend_key_block(
                q, q_sum, m_i, l_i, acc, K_new + kv_head * stride_knh, V_new + kv_head * stride_vnh, K_new, V_new,
                qo_start + offs_n, stride_knt, stride_vnt, 0, 0, offs_d, mask_d, offs_dv, mask_dv, mask_n, causal,
                sm_scale, 1.0, logit_cap, FMT_PLAIN)

        tl.store(O + (qo_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_dv[None, :],
                 (acc / l_i[:, None]).to(O.dtype.element_ty), mask=mask_r[:, None] & mask_dv[None, :])


def extend_attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, qo_start: torch.Tensor, extend_lens: torch.Tensor,
    prefix_lens: torch.Tensor, max_extend_len: int, sm_scale: float, tiles: AttentionTiles | None = None,
    kv: KVOperands | None = None, ring: RingOperands | None = None, sliding_window: int = -1,
    sinks: torch.Tensor | None = None, logit_cap: float = 0.0, loc_map: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens over [cached prefix, new tokens] for every request of the batch.

    q [N, H_q, D], k [N, KV, D], v [N, KV, Dv] (the new tokens, requests concatenated); o [N, H_q, Dv] (written);
    k_pool [S, KV, D], v_pool [S, KV, Dv] (one layer of a plain pool; ignored when `kv` is given); kv: one layer of
    a quantized pool (kv_formats.kv_operands), read in place for the cached prefix only (k/v, the new tokens, are
    attended as given: in the pool's stored basis); ring: the pool's recent window (kv_formats.ring_operands): the
    last ring.counts[b] prefix tokens of request b, and its first ring.sinks[b], are read from it, not from the codes;
    req_to_token [rows, max_ctx]; req_pool_indices, qo_start, extend_lens, prefix_lens [B];
    max_extend_len = max(extend_lens) (sizes the grid). A rotated format expects q, k (and v when V is rotated) in
    its rotated basis and gives o in the V part's.
    sliding_window W > 0: new token i (position prefix_len + i) sees keys at positions > prefix_len + i - W only, and
    nothing below the window of a request's first new token is read; sinks fp32 [H_q]: one logit per query head in
    each softmax's denominator (no value); logit_cap > 0: scores become cap * tanh(score / cap); loc_map int32:
    req_to_token's slots -> rows of k_pool / kv (a windowed pool), None: req_to_token indexes them directly. A window
    with a recent-window ring is not wired (the ring keeps the newest tokens of a quantized full pool).
    """
    assert ring is None or sliding_window <= 0, "extend_attention_fwd: a sliding window over a recent-window ring"
    kv = kv or plain_operands(k_pool, v_pool)
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads, v_dim = k.shape[1], v.shape[2]
    assert num_q_heads % num_kv_heads == 0, (num_q_heads, num_kv_heads)
    assert (kv.num_kv_heads, kv.head_dim, kv.v_dim) == (num_kv_heads, head_dim, v_dim)
    assert all(t.stride(-1) == 1 for t in (q, k, v, o))
    bs = req_pool_indices.shape[0]
    if bs == 0 or max_extend_len == 0:
        return o
    tiles = tiles or default_tiles()
    group = num_q_heads // num_kv_heads
    block_g = triton.next_power_of_2(group)
    block_m = max(1, tiles.extend_rows // block_g)  # tokens per program; rows = block_m * block_g >= 16 for tl.dot
    grid = (bs, num_kv_heads, triton.cdiv(max_extend_len, block_m))
    rings = ring_args(ring, k, req_pool_indices)
    _extend_kernel[grid](
        q, k, v, o, kv.k, kv.v, kv.k_scale, kv.v_scale, kv.k_head_scale, kv.v_head_scale, req_to_token,
        req_pool_indices, qo_start, extend_lens, prefix_lens, sm_scale, *rings[:5],
        loc_map if loc_map is not None else req_pool_indices, sinks if sinks is not None else q,
        max(sliding_window, 0), float(logit_cap),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        *kv.strides(), req_to_token.stride(0), *rings[5:],
        GROUP=group, HEAD_DIM=head_dim, V_DIM=v_dim, BLOCK_M=block_m, BLOCK_G=block_g, BLOCK_N=tiles.extend_block_n,
        BLOCK_D=dot_tile(head_dim), BLOCK_DV=dot_tile(v_dim), KV_FORMAT=kv.format_id, HEAD_SCALES=kv.head_scales,
        **ring_constexprs(ring), LOC_MAP=int(loc_map is not None), SINK_LOGITS=int(sinks is not None),
    )
    return o
