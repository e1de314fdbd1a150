"""The KV pool of a model with windowed (sliding / chunked) layers: their K/V apart from the full layers'.

Two shapes (mem_plan/layer_pools.py):
  * full + windowed layers (Gemma 3, gpt-oss): a full pool over the full layers (T tokens), a windowed pool over the
    windowed layers (T_w tokens, T_w <= T), and slot_map, int32 [kv_pool_rows(T)]: token-pool slot -> windowed slot.
    The map is page-parallel (token slot p*P + o <-> windowed q*P + o), set and cleared by the allocator
    (swa_allocator.py); a token position whose windowed page is not held maps to 0, the windowed dummy page
    (zeros: finite, so a masked read of it never turns into NaN).
  * windowed layers only (Mistral): the windowed pool is the token pool; there is no map (windowed_slots is the
    identity) and no full pool.
req_to_token and out_cache_loc always hold token-pool slots: set_kv_buffer and gather_kv translate them for a windowed
layer; get_key_buffer / get_value_buffer of a windowed layer return its windowed buffer, which a backend indexes with
windowed_slots(token slots).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from sglang.srt.mem_cache.memory_pool import KVCache, MHATokenToKVPool
from sglang.srt.mem_plan.sizes import kv_pool_rows

WINDOWED_MAP_DTYPE = torch.int32  # the plan charges 4 B per map entry (layer_pools.WINDOWED_MAP_ENTRY_BYTES)


class SWAKVPool(KVCache):
    def __init__(self, windowed_layers: Sequence[bool], size: int, windowed_size: int, page_size: int,
                 dtype: torch.dtype, head_num: int, head_dim: int, device: str = "cpu",
                 v_head_dim: Optional[int] = None):
        """windowed_layers[i]: layer i keeps its K/V in the windowed pool. With no full layer the windowed pool is the
        token pool and windowed_size must equal size."""
        self.windowed = tuple(bool(w) for w in windowed_layers)
        if not any(self.windowed):
            raise ValueError("SWAKVPool needs at least one windowed layer; an all-full model uses MHATokenToKVPool")
        self.layer_num = len(self.windowed)
        self.size, self.windowed_size, self.page_size = size, windowed_size, page_size
        self.dtype, self.device = dtype, device
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_head_dim or head_dim
        self.windowed_only = all(self.windowed)
        if self.windowed_only and windowed_size != size:
            raise ValueError(f"without full layers the windowed pool is the token pool: {windowed_size} != {size}")
        if windowed_size > size:
            raise ValueError(f"the windowed pool ({windowed_size} tokens) is larger than the token pool ({size})")
        # layer id -> its index in the pool that holds it
        self._local = []
        counts = [0, 0]  # full, windowed
        for w in self.windowed:
            self._local.append(counts[w])
            counts[w] += 1

        def pool(n_layers: int, n_tokens: int) -> MHATokenToKVPool:
            return MHATokenToKVPool(n_tokens, page_size, dtype, head_num, head_dim, n_layers, device, v_head_dim)

        self.full_pool = pool(counts[0], size) if counts[0] else None
        self.windowed_pool = pool(counts[1], windowed_size)
        self.store_dtype = self.windowed_pool.store_dtype
        self.slot_map: Optional[torch.Tensor] = None
        if not self.windowed_only:
            self.slot_map = torch.zeros(kv_pool_rows(size, page_size), dtype=WINDOWED_MAP_DTYPE, device=device)

    # ------------------------------------------------------------------ sizes (by plan term)
    def mem_usage_bytes(self) -> int:
        """The kv_cache term: the full pool (0 without full layers)."""
        return self.full_pool.mem_usage_bytes() if self.full_pool is not None else 0

    def windowed_mem_usage_bytes(self) -> int:
        """The kv_windowed term: the windowed pool, its dummy page included."""
        return self.windowed_pool.mem_usage_bytes()

    def map_mem_usage_bytes(self) -> int:
        """The kv_windowed_map term."""
        return self.slot_map.numel() * self.slot_map.element_size() if self.slot_map is not None else 0

    # ------------------------------------------------------------------ the windowed-layer contract
    def is_windowed_layer(self, layer_id: int) -> bool:
        return self.windowed[layer_id]

    def windowed_slots(self, slots: torch.Tensor) -> torch.Tensor:
        if self.slot_map is None:
            return slots
        return self.slot_map[slots].to(torch.int64)

    def _pool_of(self, layer_id: int):
        return (self.windowed_pool if self.windowed[layer_id] else self.full_pool), self._local[layer_id]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local = self._pool_of(layer_id)
        return pool.get_key_buffer(local)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, local = self._pool_of(layer_id)
        return pool.get_value_buffer(local)

    def _own_slots(self, layer_id: int, slots: torch.Tensor) -> torch.Tensor:
        return self.windowed_slots(slots) if self.windowed[layer_id] else slots

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """loc: token-pool slots (out_cache_loc). A windowed layer's token whose windowed page is not held would
        land on the dummy page; the allocator holds a windowed page for every token it hands out, so none does."""
        pool, local = self._pool_of(layer_id)
        pool.set_kv_buffer(local, self._own_slots(layer_id, loc), k, v)

    def rotation(self, part: str) -> Optional[torch.Tensor]:
        return None

    def gather_kv(self, layer_id: int, index: torch.Tensor, dtype: torch.dtype, rotated: bool = False):
        pool, local = self._pool_of(layer_id)
        return pool.gather_kv(local, self._own_slots(layer_id, index), dtype, rotated)

    def zero_(self) -> None:
        """Back every page now (a scratch pool before a measured forward: its K/V belong to the pool terms)."""
        for p in (self.full_pool, self.windowed_pool):
            if p is not None:
                p.k_buffer.zero_()
                p.v_buffer.zero_()
