"""The fused-MoE workspace: every buffer fused_experts_triton uses besides its output, sized once for the largest
batch the scheduler runs (max_tokens) and shared by all MoE layers (they run one after another).

With T = max_tokens * topk assignments (token m's j-th expert is assignment m * topk + j), E experts and BLOCK_M
rows per GEMM block (MOE_BLOCK_M, the largest any tile set uses):
    P = T + min(E, T) * (BLOCK_M - 1)   the most sorted slots: each non-empty expert pads its rows up to a multiple
                                        of BLOCK_M (adds <= BLOCK_M - 1), and at most min(E, T) experts are non-empty
    B = P // BLOCK_M                    the most blocks (the padded total is a multiple of BLOCK_M and <= P)

    name                      dtype  shape              holds
    sorted_token_ids          int32  [P]                assignment ids grouped by expert, padded with T (align.py)
    expert_ids                int32  [B]                the expert of each BLOCK_M block of sorted_token_ids
    num_tokens_post_padded    int32  [1]                the padded total actually used (read on the device)
    expert_counts             int32  [E]                assignments per expert (alignment scratch)
    gemm_out                  model  [T * max(2N, K)]   intermediate1 [T, 2N] (gate | up), then intermediate3 [T, K]
    intermediate2             model  [T, N]             silu(gate) * up

intermediate1 is dead once intermediate2 is written, so intermediate3 reuses its memory. A batch of M <= max_tokens
tokens uses the leading part of each buffer (views: their addresses never change, as CUDA graphs need).

The layout functions take and return plain integers (no torch), so the memory plan can charge the same formula.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Dict, Tuple

import torch

from sglang.srt.layers.moe.triton_ops.tiles import MOE_BLOCK_M

MOE_INDEX_BYTES = 4  # the alignment buffers are int32

# name -> (shape, "index" | "model"): the dtype is int32 for "index", the model's dtype for "model"
BufferShapes = Dict[str, Tuple[Tuple[int, ...], str]]


def max_sorted_slots(num_assignments: int, num_experts: int, block_m: int) -> int:
    """P: the most entries sorted_token_ids can use for this many assignments."""
    return num_assignments + min(num_experts, num_assignments) * (block_m - 1)


def max_blocks(num_assignments: int, num_experts: int, block_m: int) -> int:
    """B: the most BLOCK_M blocks the alignment can produce (the GEMM grid's first axis)."""
    return max_sorted_slots(num_assignments, num_experts, block_m) // block_m


def fused_moe_buffer_shapes(max_tokens: int, topk: int, num_experts: int, N: int, K: int,
                            block_m: int = MOE_BLOCK_M) -> BufferShapes:
    """The workspace's buffers (module docstring): N = intermediate size per expert, K = hidden size."""
    t = max_tokens * topk
    return {
        "sorted_token_ids": ((max_sorted_slots(t, num_experts, block_m),), "index"),
        "expert_ids": ((max_blocks(t, num_experts, block_m),), "index"),
        "num_tokens_post_padded": ((1,), "index"),
        "expert_counts": ((num_experts,), "index"),
        "gemm_out": ((t * max(2 * N, K),), "model"),
        "intermediate2": ((t, N), "model"),
    }


def fused_moe_workspace_bytes(max_tokens: int, topk: int, num_experts: int, N: int, K: int, dtype_bytes: int,
                              block_m: int = MOE_BLOCK_M) -> int:
    """Exact bytes of FusedMoeWorkspace.allocate(max_tokens, topk, num_experts, N, K, dtype, block_m=block_m) for a
    model dtype of dtype_bytes bytes:
        4 * (P + B + 1 + E) + dtype_bytes * T * (max(2N, K) + N),   T = max_tokens * topk (P, B: module docstring)"""
    total = 0
    for shape, kind in fused_moe_buffer_shapes(max_tokens, topk, num_experts, N, K, block_m).values():
        numel = 1
        for d in shape:
            numel *= d
        total += numel * (MOE_INDEX_BYTES if kind == "index" else dtype_bytes)
    return total


@dataclass
class FusedMoeWorkspace:
    max_tokens: int
    topk: int
    num_experts: int
    N: int
    K: int
    block_m: int
    sorted_token_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    expert_counts: torch.Tensor
    gemm_out: torch.Tensor
    intermediate2: torch.Tensor

    @classmethod
    def allocate(cls, max_tokens: int, topk: int, num_experts: int, N: int, K: int, dtype: torch.dtype,
                 device, block_m: int = MOE_BLOCK_M) -> "FusedMoeWorkspace":
        buffers = {
            name: torch.empty(shape, dtype=torch.int32 if kind == "index" else dtype, device=device)
            for name, (shape, kind) in fused_moe_buffer_shapes(max_tokens, topk, num_experts, N, K, block_m).items()
        }
        return cls(max_tokens, topk, num_experts, N, K, block_m, **buffers)

    @classmethod
    def from_any(cls, workspace) -> "FusedMoeWorkspace":
        """A FusedMoeWorkspace, or a dict with its fields."""
        if isinstance(workspace, cls):
            return workspace
        return cls(**{f.name: workspace[f.name] for f in fields(cls)})

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in fused_moe_buffer_shapes(0, 0, 0, 0, 0))

    def check_fits(self, num_tokens: int, topk: int, num_experts: int, N: int, K: int, dtype: torch.dtype,
                   block_m: int) -> None:
        want = (topk, num_experts, N, K, dtype)
        have = (self.topk, self.num_experts, self.N, self.K, self.gemm_out.dtype)
        if want != have:
            raise ValueError(f"fused-MoE workspace built for (topk, experts, N, K, dtype) = {have}, called with {want}")
        if num_tokens > self.max_tokens or block_m > self.block_m:
            raise ValueError(f"fused-MoE batch of {num_tokens} tokens (BLOCK_M {block_m}) does not fit the workspace "
                             f"planned for {self.max_tokens} tokens (BLOCK_M {self.block_m}): plan it for more tokens")
