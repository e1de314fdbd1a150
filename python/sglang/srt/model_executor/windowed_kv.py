"""The model runner's pools for a model with windowed layers (mem_cache/swa_pool.py), built from the plan's split of
its layers (mem_plan/layer_pools.py), and what /server_info reports of them."""

from __future__ import annotations

from typing import Optional

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.swa_allocator import SWATokenToKVPoolAllocator, WindowedTokenPoolAllocator
from sglang.srt.mem_cache.swa_pool import SWAKVPool
from sglang.srt.mem_plan.kv_quant import is_quantized
from sglang.srt.mem_plan.layer_pools import windowed_layer_flags


def windowed_kv_pool(runner, pools, num_tokens: int, windowed_tokens: Optional[int], cell) -> SWAKVPool:
    """SWAKVPool over the full layers (num_tokens) and the windowed ones (windowed_tokens; None: num_tokens, a scratch
    pool); without full layers the windowed pool is the token pool. A quantized KV format is refused: the windowed
    pool keeps plain K/V only."""
    mc = runner.model_config
    if is_quantized(mc.kv_cache_dtype_name):
        raise ValueError(f"--kv-cache-dtype {mc.kv_cache_dtype_name} with sliding-window layers "
                         f"({pools.describe_kinds()}) is not served: the windowed pool keeps plain K/V only. Use "
                         "--kv-cache-dtype auto (or bf16) for this model.")
    if pools.linear_layers:
        raise ValueError(f"linear-attention layers beside sliding-window layers ({pools.describe_kinds()}) are not "
                         "served by this runtime.")
    if windowed_tokens is None or pools.windowed_token_pool:
        windowed_tokens = num_tokens
    return SWAKVPool(windowed_layer_flags(mc.shape.text, pools), num_tokens, windowed_tokens,
                     runner.server_args.page_size, mc.kv_cache_dtype, cell.num_kv_heads_per_rank, mc.head_dim,
                     runner.device)


def kv_allocator(pool, plan, page_size: int, window_tokens: int):
    """The page allocator over the pools as planned: windowed pages alongside token pages (swa_allocator.py)."""
    if not isinstance(pool, SWAKVPool):
        return TokenToKVPoolAllocator(plan.max_total_num_tokens, page_size)
    if pool.windowed_only:
        return WindowedTokenPoolAllocator(plan.max_total_num_tokens, page_size, window_tokens)
    return SWATokenToKVPoolAllocator(plan.max_total_num_tokens, plan.windowed_tokens, page_size, window_tokens,
                                     pool.slot_map)


def windowed_pool_info(allocator) -> dict:
    """/server_info's kv_cache fields of the windowed pool (empty without windowed layers): its size, the pages in
    use now and the most seen (right after an allocation, before the window's pages are freed)."""
    if not getattr(allocator, "window_tokens", 0):
        return {}
    ps = allocator.page_size
    return {"windowed_window_tokens": allocator.window_tokens,
            "windowed_pool_tokens": allocator.windowed_size,
            "windowed_pool_is_token_pool": allocator.windowed_only,
            "windowed_pages_in_use": allocator.num_windowed_pages_in_use(),
            "windowed_tokens_in_use": allocator.num_windowed_pages_in_use() * ps,
            "windowed_pages_in_use_max": allocator.max_windowed_pages_in_use,
            "windowed_tokens_in_use_max": allocator.max_windowed_pages_in_use * ps}
