"""Linear layers with upstream's names. Single rank: no tensor parallelism, but the merged layouts are kept.

QKVParallelLinear holds q, k and v as one weight [(H + 2*KV) * D, hidden]; MergedColumnParallelLinear holds
[gate; up] as one weight [2 * I, hidden]. Checkpoint shards are copied into their row ranges at load time
(`weight_loader(param, loaded, shard_id)`), so one GEMM replaces three (or two) per layer.
forward returns the output tensor only (upstream also returns an output bias, always None here).
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.jit_kernel.cpu_ops import amx_available, get_cpu_ops


# On CPU in bf16, oneDNN's kernel behind F.linear (x @ W^T) is about 2x slower for few rows than computing
# (W @ x^T)^T, or W @ x for a single row (measured here: 3072x576 weight, 1 row: 130 vs 70 us; 32 rows: 156 vs 88 us).
# Decode batches are "few rows"; prefill batches stay on F.linear. fp32 keeps F.linear (the exact reference path).
SMALL_M_ROWS = 128
# Few-row bf16 projections on CPU go to the kernels in jit_kernel/csrc/cpu/ when they are available. Measured over
# the 120 projections of SmolLM2-135M (213 MB of weights, 2 cores), ms: 1 row: GEMV (gemv.h) 8.3, AMX (amx_gemm.h)
# 9.5, mm 17.6; 2 rows: GEMV 8.9, AMX 9.4, mm 12.8 (whole decode step: AMX 18.1 vs GEMV 19.2); 16 / 32 / 48 / 64
# rows: AMX 11.0 / 12.9 / 17.3 / 19.4, mm 16.8 / 22.9 / 24.2 / 30.5, F.linear 19.7 / 22.4 / 26.2 / 28.5.
# So GEMV for one row, AMX up to AMX_MAX_ROWS (GEMV up to GEMV_NO_AMX_MAX_ROWS where the OS gives no AMX). Within
# each kernel a row's result does not depend on the other rows: in a decode batch of 2-64 requests each gets the
# tokens it gets in any other batch of 2-64.
GEMV_MAX_ROWS = 1
AMX_MAX_ROWS = 64
GEMV_NO_AMX_MAX_ROWS = 8


def _kernel_linear(x: torch.Tensor, weight: torch.Tensor) -> Optional[torch.Tensor]:
    rows = x.shape[0]
    if rows > AMX_MAX_ROWS or x.shape[1] % 32 or weight.dtype != torch.bfloat16:
        return None
    ops = get_cpu_ops()
    if ops is None:
        return None
    if rows <= GEMV_MAX_ROWS:
        return ops.gemv(x, weight)
    if amx_available():
        return ops.amx_linear(x, weight)
    return ops.gemv(x, weight) if rows <= GEMV_NO_AMX_MAX_ROWS else None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """F.linear with faster paths for few-row bf16 inputs on CPU. x: [M, in], weight: [out, in] -> [M, out]."""
    if x.dtype == torch.bfloat16 and x.dim() == 2 and x.shape[0] <= SMALL_M_ROWS and x.is_cpu:
        out = _kernel_linear(x, weight)
        if out is None:
            if x.shape[0] == 1:
                out = torch.mv(weight, x[0]).unsqueeze(0)
            else:
                out = torch.mm(weight, x.t()).t().contiguous()
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    if param.shape != loaded_weight.shape:
        raise ValueError(f"weight shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded_weight.shape)}")
    with torch.no_grad():
        param.copy_(loaded_weight)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        default_weight_loader(param, loaded_weight)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    pass


class RowParallelLinear(LinearBase):
    pass


class MergedColumnParallelLinear(LinearBase):
    """Several column projections of the same input, stacked on the output dim (e.g. gate_proj, up_proj)."""

    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False):
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = output_sizes

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: Optional[int] = None) -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded_weight)
        start = sum(self.output_sizes[:shard_id])
        default_weight_loader(param.data[start : start + self.output_sizes[shard_id]], loaded_weight)


class QKVParallelLinear(LinearBase):
    """q, k, v projections stacked on the output dim: rows [0, H*D) q, [H*D, (H+KV)*D) k, then v."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: Optional[int] = None,
        bias: bool = False,
    ):
        self.head_size = head_size
        self.num_heads = total_num_heads
        self.num_kv_heads = total_num_kv_heads or total_num_heads
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: Union[str, None] = None) -> None:
        if shard_id is None:
            return default_weight_loader(param, loaded_weight)
        offset, size = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }[shard_id]
        default_weight_loader(param.data[offset : offset + size], loaded_weight)
