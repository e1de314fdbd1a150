"""AttentionBackend: the interface every attention kernel backend implements.

Per forward, the model runner calls `init_forward_metadata(forward_batch)` once (index tensors, masks, kernel
plans shared by all layers); then each RadixAttention layer calls `forward(q, k, v, layer, forward_batch)`.
Tensors: q [N, H, D], k/v [N, KV, D] (new tokens only); output [N, H * Dv].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class AttentionBackend:
    def __init__(
        self,
        *,
        model_config: Any,
        req_to_token_pool: "ReqToTokenPool",
        token_to_kv_pool: "KVCache",
        device: str,
    ):
        self.model_config = model_config
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool = token_to_kv_pool
        self.device = device

    def init_forward_metadata(self, forward_batch: "ForwardBatch") -> None:
        raise NotImplementedError

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: "RadixAttention",
        forward_batch: "ForwardBatch",
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if forward_batch.forward_mode.is_decode():
            return self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)
        return self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        raise NotImplementedError
