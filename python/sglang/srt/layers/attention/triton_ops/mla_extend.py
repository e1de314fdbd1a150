"""Extend (prefill) attention over MLA latent rows: the general extend kernel (extend_attention.py) with one KV head
of width LORA + ROPE and V = the first LORA columns of the same rows.

The kernel reads K and V through their own strides, so V needs no storage of its own: for the cached prefix it gets
the pool's rows and the view rows[..., :LORA] (stride LORA + ROPE per token), for the new tokens this forward's rows
k and k[..., :LORA]. Every query head shares the one KV head (GROUP = H), so each key block is read once per query
block for all heads. The query arrives absorbed ([q_nope @ W_UK | q_pe]) and the output is latent ([N, H, LORA]).
"""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.triton_ops.kv_formats import plain_operands
from sglang.srt.layers.attention.triton_ops.tiles import AttentionTiles


def mla_extend_fwd(
    q: torch.Tensor, k_rows: torch.Tensor, o: torch.Tensor, kv_rows: torch.Tensor, req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor, qo_start: torch.Tensor, extend_lens: torch.Tensor, prefix_lens: torch.Tensor,
    max_extend_len: int, sm_scale: float, tiles: AttentionTiles | None = None,
) -> torch.Tensor:
    """q [N, H, LORA + ROPE] (absorbed), k_rows [N, 1, LORA + ROPE] the new tokens' latent rows, o [N, H, LORA]
    (written; LORA = o.shape[2]), kv_rows [S, 1, LORA + ROPE] one layer of the latent pool; the rest as
    extend_attention_fwd. New token i of request b attends to its prefix_lens[b] cached rows and, causally, to the new
    rows j <= i."""
    lora = o.shape[2]
    assert k_rows.shape[1] == 1 and kv_rows.shape[1] == 1, "MLA: one latent KV head"
    assert q.shape[2] == k_rows.shape[2] == kv_rows.shape[2] > lora, (tuple(q.shape), tuple(kv_rows.shape), lora)
    return extend_attention_fwd(
        q, k_rows, k_rows[..., :lora], o, None, None, req_to_token, req_pool_indices, qo_start, extend_lens,
        prefix_lens, max_extend_len, sm_scale, tiles=tiles, kv=plain_operands(kv_rows, kv_rows[..., :lora]))
