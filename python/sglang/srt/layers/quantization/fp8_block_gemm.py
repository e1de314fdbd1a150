"""Block-fp8 GEMM in Triton (the GPU path of an fp8 block checkpoint's linear layers: fp8_block_linear.py).

    y[m, n] = sum_k  A[m, k] * W[n, k]        A = x quantized per token and group, W = the checkpoint's blocks
    x ≈ qa * sa[m, k // GROUP]                qa fp8 e4m3, sa fp32: one scale per token and GROUP input columns
    W ≈ qw * sw[n // BN_W, k // BK_W]         qw fp8 e4m3, sw fp32 (weight_scale_inv): one per [BN_W, BK_W] block

1. per_token_group_quant_fp8(x, GROUP): sa = max(|x| over the group) / 448 (at least EPS), qa = x / sa rounded to
   e4m3 (|x / sa| <= 448 by construction, so nothing saturates).
2. the GEMM: program (pid_m, pid_n) owns a [BLOCK_M, BLOCK_N] tile of y and walks K in steps of GROUP == BK_W (the
   activation group is the weight's K block, so every K step has one activation scale per row and one weight scale
   per column): partial = qa_tile @ qw_tile^T as an fp8 x fp8 dot with an fp32 result, then
   acc += partial * sa[rows, step] * sw[cols // BN_W, step]. The scales apply in fp32 outside the dot, which is
   exact per step; y is rounded once to the output dtype. Ragged edges (M, N, K not multiples of the tiles) are
   masked loads of 0.

The interpreter (TRITON_INTERPRET=1) runs the same kernels on CPU tensors (the tests; its fp8 dot is exact in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import interpreted, lazy_jit

FP8_MAX = 448.0  # e4m3's largest finite value
EPS = 1e-10  # a zero group's scale (its values quantize to 0 whatever the scale)


@dataclass(frozen=True)
class Fp8GemmTiles:
    block_m: int
    block_n: int
    num_warps: int


GPU_TILES = Fp8GemmTiles(64, 128, 4)
INTERPRETER_TILES = Fp8GemmTiles(16, 32, 1)  # small tiles: the interpreter's cost is per element of a tile


@lazy_jit
def _group_quant_kernel(X, Q, S, K, stride_xm, stride_qm, stride_sm, GROUP: tl.constexpr,
                        ROUND_FIRST: tl.constexpr):
    m = tl.program_id(0)
    g = tl.program_id(1)
    cols = g * GROUP + tl.arange(0, GROUP)
    mask = cols < K
    x = tl.load(X + m * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) / FP8_MAX, EPS)
    v = x / scale
    if ROUND_FIRST:
        # the interpreter's fp32 -> e4m3 cast drops the carry of a mantissa that rounds up into the next binade
        # (124.7 -> 64, not 128; triton 3.9): round to e4m3's grid here (3 mantissa bits, subnormal step 2^-9), so
        # the cast only sees representable values. Nearest, ties away from zero (the GPU cast: ties to even).
        mag = tl.abs(v)
        exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1e-30))), -6.0)
        step = tl.exp2(exponent - 3.0)
        v = tl.where(v < 0, -1.0, 1.0) * tl.floor(mag / step + 0.5) * step
    tl.store(Q + m * stride_qm + cols, v.to(Q.dtype.element_ty), mask=mask)
    tl.store(S + m * stride_sm + g, scale)


@lazy_jit
def _block_fp8_gemm_kernel(
    A, As, W, Ws, Y, M, N, K,
    stride_am, stride_asm, stride_wn, stride_wsn, stride_ym,
    BN_W: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rows < M
    mask_n = cols < N
    a_ptrs = A + rows.to(tl.int64)[:, None] * stride_am
    w_ptrs = W + cols.to(tl.int64)[None, :] * stride_wn  # W[n, k] read as [K, N]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for step in range(0, tl.cdiv(K, GROUP)):
        offs_k = step * GROUP + tl.arange(0, GROUP)
        mask_k = offs_k < K
        a = tl.load(a_ptrs + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptrs + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        partial = tl.dot(a, w, out_dtype=tl.float32)
        sa = tl.load(As + rows * stride_asm + step, mask=mask_m, other=0.0)
        sw = tl.load(Ws + (cols // BN_W) * stride_wsn + step, mask=mask_n, other=0.0)
        acc += partial * sa[:, None] * sw[None, :]
    tl.store(Y + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], acc.to(Y.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


def per_token_group_quant_fp8(x: torch.Tensor, group: int):
    """(qa fp8 [M, K], sa fp32 [M, ceil(K / group)]) of a 2-D activation (step 1 of the module docstring)."""
    m, k = x.shape
    x = x.contiguous()
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, triton.cdiv(k, group), dtype=torch.float32, device=x.device)
    if m:
        _group_quant_kernel[(m, s.shape[1])](x, q, s, k, x.stride(0), q.stride(0), s.stride(0), GROUP=group,
                                              ROUND_FIRST=interpreted())
    return q, s


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, block: tuple,
                     out_dtype: torch.dtype = None, tiles: Fp8GemmTiles = None) -> torch.Tensor:
    """x [M, K] (any float dtype) times an fp8 block weight [N, K] with scales [ceil(N / bn), ceil(K / bk)]
    -> [M, N] in out_dtype (x's by default)."""
    bn, bk = block
    m, k = x.shape
    n = weight.shape[0]
    if weight.shape[1] != k or tuple(weight_scale_inv.shape) != (triton.cdiv(n, bn), triton.cdiv(k, bk)):
        raise ValueError(f"block fp8 GEMM: x {tuple(x.shape)}, weight {tuple(weight.shape)}, scales "
                         f"{tuple(weight_scale_inv.shape)} do not fit blocks [{bn}, {bk}]")
    tiles = tiles or (INTERPRETER_TILES if interpreted() else GPU_TILES)
    qa, sa = per_token_group_quant_fp8(x, bk)
    y = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m:
        grid = (triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n))
        _block_fp8_gemm_kernel[grid](
            qa, sa, weight, weight_scale_inv, y, m, n, k,
            qa.stride(0), sa.stride(0), weight.stride(0), weight_scale_inv.stride(0), y.stride(0),
            BN_W=bn, GROUP=bk, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps)
    return y
