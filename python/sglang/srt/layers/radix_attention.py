"""RadixAttention: the attention layer of a model; the math lives in forward_batch.attn_backend.

What a backend must honour beyond plain causal attention (HF transformers' semantics):
  sliding_window_size  W > 0: the query at position p attends to keys p - W + 1 .. p only (W keys with itself);
                       -1: every earlier key. A windowed layer's K/V may live in the KV pool's windowed pool
                       (pool.is_windowed_layer(layer_id)); positions before p - W + 1 may then be freed.
  sinks                None, or fp32 [tp_q_head_num]: one learned logit per query head that joins each softmax's
                       denominator and attends to no value (gpt-oss): out = sum_j e^{s_j} v_j / (e^{sink} + sum_j e^{s_j}).
  logit_cap            > 0: scores pass through cap * tanh(score / cap) before the softmax (Gemma 2); 0: none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int, layer_id: int, v_head_dim: int = -1,
                 sliding_window_size: int = -1, sinks: "torch.Tensor | None" = None, logit_cap: float = 0.0):
        super().__init__()
        if sliding_window_size == 0 or sliding_window_size < -1:
            raise ValueError(f"sliding_window_size must be -1 (none) or a positive token count, got {sliding_window_size}")
        self.sliding_window_size = sliding_window_size
        self.sinks = sinks  # the model's parameter (loaded into in place), read by the backend at each forward
        self.logit_cap = logit_cap
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.tp_v_head_num = num_kv_heads
        self.head_dim = head_dim
        self.qk_head_dim = head_dim
        self.v_head_dim = v_head_dim if v_head_dim != -1 else head_dim
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: "ForwardBatch", save_kv_cache: bool = True
    ) -> torch.Tensor:
        # q: [N, H * D] or [N, H, D]; k, v: [N, KV * D] or [N, KV, D]  ->  [N, H * Dv]
        q = q.view(-1, self.tp_q_head_num, self.qk_head_dim)
        k = k.view(-1, self.tp_k_head_num, self.qk_head_dim)
        v = v.view(-1, self.tp_v_head_num, self.v_head_dim)
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache=save_kv_cache)
