"""The gated delta rule (Qwen3-Next's Gated DeltaNet), varlen over requests, with per-request initial states.

Per head, with the state S [dk, dv] (S[k, v], HF transformers' layout) and, for each token t,
    q_t, k_t <- l2norm(q_t), l2norm(k_t)  (when use_qk_l2norm: x * rsqrt(sum x^2 + 1e-6)), q_t <- scale * q_t
    S <- exp(g_t) * S                              (g_t <= 0: the per-head log decay)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T        (the delta rule: write only what S does not yet predict)
    o_t = S^T q_t
Heads: v, g, beta carry H heads; q and k carry H or Hk heads with H % Hk == 0, query/key head j serving the H / Hk
consecutive value heads j * H / Hk ... (HF's grouping); they are repeated here when Hk < H.

Extend uses the chunked form: inside a chunk of C tokens the deltas u = beta (v - S_{t-1}^T k) solve one unit
lower-triangular system (I + L) u = beta v - (beta exp(gc) k) S0, L[t, j] = beta_t exp(gc_t - gc_j) k_t.k_j for
j < t (gc: the in-chunk cumulative log decay, S0: the state entering the chunk), so only the hand-over from chunk to
chunk is sequential. Every exponent is gc_t - gc_j with j <= t, or gc_t alone: <= 0, no overflow. Requests are padded
to whole chunks with tokens of g = 0, beta = 0, k = v = 0 (they leave S unchanged); all chunks of all requests go
through the in-chunk phase together and the hand-over steps over chunk index, batched over the requests that still
have one. Decode is one recurrent step. fp32 inside; o in v's dtype, states fp32.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

L2NORM_EPS = 1e-6


def _uses_triton(x: torch.Tensor) -> bool:
    return x.device.type == "cuda"  # torch names ROCm devices "cuda" too


def gated_delta_rule_extend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                            initial_state: torch.Tensor, has_initial_state: torch.Tensor, extend_lens: List[int],
                            scale: float, use_qk_l2norm: bool, chunk_size: int = 64
                            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """q, k [N, H or Hk, dk], v [N, H, dv], g, beta [N, H], initial_state [B, H, dk, dv] fp32, has_initial_state [B]
    bool, extend_lens (B, summing to N) -> (o [N, H, dv] in v.dtype, final_state [B, H, dk, dv] fp32)."""
    if _uses_triton(v):
        from sglang.srt.layers.attention.triton_ops.gated_delta_rule import gated_delta_rule_extend_triton
        qk_group(q, k, v.shape[-2])  # the kernel assumes it
        return gated_delta_rule_extend_triton(q, k, v, g, beta, initial_state, has_initial_state, extend_lens, scale,
                                              use_qk_l2norm, chunk_size)
    return gated_delta_rule_extend_torch(q, k, v, g, beta, initial_state, has_initial_state, extend_lens, scale,
                                         use_qk_l2norm, chunk_size)


def gated_delta_rule_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                            state: torch.Tensor, scale: float, use_qk_l2norm: bool
                            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """One token per request: q, k [B, H or Hk, dk], v [B, H, dv], g, beta [B, H], state [B, H, dk, dv] fp32 ->
    (o [B, H, dv] in v.dtype, new_state [B, H, dk, dv] fp32)."""
    if _uses_triton(v):
        from sglang.srt.layers.attention.triton_ops.gated_delta_rule import gated_delta_rule_decode_triton
        qk_group(q, k, v.shape[-2])  # the kernel assumes it
        return gated_delta_rule_decode_triton(q, k, v, g, beta, state, scale, use_qk_l2norm)
    return gated_delta_rule_decode_torch(q, k, v, g, beta, state, scale, use_qk_l2norm)


def decode_in_pool(pool_state: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether gated_delta_rule_decode_pool_ serves this decode (CPU tensors, fp32 state pool)."""
    return v.device.type == "cpu" and pool_state.dtype == torch.float32


