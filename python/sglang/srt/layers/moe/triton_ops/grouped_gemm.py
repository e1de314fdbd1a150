"""The grouped expert GEMM of the fused MoE: for every assignment i (token i // A_ROW_DIV's expert e_i, align.py),
    C[i, n] = sum_k A[i // A_ROW_DIV, k] * W[e_i, n, k]            (* topk_weights.flatten()[i] when MUL_WEIGHT)
C is indexed by assignment id (row i = token m's j-th expert, i = m * topk + j), not by sorted position, so the
next step reads rows in the order it likes and the final sum over a token's topk rows is one contiguous reduction.

Grid (B, ceil(N_OUT / BLOCK_N)), B = workspace.max_blocks: program (b, n) takes block b of sorted_ids, i.e. the
BLOCK_M assignments sorted_ids[b * BLOCK_M : (b + 1) * BLOCK_M] (all of expert expert_ids[b]; the sentinel T
marks padding rows, which are neither read nor written), and output columns [n * BLOCK_N, (n + 1) * BLOCK_N).
Programs with b * BLOCK_M >= num_tokens_post_padded (= expert_offsets[E], read on the device) do nothing: the grid
is fixed by host integers (M, topk, E, BLOCK_M), never by the routing. Consecutive programs are consecutive blocks
of the same column tile, so the blocks of one expert read its weight tile from L2 one after another.

Dot products accumulate in fp32 (fp32 inputs: input_precision="ieee", no TF32); the routing weight multiplies the
fp32 accumulator before the one rounding to C's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit
from sglang.srt.layers.attention.triton_ops.tiles import dot_tile
from sglang.srt.layers.moe.triton_ops.tiles import MoeTiles


@lazy_jit
def _grouped_gemm_kernel(
    A, W, C, Sorted_ids, Expert_ids, Num_post_padded, Topk_weights, num_assignments,
    stride_am, stride_we, stride_wn, stride_cm, stride_tw_m, stride_tw_j,
    N_OUT: tl.constexpr, K_IN: tl.constexpr, A_ROW_DIV: tl.constexpr, TOPK: tl.constexpr,
    MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M < tl.load(Num_post_padded):
        rows = tl.load(Sorted_ids + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # assignment ids
        valid = rows < num_assignments
        expert = tl.load(Expert_ids + pid_m).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < N_OUT
        a_ptrs = A + (rows // A_ROW_DIV)[:, None] * stride_am
        w_ptrs = W + expert * stride_we + offs_n.to(tl.int64)[None, :] * stride_wn  # W[e] read as [K, N]
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K_IN, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K_IN
            a = tl.load(a_ptrs + offs_k[None, :], mask=valid[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_ptrs + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            acc = tl.dot(a, w, acc, input_precision="ieee")
        if MUL_WEIGHT:  # topk_weights[i // TOPK, i % TOPK], any strides
            weight = tl.load(Topk_weights + (rows // TOPK) * stride_tw_m + (rows % TOPK) * stride_tw_j, mask=valid,
                             other=0.0)
            acc = acc * weight.to(tl.float32)[:, None]
        tl.store(C + rows[:, None] * stride_cm + offs_n[None, :], acc.to(C.dtype.element_ty),
                 mask=valid[:, None] & mask_n[None, :])


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, c: torch.Tensor, sorted_ids: torch.Tensor,
                 expert_ids: torch.Tensor, num_tokens_post_padded: torch.Tensor, topk: int, a_row_div: int,
                 block_m: int, tiles: MoeTiles, topk_weights: torch.Tensor | None = None) -> None:
    """C[i] = A[i // a_row_div] @ W[e_i].T (module docstring) for the T = c.shape[0] assignments of the batch.

    a [rows, K_IN] (rows >= T / a_row_div), w [E, N_OUT, K_IN], c [T, N_OUT]: rows contiguous. The alignment
    buffers come from align.align_block_size at this block_m: expert_ids of exactly max_blocks(T, E, block_m)
    entries (the grid's first axis), num_tokens_post_padded a view of expert_offsets[E:]. topk_weights
    [T / topk, topk] (fp32) multiplies row i by topk_weights[i // topk, i % topk].
    """
    num_assignments, n_out = c.shape
    k_in = w.shape[2]
    assert a.shape[1] == k_in and w.shape[1] == n_out, (tuple(a.shape), tuple(w.shape), tuple(c.shape))
    assert a.stride(1) == 1 and w.stride(2) == 1 and c.stride(1) == 1, "rows must be contiguous"
    block_n = min(tiles.block_n, dot_tile(n_out))
    block_k = min(tiles.block_k, dot_tile(k_in))
    mul_weight = topk_weights is not None
    tw = topk_weights if mul_weight else sorted_ids  # unread placeholder when not weighting
    grid = (expert_ids.shape[0], triton.cdiv(n_out, block_n))
    _grouped_gemm_kernel[grid](
        a, w, c, sorted_ids, expert_ids, num_tokens_post_padded, tw, num_assignments,
        a.stride(0), w.stride(0), w.stride(1), c.stride(0),
        tw.stride(0) if mul_weight else 0, tw.stride(1) if mul_weight else 0,
        N_OUT=n_out, K_IN=k_in, A_ROW_DIV=a_row_div, TOPK=topk, MUL_WEIGHT=mul_weight,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )
