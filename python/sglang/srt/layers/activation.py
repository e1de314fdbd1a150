"""SiluAndMul: the gated-MLP activation on a merged [gate | up] projection."""

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [N, 2 * I] -> [N, I]
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