def gated_delta_rule_decode_pool_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                  beta: torch.Tensor, pool_state: torch.Tensor, rows: List[int], scale: float,
                                  use_qk_l2norm: bool) -> torch.Tensor:
    """gated_delta_rule_decode with each request's state updated in place in its pool row (pool_state
    [rows_total, H, dk, dv] fp32, request b's row rows[b]): o [B, H, dv] in v.dtype. On a CPU the batch's states are
    not gathered into a new [B, H, dk, dv] tensor and scattered back (at B 32, H 16, 128 x 128 that is 32 MB written
    twice per layer into freshly faulted pages); each row is read once for S^T q and S^T k and updated once. The same
    operations as gated_delta_rule_decode_torch, so the same bits. CPU tensors and an fp32 pool only
    (decode_in_pool says when); a GPU decode gathers its rows by index (CUDA graphs capture no host row list)."""
    if not decode_in_pool(pool_state, v):
        raise ValueError("gated_delta_rule_decode_pool_ takes CPU tensors and an fp32 state pool")
    batch, n_heads, dv = v.shape
    q, k = prepare_qk(q, k, n_heads, scale, use_qk_l2norm)
    decay = torch.exp(g.float())  # [B, H]
    qk = torch.stack([q, k], dim=-2)  # [B, H, 2, dk]
    vf, bf = v.float(), beta.float()
    qdotk = (q * k).sum(-1)  # [B, H]
    o = torch.empty(batch, n_heads, dv, dtype=torch.float32, device=v.device)
    for b, row in enumerate(rows):
        s = pool_state[row]  # [H, dk, dv], a view of the pool
        read = torch.bmm(qk[b], s)  # [H, 2, dv]: S^T q, S^T k
        a = decay[b].unsqueeze(-1)
        delta = (vf[b] - a * read[:, 1]) * bf[b].unsqueeze(-1)
        torch.add(a * read[:, 0], qdotk[b].unsqueeze(-1) * delta, out=o[b])
        s.mul_(a.unsqueeze(-1)).baddbmm_(k[b].unsqueeze(-1), delta.unsqueeze(-2))
    return o.to(v.dtype)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def qk_group(q: torch.Tensor, k: torch.Tensor, n_heads: int) -> int:
    """How many value heads each query / key head serves; ValueError when the head counts do not fit."""
    if n_heads % q.shape[-2] or q.shape[-2] != k.shape[-2]:
        raise ValueError(f"gated delta rule: q / k heads ({q.shape[-2]}, {k.shape[-2]}) must be equal and divide "
                         f"the value heads ({n_heads})")
    return n_heads // q.shape[-2]


