"""The project's Triton fused-MoE kernels: token-to-expert alignment and the grouped expert GEMMs.

Importing this package imports triton. On a CPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1,
set before triton is imported; the kernels pick the mode at launch, attention/triton_ops/jit_mode.py).
"""

from sglang.srt.layers.moe.triton_ops.fused_moe import fused_experts_triton
from sglang.srt.layers.moe.triton_ops.workspace import FusedMoeWorkspace, fused_moe_workspace_bytes

__all__ = ["fused_experts_triton", "fused_moe_workspace_bytes", "FusedMoeWorkspace"]
