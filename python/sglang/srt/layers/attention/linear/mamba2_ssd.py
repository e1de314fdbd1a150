"""Mamba-2 selective state-space scan (SSD): chunked prefill over a varlen batch, and the one-token decode step.

The recurrence, per request, head h (group g = h // (nh / ng) supplies B and C), token t:
    dt_t    = clamp(softplus(dt_raw_t + dt_bias), *dt_limit)          (dt is passed RAW; the op applies all three)
    S_t     = S_{t-1} * exp(dt_t * A) + dt_t * x_t (outer) B_t        S: [hd, Ns], x_t: [hd], B_t: [Ns]
    y_t     = S_t . C_t + D * x_t
S_{-1} is the request's initial_state when has_initial_state, else zero. This is transformers' NemotronHMamba2Mixer
chunk path (mamba2_chunk_scan with dt_softplus and dt_limit). Its one-token cache path (selective_state_update)
does not clamp dt; here decode clamps too, so a decode step equals a one-token extend. A caller that wants the
unclamped step passes dt_limit=(0.0, inf).

The chunked (SSD) form computes the same numbers in parallel: tokens of each request are cut into chunks of
chunk_size that start at the request's first token (a chunk never spans two requests); inside a chunk the output is a
masked quadratic form (like causal attention with decay weights exp(sum of dt*A between the two tokens)), and across
chunks only the [nh, hd, Ns] state is passed, one step per chunk. Padding tokens at a chunk's tail get dt = 0: they
neither decay nor feed the state, so a chunk's end state is the state after its last real token.

All math is fp32 whatever the input dtypes; y comes back in x.dtype and the state in initial_state's dtype (the pool's
SSM dtype: float32 unless the checkpoint names another). Inputs are never written in place.

Dispatch: on a CUDA / ROCm device the Triton kernels (layers/attention/triton_ops/mamba2_ssd.py), elsewhere torch.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

NO_DT_LIMIT = (0.0, math.inf)


def discretize_dt(dt: torch.Tensor, dt_bias: Optional[torch.Tensor], dt_limit: Tuple[float, float]) -> torch.Tensor:
    """Raw dt [..., nh] -> the step size in fp32: softplus(dt + dt_bias) clamped to dt_limit."""
    step = dt.float()
    if dt_bias is not None:
        step = step + dt_bias.float()
    step = F.softplus(step)
    lo, hi = dt_limit
    if lo > 0.0 or hi < math.inf:
        step = step.clamp(min=lo, max=hi)
    return step


def _uses_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda"  # ROCm builds of torch report "cuda" too


def ssd_extend(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: Optional[torch.Tensor],
    initial_state: torch.Tensor,
    has_initial_state: torch.Tensor,
    extend_lens: Sequence[int],
    chunk_size: int,
    dt_bias: Optional[torch.Tensor] = None,
    dt_limit: Tuple[float, float] = NO_DT_LIMIT,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """x [N, nh, hd], dt [N, nh] raw, A [nh] (= -exp(A_log)), B / C [N, ng, Ns], D [nh] or None,
    initial_state [R, nh, hd, Ns], has_initial_state [R] bool, extend_lens (R ints summing to N), chunk_size > 0.
    Returns (y [N, nh, hd] in x.dtype, final_state [R, nh, hd, Ns] in initial_state.dtype)."""
    _check_shapes(x, dt, A, B, C, D, initial_state)
    if len(extend_lens) != initial_state.shape[0] or sum(extend_lens) != x.shape[0]:
        raise ValueError(
            f"extend_lens {list(extend_lens)} must have one entry per initial_state row "
            f"({initial_state.shape[0]}) and sum to the token count {x.shape[0]}"
        )
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if _uses_triton(x):
        from sglang.srt.layers.attention.triton_ops.mamba2_ssd import ssd_extend_triton

        return ssd_extend_triton(
            x, dt, A, B, C, D, initial_state, has_initial_state, extend_lens, chunk_size, dt_bias, dt_limit
        )
    return ssd_extend_torch(
        x, dt, A, B, C, D, initial_state, has_initial_state, extend_lens, chunk_size, dt_bias, dt_limit
    )


def ssd_decode(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: Optional[torch.Tensor],
    state: torch.Tensor,
    dt_bias: Optional[torch.Tensor] = None,
    dt_limit: Tuple[float, float] = NO_DT_LIMIT,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """One recurrent step per request: x [R, nh, hd], dt [R, nh] raw, B / C [R, ng, Ns], state [R, nh, hd, Ns].
    Returns (y [R, nh, hd] in x.dtype, new_state in state.dtype); `state` itself is not modified."""
    _check_shapes(x, dt, A, B, C, D, state)
    if state.shape[0] != x.shape[0]:
        raise ValueError(f"decode takes one token per state row: x has {x.shape[0]} rows, state {state.shape[0]}")
    if _uses_triton(x):
        from sglang.srt.layers.attention.triton_ops.mamba2_ssd import ssd_decode_triton

        return ssd_decode_triton(x, dt, A, B, C, D, state, dt_bias, dt_limit)
    return ssd_decode_torch(x, dt, A, B, C, D, state, dt_bias, dt_limit)


def _check_shapes(x, dt, A, B, C, D, state) -> None:
    n, nh, hd = x.shape
    ng, ns = B.shape[1], B.shape[2]
    if nh % ng != 0:
        raise ValueError(f"{nh} heads cannot share {ng} B/C groups evenly")
    want = {"dt": (dt.shape, (n, nh)), "A": (A.shape, (nh,)), "B": (B.shape, (n, ng, ns)),
            "C": (C.shape, (n, ng, ns)), "state": (state.shape[1:], (nh, hd, ns))}
    if D is not None:
        want["D"] = (D.shape, (nh,))
    for name, (got, expected) in want.items():
        if tuple(got) != tuple(expected):
            raise ValueError(f"{name} has shape {tuple(got)}, expected {tuple(expected)}")


def ssd_decode_torch(x, dt, A, B, C, D, state, dt_bias=None, dt_limit=NO_DT_LIMIT):
    nh, ng = x.shape[1], B.shape[1]
    step = discretize_dt(dt, dt_bias, dt_limit)  # [R, nh]
    xf = x.float()
    Bh = B.float().repeat_interleave(nh // ng, dim=1)  # [R, nh, Ns]
    Ch = C.float().repeat_interleave(nh // ng, dim=1)
    decay = torch.exp(step * A.float())  # [R, nh]
    # two passes over the state (the input outer product, then + state * decay in place), one more for y
    new = (step[:, :, None] * xf)[..., None] * Bh[:, :, None, :]
    new.addcmul_(state.float(), decay[:, :, None, None])
    y = torch.matmul(new, Ch[..., None]).squeeze(-1)
    if D is not None:
        y = y + D.float()[None, :, None] * xf
    return y.to(x.dtype), new.to(state.dtype)


def _chunk_layout(extend_lens: Sequence[int], chunk_size: int, device):
    """Token index of every (chunk, position) slot, N for padding; each request's first chunk; its chunk count."""
    n_chunks = [(length + chunk_size - 1) // chunk_size for length in extend_lens]
    total = sum(extend_lens)
    rows = []
    start = 0
    for length, count in zip(extend_lens, n_chunks):
        slots = torch.full((count * chunk_size,), total, dtype=torch.long)
        slots[:length] = torch.arange(start, start + length)
        rows.append(slots.view(count, chunk_size))
        start += length
    token_of_slot = torch.cat(rows) if rows else torch.empty((0, chunk_size), dtype=torch.long)
    first_chunk = [0]
    for count in n_chunks[:-1]:
        first_chunk.append(first_chunk[-1] + count)
    return token_of_slot.to(device), first_chunk, n_chunks


# Elements of one [chunks, nh, chunk, chunk] decay-weight block: the intra-chunk part runs over blocks of chunks this
# size at most, so a long prefill's temporaries stay ~64 MiB per tensor instead of growing with the token count.
INTRA_BLOCK_ELEMS = 1 << 24


def _intra_chunk(xdt, a, Bc, Cc, hpg):
    """One block of chunks, each from a zero start state: xdt [T, cs, nh, hd] (dt x), a [T, nh, cs] (dt A), Bc / Cc
    [T, cs, ng, Ns] -> (y [T, cs, nh, hd], end state [T, nh, hd, Ns])."""
    t, cs, nh, hd = xdt.shape
    ng = Bc.shape[2]
    dev = xdt.device
    # seg[t, h, l, s] = sum of a over (s, l]: the log decay from token s's write to token l's read (l >= s). Summed
    # from masked terms rather than as cumsum[l] - cumsum[s], which cancels badly when the cumsum is large.
    above = torch.tril(torch.ones(cs, cs, dtype=torch.bool, device=dev), diagonal=-1)
    seg = a[..., :, None].expand(t, nh, cs, cs).masked_fill(~above, 0.0).cumsum(dim=-2)
    causal = torch.tril(torch.ones(cs, cs, dtype=torch.bool, device=dev))
    weight = torch.exp(seg.masked_fill(~causal, -math.inf)).view(t, ng, hpg, cs, cs)  # [T, g, q, l, s]
    scores = torch.einsum("tlgn,tsgn->tgls", Cc, Bc)
    xdt_g = xdt.view(t, cs, ng, hpg, hd)
    y = torch.einsum("tgqls,tsgqp->tlgqp", weight * scores[:, :, None], xdt_g).reshape(t, cs, nh, hd)
    # decay from each slot s to the chunk's last slot (padding slots have a = 0, so the last slot is the last token's)
    to_end = weight[:, :, :, -1, :].permute(0, 3, 1, 2)  # [T, s, g, q]
    # two-operand einsums only: torch contracts a three-operand one left to right, through an outer product
    end_state = torch.einsum("tsgn,tsgqp->tgqpn", Bc, xdt_g * to_end[..., None])
    return y, end_state.reshape(t, nh, hd, Bc.shape[3])


def ssd_extend_torch(x, dt, A, B, C, D, initial_state, has_initial_state, extend_lens, chunk_size,
                     dt_bias=None, dt_limit=NO_DT_LIMIT):
    n, nh, hd = x.shape
    ng, ns = B.shape[1], B.shape[2]
    hpg = nh // ng
    dev = x.device
    token_of_slot, first_chunk, n_chunks = _chunk_layout(extend_lens, chunk_size, dev)
    n_chunk_total, cs = token_of_slot.shape

    step = discretize_dt(dt, dt_bias, dt_limit)  # [N, nh]

    def gather(t: torch.Tensor) -> torch.Tensor:  # [N, ...] -> [T, cs, ...], zero rows at padding
        padded = torch.cat([t.float(), t.new_zeros((1,) + t.shape[1:], dtype=torch.float32)])
        return padded[token_of_slot]

    stepc = gather(step)  # [T, cs, nh]; 0 at padding
    xdt = gather(x) * stepc[..., None]  # [T, cs, nh, hd]
    Bc = gather(B)  # [T, cs, ng, Ns]
    Cc = gather(C)
    a = (stepc * A.float()).permute(0, 2, 1).contiguous()  # [T, nh, cs], log decay per token (<= 0)

    y = torch.empty(n_chunk_total, cs, nh, hd, dtype=torch.float32, device=dev)
    chunk_state = torch.empty(n_chunk_total, nh, hd, ns, dtype=torch.float32, device=dev)
    block = max(1, INTRA_BLOCK_ELEMS // (nh * cs * cs))
    for lo in range(0, n_chunk_total, block):
        hi = min(lo + block, n_chunk_total)
        y[lo:hi], chunk_state[lo:hi] = _intra_chunk(xdt[lo:hi], a[lo:hi], Bc[lo:hi], Cc[lo:hi], hpg)
    chunk_decay = torch.exp(a.sum(dim=-1))  # [T, nh]

    # Pass the state chunk to chunk, all requests at once, one step per chunk index.
    keep = has_initial_state.to(device=dev, dtype=torch.bool)[:, None, None, None]
    state = torch.where(keep, initial_state.float(), torch.zeros((), dtype=torch.float32, device=dev))
    start_state = torch.empty(n_chunk_total, nh, hd, ns, dtype=torch.float32, device=dev)
    first = torch.tensor(first_chunk, dtype=torch.long, device=dev)
    counts = torch.tensor(n_chunks, dtype=torch.long, device=dev)
    for j in range(max(n_chunks, default=0)):
        live = torch.nonzero(counts > j).flatten()
        idx = first[live] + j
        start_state[idx] = state[live]
        state[live] = state[live] * chunk_decay[idx][:, :, None, None] + chunk_state[idx]

    # The chunk's start state, read at slot l after the decay of slots 0..l.
    from_start = torch.exp(torch.cumsum(a, dim=-1)).permute(0, 2, 1)  # [T, l, nh]
    read = torch.einsum("tlgn,tgqpn->tlgqp", Cc, start_state.view(n_chunk_total, ng, hpg, hd, ns))
    y += read.reshape(n_chunk_total, cs, nh, hd) * from_start[..., None]

    valid = token_of_slot.flatten() < n
    out = torch.empty(n, nh, hd, dtype=torch.float32, device=dev)
    out[token_of_slot.flatten()[valid]] = y.reshape(-1, nh, hd)[valid]
    if D is not None:
        out = out + D.float()[None, :, None] * x.float()
    return out.to(x.dtype), state.to(initial_state.dtype)