def prepare_qk(q: torch.Tensor, k: torch.Tensor, n_heads: int, scale: float, use_qk_l2norm: bool
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp32 q, k with H heads, normalized when asked, q scaled."""
    group = qk_group(q, k, n_heads)
    q, k = q.float(), k.float()
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    if group > 1:
        q, k = q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)
    return q * scale, k


def gated_delta_rule_decode_torch(q, k, v, g, beta, state, scale, use_qk_l2norm):
    """One step, written against the old state S so it is read once for both products (the step is memory-bound:
    S is [B, H, dk, dv] fp32): with a = exp(g), [q; k]^T S gives S^T k and S^T q; then
    delta = beta (v - a S^T k), o = a S^T q + (q . k) delta, S' = a S + k delta^T (2.7x fewer CPU seconds than
    forming a S first at B 32, H 16, dk = dv = 128)."""
    batch, n_heads, dv = v.shape
    q, k = prepare_qk(q, k, n_heads, scale, use_qk_l2norm)
    dk = q.shape[-1]
    rows = batch * n_heads
    s = state.float().reshape(rows, dk, dv)
    decay = torch.exp(g.float()).reshape(rows, 1)
    read = torch.bmm(torch.stack([q, k], dim=-2).reshape(rows, 2, dk), s)  # [rows, 2, dv]: S^T q, S^T k
    delta = (v.float().reshape(rows, dv) - decay * read[:, 1]) * beta.float().reshape(rows, 1)
    o = decay * read[:, 0] + (q * k).sum(-1).reshape(rows, 1) * delta
    new_state = (s * decay[:, :, None]).baddbmm_(k.reshape(rows, dk, 1), delta[:, None, :])
    return o.reshape(batch, n_heads, dv).to(v.dtype), new_state.reshape(batch, n_heads, dk, dv)


def _chunk_layout(extend_lens: List[int], chunk: int, device):
    """The padded layout [n_chunks_total * chunk] of the tokens, step-major: with requests ranked by descending chunk
    count, those still running at hand-over step i are a prefix of the ranking, and their i-th chunks sit at the
    contiguous positions step_start[i] + rank, so each step works on slices, not gathers.
    Returns (rank order of the requests, chunks per step, step_start, dest [N] token -> padded position)."""
    lens = torch.tensor(extend_lens, dtype=torch.long)
    n_chunks = (lens + chunk - 1) // chunk
    order = sorted(range(len(extend_lens)), key=lambda b: -int(n_chunks[b]))
    rank = torch.empty(len(extend_lens), dtype=torch.long)
    rank[order] = torch.arange(len(extend_lens))
    n_steps = int(n_chunks.max()) if len(extend_lens) else 0
    per_step = [(n_chunks > i).sum().item() for i in range(n_steps)]
    step_start = torch.tensor([0, *per_step], dtype=torch.long).cumsum(0)
    tok_req = torch.repeat_interleave(torch.arange(len(extend_lens)), lens)
    tok_in_req = torch.arange(int(lens.sum())) - (torch.cumsum(lens, 0) - lens)[tok_req]
    chunk_pos = step_start[tok_in_req // chunk] + rank[tok_req]
    dest = chunk_pos * chunk + tok_in_req % chunk
    return order, per_step, step_start.tolist(), dest.to(device)


def gated_delta_rule_extend_torch(q, k, v, g, beta, initial_state, has_initial_state, extend_lens, scale,
                                  use_qk_l2norm, chunk_size=64):
    n_tokens, n_heads, dv = v.shape
    batch, c = len(extend_lens), chunk_size
    assert sum(extend_lens) == n_tokens, (extend_lens, n_tokens)
    dk = q.shape[-1]
    device = v.device
    q, k = prepare_qk(q, k, n_heads, scale, use_qk_l2norm)
    order, per_step, step_start, dest = _chunk_layout(extend_lens, c, device)
    total = step_start[-1]

    def padded(x, width):  # [N, H, width] -> [total, H, C, width], padding rows zero
        out = x.new_zeros(total * c, n_heads, width, dtype=torch.float32)
        out[dest] = x.float().reshape(n_tokens, n_heads, width)
        return out.view(total, c, n_heads, width).transpose(1, 2).contiguous()

    qc, kc, vc = padded(q, dk), padded(k, dk), padded(v, dv)
    gc = padded(g.unsqueeze(-1), 1).squeeze(-1).cumsum(-1)  # [total, H, C]
    bc = padded(beta.unsqueeze(-1), 1)  # [total, H, C, 1]

    causal = torch.ones(c, c, dtype=torch.bool, device=device).tril()
    decay = torch.exp((gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf")))  # [.., t, j]
    kb = kc * bc
    lower = (kb @ kc.transpose(-1, -2)) * decay  # only its strict lower triangle is read (unitriangular solve)
    eye = torch.eye(c, dtype=torch.float32, device=device).expand_as(lower)
    inverse = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)  # (I + L)^-1
    u = inverse @ (vc * bc)
    w = inverse @ (kb * torch.exp(gc)[..., None])  # delta = u - w @ S0
    attn = (qc @ kc.transpose(-1, -2)) * decay  # diagonal included: o_t reads its own update
    q_decayed = qc * torch.exp(gc)[..., None]
    k_tail = (kc * torch.exp(gc[..., -1:] - gc)[..., None]).transpose(-1, -2)  # decayed to the chunk's end
    chunk_decay = torch.exp(gc[..., -1])[..., None, None]

    # where, not a product: a stale row may hold anything (inf * 0 is nan); rows in rank order from here
    rows = torch.tensor(order, dtype=torch.long, device=device)
    has = has_initial_state.to(device=device, dtype=torch.bool)[rows].view(batch, 1, 1, 1)
    state = torch.where(has, initial_state.float()[rows], 0.0)
    out = torch.empty(total, n_heads, c, dv, dtype=torch.float32, device=device)
    for i, n_active in enumerate(per_step):
        ids = slice(step_start[i], step_start[i] + n_active)
        s0 = state[:n_active]
        delta = u[ids] - w[ids] @ s0
        out[ids] = q_decayed[ids] @ s0 + attn[ids] @ delta
        state[:n_active] = s0 * chunk_decay[ids] + k_tail[ids] @ delta
    o = out.transpose(1, 2).reshape(total * c, n_heads, dv)[dest]
    final = torch.empty_like(state)
    final[rows] = state
    return o.to(v.dtype), final
