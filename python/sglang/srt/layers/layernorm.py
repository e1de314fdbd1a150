"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.jit_kernel.cpu_ops import get_ops_for_dtype

# the CPU kernel's dtypes: bf16 from level avx512_bf16, fp32 from avx2 (sgl-kernel/csrc/cpu/norm.h, kernels_f32.h)
_KERNEL_DTYPES = (torch.bfloat16, torch.float32)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.variance_epsilon = eps
        self.hidden_size = hidden_size

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """x: [..., hidden]. With residual: returns (norm(x + residual), x + residual)."""
        if x.dtype in _KERNEL_DTYPES and x.is_cpu and x.dim() == 2 and x.is_contiguous() and self.weight.dtype == x.dtype:
            ops = get_ops_for_dtype(x.dtype)
            if ops is not None and (residual is None or residual.is_contiguous()):
                out, residual_out = ops.rmsnorm(x, residual, self.weight, self.variance_epsilon)
                return out if residual is None else (out, residual_out)
        if residual is not None:
            x = x + residual
            residual = x
        out = self._norm(x)
        return out if residual is None else (out, residual)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.variance_epsilon)
        # Low precision: normalise in float32, round once, then scale in the model dtype (HF's order of rounding).
        y = F.rms_norm(x.float(), (self.hidden_size,), None, self.variance_epsilon)
        return self.weight * y.to(x.dtype)
