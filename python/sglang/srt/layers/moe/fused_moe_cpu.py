"""Fused MoE experts on CPU: the AVX-512 BF16 kernel (sgl-kernel/csrc/cpu/moe.h), or a grouped torch path.

    fused_experts_cpu(hidden [M, K], w13 [E, 2N, K], w2 [E, K, N], topk_weights [M, k] fp32, topk_ids [M, k] int,
                      workspace=None) -> [M, K]
    out[m] = sum_j topk_weights[m, j] * (silu(gate) * up) @ w2[e].T,  e = topk_ids[m, j],
             gate / up = hidden[m] @ w13[e][:N].T / w13[e][N:].T
(the signature shared with fused_experts_torch and the Triton kernel). Ids outside [0, E) contribute nothing.

The kernel reads the expert weights packed once at load (`prepack_moe_weights_`: every expert in the VNNI lines moe.h
reads, w13 with each gate block's lines interleaved with its up block's, w2 in gemm_bf16.h's layout; same shape, dtype
and bytes, the packed tensor replacing the original; `vnni_packed` marks it). It serves bf16
hidden states with K and N multiples of 32 when the CPU kernels are loaded (`get_cpu_ops()`); everything else takes
`grouped_experts_torch` (unpacked weights too, with a warning once where the kernel could have served them): one pass
per routed expert over its tokens with torch.mm, rounding where the kernel rounds (gate/up and silu(gate) * up in bf16,
the weighted sum in fp32) except that torch also rounds each expert's output to bf16. A packed weight reaching the
torch path is unpacked per routed expert (exactly the original).

Quantized experts (`QuantExpertWeights`: each expert packed as quant_linear's weights, GGUF Q4_0 / Q4_1 / Q8_0 blocks or
int8; sgl-kernel/csrc/cpu/moe_quant.h) take the same entry; their activations are quantized to int8 per 32 values like
quant_linear's, and the torch path dequantizes the routed experts per call.

Workspace: `fused_moe_cpu_workspace_bytes(M, k, E, K, N[, w13_bits, w2_bits])` bytes (a uint8 tensor); without one
the kernel allocates its own per call. Kernel rounding: each gate/up and output column is one fp32 chain of VDPBF16PS
over k-pairs in order, and a token's expert outputs are summed in ascending expert id, so a token's result does not
depend on its batch mates or on the thread count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import get_cpu_ops
from sglang.srt.layers.packed_linear import unpack_weight
from sglang.srt.layers.quantization import packing
from sglang.srt.mem_plan.moe_sizes import CPU_KERNEL_DIM_MULTIPLE, cpu_kernel_workspace_bytes

logger = logging.getLogger(__name__)

MOE_DIM_MULTIPLE = CPU_KERNEL_DIM_MULTIPLE  # K and N (moe.h: the packing transposes 16 x 32 pieces)
PACK_ROWS = 16  # output columns per packed block
_warned_unpacked = False


def fused_moe_cpu_workspace_bytes(num_tokens: int, top_k: int, num_experts: int, hidden_size: int,
                                  intermediate_size: int, w13_bits: int = 16, w2_bits: int = 16) -> int:
    """Bytes of the kernel's workspace for `num_tokens` tokens (moe.h's moe_workspace_bytes; with quantized experts,
    w13_bits and w2_bits in {4, 8}, moe_quant.h's moe_quant_workspace_bytes): the plan's formula,
    mem_plan/moe_sizes.cpu_kernel_workspace_bytes, which the plan charges and the runtime allocates."""
    return cpu_kernel_workspace_bytes(num_tokens, top_k, num_experts, hidden_size, intermediate_size, w13_bits,
                                      w2_bits)


@dataclass(frozen=True)
class QuantExpertWeights:
    """One block-quantized expert weight of every expert: packed uint8 [E, tiles, blocks, record bytes] (each expert
    as packing.pack lays out a [rows, cols] linear weight), `bits` 4 (Q4_0 / Q4_1) or 8 (Q8_0 / int8)."""

    packed: torch.Tensor
    bits: int
    rows: int  # 2N for w13, K for w2
    cols: int  # K for w13, N for w2

    @property
    def shape(self) -> Tuple[int, int, int]:
        return (self.packed.shape[0], self.rows, self.cols)

    def dequantize(self, e: int, dtype: torch.dtype) -> torch.Tensor:
        """Expert e's [rows, cols] weight in dtype (the torch path's, per call)."""
        return packing.unpack_dequantize(self.packed[e], self.bits, self.rows, self.cols, dtype)


def pack_quant_experts(staging: torch.Tensor, cols: int, bits: Optional[int] = None) -> QuantExpertWeights:
    """Staging forms of every expert, uint8 [E, rows, blocks * 36] (packing.py: GGUF Q4_0 / Q4_1 / Q8_0 blocks through
    staging_from_gguf, int8 through staging_q8_blocks) -> QuantExpertWeights. bits: 4 when every u fits a nibble,
    else 8 (by default from the blocks)."""
    if bits is None:
        bits = max(packing.staging_bits(s) for s in staging)
    packed = torch.stack([packing.pack(s, bits) for s in staging])
    return QuantExpertWeights(packed, bits, staging.shape[1], cols)


def quantize_experts_int8(w: torch.Tensor) -> QuantExpertWeights:
    """Dense expert weights [E, rows, cols] -> 8-bit blocks (w8a8_int8's fitted step and offset per 32 weights)."""
    return pack_quant_experts(torch.stack([packing.staging_q8_blocks(we) for we in w]), w.shape[2], 8)


def moe_kernel_shapes_supported(hidden_size: int, intermediate_size: int) -> bool:
    return hidden_size % MOE_DIM_MULTIPLE == 0 and intermediate_size % MOE_DIM_MULTIPLE == 0


Experts = Union[torch.Tensor, QuantExpertWeights]


def _expert_shapes(w13: Experts, w2: Experts) -> Tuple[int, int, int]:
    """(E, N, K) of w13 [E, 2N, K] and w2 [E, K, N]; ValueError otherwise."""
    if len(w13.shape) != 3 or len(w2.shape) != 3 or w13.shape[1] % 2:
        raise ValueError(f"fused experts: w13 must be [E, 2N, K] and w2 [E, K, N], got {tuple(w13.shape)}, {tuple(w2.shape)}")
    e, n, k = w13.shape[0], w13.shape[1] // 2, w13.shape[2]
    if tuple(w2.shape) != (e, k, n):
        raise ValueError(f"fused experts: w2 {tuple(w2.shape)} does not match w13 {tuple(w13.shape)} (expected {(e, k, n)})")
    return e, n, k


def moe_weights_packable(w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """Whether the kernel would serve these (unpacked) expert weights on this machine."""
    if get_cpu_ops() is None or getattr(w13, "vnni_packed", False) or getattr(w2, "vnni_packed", False):
        return False
    try:
        _, n, k = _expert_shapes(w13, w2)
    except ValueError:
        return False
    return (w13.dtype == torch.bfloat16 and w2.dtype == torch.bfloat16 and w13.is_cpu and w2.is_cpu
            and moe_kernel_shapes_supported(k, n))


def pack_moe_weights(w13: torch.Tensor, w2: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(w13, w2) -> new tensors of the same shape holding each expert in the kernel's VNNI layout, marked
    `vnni_packed`. Needs the CPU kernels and K, N multiples of 32 (RuntimeError / ValueError otherwise)."""
    ops = get_cpu_ops()
    if ops is None:
        raise RuntimeError("pack_moe_weights: the CPU kernels are not loaded (see cpu_ops_status())")
    _, n, k = _expert_shapes(w13, w2)
    if not moe_kernel_shapes_supported(k, n):
        raise ValueError(f"pack_moe_weights: hidden size {k} and intermediate size {n} must be multiples of {MOE_DIM_MULTIPLE}")
    w13p, w2p = ops.pack_moe_weight(w13, True), ops.pack_moe_weight(w2, False)
    w13p.vnni_packed = True
    w2p.vnni_packed = True
    return w13p, w2p


def prepack_moe_weights_(w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """At load: pack the two expert weights (parameters or tensors) in place when the kernel will serve them
    (`.data` replaced, the original freed, `vnni_packed` set); returns whether it did. A no-op on other CPUs, in fp32,
    for unsupported shapes and with SGLANG_CPU_KERNELS=0."""
    if not moe_weights_packable(w13, w2):
        return False
    w13p, w2p = pack_moe_weights(w13.data, w2.data)
    w13.data, w2.data = w13p, w2p
    w13.vnni_packed = True
    w2.vnni_packed = True
    return True


def unpack_moe_weight(packed: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """The [E, R, C] layout of a packed expert weight: w13 (gate_up, R = 2N: [E][N/16][C/2][2][16][2], gate block g's
    line then up block g's) or w2 (gemm_bf16.h's layout of each [R, C], packed_linear.unpack_weight)."""
    if not gate_up:
        return unpack_weight(packed)
    e, r, c = packed.shape
    pairs = packed.reshape(e, r // (2 * PACK_ROWS), c // 2, 2, PACK_ROWS, 2)
    return pairs.permute(0, 3, 1, 4, 2, 5).reshape(e, r, c)


def _expert_weight(w: Experts, e: int, dtype: torch.dtype, gate_up: bool) -> torch.Tensor:
    """Expert e's [R, C] weight in dtype: unpacked if packed, dequantized if quantized."""
    if isinstance(w, QuantExpertWeights):
        return w.dequantize(e, dtype)
    if not getattr(w, "vnni_packed", False):
        return w[e].to(dtype)
    return unpack_moe_weight(w[e : e + 1], gate_up)[0].to(dtype)


def grouped_experts_torch(hidden: torch.Tensor, w13: Experts, w2: Experts, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor) -> torch.Tensor:
    """The torch path: tokens grouped by expert, one gate/up and one down torch.mm per routed expert."""
    num_experts, n, _ = _expert_shapes(w13, w2)
    m, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1).long()
    flat_weights = topk_weights.reshape(-1).float()
    valid = (flat_ids >= 0) & (flat_ids < num_experts)
    order = torch.argsort(torch.where(valid, flat_ids, num_experts), stable=True)
    counts = torch.bincount(flat_ids[valid], minlength=num_experts).tolist()
    out = torch.zeros(m, hidden.shape[1], dtype=torch.float32)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        tokens = pairs // top_k
        gate_up = hidden[tokens] @ _expert_weight(w13, e, hidden.dtype, True).t()
        act = F.silu(gate_up[:, :n]) * gate_up[:, n:]
        y = act @ _expert_weight(w2, e, hidden.dtype, False).t()
        out.index_add_(0, tokens, y.float() * flat_weights[pairs, None])
    return out.to(hidden.dtype)


def fused_experts_cpu(hidden: torch.Tensor, w13: Experts, w2: Experts, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, workspace: Optional[torch.Tensor] = None) -> torch.Tensor:
    """hidden [M, K] through the routed experts -> [M, K] (see the module docstring). workspace: the kernel's byte
    buffer, or the runtime's MoEWorkspace holding it (moe_sizes.MoEWorkspaceSpec with impl 'cpu')."""
    global _warned_unpacked
    workspace = getattr(workspace, "cpu_kernel", workspace)
    _, n, k = _expert_shapes(w13, w2)
    if hidden.dim() != 2 or hidden.shape[1] != k or topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 \
            or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"fused_experts_cpu: hidden {tuple(hidden.shape)}, topk_weights {tuple(topk_weights.shape)}, "
                         f"topk_ids {tuple(topk_ids.shape)} do not match K = {k}")
    quantized = isinstance(w13, QuantExpertWeights)
    if quantized != isinstance(w2, QuantExpertWeights):
        raise ValueError("fused_experts_cpu: w13 and w2 must both be quantized or both dense")
    served = hidden.dtype == torch.bfloat16 and hidden.is_cpu and moe_kernel_shapes_supported(k, n)
    if quantized:
        ops = get_cpu_ops() if served else None
        if ops is not None and ops.moe_quant_supported():  # the module's level: avx512_bf16 and up (isa.h)
            return ops.fused_experts_quant(hidden, w13.packed, w2.packed, w13.bits, w2.bits, topk_weights.float(),
                                           topk_ids, workspace)
        return grouped_experts_torch(hidden, w13, w2, topk_weights, topk_ids)
    packed = getattr(w13, "vnni_packed", False) and getattr(w2, "vnni_packed", False)
    if getattr(w13, "vnni_packed", False) != getattr(w2, "vnni_packed", False):
        raise ValueError("fused_experts_cpu: w13 and w2 must both be packed or both unpacked")
    ops = get_cpu_ops() if served else None
    if ops is not None and packed:
        return ops.fused_experts(hidden, w13, w2, topk_weights.float(), topk_ids, workspace)
    if ops is not None and not _warned_unpacked:
        _warned_unpacked = True
        logger.warning("fused_experts_cpu: expert weights are not packed (prepack_moe_weights_ at load); "
                       "using the slower torch path")
    return grouped_experts_torch(hidden, w13, w2, topk_weights, topk_ids)
