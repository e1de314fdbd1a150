"""Linear layers with upstream's names and tensor-parallel sharding (srt/distributed/).

QKVParallelLinear holds q, k and v as one weight [(H + 2*KV) * D, hidden]; MergedColumnParallelLinear holds
[gate; up] as one weight [2 * I, hidden]. Checkpoint shards are copied into their row ranges at load time
(`weight_loader(param, loaded, shard_id)`), so one GEMM replaces three (or two) per layer.
With tp ranks (rank r of tp), each rank holds and loads only its slice of the checkpoint tensor:
    MergedColumnParallel / QKVParallel    output rows: each projection's rows [r * n/tp, (r+1) * n/tp); QKV splits
                                          q by heads and k, v by KV heads (a KV head is replicated on tp/KV ranks
                                          when tp > KV: rank r holds KV head r // (tp / KV))
    RowParallelLinear                     input columns [r * n/tp, ...); the partial products are summed by one
                                          all-reduce, then the (unsharded) bias is added once
forward returns the output tensor only (upstream also returns an output bias, always None here). Every layer's
GEMM goes through LinearBase.apply_linear, the one place a weight format (quantized weights) plugs in.
"""

from __future__ import annotations

from collections import Counter
from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from sglang.jit_kernel.cpu_ops import amx_available, get_cpu_ops
from sglang.srt.distributed.communication_op import tp_all_reduce
from sglang.srt.distributed.parallel_state import divide, get_tp_rank, get_tp_size
from sglang.srt.model_loader.weight_utils import materialize
from sglang.srt.layers.quantization import linear_quant_method
from sglang.srt.layers.packed_linear import packable, packed_linear


# On CPU in bf16, oneDNN's kernel behind F.linear (x @ W^T) is about 2x slower for few rows than computing
# (W @ x^T)^T, or W @ x for a single row (measured here: 3072x576 weight, 1 row: 130 vs 70 us; 32 rows: 156 vs 88 us).
# Decode batches are "few rows"; prefill batches stay on F.linear. fp32 keeps F.linear (the exact reference path).
SMALL_M_ROWS = 128
# Few-row bf16 projections on CPU go to the kernels in sgl-kernel/csrc/cpu/ when they are available. Measured over
# the 120 projections of SmolLM2-135M (213 MB of weights, 2 cores), ms: 1 row: GEMV (gemv.h) 8.3, AMX (amx_gemm.h)
# 9.5, mm 17.6; 2 rows: GEMV 8.9, AMX 9.4, mm 12.8 (whole decode step: AMX 18.1 vs GEMV 19.2); 16 / 32 / 48 / 64
# rows: AMX 11.0 / 12.9 / 17.3 / 19.4, mm 16.8 / 22.9 / 24.2 / 30.5, F.linear 19.7 / 22.4 / 26.2 / 28.5.
# So GEMV for one row, AMX up to AMX_MAX_ROWS (GEMV up to GEMV_NO_AMX_MAX_ROWS where the OS gives no AMX). Within
# each kernel a row's result does not depend on the other rows: in a decode batch of 2-64 requests each gets the
# tokens it gets in any other batch of 2-64.
# Without AMX, the dense layer weights are packed at load (layers/packed_linear.py) and every row count takes that
# kernel (single core, the 120 projections: 1 / 8 / 16 / 32 / 64 rows 18 / 25 / 49 / 91 / 171 ms against GEMV
# 20 / 35 / 62 / 116 / 205 and mm 36 / 61 / 70 / 120 / 204), an untied lm_head included; what stays unpacked (a
# tied lm_head, shapes the packing does not take) keeps GEMV up to GEMV_NO_AMX_MAX_ROWS and torch.mm above (the
# 49152 x 576 lm_head, one core: 8 / 16 / 32 / 64 rows GEMV 8.1 / 13.7 / 26.5 / 52.6 ms, mm 13.8 / 15.2 / 27.6 / 49.6).
GEMV_MAX_ROWS = 1
AMX_MAX_ROWS = 64
GEMV_NO_AMX_MAX_ROWS = 16


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
    if getattr(weight, "vnni_packed", False):
        return packed_linear(x, weight, bias)
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
    loaded_weight = materialize(loaded_weight)  # a CheckpointSlice (tp ranks) is read whole here
    if param.shape != loaded_weight.shape:
        raise ValueError(f"weight shape mismatch: parameter {tuple(param.shape)} vs checkpoint {tuple(loaded_weight.shape)}")
    with torch.no_grad():
        param.copy_(loaded_weight)


def _rows(loaded: torch.Tensor, index: int, size: int, dim: int = 0) -> torch.Tensor:
    """Slice `index` of `size` along dim of a checkpoint tensor (a view: only the slice is copied)."""
    return loaded.narrow(dim, index * size, size)


