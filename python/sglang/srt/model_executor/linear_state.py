"""The model runner's side of linear-attention / state-space layers (mem_cache/linear_state_pool.py): which pools such
a model gets, what it cannot be served with yet, and what /server_info reports of its state.

The plan (mem_plan/layer_pools.py) splits the layers: the KV pool holds the full-attention layers only (the model
numbers them 0..n_full-1 as their RadixAttention layer_id), and the linear layers keep a state row per request slot,
attached to the request-slot pool as req_to_token_pool.linear_state so a forward reaches it as
fb.req_to_token_pool.linear_state at rows fb.req_pool_indices.
"""

from __future__ import annotations

from sglang.srt.mem_cache.linear_state_pool import linear_state_pool
from sglang.srt.mem_plan.kv_quant import is_quantized

# A scratch pool (the profile forward, the dry CUDA-graph capture) needs the dummy row and one request's: the profile
# forward runs one request at row 1, and captured decode rows all point at the dummy row 0.
SCRATCH_STATE_ROWS = 2


def check_linear_served(runner, pools) -> None:
    """ValueError naming what a model with linear layers cannot be served with yet; nothing for other models."""
    if not pools.linear_layers:
        return
    mc = runner.model_config
    model_type = mc.shape.text.model_type
    if not pools.full_layers:
        raise ValueError(f"{model_type}: every layer keeps a linear state ({pools.describe_kinds()}); a model without "
                         "full-attention layers has no KV pool, which this runtime's scheduler needs to admit requests. "
                         "Serve a hybrid with full-attention layers.")
    if is_quantized(mc.kv_cache_dtype_name):
        raise ValueError(f"--kv-cache-dtype {mc.kv_cache_dtype_name} on {model_type} ({pools.describe_kinds()}) is not "
                         "served: its KV pool numbers the full-attention layers 0..n_full-1, while a quantized "
                         "format's startup calibration and checkpoint KV scales go by decoder layer. Use "
                         "--kv-cache-dtype auto (or bf16).")


def kv_pool_layers(runner, pools) -> int:
    """Layers the (non-windowed) KV pool holds: the full ones when linear layers keep state instead, else every
    decoder layer."""
    return pools.full_layers if pools.linear_layers else runner.model_config.num_hidden_layers


def attach_linear_state(runner, r2t, pools, num_rows: int = SCRATCH_STATE_ROWS) -> None:
    """Give r2t (a ReqToTokenPool) the linear-state pool of num_rows rows (plan.state_slots for the real one); a model
    without linear layers gets None."""
    if not pools.linear_layers:
        r2t.linear_state = None
        return
    check_linear_served(runner, pools)
    if num_rows > r2t.size + 1:
        raise ValueError(f"{num_rows} state rows for {r2t.size} request slots + the dummy row")
    r2t.linear_state = linear_state_pool(runner.model_config.shape.text, runner.server_args.tp_size, num_rows,
                                         runner.device)


def linear_state_bytes(r2t) -> int:
    pool = getattr(r2t, "linear_state", None)
    return pool.mem_usage_bytes() if pool is not None else 0


def linear_state_info(r2t) -> dict:
    """/server_info kv_cache fields of the state pool (empty without linear layers)."""
    pool = getattr(r2t, "linear_state", None)
    return pool.info() if pool is not None else {}
