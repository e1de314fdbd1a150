"""Triton kernels of the gated delta rule (layers/attention/linear/gated_delta_rule.py defines it and holds the torch
form these equal): q / k l2-normalized in the kernel, q scaled, state S [dk, dv] per request and value head.

  _gdr_chunk_kernel, grid (B, H, dv blocks): request b's tokens, CHUNK at a time, with S[:, dv block] in registers.
      Per chunk (gc: in-chunk cumulative log decay; tokens past the request load g = beta = k = v = 0, which leaves
      S unchanged): L = strict lower ((beta k) k^T * exp(gc_t - gc_j)); (I + L)^-1 by forward substitution, one row
      per step (row t = e_t - L[t, :] (I + L)^-1, rows above t final); u = (I + L)^-1 (beta v),
      w = (I + L)^-1 (beta exp(gc) k); delta = u - w S; o = exp(gc) q S + (q k^T * decay, diagonal kept) delta;
      S <- exp(gc_last) S + (exp(gc_last - gc) k)^T delta. Every exponent is <= 0. The dv blocks are independent
      (each column of S evolves alone given k), so programs of one head share nothing but recompute L.
  _gdr_decode_kernel, grid (B, H, dv blocks): one recurrent step.
Query / key head of value head h: h // GROUP (GROUP = H / Hk). fp32 math (tl.dot in ieee precision); o in v's
dtype, states fp32, written to fresh tensors.
"""

from __future__ import annotations

from typing import List

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit, lazy_jit_helper

BLOCK_V = 32


@lazy_jit_helper
def _load_qk(Ptr, rows, mask_rows, offs_k, mask_k, USE_L2NORM: tl.constexpr):
    """[rows, BLOCK_K] fp32 q or k rows (pointer offsets `rows` along tokens), l2-normalized when asked (eps 1e-6:
    linear/gated_delta_rule.py's L2NORM_EPS, HF's)."""
    x = tl.load(Ptr + rows[:, None] + offs_k[None, :], mask=mask_rows[:, None] & mask_k[None, :], other=0.0
                ).to(tl.float32)
    if USE_L2NORM:
        x = x * (1.0 / tl.sqrt(tl.sum(x * x, 1) + 1e-6))[:, None]
    return x


