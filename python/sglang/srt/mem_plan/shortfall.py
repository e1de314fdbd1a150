"""The planner's "does not fit" message: what the weights, the minimum KV pool and each runtime term need against the
budget, and the knobs that help. `r` is planner._Resolved (duck-typed: its inputs, budget, minimum pool and terms)."""

from __future__ import annotations

from sglang.srt.mem_plan.errors import MemoryPlanError
from sglang.srt.mem_plan.sizes import kv_pool_rows
from sglang.srt.mem_plan.units import gib


def runtime_breakdown(r, num_tokens: int) -> str:
    """The runtime terms at T that a shortfall message lists (the pools and weights are named on their own)."""
    skip = ("weights", "kv_cache", "kv_windowed", "kv_windowed_map", "linear_state",  # static: the pools beside the
            "draft_weights", "draft_kv_cache")  # KV pool, a draft's weights and KV
    parts = [f"{t.name} {gib(t.num_bytes):.2f}" for t in r.terms(num_tokens) if t.name not in skip and t.num_bytes]
    return ", ".join(parts) + " GiB"


def raise_nothing_fits(r, prefix: str = "") -> None:
    """MemoryPlanError: not even the minimum KV pool fits, with what each part needs and the knobs that help."""
    x = r.inputs
    need = (x.static_weight_bytes + kv_pool_rows(r.min_kv_tokens, x.page_size) * x.token_cell_bytes
            + r.pool_bytes(r.min_kv_tokens) + r.runtime_bytes(r.min_kv_tokens))
    shortfall = max(need - r.budget, 0)
    raise MemoryPlanError(
        f"{prefix}Does not fit: weights {gib(x.static_weight_bytes):.2f} GiB + the minimum KV pool of {r.min_kv_tokens:,} "
        f"tokens ({gib(r.min_kv_tokens * x.token_cell_bytes):.2f} GiB)"
        + (f" + its windowed / linear-state pools ({gib(r.pool_bytes(r.min_kv_tokens)):.2f} GiB)"
           if x.layer_pools.per_slot_layers else "") + " + runtime terms "
        f"({runtime_breakdown(r, r.min_kv_tokens)}) need {gib(need):.2f} GiB, but the budget is "
        f"{gib(r.budget):.2f} GiB (short by {gib(shortfall):.2f} GiB). Options: more tensor parallelism, "
        f"--kv-cache-dtype fp8_e4m3, a smaller --context-length, fewer --max-running-requests, a smaller "
        f"--chunked-prefill-size or --encoder-mem-reserve, or free memory held by other processes.",
        shortfall_bytes=shortfall)
