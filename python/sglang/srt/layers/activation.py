"""SiluAndMul: the gated-MLP activation on a merged [gate | up] projection."""

import torch
import torch.nn.functional as F
from torch import nn

from sglang.jit_kernel.cpu_ops import get_ops_for_dtype


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, 2 * I] -> [N, I]
        if x.dtype in (torch.bfloat16, torch.float32) and x.is_cpu and x.dim() == 2 and x.is_contiguous():
            ops = get_ops_for_dtype(x.dtype)  # bf16 from avx512_bf16, fp32 from avx2
            if ops is not None:
                return ops.silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
