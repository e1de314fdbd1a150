"""Dense bf16 linear weights packed once at load for CPUs without AMX (sgl-kernel/csrc/cpu/gemm_bf16.h).

Without AMX tiles, a decode batch of 9-64 rows used to fall to torch.mm; with the weights in the VNNI layout that
VDPBF16PS reads, one kernel serves every row count (decode and prefill) at the instruction-throughput bound. The
packed tensor replaces the nn.Linear weight in place: same shape [N, K], dtype and bytes (so the plan's weights term
is unchanged and measured as before), with the attribute `vnni_packed` set. `linear()` (layers/linear.py) sends such
a weight here for every call.

    linear.prepack_dense_linear_weights(model)   after loading (model_loader/loader.py); a no-op with AMX, in fp32,
                                                 on other CPUs, or with SGLANG_CPU_KERNELS=0
    packed_linear(x, weight, bias)        the kernel; inside cpu_kernels_disabled() (A/B tests) the torch path on the
                                          unpacked weight, which is exactly the original
Quantized layers (--quantization) hold no dense weight and are left alone.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from sglang.jit_kernel.cpu_ops import get_cpu_ops

PACK_ROWS = 16  # output rows per packed block (kPackRows)
PACK_K = 32  # input columns must be a multiple (kPackK)
PACK_GROUP = 3  # blocks whose k-pair lines are interleaved (kPackGroup)


def packable(weight: Optional[torch.Tensor]) -> bool:
    return (weight is not None and weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.is_cpu
            and weight.shape[0] % PACK_ROWS == 0 and weight.shape[1] % PACK_K == 0
            and not getattr(weight, "vnni_packed", False))


def unpack_weight(packed: torch.Tensor) -> torch.Tensor:
    """The nn.Linear layout [..., N, K] of packed weights [..., N, K] (each [N, K] as gemm_bf16.h packs it: groups
    of 3 blocks of 16 rows, [K/2][3][16][2] each, the last group of N/16 % 3 blocks [K/2][N/16 % 3][16][2])."""
    *lead, n, k = packed.shape
    flat = packed.reshape(-1, n * k)
    blocks = n // PACK_ROWS
    full = blocks // PACK_GROUP * PACK_GROUP  # blocks in whole groups
    parts = []
    if full:
        whole = flat[:, : full * PACK_ROWS * k].reshape(-1, full // PACK_GROUP, k // 2, PACK_GROUP, PACK_ROWS, 2)
        parts.append(whole.permute(0, 1, 3, 4, 2, 5).reshape(-1, full * PACK_ROWS, k))
    if blocks > full:
        rest = flat[:, full * PACK_ROWS * k:].reshape(-1, k // 2, blocks - full, PACK_ROWS, 2)
        parts.append(rest.permute(0, 2, 3, 1, 4).reshape(-1, (blocks - full) * PACK_ROWS, k))
    return torch.cat(parts, dim=1).reshape(*lead, n, k)


def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) for a packed weight."""
    ops = get_cpu_ops() if x.dtype == torch.bfloat16 else None
    if ops is not None and x.dim() == 2 and x.shape[0] > 0 and bias is None:  # decode's case, no reshapes
        return ops.packed_linear(x, weight)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if ops is not None and x2.shape[0] > 0:
        out = ops.packed_linear(x2, weight)
        if bias is not None:
            out = out + bias
    else:
        out = F.linear(x2, unpack_weight(weight).to(x2.dtype), bias)
    return out.reshape(*shape[:-1], weight.shape[0])
