"""Split-KV decode attention over MLA latent rows (DeepSeek V2/V3, Kimi-K2): absorbed multi-head latent attention.

The pool holds one row per token and layer, row = [c_kv (LORA) | k_pe (ROPE)] (mem_cache/mla_pool.py), shared by
every query head: a key is the whole row, a value its first LORA columns. The query arrives absorbed,
q = [q_nope @ W_UK | q_pe] [B, H, LORA + ROPE], and the output is the latent o [B, H, LORA] (the model applies W_UV).
The expanded form -- K and V per head decompressed from c_kv -- gives the same softmax(q . k) v, and is never formed.

Two launches, like decode_attention.py:
  _mla_split_kernel, grid (B, head blocks, splits): one slice of request b's sequence for BLOCK_H query heads. Each
      key block loads the latent rows once, [BLOCK_N, LORA], and uses them twice: as the keys' first part
      (scores = q_c . c^T + q_pe . pe^T) and as the values (acc += p @ c). Writes the slice's normalised partial
      output and its log-sum-exp (fp32) to the planned workspace (attn_logits [R, H, splits, LORA], attn_lse).
  _mla_merge_kernel, grid (B, head blocks): merges the slices by their log-sum-exp weights.
Request b uses max(1, min(splits, ceil(seq_len / MIN_SPLIT))) splits of ceil(seq_len / n) tokens each (the split
count the two kernels compute alike). Tokens are read through req_to_token (one slot per token: any page size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted, lazy_jit, lazy_jit_helper
from sglang.srt.layers.attention.triton_ops.tiles import AttentionTiles, default_tiles, dot_tile

# query heads per program on a GPU: 16 rows is tl.dot's minimum, and a [16, 512] fp32 accumulator fits the registers
GPU_HEADS_PER_PROGRAM = 16


@lazy_jit_helper
def attend_latent_block(q_c, q_pe, m_i, l_i, acc, Kv, rows, stride_kt, offs_c, mask_c, offs_r, mask_r, mask_n,
                        mask_s, sm_scale, LORA: tl.constexpr):
    """One online-softmax step (online_softmax.py's state: m_i, l_i, acc per query row) over the latent rows `rows`
    [BLOCK_N] of Kv: they are loaded once, [BLOCK_N, C], and serve as the keys' first LORA columns and, as they are,
    as the values. mask_n [BLOCK_N]: rows in range; mask_s [ROWS, BLOCK_N]: which keys each query row sees (a row that
    sees none of the block keeps its state)."""
    c = tl.load(Kv + rows[:, None] * stride_kt + offs_c[None, :], mask=mask_n[:, None] & mask_c[None, :],
                other=0.0).to(q_c.dtype)  # [BLOCK_N, C]
    pe = tl.load(Kv + rows[None, :] * stride_kt + LORA + offs_r[:, None], mask=mask_r[:, None] & mask_n[None, :],
                 other=0.0).to(q_pe.dtype)  # [R, BLOCK_N]
    scores = tl.dot(q_c, tl.trans(c), input_precision="ieee")
    scores += tl.dot(q_pe, pe, input_precision="ieee")
    scores = tl.where(mask_s, scores * sm_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: p = 0, not NaN
    p = tl.exp(scores - m_safe[:, None])
    rescale = tl.exp(m_i - m_safe)
    l_i = l_i * rescale + tl.sum(p, 1)
    acc = acc * rescale[:, None] + tl.dot(p.to(c.dtype), c, input_precision="ieee")
    return acc, m_new, l_i


@lazy_jit
def _mla_split_kernel(
    Q, Kv, Req_to_token, Req_pool_indices, Seq_lens, Partial_out, Lse, sm_scale,
    stride_qb, stride_qh, stride_kt, stride_r2t, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
    NUM_HEADS: tl.constexpr, LORA: tl.constexpr, ROPE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    MIN_SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)

    seq_len = tl.load(Seq_lens + b).to(tl.int64)
    num_splits = tl.maximum(tl.minimum((seq_len + MIN_SPLIT - 1) // MIN_SPLIT, NUM_SPLITS), 1)
    split_len = (seq_len + num_splits - 1) // num_splits
    start = split * split_len  # this split's positions [start, end)
    end = tl.minimum(start + split_len, seq_len)
    if (split < num_splits) & (end > start):
        row = tl.load(Req_pool_indices + b).to(tl.int64)
        heads = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
        mask_h = heads < NUM_HEADS
        offs_c = tl.arange(0, BLOCK_C)
        offs_r = tl.arange(0, BLOCK_R)
        mask_c = offs_c < LORA
        mask_r = offs_r < ROPE
        q_row = Q + b * stride_qb + heads[:, None] * stride_qh
        q_c = tl.load(q_row + offs_c[None, :], mask=mask_h[:, None] & mask_c[None, :], other=0.0)  # [BLOCK_H, C]
        q_pe = tl.load(q_row + LORA + offs_r[None, :], mask=mask_h[:, None] & mask_r[None, :], other=0.0)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            slots = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=mask_n, other=0).to(tl.int64)
            acc, m_i, l_i = attend_latent_block(q_c, q_pe, m_i, l_i, acc, Kv, slots, stride_kt, offs_c, mask_c,
                                                offs_r, mask_r, mask_n, mask_n[None, :], sm_scale, LORA)
        out = Partial_out + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + offs_c[None, :]
        tl.store(out, acc / l_i[:, None], mask=mask_h[:, None] & mask_c[None, :])
        tl.store(Lse + b * stride_lb + heads * stride_lh + split, m_i + tl.log(l_i), mask=mask_h)


@lazy_jit
def _mla_merge_kernel(
    Partial_out, Lse, Seq_lens, O, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, LORA: tl.constexpr, NUM_SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1).to(tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
    seq_len = tl.load(Seq_lens + b).to(tl.int64)
    num_splits = tl.maximum(tl.minimum((seq_len + MIN_SPLIT - 1) // MIN_SPLIT, NUM_SPLITS), 1)  # as the split kernel
    split_len = (seq_len + num_splits - 1) // num_splits
    offs_c = tl.arange(0, BLOCK_C)
    mask_h = heads < NUM_HEADS
    mask = mask_h[:, None] & (offs_c < LORA)[None, :]
    m_run = tl.full([BLOCK_H], float("-inf"), tl.float32)
    weight_sum = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_C], tl.float32)
    for split in range(0, num_splits):
        if split * split_len < seq_len:  # a split past the sequence's end wrote nothing
            lse = tl.load(Lse + b * stride_lb + heads * stride_lh + split, mask=mask_h, other=0.0)
            part = tl.load(Partial_out + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
                           + offs_c[None, :], mask=mask, other=0.0)
            m_new = tl.maximum(m_run, lse)
            rescale = tl.exp(m_run - m_new)
            w = tl.exp(lse - m_new)
            acc = acc * rescale[:, None] + w[:, None] * part
            weight_sum = weight_sum * rescale + w
            m_run = m_new
    tl.store(O + b * stride_ob + heads[:, None] * stride_oh + offs_c[None, :],
             (acc / weight_sum[:, None]).to(O.dtype.element_ty), mask=mask)


def mla_decode_fwd(
    q: torch.Tensor, kv_rows: torch.Tensor, o: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, partial_out: torch.Tensor, lse: torch.Tensor,
    sm_scale: float, tiles: AttentionTiles | None = None, max_seq_len: int | None = None,
    heads_per_program: int | None = None,
) -> torch.Tensor:
    """o[b, h] = softmax(q[b, h] . rows_b^T * sm_scale) rows_b[:, :LORA] over the first seq_lens[b] latent rows.

    q [B, H, LORA + ROPE] (absorbed: [q_nope @ W_UK | q_pe]); kv_rows [S, 1, LORA + ROPE] one layer of the latent
    pool (only dim 2 need be contiguous); o [B, H, LORA] (written), LORA = o.shape[2]; req_to_token [rows, max_ctx];
    req_pool_indices, seq_lens [B] (every seq_len >= 1; the current token already written to the pool);
    partial_out fp32 [>= B, H, splits, LORA], lse fp32 [>= B, H, splits] (the planned workspace; splits =
    partial_out.shape[2]). max_seq_len: max(seq_lens) when the host knows it (eager decode: the grid gets only the
    splits the longest request uses); None (a CUDA graph's fixed grid) launches every split. heads_per_program: query
    heads per program (default: all of them under the interpreter, where fewer programs are faster; 16 on a GPU).
    """
    bs, num_heads, width = q.shape
    lora = o.shape[2]
    rope = width - lora
    assert kv_rows.dim() == 3 and kv_rows.shape[1] == 1 and kv_rows.shape[2] == width, (
        f"MLA decode: latent rows {tuple(kv_rows.shape)} for a {width}-wide query")
    assert 0 < rope and o.shape[:2] == (bs, num_heads), (tuple(o.shape), tuple(q.shape))
    assert q.stride(2) == 1 and o.stride(2) == 1 and kv_rows.stride(2) == 1
    num_splits = partial_out.shape[2]
    assert partial_out.shape[0] >= bs and partial_out.shape[1] == num_heads and partial_out.shape[3] == lora, (
        f"split-KV workspace {tuple(partial_out.shape)} does not fit batch {bs} x {num_heads} heads x {lora}")
    assert lse.shape[0] >= bs and tuple(lse.shape[1:]) == (num_heads, num_splits), tuple(lse.shape)
    if bs == 0:
        return o
    tiles = tiles or default_tiles()
    if heads_per_program is None:
        heads_per_program = num_heads if interpreted() else GPU_HEADS_PER_PROGRAM
    block_h = dot_tile(min(heads_per_program, num_heads))
    head_blocks = triton.cdiv(num_heads, block_h)
    grid_splits = num_splits
    if max_seq_len is not None:
        grid_splits = max(1, min(num_splits, triton.cdiv(max_seq_len, tiles.decode_min_split_tokens)))
    common = dict(NUM_HEADS=num_heads, LORA=lora, NUM_SPLITS=num_splits, MIN_SPLIT=tiles.decode_min_split_tokens,
                  BLOCK_H=block_h, BLOCK_C=dot_tile(lora))
    _mla_split_kernel[(bs, head_blocks, grid_splits)](
        q, kv_rows, req_to_token, req_pool_indices, seq_lens, partial_out, lse, sm_scale,
        q.stride(0), q.stride(1), kv_rows.stride(0), req_to_token.stride(0), partial_out.stride(0),
        partial_out.stride(1), partial_out.stride(2), lse.stride(0), lse.stride(1),
        ROPE=rope, BLOCK_R=dot_tile(rope), BLOCK_N=tiles.decode_block_n, **common,
    )
    _mla_merge_kernel[(bs, head_blocks)](
        partial_out, lse, seq_lens, o, partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        lse.stride(0), lse.stride(1), o.stride(0), o.stride(1), **common,
    )
    return o
