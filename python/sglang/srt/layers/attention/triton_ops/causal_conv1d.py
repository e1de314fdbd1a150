"""Triton kernels of the causal conv1d with a carried window (layers/attention/linear/causal_conv1d.py defines it and
holds the torch form these equal).

  _conv_extend_kernel, grid (token blocks, channel blocks): y of BLOCK_T flat tokens; tap j of token t of request b
      reads x (t - (K - 1) + j >= 0 inside the request) or column (K - 1) + (t - (K - 1) + j) of b's old state
      (zeros without has_initial_state).
  _conv_state_kernel, grid (B, channel blocks): b's new state, the last K - 1 inputs of (old state ++ new tokens).
  _conv_decode_kernel, grid (B, channel blocks): one token: y and the state shifted by one column.
New states go to fresh tensors, never in place: the extend kernel's programs read old state columns in any order.
fp32 math; y in x's dtype, states in conv_state's dtype.
"""

from __future__ import annotations

from typing import List, Optional

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit

BLOCK_T = 16
BLOCK_C = 64


@lazy_jit
def _conv_extend_kernel(X, W, Bias, State, Has_state, Tok_req, Cu_seqlens, Y, stride_xt, stride_yt, stride_sb,
                        stride_sc, n_tokens, channels, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                        SILU: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_t = tok < n_tokens
    mask_c = ch < channels
    req = tl.load(Tok_req + tok, mask=mask_t, other=0).to(tl.int64)
    start = tl.load(Cu_seqlens + req, mask=mask_t, other=0).to(tl.int64)
    has = tl.load(Has_state + req, mask=mask_t, other=0) != 0
    pos = tok - start  # position inside the request
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(Bias + ch, mask=mask_c, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(K):
        src = pos - (K - 1) + j  # < 0: one of the K - 1 carried columns, column (K - 1) + src
        w = tl.load(W + ch * K + j, mask=mask_c, other=0.0).to(tl.float32)
        in_x = mask_t & (src >= 0)
        in_state = mask_t & (src < 0) & has
        xv = tl.load(X + (start + src)[:, None] * stride_xt + ch[None, :], mask=in_x[:, None] & mask_c[None, :],
                     other=0.0).to(tl.float32)
        sv = tl.load(State + req[:, None] * stride_sb + ch[None, :] * stride_sc + (K - 1 + src)[:, None],
                     mask=in_state[:, None] & mask_c[None, :], other=0.0).to(tl.float32)
        acc += (xv + sv) * w[None, :]
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(Y + tok[:, None] * stride_yt + ch[None, :], acc.to(Y.dtype.element_ty),
             mask=mask_t[:, None] & mask_c[None, :])


@lazy_jit
def _conv_state_kernel(X, State, Has_state, Cu_seqlens, New_state, stride_xt, stride_sb, stride_sc, stride_nb,
                       stride_nc, channels, K: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = ch < channels
    start = tl.load(Cu_seqlens + b).to(tl.int64)
    n = tl.load(Cu_seqlens + b + 1).to(tl.int64) - start
    has = (tl.load(Has_state + b) + tl.zeros([BLOCK_C], dtype=tl.int32)) != 0  # per lane: a mask operand
    for j in tl.static_range(K - 1):
        src = n - (K - 1) + j + tl.zeros([BLOCK_C], dtype=tl.int64)  # < 0: old column n + j; per lane (masks)
        in_x = mask_c & (src >= 0)
        in_state = mask_c & (src < 0) & has
        val = tl.load(X + (start + src) * stride_xt + ch, mask=in_x, other=0.0).to(tl.float32)
        val += tl.load(State + b * stride_sb + ch * stride_sc + (src + K - 1), mask=in_state, other=0.0).to(tl.float32)
        tl.store(New_state + b * stride_nb + ch * stride_nc + j, val.to(New_state.dtype.element_ty), mask=mask_c)


@lazy_jit
def _conv_decode_kernel(X, W, Bias, State, Y, New_state, stride_xb, stride_yb, stride_sb, stride_sc, stride_nb,
                        stride_nc, channels, K: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = ch < channels
    xv = tl.load(X + b * stride_xb + ch, mask=mask_c, other=0.0).to(tl.float32)
    acc = xv * tl.load(W + ch * K + (K - 1), mask=mask_c, other=0.0).to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(Bias + ch, mask=mask_c, other=0.0).to(tl.float32)
    for j in tl.static_range(K - 1):
        sv = tl.load(State + b * stride_sb + ch * stride_sc + j, mask=mask_c, other=0.0).to(tl.float32)
        acc += sv * tl.load(W + ch * K + j, mask=mask_c, other=0.0).to(tl.float32)
        if j > 0:  # the window moves on by one: old column j becomes column j - 1
            tl.store(New_state + b * stride_nb + ch * stride_nc + (j - 1), sv.to(New_state.dtype.element_ty),
                     mask=mask_c)
    tl.store(New_state + b * stride_nb + ch * stride_nc + (K - 2), xv.to(New_state.dtype.element_ty), mask=mask_c)
    if SILU:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(Y + b * stride_yb + ch, acc.to(Y.dtype.element_ty), mask=mask_c)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def causal_conv1d_extend_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                                conv_state: torch.Tensor, has_initial_state: torch.Tensor, extend_lens: List[int],
                                activation: Optional[str]):
    n_tokens, channels = x.shape
    kernel = weight.shape[1]
    batch = len(extend_lens)
    x = _rows_contiguous(x)
    weight = weight.contiguous()
    conv_state = conv_state if conv_state.stride(-1) == 1 else conv_state.contiguous()
    lens = torch.tensor(extend_lens, dtype=torch.int32, device=x.device)
    cu = torch.zeros(batch + 1, dtype=torch.int32, device=x.device)
    cu[1:] = torch.cumsum(lens, 0)
    tok_req = torch.repeat_interleave(torch.arange(batch, dtype=torch.int32, device=x.device), lens)
    has = has_initial_state.to(device=x.device, dtype=torch.int32)
    y = torch.empty(n_tokens, channels, dtype=x.dtype, device=x.device)
    new_state = torch.empty(batch, channels, kernel - 1, dtype=conv_state.dtype, device=x.device)
    bias_arg = bias.contiguous() if bias is not None else weight  # never read without HAS_BIAS
    if n_tokens:
        _conv_extend_kernel[(triton.cdiv(n_tokens, BLOCK_T), triton.cdiv(channels, BLOCK_C))](
            x, weight, bias_arg, conv_state, has, tok_req, cu, y, x.stride(0), y.stride(0), conv_state.stride(0),
            conv_state.stride(1), n_tokens, channels, K=kernel, HAS_BIAS=bias is not None,
            SILU=activation == "silu", BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C)
    if batch:
        _conv_state_kernel[(batch, triton.cdiv(channels, BLOCK_C))](
            x, conv_state, has, cu, new_state, x.stride(0), conv_state.stride(0), conv_state.stride(1),
            new_state.stride(0), new_state.stride(1), channels, K=kernel, BLOCK_C=BLOCK_C)
    return y, new_state


def causal_conv1d_decode_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                                conv_state: torch.Tensor, activation: Optional[str]):
    batch, channels = x.shape
    kernel = weight.shape[1]
    x = _rows_contiguous(x)
    weight = weight.contiguous()
    conv_state = conv_state if conv_state.stride(-1) == 1 else conv_state.contiguous()
    y = torch.empty(batch, channels, dtype=x.dtype, device=x.device)
    new_state = torch.empty(batch, channels, kernel - 1, dtype=conv_state.dtype, device=x.device)
    bias_arg = bias.contiguous() if bias is not None else weight
    if batch:
        _conv_decode_kernel[(batch, triton.cdiv(channels, BLOCK_C))](
            x, weight, bias_arg, conv_state, y, new_state, x.stride(0), y.stride(0), conv_state.stride(0),
            conv_state.stride(1), new_state.stride(0), new_state.stride(1), channels, K=kernel,
            HAS_BIAS=bias is not None, SILU=activation == "silu", BLOCK_C=BLOCK_C)
    return y, new_state
