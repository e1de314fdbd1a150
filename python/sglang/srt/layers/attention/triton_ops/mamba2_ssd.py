"""Triton kernels of the Mamba-2 SSD scan (semantics: layers/attention/linear/mamba2_ssd.py, whose dispatch calls
these on a CUDA / ROCm device): the chunked extend over a varlen batch and the one-token decode step.

Chunks are cut per request (a chunk never spans two requests), so chunk c is tokens [chunk_start[c],
chunk_start[c] + chunk_ntok[c]) of the batch; its slots past chunk_ntok[c] are padding with step 0 (no decay, no
input). The extend runs four kernels, each over (chunk or request, head):
  1. _chunk_cumsum_kernel  (T, nh): step = clamp(softplus(dt + dt_bias)) per slot and acs = the inclusive cumsum of
     step * A inside the chunk, into step / acs [T, nh, CS] (CS = chunk_size rounded up to a power of two).
  2. _chunk_state_kernel   (T, nh): the chunk's end state from a zero start,
     sum_s exp(acs[last] - acs[s]) step[s] x[s] B[s]^T, into chunk_state [T, nh, hd, Ns].
  3. _state_passing_kernel (R, nh, state blocks): per request, chunk after chunk, the state entering each chunk
     (start_state) and the final state; a request without an initial state starts from zero and never reads its
     row (a reused pool row may hold anything, NaN included).
  4. _chunk_scan_kernel    (T, nh, row blocks): y[l] = exp(acs[l]) C[l] . start_state + sum_{s <= l} (C[l] . B[s])
     exp(acs[l] - acs[s]) step[s] x[s] + D x[l], over blocks of BLOCK_S source slots up to the diagonal.
Every tl.dot is fp32 at input_precision="ieee" (no tf32); the workspaces step / acs / chunk_state / start_state are
fp32 temporaries of the prefill, O(chunks x nh x hd x Ns), allocated here per call.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from sglang.srt.layers.attention.triton_ops.jit_mode import lazy_jit, lazy_jit_helper
from sglang.srt.layers.attention.triton_ops.tiles import dot_tile

DEFAULT_BLOCK = 64  # rows / source slots per tile of the chunk scan on a GPU
STATE_BLOCK = 1024  # state elements per program of the state passing
TILE_WARPS = 8  # the chunk kernels hold several [64, 128] fp32 tiles (Nemotron-H: hd 64, Ns 128) per program


@lazy_jit_helper
def _step_size(raw, dt_lo, dt_hi):
    """clamp(softplus(raw)): torch's softplus (x above 20 passes through), with log1p's series for tiny exp(x)."""
    e = tl.exp(tl.minimum(raw, 20.0))
    soft = tl.where(e < 1e-3, e * (1.0 - e * 0.5 + e * e / 3.0), tl.log(1.0 + e))
    soft = tl.where(raw > 20.0, raw, soft)
    return tl.minimum(tl.maximum(soft, dt_lo), dt_hi)


@lazy_jit
def _chunk_cumsum_kernel(Dt, Dt_bias, A, Chunk_start, Chunk_ntok, Step, Acs, dt_lo, dt_hi, stride_dt, nh,
                         HAS_BIAS: tl.constexpr, CS: tl.constexpr):
    c = tl.program_id(0)
    h = tl.program_id(1)
    start = tl.load(Chunk_start + c)
    ntok = tl.load(Chunk_ntok + c)
    offs = tl.arange(0, CS)
    live = offs < ntok
    raw = tl.load(Dt + (start + offs) * stride_dt + h, mask=live, other=0.0).to(tl.float32)
    if HAS_BIAS:
        raw += tl.load(Dt_bias + h).to(tl.float32)
    step = tl.where(live, _step_size(raw, dt_lo, dt_hi), 0.0)
    acs = tl.cumsum(step * tl.load(A + h).to(tl.float32), 0)
    base = (c * nh + h) * CS
    tl.store(Step + base + offs, step)
    tl.store(Acs + base + offs, acs)


@lazy_jit
def _chunk_state_kernel(X, B, Step, Acs, Chunk_start, Chunk_ntok, Chunk_state, stride_xt, stride_xh, stride_bt,
                        stride_bg, nh, hpg, hd, ns, CS: tl.constexpr, BLOCK_S: tl.constexpr, HD: tl.constexpr,
                        NS: tl.constexpr):
    c = tl.program_id(0)
    h = tl.program_id(1)
    g = h // hpg
    start = tl.load(Chunk_start + c)
    ntok = tl.load(Chunk_ntok + c)
    base = (c * nh + h) * CS
    total = tl.load(Acs + base + CS - 1)  # padding slots add 0, so the last slot holds the chunk's total
    p = tl.arange(0, HD)
    n = tl.arange(0, NS)
    acc = tl.zeros((HD, NS), dtype=tl.float32)
    for s0 in range(0, ntok, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        live = s < ntok
        xs = tl.load(X + (start + s)[:, None] * stride_xt + h * stride_xh + p[None, :],
                     mask=live[:, None] & (p[None, :] < hd), other=0.0).to(tl.float32)
        bs = tl.load(B + (start + s)[:, None] * stride_bt + g * stride_bg + n[None, :],
                     mask=live[:, None] & (n[None, :] < ns), other=0.0).to(tl.float32)
        st = tl.load(Step + base + s, mask=live, other=0.0)
        ac = tl.load(Acs + base + s, mask=live, other=0.0)
        w = tl.where(live, tl.exp(total - ac) * st, 0.0)
        acc += tl.dot(tl.trans(xs * w[:, None]), bs, input_precision="ieee")
    out = Chunk_state + (c * nh + h) * hd * ns + p[:, None] * ns + n[None, :]
    tl.store(out, acc, mask=(p[:, None] < hd) & (n[None, :] < ns))


@lazy_jit
def _state_passing_kernel(Chunk_state, Acs, Start_state, Init, Has_init, Final, Req_first_chunk, Req_nchunks, nh,
                          state_elems, CS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    e = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    m = e < state_elems
    has = (e * 0 + tl.load(Has_init + r)) != 0  # a block, not a scalar: the mask of a block load
    state = tl.load(Init + (r * nh + h) * state_elems + e, mask=m & has, other=0.0).to(tl.float32)
    first = tl.load(Req_first_chunk + r)
    count = tl.load(Req_nchunks + r)
    for j in range(0, count):
        c = first + j
        row = (c * nh + h) * state_elems + e
        tl.store(Start_state + row, state, mask=m)
        decay = tl.exp(tl.load(Acs + (c * nh + h) * CS + CS - 1))
        state = state * decay + tl.load(Chunk_state + row, mask=m, other=0.0)
    tl.store(Final + (r * nh + h) * state_elems + e, state.to(Final.dtype.element_ty), mask=m)


@lazy_jit
def _chunk_scan_kernel(X, B, C, D, Step, Acs, Start_state, Chunk_start, Chunk_ntok, Y, stride_xt, stride_xh,
                       stride_bt, stride_bg, stride_yt, stride_yh, nh, hpg, hd, ns, HAS_D: tl.constexpr,
                       CS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr, HD: tl.constexpr,
                       NS: tl.constexpr):
    c = tl.program_id(0)
    h = tl.program_id(1)
    l0 = tl.program_id(2) * BLOCK_L
    ntok = tl.load(Chunk_ntok + c)
    if l0 >= ntok:
        return
    g = h // hpg
    start = tl.load(Chunk_start + c)
    base = (c * nh + h) * CS
    l = l0 + tl.arange(0, BLOCK_L)
    live_l = l < ntok
    p = tl.arange(0, HD)
    n = tl.arange(0, NS)
    mp = p < hd
    mn = n < ns
    cl = tl.load(C + (start + l)[:, None] * stride_bt + g * stride_bg + n[None, :],
                 mask=live_l[:, None] & mn[None, :], other=0.0).to(tl.float32)
    acs_l = tl.load(Acs + base + l, mask=live_l, other=0.0)
    s_in = tl.load(Start_state + (c * nh + h) * hd * ns + p[:, None] * ns + n[None, :],
                   mask=mp[:, None] & mn[None, :], other=0.0)
    acc = tl.dot(cl, tl.trans(s_in), input_precision="ieee") * tl.exp(acs_l)[:, None]  # [BLOCK_L, HD]
    for s0 in range(0, tl.minimum(l0 + BLOCK_L, ntok), BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        live_s = s < ntok
        bs = tl.load(B + (start + s)[:, None] * stride_bt + g * stride_bg + n[None, :],
                     mask=live_s[:, None] & mn[None, :], other=0.0).to(tl.float32)
        xs = tl.load(X + (start + s)[:, None] * stride_xt + h * stride_xh + p[None, :],
                     mask=live_s[:, None] & mp[None, :], other=0.0).to(tl.float32)
        st = tl.load(Step + base + s, mask=live_s, other=0.0)
        acs_s = tl.load(Acs + base + s, mask=live_s, other=0.0)
        causal = (l[:, None] >= s[None, :]) & live_s[None, :]
        decay = tl.exp(tl.where(causal, acs_l[:, None] - acs_s[None, :], -float("inf")))
        scores = tl.dot(cl, tl.trans(bs), input_precision="ieee")  # [BLOCK_L, BLOCK_S]
        acc += tl.dot(scores * decay * st[None, :], xs, input_precision="ieee")
    xl = tl.load(X + (start + l)[:, None] * stride_xt + h * stride_xh + p[None, :],
                 mask=live_l[:, None] & mp[None, :], other=0.0).to(tl.float32)
    if HAS_D:
        acc += tl.load(D + h).to(tl.float32) * xl
    tl.store(Y + (start + l)[:, None] * stride_yt + h * stride_yh + p[None, :], acc.to(Y.dtype.element_ty),
             mask=live_l[:, None] & mp[None, :])


@lazy_jit
def _ssd_decode_kernel(X, Dt, Dt_bias, A, B, C, D, State, New_state, Y, dt_lo, dt_hi, stride_xr, stride_xh,
                       stride_dtr, stride_br, stride_bg, nh, hpg, hd, ns, HAS_BIAS: tl.constexpr,
                       HAS_D: tl.constexpr, BLOCK_P: tl.constexpr, NS: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    g = h // hpg
    n = tl.arange(0, NS)
    mp = p < hd
    mn = n < ns
    raw = tl.load(Dt + r * stride_dtr + h).to(tl.float32)
    if HAS_BIAS:
        raw += tl.load(Dt_bias + h).to(tl.float32)
    step = _step_size(raw, dt_lo, dt_hi)
    decay = tl.exp(step * tl.load(A + h).to(tl.float32))
    x = tl.load(X + r * stride_xr + h * stride_xh + p, mask=mp, other=0.0).to(tl.float32)
    b = tl.load(B + r * stride_br + g * stride_bg + n, mask=mn, other=0.0).to(tl.float32)
    cc = tl.load(C + r * stride_br + g * stride_bg + n, mask=mn, other=0.0).to(tl.float32)
    rows = ((r * nh + h) * hd + p)[:, None] * ns + n[None, :]
    m2 = mp[:, None] & mn[None, :]
    state = tl.load(State + rows, mask=m2, other=0.0).to(tl.float32)
    state = state * decay + (step * x)[:, None] * b[None, :]
    y = tl.sum(state * cc[None, :], axis=1)
    if HAS_D:
        y += tl.load(D + h).to(tl.float32) * x
    tl.store(New_state + rows, state.to(New_state.dtype.element_ty), mask=m2)
    tl.store(Y + r * stride_xr + h * stride_xh + p, y.to(Y.dtype.element_ty), mask=mp)


def _chunk_table(extend_lens: Sequence[int], chunk_size: int) -> Tuple[List[int], List[int], List[int], List[int]]:
    """(first token, token count) of every chunk; each request's first chunk and chunk count."""
    starts, ntoks, first, counts = [], [], [], []
    token = 0
    for length in extend_lens:
        first.append(len(starts))
        counts.append((length + chunk_size - 1) // chunk_size)
        for lo in range(0, length, chunk_size):
            starts.append(token + lo)
            ntoks.append(min(chunk_size, length - lo))
        token += length
    return starts, ntoks, first, counts


def _limits(dt_limit) -> Tuple[float, float]:
    lo, hi = dt_limit
    return float(lo), float(hi) if hi < math.inf else 3.0e38  # a finite fp32 bound: no inf kernel argument


def ssd_extend_triton(x, dt, A, B, C, D, initial_state, has_initial_state, extend_lens, chunk_size,
                      dt_bias: Optional[torch.Tensor] = None, dt_limit=(0.0, math.inf), block: Optional[int] = None):
    """ssd_extend's contract (linear/mamba2_ssd.py). `block`: rows / source slots per chunk-scan tile (a power of
    two >= 16; default DEFAULT_BLOCK, capped at the chunk)."""
    x, dt, B, C = x.contiguous(), dt.contiguous(), B.contiguous(), C.contiguous()
    A = A.float().contiguous()
    n, nh, hd = x.shape
    ng, ns = B.shape[1], B.shape[2]
    r = initial_state.shape[0]
    dev = x.device
    starts, ntoks, first, counts = _chunk_table(extend_lens, chunk_size)
    n_chunks = len(starts)
    cs = triton.next_power_of_2(chunk_size)
    tile = max(16, min(block or DEFAULT_BLOCK, cs))
    hd_tile, ns_tile = dot_tile(hd), dot_tile(ns)
    lo, hi = _limits(dt_limit)

    def ints(values):
        return torch.tensor(values, dtype=torch.int32, device=dev)

    chunk_start, chunk_ntok = ints(starts), ints(ntoks)
    step = torch.empty(n_chunks, nh, cs, dtype=torch.float32, device=dev)
    acs = torch.empty_like(step)
    chunk_state = torch.empty(n_chunks, nh, hd, ns, dtype=torch.float32, device=dev)
    start_state = torch.empty_like(chunk_state)
    final = torch.empty_like(initial_state)
    y = torch.empty_like(x)
    bias = dt_bias.contiguous() if dt_bias is not None else A
    if n_chunks:
        _chunk_cumsum_kernel[(n_chunks, nh)](dt, bias, A, chunk_start, chunk_ntok, step, acs, lo, hi, dt.stride(0),
                                             nh, HAS_BIAS=dt_bias is not None, CS=cs)
        _chunk_state_kernel[(n_chunks, nh)](x, B, step, acs, chunk_start, chunk_ntok, chunk_state, x.stride(0),
                                            x.stride(1), B.stride(0), B.stride(1), nh, nh // ng, hd, ns, CS=cs,
                                            BLOCK_S=tile, HD=hd_tile, NS=ns_tile, num_warps=TILE_WARPS)
    state_elems = hd * ns
    has = has_initial_state.to(device=dev, dtype=torch.int32)
    _state_passing_kernel[(r, nh, triton.cdiv(state_elems, STATE_BLOCK))](
        chunk_state, acs, start_state, initial_state.contiguous(), has, final, ints(first), ints(counts), nh,
        state_elems, CS=cs, BLOCK=min(STATE_BLOCK, triton.next_power_of_2(state_elems)))
    if n_chunks:
        _chunk_scan_kernel[(n_chunks, nh, triton.cdiv(cs, tile))](
            x, B, C, D if D is not None else A, step, acs, start_state, chunk_start, chunk_ntok, y, x.stride(0),
            x.stride(1), B.stride(0), B.stride(1), y.stride(0), y.stride(1), nh, nh // ng, hd, ns,
            HAS_D=D is not None, CS=cs, BLOCK_L=tile, BLOCK_S=tile, HD=hd_tile, NS=ns_tile, num_warps=TILE_WARPS)
    return y, final


def ssd_decode_triton(x, dt, A, B, C, D, state, dt_bias: Optional[torch.Tensor] = None, dt_limit=(0.0, math.inf)):
    """ssd_decode's contract (linear/mamba2_ssd.py): one program per (request, head, block of head-dim rows)."""
    x, dt, B, C, state = x.contiguous(), dt.contiguous(), B.contiguous(), C.contiguous(), state.contiguous()
    A = A.float().contiguous()
    r, nh, hd = x.shape
    ng, ns = B.shape[1], B.shape[2]
    lo, hi = _limits(dt_limit)
    block_p = min(triton.next_power_of_2(hd), 16)
    new_state = torch.empty_like(state)
    y = torch.empty_like(x)
    _ssd_decode_kernel[(r, nh, triton.cdiv(hd, block_p))](
        x, dt, dt_bias.contiguous() if dt_bias is not None else A, A, B, C, D if D is not None else A, state,
        new_state, y, lo, hi, x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), nh, nh // ng, hd, ns,
        HAS_BIAS=dt_bias is not None, HAS_D=D is not None, BLOCK_P=block_p, NS=triton.next_power_of_2(ns))
    return y, new_state
