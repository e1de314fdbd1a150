"""MLATokenToKVPool: the latent KV pool of a multi-head latent attention model (DeepSeek V2 / V3, Kimi-K2).

One row per token and layer, never decompressed here:
    row = [ c_kv (kv_lora_rank, after kv_a_layernorm) | k_pe (qk_rope_head_dim, after RoPE) ]   width L
kv_buffer: [layer_num, size + page_size, 1, L]; slots [0, page_size) are the dummy page (zeroed, never handed out),
as in MHATokenToKVPool. The attention layers read it as MQA with one KV head of width L: K is the whole row and V
the row's first kv_lora_rank columns, a view of the same storage (get_value_buffer), so nothing is stored twice.
Bytes = layer_num x (size + page_size) x L x dtype bytes == the plan's kv_cache term (specs.KVCellSpec, MLA cell);
under TP every rank holds every token's full row (the latent is not split by heads).

Quantized KV (fp8 / int formats) is not stored here: create_mla_pool refuses it, naming --kv-cache-dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

from sglang.srt.mem_cache.memory_pool import KVCache
from sglang.srt.mem_plan.kv_quant import is_quantized, mla_kv_dtype_error
from sglang.srt.mem_plan.sizes import kv_pool_rows


class MLATokenToKVPool(KVCache):
    is_mla = True
    kv_format = ""  # plain rows: no codes, scales or rotation
    calibrating = False

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str = "cpu"):
        if kv_lora_rank <= 0 or qk_rope_head_dim < 0:
            raise ValueError(f"MLA pool needs kv_lora_rank > 0 and qk_rope_head_dim >= 0, got {kv_lora_rank}, "
                             f"{qk_rope_head_dim}")
        self.size = size
        self.page_size = page_size
        self.dtype = self.store_dtype = dtype
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        # the MQA view the attention backends take: one KV head of the whole row, V its first kv_lora_rank columns
        self.head_num = 1
        self.head_dim = kv_lora_rank + qk_rope_head_dim
        self.v_head_dim = kv_lora_rank
        self.layer_num = layer_num
        self.device = device
        # torch.empty: every handed-out slot is written before it is read; the dummy page padded reads point at is
        # zeroed (finite). On CPU the rest is backed lazily as it fills.
        self.kv_buffer = torch.empty((layer_num, kv_pool_rows(size, page_size), 1, self.head_dim), dtype=dtype,
                                     device=device)
        self.kv_buffer[:, :page_size].zero_()

    @property
    def row_width(self) -> int:
        return self.head_dim

    def mem_usage_bytes(self) -> int:
        """Everything allocated, the dummy page included (= the plan's kv_cache term)."""
        return self.kv_buffer.numel() * self.kv_buffer.element_size()

    def zero_(self) -> None:
        """Back every row (the profile forward's scratch pool: its pages resident before the peak is measured)."""
        self.kv_buffer.zero_()

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """[rows, 1, L], contiguous."""
        return self.kv_buffer[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """[rows, 1, kv_lora_rank]: a non-contiguous view of the key rows' first columns."""
        return self.kv_buffer[layer_id][..., : self.kv_lora_rank]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]) -> None:
        """Writes the rows k [N, 1, L]; v (None, or k's first kv_lora_rank columns) is not stored: it is part of k."""
        if k.dim() == 2:
            k = k.unsqueeze(1)
        if k.shape[1:] != (1, self.head_dim):
            raise ValueError(f"MLA pool rows are [N, 1, {self.head_dim}], got k {tuple(k.shape)}")
        if v is not None and v.shape[-1] != self.kv_lora_rank:
            raise ValueError(f"MLA pool: v must be k[..., :{self.kv_lora_rank}] or None, got {tuple(v.shape)}")
        self.kv_buffer[layer_id].index_copy_(0, loc, k.to(self.dtype))

    # the read interface torch_native shares with the other pools: plain rows, no rotation
    def rotation(self, part: str) -> Optional[torch.Tensor]:
        return None

    def gather_kv(self, layer_id: int, index: torch.Tensor, dtype: torch.dtype, rotated: bool = False):
        """K [n, 1, L] (one gathered copy) and V [n, 1, kv_lora_rank] (a view of it) of the slots `index`."""
        k = self.get_key_buffer(layer_id).index_select(0, index)
        if k.dtype != dtype:
            k = k.to(dtype)
        return k, k[..., : self.kv_lora_rank]


def create_mla_pool(kv_cache_dtype: str, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int,
                    qk_rope_head_dim: int, layer_num: int, device: str = "cpu") -> MLATokenToKVPool:
    """The latent pool for a resolved --kv-cache-dtype name; a quantized format is refused (ValueError naming it)."""
    if is_quantized(kv_cache_dtype):
        raise ValueError(mla_kv_dtype_error(kv_cache_dtype))
    return MLATokenToKVPool(size, page_size, dtype, kv_lora_rank, qk_rope_head_dim, layer_num, device)
