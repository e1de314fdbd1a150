"""Extend (prefill) attention over MLA latent rows: new tokens attend to their request's cached latent rows and,
causally, to each other's, in the absorbed form (q = [q_nope @ W_UK | q_pe], output latent [N, H, LORA]).

Grid (B, head blocks, query blocks); the program for (b, head block g, m) handles new tokens [m * BLOCK_M,
(m + 1) * BLOCK_M) of request b for BLOCK_H query heads: its BLOCK_M * BLOCK_H rows are (token, head) pairs, row r =
token r // BLOCK_H, head g * BLOCK_H + r % BLOCK_H (rows of padding heads or of tokens past extend_len are computed on
zeros and never stored). Every head shares the one latent row per token, so a program loads each key block once,
[BLOCK_N, LORA + ROPE], for all its rows, and uses the block's first LORA columns as keys and values alike
(mla_decode.attend_latent_block). One online softmax runs over
  1. the cached prefix [0, prefix_len): the pool's rows through req_to_token[req_pool_indices[b], t] (any page size);
  2. the new tokens' rows k_rows[qo_start[b] + j] as computed this forward, with the causal mask j <= i.
Split as 512 + 64 (DeepSeek's LORA + ROPE), the rows need no padding to a power of two: the general extend kernel
would carry a 1024-wide key tile and all H heads per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted, lazy_jit
from sglang.srt.layers.attention.triton_ops.mla_decode import GPU_HEADS_PER_PROGRAM, attend_latent_block
from sglang.srt.layers.attention.triton_ops.tiles import MIN_DOT_TILE, AttentionTiles, default_tiles, dot_tile

# (token, head) rows per program on a GPU: a [32, 512] fp32 accumulator and [32, 512 + 64] query, as decode's 16 heads
# twice (the general extend kernel's 64 rows of 1024-wide padded keys would not fit)
GPU_ROWS_PER_PROGRAM = 32
GPU_NUM_WARPS = 8  # the [32, 512] fp32 accumulator is 64 KiB: 64 registers a thread over 8 warps, 128 over 4


@lazy_jit
def _mla_extend_kernel(
    Q, K_rows, O, Kv, Req_to_token, Req_pool_indices, Qo_start, Extend_lens, Prefix_lens, sm_scale,
    stride_qt, stride_qh, stride_knt, stride_ot, stride_oh, stride_kt, stride_r2t,
    NUM_HEADS: tl.constexpr, LORA: tl.constexpr, ROPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    head_block = tl.program_id(1).to(tl.int64)
    m_block = tl.program_id(2).to(tl.int64)

    extend_len = tl.load(Extend_lens + b).to(tl.int64)
    if m_block * BLOCK_M < extend_len:
        qo_start = tl.load(Qo_start + b).to(tl.int64)
        prefix_len = tl.load(Prefix_lens + b).to(tl.int64)
        row = tl.load(Req_pool_indices + b).to(tl.int64)
        rows = tl.arange(0, BLOCK_M * BLOCK_H)
        tok = m_block * BLOCK_M + rows // BLOCK_H  # new-token index within the request
        heads = head_block * BLOCK_H + rows % BLOCK_H
        mask_q = (tok < extend_len) & (heads < NUM_HEADS)
        offs_c = tl.arange(0, BLOCK_C)
        offs_r = tl.arange(0, BLOCK_R)
        mask_c = offs_c < LORA
        mask_r = offs_r < ROPE
        q_row = Q + (qo_start + tok)[:, None] * stride_qt + heads[:, None] * stride_qh
        q_c = tl.load(q_row + offs_c[None, :], mask=mask_q[:, None] & mask_c[None, :], other=0.0)  # [ROWS, C]
        q_pe = tl.load(q_row + LORA + offs_r[None, :], mask=mask_q[:, None] & mask_r[None, :], other=0.0)
        m_i = tl.full([BLOCK_M * BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M * BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_M * BLOCK_H, BLOCK_C], tl.float32)

        # 1. the cached prefix: every row sees all of it
        for n0 in range(0, prefix_len, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < prefix_len
            slots = tl.load(Req_to_token + row * stride_r2t + offs_n, mask=mask_n, other=0).to(tl.int64)
            acc, m_i, l_i = attend_latent_block(q_c, q_pe, m_i, l_i, acc, Kv, slots, stride_kt, offs_c, mask_c,
                                                offs_r, mask_r, mask_n, mask_n[None, :], sm_scale, LORA)
        # 2. this forward's new rows, causally up to the last token of this block
        keys_end = tl.minimum(extend_len, (m_block + 1) * BLOCK_M)
        for n0 in range(0, keys_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < keys_end
            causal = (tok[:, None] >= offs_n[None, :]) & mask_n[None, :]
            acc, m_i, l_i = attend_latent_block(q_c, q_pe, m_i, l_i, acc, K_rows, qo_start + offs_n, stride_knt,
                                                offs_c, mask_c, offs_r, mask_r, mask_n, causal, sm_scale, LORA)

        tl.store(O + (qo_start + tok)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_c[None, :],
                 (acc / l_i[:, None]).to(O.dtype.element_ty), mask=mask_q[:, None] & mask_c[None, :])


def mla_extend_fwd(
    q: torch.Tensor, k_rows: torch.Tensor, o: torch.Tensor, kv_rows: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, qo_start: torch.Tensor, extend_lens: torch.Tensor, prefix_lens: torch.Tensor,
    max_extend_len: int, sm_scale: float, tiles: AttentionTiles | None = None, heads_per_program: int | None = None,
    rows_per_program: int | None = None,
) -> torch.Tensor:
    """Causal absorbed attention of the new tokens over [cached prefix, new tokens] for every request of the batch.

    q [N, H, LORA + ROPE] (absorbed; requests concatenated), k_rows [N, 1, LORA + ROPE] the new tokens' latent rows,
    o [N, H, LORA] (written; LORA = o.shape[2]), kv_rows [S, 1, LORA + ROPE] one layer of the latent pool (only dim 2
    need be contiguous); req_to_token [rows, max_ctx]; req_pool_indices, qo_start (where each request's rows start in
    q), extend_lens, prefix_lens [B]; max_extend_len = max(extend_lens) (sizes the grid). heads_per_program: query
    heads per program, rows_per_program: (token, head) rows per program (defaults: all heads and the interpreter
    tiles' extend_rows under the interpreter, 16 and GPU_ROWS_PER_PROGRAM on a GPU).
    """
    num_tokens, num_heads, width = q.shape
    lora = o.shape[2]
    rope = width - lora
    assert k_rows.shape == (num_tokens, 1, width) and kv_rows.dim() == 3 and kv_rows.shape[1:] == (1, width), (
        f"MLA extend: rows {tuple(k_rows.shape)} / {tuple(kv_rows.shape)} for a {width}-wide query")
    assert 0 < rope and o.shape[:2] == (num_tokens, num_heads)
    assert all(t.stride(-1) == 1 for t in (q, k_rows, o, kv_rows))
    bs = req_pool_indices.shape[0]
    if bs == 0 or max_extend_len == 0:
        return o
    tiles = tiles or default_tiles()
    if heads_per_program is None:
        heads_per_program = num_heads if interpreted() else GPU_HEADS_PER_PROGRAM
    if rows_per_program is None:
        rows_per_program = tiles.extend_rows if interpreted() else GPU_ROWS_PER_PROGRAM
    block_h = triton.next_power_of_2(min(heads_per_program, num_heads))
    # tokens per program: rows = block_m * block_h, at least tl.dot's 16
    block_m = max(1, rows_per_program // block_h, triton.cdiv(MIN_DOT_TILE, block_h))
    grid = (bs, triton.cdiv(num_heads, block_h), triton.cdiv(max_extend_len, block_m))
    _mla_extend_kernel[grid](
        q, k_rows, o, kv_rows, req_to_token, req_pool_indices, qo_start, extend_lens, prefix_lens, sm_scale,
        q.stride(0), q.stride(1), k_rows.stride(0), o.stride(0), o.stride(1), kv_rows.stride(0),
        req_to_token.stride(0),
        NUM_HEADS=num_heads, LORA=lora, ROPE=rope, BLOCK_M=block_m, BLOCK_H=block_h, BLOCK_C=dot_tile(lora),
        BLOCK_R=dot_tile(rope), BLOCK_N=tiles.extend_block_n, num_warps=GPU_NUM_WARPS,
    )
    return o