@lazy_jit
def _gdr_chunk_kernel(Q, K, V, G, Beta, State0, Has_state, Cu_seqlens, O, State_out, scale,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                      stride_gt, stride_bt, DK, DV, GROUP: tl.constexpr, USE_L2NORM: tl.constexpr,
                      CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_v = offs_v < DV
    mask_k = offs_k < DK
    start = tl.load(Cu_seqlens + b).to(tl.int64)
    n = tl.load(Cu_seqlens + b + 1).to(tl.int64) - start
    state_ptr = (b * tl.num_programs(1) + h) * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    mask_s = mask_k[:, None] & mask_v[None, :]
    has = (tl.load(Has_state + b) + tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.int32)) != 0
    s = tl.load(State0 + state_ptr, mask=mask_s & has, other=0.0).to(tl.float32)

    t_idx = tl.arange(0, CHUNK)
    lower_strict = t_idx[:, None] > t_idx[None, :]
    causal = t_idx[:, None] >= t_idx[None, :]
    eye = tl.where(t_idx[:, None] == t_idx[None, :], 1.0, 0.0)
    hk = h // GROUP
    for c0 in range(0, n, CHUNK):
        tok = start + c0 + t_idx
        mask_t = (c0 + t_idx) < n
        q = _load_qk(Q + hk * stride_qh, tok * stride_qt, mask_t, offs_k, mask_k, USE_L2NORM) * scale
        k = _load_qk(K + hk * stride_kh, tok * stride_kt, mask_t, offs_k, mask_k, USE_L2NORM)
        v = tl.load(V + h * stride_vh + tok[:, None] * stride_vt + offs_v[None, :],
                    mask=mask_t[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        g = tl.load(G + tok * stride_gt + h, mask=mask_t, other=0.0).to(tl.float32)
        beta = tl.load(Beta + tok * stride_bt + h, mask=mask_t, other=0.0).to(tl.float32)
        gc = tl.cumsum(g, 0)
        gc_last = tl.sum(g, 0)
        decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
        kb = k * beta[:, None]
        lower = tl.where(lower_strict, tl.dot(kb, tl.trans(k), input_precision="ieee") * decay, 0.0)
        inv = eye
        for t in range(1, CHUNK):
            row_l = tl.sum(tl.where(t_idx[:, None] == t, lower, 0.0), 0)  # L[t, :], zero from column t on
            row = tl.where(t_idx == t, 1.0, 0.0) - tl.sum(row_l[:, None] * inv, 0)
            inv = tl.where(t_idx[:, None] == t, row[None, :], inv)
        u = tl.dot(inv, v * beta[:, None], input_precision="ieee")
        w = tl.dot(inv, kb * tl.exp(gc)[:, None], input_precision="ieee")
        delta = u - tl.dot(w, s, input_precision="ieee")
        attn = tl.where(causal, tl.dot(q, tl.trans(k), input_precision="ieee") * decay, 0.0)
        o = tl.dot(q * tl.exp(gc)[:, None], s, input_precision="ieee") + tl.dot(attn, delta, input_precision="ieee")
        tl.store(O + tok[:, None] * stride_ot + h * stride_oh + offs_v[None, :], o.to(O.dtype.element_ty),
                 mask=mask_t[:, None] & mask_v[None, :])
        k_tail = k * tl.exp(gc_last - gc)[:, None]
        s = s * tl.exp(gc_last) + tl.dot(tl.trans(k_tail), delta, input_precision="ieee")
    tl.store(State_out + state_ptr, s, mask=mask_s)


@lazy_jit
def _gdr_decode_kernel(Q, K, V, G, Beta, State0, O, State_out, scale, stride_qb, stride_qh, stride_kb, stride_kh,
                       stride_vb, stride_vh, stride_ob, stride_oh, stride_gb, stride_bb, DK, DV,
                       GROUP: tl.constexpr, USE_L2NORM: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    mask_v = offs_v < DV
    mask_k = offs_k < DK
    hk = h // GROUP
    q = tl.load(Q + b * stride_qb + hk * stride_qh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = tl.load(K + b * stride_kb + hk * stride_kh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    if USE_L2NORM:
        q = q / tl.sqrt(tl.sum(q * q, 0) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k, 0) + 1e-6)
    q = q * scale
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    g = tl.load(G + b * stride_gb + h).to(tl.float32)
    beta = tl.load(Beta + b * stride_bb + h).to(tl.float32)
    state_ptr = (b * tl.num_programs(1) + h) * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    mask_s = mask_k[:, None] & mask_v[None, :]
    s = tl.load(State0 + state_ptr, mask=mask_s, other=0.0).to(tl.float32) * tl.exp(g)
    delta = (v - tl.sum(s * k[:, None], 0)) * beta
    s += k[:, None] * delta[None, :]
    o = tl.sum(s * q[:, None], 0)
    tl.store(O + b * stride_ob + h * stride_oh + offs_v, o.to(O.dtype.element_ty), mask=mask_v)
    tl.store(State_out + state_ptr, s, mask=mask_s)


def _last_dim_contiguous(*xs: torch.Tensor):
    return [x if x.stride(-1) == 1 else x.contiguous() for x in xs]


def gated_delta_rule_extend_triton(q, k, v, g, beta, initial_state, has_initial_state, extend_lens: List[int],
                                   scale: float, use_qk_l2norm: bool, chunk_size: int = 64):
    n_tokens, n_heads, dv = v.shape
    dk = q.shape[-1]
    group = n_heads // q.shape[-2]  # q / k heads checked by the dispatch (linear/gated_delta_rule.py)
    batch = len(extend_lens)
    q, k, v, g, beta = _last_dim_contiguous(q, k, v, g, beta)
    state0 = initial_state.float().contiguous()
    lens = torch.tensor(extend_lens, dtype=torch.int32, device=v.device)
    cu = torch.zeros(batch + 1, dtype=torch.int32, device=v.device)
    cu[1:] = torch.cumsum(lens, 0)
    has = has_initial_state.to(device=v.device, dtype=torch.int32)
    o = torch.empty(n_tokens, n_heads, dv, dtype=v.dtype, device=v.device)
    state = torch.empty(batch, n_heads, dk, dv, dtype=torch.float32, device=v.device)
    if batch:
        _gdr_chunk_kernel[(batch, n_heads, triton.cdiv(dv, BLOCK_V))](
            q, k, v, g, beta, state0, has, cu, o, state, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), o.stride(0), o.stride(1), g.stride(0), beta.stride(0), dk, dv, GROUP=group,
            USE_L2NORM=use_qk_l2norm, CHUNK=triton.next_power_of_2(max(16, chunk_size)),
            BLOCK_K=max(16, triton.next_power_of_2(dk)), BLOCK_V=BLOCK_V)
    return o, state


def gated_delta_rule_decode_triton(q, k, v, g, beta, state, scale: float, use_qk_l2norm: bool):
    batch, n_heads, dv = v.shape
    dk = q.shape[-1]
    group = n_heads // q.shape[-2]  # q / k heads checked by the dispatch (linear/gated_delta_rule.py)
    q, k, v, g, beta = _last_dim_contiguous(q, k, v, g, beta)
    state0 = state.float().contiguous()
    o = torch.empty(batch, n_heads, dv, dtype=v.dtype, device=v.device)
    new_state = torch.empty_like(state0)
    if batch:
        _gdr_decode_kernel[(batch, n_heads, triton.cdiv(dv, BLOCK_V))](
            q, k, v, g, beta, state0, o, new_state, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), o.stride(0), o.stride(1), g.stride(0), beta.stride(0), dk, dv, GROUP=group,
            USE_L2NORM=use_qk_l2norm, BLOCK_K=max(16, triton.next_power_of_2(dk)), BLOCK_V=BLOCK_V)
    return o, new_state
