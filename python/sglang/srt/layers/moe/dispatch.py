"""The one place a fused_experts implementation is chosen: by name, once per FusedMoE layer at build time.

    get_fused_experts(moe_impl_for(device_kind)) -> fused_experts(hidden, w13, w2, topk_weights, topk_ids, workspace)

The name comes from mem_plan/moe_sizes.moe_impl_for, the rule `sglang plan` sizes the workspace by (each
implementation's sorted-ids row block is SORT_BLOCK_M there): the Triton kernel on GPUs, the sgl-kernel kernel on
CPUs where it serves the experts (bf16, its kernels load), else torch. Modules are imported on first use, so CPU-only
runs never import Triton.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Tuple

# implementation name -> (module, function); every function has the signature of layers/moe/__init__.py
FUSED_EXPERTS_IMPLS: Dict[str, Tuple[str, str]] = {
    "torch": ("sglang.srt.layers.moe.fused_moe_torch", "fused_experts_torch"),
    "triton": ("sglang.srt.layers.moe.triton_ops.fused_moe", "fused_experts_triton"),
    "cpu": ("sglang.srt.layers.moe.fused_moe_cpu", "fused_experts_cpu"),
}


def get_fused_experts(impl: str) -> Callable:
    if impl not in FUSED_EXPERTS_IMPLS:
        raise ValueError(f"unknown fused_experts implementation {impl!r}; known: {', '.join(FUSED_EXPERTS_IMPLS)}")
    module, name = FUSED_EXPERTS_IMPLS[impl]
    return getattr(importlib.import_module(module), name)
