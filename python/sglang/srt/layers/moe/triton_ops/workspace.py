"""The fused-MoE workspace: every buffer fused_experts_triton uses besides its output, sized once for the largest
batch the scheduler runs (max_tokens) and shared by all MoE layers (they run one after another).

With T = max_tokens * topk assignments (token m's j-th expert is assignment m * topk + j), E experts and BLOCK_M
rows per GEMM block (MOE_BLOCK_M, the largest any tile set uses):
    P = T + min(E, T) * (BLOCK_M - 1)   the most sorted slots: each non-empty expert pads its rows up to a multiple
                                        of BLOCK_M (adds <= BLOCK_M - 1), and at most min(E, T) experts are non-empty
    B = P // BLOCK_M                    the most blocks (the padded total is a multiple of BLOCK_M and <= P)

    name             dtype  shape              holds
    intermediate1    model  [T * max(2N, K)]   intermediate1 [T, 2N] (gate | up), then intermediate3 [T, K]
    intermediate2    model  [T, N]             silu(gate) * up
    sorted_ids       int32  [P]                assignment ids grouped by expert, padded with T (align.py)
    expert_ids       int32  [B]                the expert of each BLOCK_M block of sorted_ids
    expert_offsets   int32  [E + 1]            start of each expert's padded group; entry E = the padded total

intermediate1 is dead once intermediate2 is written, so intermediate3 reuses its memory. A batch of M <= max_tokens
tokens uses the leading elements of each buffer (views: their addresses never change, as CUDA graphs need).

fused_experts_triton also takes any object or dict with these names plus a separate `intermediate3` (>= T * K
elements), each buffer at least its size here: e.g. the model runner's MoEWorkspace, whose intermediate3 is its own.
The layout functions take and return plain integers (no torch), so the memory plan can charge the same formula.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import torch

from sglang.srt.layers.moe.triton_ops.tiles import MOE_BLOCK_M

MOE_INDEX_BYTES = 4  # the alignment buffers are int32

# name -> (shape, "index" | "model"): the dtype is int32 for "index", the model's dtype for "model"
BufferShapes = Dict[str, Tuple[Tuple[int, ...], str]]


def max_sorted_slots(num_assignments: int, num_experts: int, block_m: int) -> int:
    """P: the most entries sorted_ids can use for this many assignments."""
    return num_assignments + min(num_experts, num_assignments) * (block_m - 1)


def max_blocks(num_assignments: int, num_experts: int, block_m: int) -> int:
    """B: the most BLOCK_M blocks the alignment can produce (the GEMM grid's first axis)."""
    return max_sorted_slots(num_assignments, num_experts, block_m) // block_m


def fused_moe_buffer_shapes(max_tokens: int, topk: int, num_experts: int, N: int, K: int,
                            block_m: int = MOE_BLOCK_M) -> BufferShapes:
    """The workspace's buffers (module docstring): N = intermediate size per expert, K = hidden size."""
    t = max_tokens * topk
    return {
        "intermediate1": ((t * max(2 * N, K),), "model"),
        "intermediate2": ((t, N), "model"),
        "sorted_ids": ((max_sorted_slots(t, num_experts, block_m),), "index"),
        "expert_ids": ((max_blocks(t, num_experts, block_m),), "index"),
        "expert_offsets": ((num_experts + 1,), "index"),
    }


def fused_moe_workspace_bytes(max_tokens: int, topk: int, num_experts: int, N: int, K: int, dtype_bytes: int,
                              block_m: int = MOE_BLOCK_M) -> int:
    """Exact bytes of FusedMoeWorkspace.allocate(max_tokens, topk, num_experts, N, K, dtype, block_m=block_m) for a
    model dtype of dtype_bytes bytes:
        dtype_bytes * T * (max(2N, K) + N) + 4 * (P + B + E + 1),   T = max_tokens * topk (P, B: module docstring)"""
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
    intermediate1: torch.Tensor
    intermediate2: torch.Tensor
    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    expert_offsets: torch.Tensor

    @property
    def intermediate3(self) -> torch.Tensor:
        return self.intermediate1  # the same memory: intermediate1 is dead when intermediate3 is written

    @classmethod
    def allocate(cls, max_tokens: int, topk: int, num_experts: int, N: int, K: int, dtype: torch.dtype,
                 device, block_m: int = MOE_BLOCK_M) -> "FusedMoeWorkspace":
        buffers = {
            name: torch.empty(shape, dtype=torch.int32 if kind == "index" else dtype, device=device)
            for name, (shape, kind) in fused_moe_buffer_shapes(max_tokens, topk, num_experts, N, K, block_m).items()
        }
        return cls(max_tokens, **buffers)

    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in fused_moe_buffer_shapes(0, 0, 0, 0, 0))


@dataclass(frozen=True)
class CallBuffers:
    """The views one call of T assignments works in (leading elements of the workspace's buffers)."""

    intermediate1: torch.Tensor  # [T, 2N]
    intermediate2: torch.Tensor  # [T, N]
    intermediate3: torch.Tensor  # [T, K]
    sorted_ids: torch.Tensor  # int32 [P(T)]
    expert_ids: torch.Tensor  # int32 [B(T)]: the GEMM grid's first axis
    expert_offsets: torch.Tensor  # int32 [E + 1]


def _buffer(workspace, name: str):
    if isinstance(workspace, dict):
        return workspace.get(name)
    return getattr(workspace, name, None)


def call_buffers(workspace, num_assignments: int, num_experts: int, N: int, K: int, dtype: torch.dtype,
                 block_m: int) -> CallBuffers:
    """Views of `workspace` (a FusedMoeWorkspace, or any object / dict with its buffer names, intermediate3
    optional) for one call; ValueError naming the buffer when one is too small or of the wrong dtype."""
    t = num_assignments
    need = {"intermediate1": (t * 2 * N, dtype), "intermediate2": (t * N, dtype),
            "intermediate3": (t * K, dtype), "sorted_ids": (max_sorted_slots(t, num_experts, block_m), torch.int32),
            "expert_ids": (max_blocks(t, num_experts, block_m), torch.int32),
            "expert_offsets": (num_experts + 1, torch.int32)}
    found = {}
    for name, (numel, want_dtype) in need.items():
        buf = _buffer(workspace, name)
        if buf is None and name == "intermediate3":
            buf = _buffer(workspace, "intermediate1")
        if buf is None:
            raise ValueError(f"fused-MoE workspace has no buffer {name!r}")
        if buf.numel() < numel or buf.dtype != want_dtype or not buf.is_contiguous():
            raise ValueError(f"fused-MoE workspace buffer {name} ({buf.numel()} x {buf.dtype}) does not fit a batch of "
                             f"{t} assignments over {num_experts} experts (needs {numel} contiguous x {want_dtype}): "
                             f"plan the workspace for more tokens, or for this model's shapes and dtype")
        found[name] = buf.view(-1)[:numel]
    offsets = _buffer(workspace, "expert_offsets")
    if offsets.numel() != num_experts + 1:
        raise ValueError(f"fused-MoE workspace expert_offsets has {offsets.numel()} entries for {num_experts} "
                         f"experts (needs {num_experts + 1})")
    return CallBuffers(found["intermediate1"].view(t, 2 * N), found["intermediate2"].view(t, N),
                       found["intermediate3"].view(t, K), found["sorted_ids"], found["expert_ids"],
                       found["expert_offsets"])
