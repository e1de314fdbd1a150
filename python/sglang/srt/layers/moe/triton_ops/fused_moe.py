"""Fused MoE experts in Triton: out[m] = sum_j topk_weights[m, j] * (silu(x_m W_g^T) * (x_m W_u^T)) W_2^T with
W_g = w13[e][:N], W_u = w13[e][N:], W_2 = w2[e], e = topk_ids[m, j].

The same contract as the torch and CPU implementations of fused_experts. Per call (T = M * topk assignments,
assignment i = m * topk + j; every buffer but `out` is a view of the workspace, workspace.py):
    1. align.align_block_size: assignments grouped by expert into BLOCK_M-row blocks (sorted_ids, expert_ids,
       expert_offsets; expert_offsets[E] is the padded total, the GEMMs' num_tokens_post_padded)
    2. grouped GEMM: intermediate1[i] = hidden[i // topk] @ w13[e_i].T          [T, 2N], row = assignment id
    3. _silu_and_mul_kernel: intermediate2[i] = silu(intermediate1[i, :N]) * intermediate1[i, N:]      [T, N]
    4. grouped GEMM: intermediate3[i] = topk_weights[m, j] * intermediate2[i] @ w2[e_i].T              [T, K]
       (in a FusedMoeWorkspace intermediate3 is intermediate1's memory: that one is dead by now)
    5. _combine_kernel: out[m] = sum_j intermediate3[m * topk + j] over the j whose expert is in [0, E)     [M, K]
An id outside [0, E) (another rank's expert under --ep-size, where the layer passes -1) gets no slot in step 1, so
neither GEMM touches its row and step 5 leaves that row, stale workspace memory, out of the sum: the assignment
contributes nothing, as in the torch and CPU implementations.
No step reads a device value on the host, and every grid and view is a function of (M, topk, E, N, K, BLOCK_M), so
a call with a planned workspace allocates only `out` and can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit
from sglang.srt.layers.moe.triton_ops.align import align_block_size
from sglang.srt.layers.moe.triton_ops.grouped_gemm import grouped_gemm
from sglang.srt.layers.moe.triton_ops.tiles import MoeTiles, default_tiles
from sglang.srt.layers.moe.triton_ops.workspace import FusedMoeWorkspace, call_buffers, fused_moe_workspace_bytes

__all__ = ["fused_experts_triton", "fused_moe_workspace_bytes", "FusedMoeWorkspace"]


@lazy_jit
def _silu_and_mul_kernel(X, Y, num_rows, stride_x, stride_y, N: tl.constexpr, ROWS: tl.constexpr,
                         COLS: tl.constexpr):
    # Y[r, c] = silu(X[r, c]) * X[r, N + c] in fp32, r in [pid0 * ROWS, +ROWS), c in [pid1 * COLS, +COLS)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    mask = (rows < num_rows)[:, None] & (cols < N)[None, :]
    x_ptrs = X + rows[:, None] * stride_x + cols[None, :]
    gate = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptrs + N, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@lazy_jit
def _combine_kernel(X, Ids, Out, num_experts, stride_x, stride_out, K: tl.constexpr, TOPK: tl.constexpr,
                    COLS: tl.constexpr):
    # Out[m, c] = sum_j X[m * TOPK + j, c] over the j with Ids[m * TOPK + j] in [0, num_experts), j ascending, in fp32,
    # m = pid0, c in [pid1 * COLS, +COLS). A skipped row is never loaded (its memory may hold anything, NaN included).
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    acc = tl.zeros([COLS], tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(Ids + m * TOPK + j)
        width = tl.where((e >= 0) & (e < num_experts), K, 0)  # columns to read: all, or none for a skipped row
        acc += tl.load(X + (m * TOPK + j) * stride_x + cols, mask=cols < width, other=0.0).to(tl.float32)
    tl.store(Out + m * stride_out + cols, acc.to(Out.dtype.element_ty), mask=cols < K)


def combine(x: torch.Tensor, ids: torch.Tensor, out: torch.Tensor, num_experts: int, tiles: MoeTiles) -> None:
    """out [M, K] = the sum of each token's topk rows of x [M * topk, K] whose ids (flat [M * topk]) are experts of
    this rank (step 5)."""
    num_tokens, k = out.shape
    topk = ids.numel() // max(1, num_tokens)
    assert x.shape[0] >= num_tokens * topk and x.shape[1] == k and x.stride(1) == 1 and out.stride(1) == 1
    cols = min(tiles.act_cols, triton.next_power_of_2(k))
    grid = (num_tokens, triton.cdiv(k, cols))
    _combine_kernel[grid](x, ids, out, num_experts, x.stride(0), out.stride(0), K=k, TOPK=topk, COLS=cols)


def silu_and_mul(x: torch.Tensor, y: torch.Tensor, tiles: MoeTiles) -> None:
    """y [T, N] = silu(x[:, :N]) * x[:, N:] for x [T, 2N]; rows contiguous."""
    num_rows, n = y.shape
    assert x.shape == (num_rows, 2 * n) and x.stride(1) == 1 and y.stride(1) == 1
    cols = min(tiles.act_cols, triton.next_power_of_2(n))
    grid = (triton.cdiv(num_rows, tiles.act_rows), triton.cdiv(n, cols))
    _silu_and_mul_kernel[grid](x, y, num_rows, x.stride(0), y.stride(0), N=n, ROWS=tiles.act_rows, COLS=cols)


def fused_experts_triton(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor, workspace=None, *, tiles: MoeTiles | None = None) -> torch.Tensor:
    """hidden [M, K]; w13 [E, 2N, K] (rows [0, N) gate, [N, 2N) up); w2 [E, K, N]; topk_weights fp32 [M, topk];
    topk_ids int [M, topk], an id outside [0, E) contributing nothing -> out [M, K] in hidden's dtype.

    workspace: a FusedMoeWorkspace (or an object / dict with its buffers, workspace.py) planned for at least M
    tokens of these shapes and dtype; None allocates one for this call (tests)."""
    num_tokens, hidden_size = hidden.shape
    num_experts, two_n, _ = w13.shape
    n = two_n // 2
    topk = topk_ids.shape[1]
    assert w13.shape == (num_experts, 2 * n, hidden_size), f"w13 {tuple(w13.shape)}"
    assert w2.shape == (num_experts, hidden_size, n), f"w2 {tuple(w2.shape)} for w13 {tuple(w13.shape)}"
    assert topk_ids.shape == topk_weights.shape == (num_tokens, topk), (tuple(topk_ids.shape), topk_weights.shape)
    assert hidden.dtype == w13.dtype == w2.dtype, (hidden.dtype, w13.dtype, w2.dtype)
    out = torch.empty(num_tokens, hidden_size, dtype=hidden.dtype, device=hidden.device)
    if num_tokens == 0:
        return out
    tiles = tiles or default_tiles()
    t = num_tokens * topk
    block_m = tiles.block_m(t, num_experts)
    if workspace is None:
        workspace = FusedMoeWorkspace.allocate(num_tokens, topk, num_experts, n, hidden_size, hidden.dtype,
                                               hidden.device, block_m=block_m)
    bufs = call_buffers(workspace, t, num_experts, n, hidden_size, hidden.dtype, block_m)

    align_block_size(topk_ids, num_experts, block_m, bufs.sorted_ids, bufs.expert_ids, bufs.expert_offsets, tiles)
    aligned = (bufs.sorted_ids, bufs.expert_ids, bufs.expert_offsets[num_experts:], topk)
    hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
    grouped_gemm(hidden, w13, bufs.intermediate1, *aligned, a_row_div=topk, block_m=block_m, tiles=tiles)
    silu_and_mul(bufs.intermediate1, bufs.intermediate2, tiles)
    grouped_gemm(bufs.intermediate2, w2, bufs.intermediate3, *aligned, a_row_div=1, block_m=block_m, tiles=tiles,
                 topk_weights=topk_weights)
    combine(bufs.intermediate3, topk_ids.reshape(-1), out, num_experts, tiles)
    return out
