"""The project's Triton fused-MoE kernels: token-to-expert alignment and the grouped expert GEMMs.

    fused_moe.py     fused_experts_triton (the shared fused_experts signature) and the silu-and-mul kernel
    align.py         assignments grouped by expert into BLOCK_M-row blocks (sorted_ids, expert_ids, expert_offsets)
    grouped_gemm.py  C[i] = A[row of i] @ W[expert of i].T over the aligned blocks, optionally * the routing weight
    workspace.py     the buffers, allocated once, and fused_moe_workspace_bytes (the formula the plan charges)
    tiles.py         tile sizes for GPUs and for the CPU interpreter; MOE_BLOCK_M

Importing this package imports triton. On a CPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1,
set before triton is imported; the kernels pick the mode at launch, attention/triton_ops/jit_mode.py).
"""

from sglang.srt.layers.attention.triton_ops import jit_mode  # noqa: F401 (first: it refuses a triton too old)
from sglang.srt.layers.moe.triton_ops.fused_moe import fused_experts_triton
from sglang.srt.layers.moe.triton_ops.workspace import FusedMoeWorkspace, fused_moe_workspace_bytes

__all__ = ["fused_experts_triton", "fused_moe_workspace_bytes", "FusedMoeWorkspace"]