class LinearBase(nn.Module):
    """weight [output_size, input_size] of this rank (already divided by tp where the subclass shards)."""

    def __init__(self, input_size: int, output_size: int, bias: bool):
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.input_size = input_size
        self.output_size = output_size
        # None: a dense weight; else (--quantization, layers/quantization/) it owns the weights and the GEMM
        self.quant_method = linear_quant_method(self)
        if self.quant_method is not None:
            self.quant_method.create_weights(self)
        else:
            self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
            self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def apply_linear(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        """x: [M, input_size] -> [M, output_size]: this rank's GEMM (the hook for other weight formats)."""
        if self.quant_method is not None:
            return self.quant_method.apply(self, x, bias)
        return linear(x, self.weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_linear(x, self.bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        default_weight_loader(param, loaded_weight)


class ReplicatedLinear(LinearBase):
    pass


class RowParallelLinear(LinearBase):
    """Input columns split over the ranks; forward all-reduces the partial sums (one all-reduce per layer), or with
    reduce_results=False returns this rank's partial sum for the caller to reduce with others (a MoE block's shared
    expert, summed with the routed experts' partial output: one all-reduce per block)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, reduce_results: bool = True):
        super().__init__(divide(input_size, get_tp_size(), "input size"), output_size, bias)
        if bias and not reduce_results:
            raise ValueError("a partial sum cannot carry the bias: add it after the caller's all-reduce")
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, input_size / tp] -> partial [M, output_size] -> summed over ranks
        if self.tp_size == 1 or not self.reduce_results:
            return self.apply_linear(x, self.bias)
        out = tp_all_reduce(self.apply_linear(x, None))
        return out if self.bias is None else out + self.bias

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        if param.dim() == 2:
            loaded_weight = _rows(loaded_weight, self.tp_rank, param.shape[1], dim=1)
        default_weight_loader(param, loaded_weight)


class MergedColumnParallelLinear(LinearBase):
    """Several column projections of the same input, stacked on the output dim (e.g. gate_proj, up_proj); each
    is split over the ranks, so rank r holds [gate_r; up_r]."""

    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False):
        tp = get_tp_size()
        self.output_sizes = [divide(n, tp, "output size") for n in output_sizes]  # per rank
        super().__init__(input_size, sum(self.output_sizes), bias)

    def forward_gated(self, x: torch.Tensor, act: str) -> Optional[torch.Tensor]:
        """A [gate | up] pair without bias: act(gate) * up [M, I] in one call where the weight format has one
        (QuantLinearMethod.apply_gated; act 'silu' or 'gelu_tanh'), else None: forward, then the activation."""
        apply_gated = getattr(self.quant_method, "apply_gated", None)
        if apply_gated is None or self.bias is not None or len(self.output_sizes) != 2 \
                or self.output_sizes[0] != self.output_sizes[1]:
            return None
        return apply_gated(self, x, act)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: Optional[int] = None) -> None:
        if shard_id is None:
            if self.tp_size != 1:
                raise ValueError("a merged checkpoint tensor cannot be split over TP ranks; load gate and up apart")
            return default_weight_loader(param, loaded_weight)
        start, size = sum(self.output_sizes[:shard_id]), self.output_sizes[shard_id]
        default_weight_loader(param.data[start : start + size], _rows(loaded_weight, self.tp_rank, size))


class QKVParallelLinear(LinearBase):
    """q, k, v projections of this rank stacked on the output dim: rows [0, h*D) q, [h*D, (h+kv)*D) k, then v,
    with h = H / tp and kv = max(1, KV / tp) heads."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: Optional[int] = None,
        bias: bool = False,
    ):
        tp, rank = get_tp_size(), get_tp_rank()
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.num_heads = divide(total_num_heads, tp, "number of attention heads")
        if tp >= self.total_num_kv_heads:
            divide(tp, self.total_num_kv_heads, "number of KV heads times the replicas of each")
            self.num_kv_heads, self.kv_head_index = 1, rank // (tp // self.total_num_kv_heads)
        else:
            self.num_kv_heads = divide(self.total_num_kv_heads, tp, "number of KV heads")
            self.kv_head_index = rank * self.num_kv_heads
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: Union[str, None] = None) -> None:
        if shard_id is None:
            if self.tp_size != 1:
                raise ValueError("a merged qkv checkpoint tensor cannot be split over TP ranks; load q, k, v apart")
            return default_weight_loader(param, loaded_weight)
        if shard_id == "q":
            offset, size, src = 0, self.q_size, _rows(loaded_weight, self.tp_rank, self.q_size)
        else:
            offset = self.q_size if shard_id == "k" else self.q_size + self.kv_size
            size = self.kv_size
            src = loaded_weight.narrow(0, self.kv_head_index * self.head_size, size)
        default_weight_loader(param.data[offset : offset + size], src)


def prepack_dense_linear_weights(model: nn.Module) -> int:
    """Pack every dense bf16 LinearBase weight, and an untied lm_head's (ParallelLMHead.logits runs linear() too: at
    batch 1 its vocabulary GEMV is the largest weight read of a decode step, 100 MB on the MoE benchmark model, and the
    packed kernel streams it ~15% faster than gemv.h), in place when the non-AMX kernel serves this machine
    (packed_linear.py); returns the count. A weight another module shares stays as it is: a tied lm_head is the
    embedding table, whose rows the lookup reads."""
    ops = get_cpu_ops()
    if ops is None or amx_available() or not hasattr(ops, "pack_linear_weight"):
        return 0
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    count = 0
    for module in model.modules():
        dense = isinstance(module, LinearBase) or getattr(module, "is_lm_head", False)
        weight = getattr(module, "weight", None) if dense else None
        if getattr(module, "quant_method", None) is None and packable(weight) and uses[id(weight)] == 1:
            weight.data = ops.pack_linear_weight(weight.data)  # the original is freed: one copy is held
            weight.vnni_packed = True
            count += 1
    return count
